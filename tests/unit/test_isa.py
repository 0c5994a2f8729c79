"""The theoretical peak's parts read from fake /proc/cpuinfo and sysfs trees (this machine has one CPU
model and no cpufreq), and the report lines built from them."""

from __future__ import annotations

from pathlib import Path

import pytest

from cpuprof.analysis.roofs import roofs_lines, roofs_table
from cpuprof.machine import isa
from cpuprof.model import ArithmeticPeak, MachineRoofs, Repeated

ZEN4 = {"vendor_id": "AuthenticAMD", "cpu family": "25", "model": "17",
        "flags": "fpu sse2 avx avx2 fma avx512f avx512bw avx512vl avx512_bf16"}
ZEN3 = {"vendor_id": "AuthenticAMD", "cpu family": "25", "model": "1", "flags": "sse2 avx avx2 fma"}
ZEN2 = {"vendor_id": "AuthenticAMD", "cpu family": "23", "model": "49", "flags": "sse2 avx avx2 fma"}
ZEN1 = {"vendor_id": "AuthenticAMD", "cpu family": "23", "model": "1", "flags": "sse2 avx avx2 fma"}
XEON = {"vendor_id": "GenuineIntel", "cpu family": "6", "model": "143", "flags": "sse2 avx2 fma avx512f amx_bf16"}
HASWELL = {"vendor_id": "GenuineIntel", "cpu family": "6", "model": "63", "flags": "sse2 avx avx2 fma"}


@pytest.mark.parametrize(("fields", "chosen", "flop", "core"), [
    (ZEN4, "avx512", 32, "Zen 4"),  # AVX-512 on two 256-bit pipes: no more than AVX2
    (ZEN4, "avx2", 32, "Zen 4"),
    (ZEN3, "avx2", 32, "Zen 3"),
    (ZEN2, "avx2", 32, "Zen 2"),
    (ZEN1, "avx2", 16, "Zen 1"),  # two 128-bit pipes: a 256-bit FMA takes both
    (XEON, "avx512", 64, "Intel"),
    (XEON, "avx2", 32, "Intel"),  # 256-bit vectors on 512-bit units
    (HASWELL, "avx2", 32, "Intel"),
])
def test_fma_pipes_by_core(fields: dict[str, str], chosen: str, flop: int, core: str):
    got, why = isa.fma_pipes(fields, chosen)
    assert got == flop and core in why


@pytest.mark.parametrize(("fields", "chosen", "why"), [
    (ZEN4, "sse2", "no fused multiply-add"),
    ({"vendor_id": "CentaurHauls", "cpu family": "6", "model": "1", "flags": "avx2 fma"}, "avx2", "vendor"),
    ({"vendor_id": "AuthenticAMD", "cpu family": "21", "model": "1", "flags": "avx fma"}, "avx2", "family 0x15"),
    ({"vendor_id": "AuthenticAMD", "flags": "avx2"}, "avx2", "family is not"),
])
def test_no_theoretical_peak_for_an_unknown_core(fields: dict[str, str], chosen: str, why: str):
    got, text = isa.fma_pipes(fields, chosen)
    assert got is None and why in text and "not derived" in text


def _tree(tmp_path: Path, cpuinfo: str, max_khz: str | None = None) -> Path:
    (tmp_path / "proc").mkdir(parents=True)
    (tmp_path / "proc" / "cpuinfo").write_text(cpuinfo)
    if max_khz is not None:
        freq = tmp_path / "sys/devices/system/cpu/cpu2/cpufreq"
        freq.mkdir(parents=True)
        (freq / "cpuinfo_max_freq").write_text(max_khz + "\n")
    return tmp_path


def test_the_clock_is_cpufreqs_maximum_where_there_is_one(tmp_path: Path):
    root = _tree(tmp_path, "processor\t: 0\ncpu MHz\t\t: 2596.128\n\nprocessor\t: 1\ncpu MHz\t: 1000\n", "3700000")
    assert isa.clock_ghz([2, 3], root) == (3.7, "cpufreq's cpuinfo_max_freq")


def test_the_clock_falls_back_to_cpuinfo_then_to_the_model_name(tmp_path: Path):
    ghz, source = isa.clock_ghz([0], _tree(tmp_path / "a", "processor\t: 0\ncpu MHz\t\t: 2596.128\n"))
    assert ghz == pytest.approx(2.596128) and "cpu MHz" in source
    ghz, source = isa.clock_ghz([0], _tree(tmp_path / "b", "model name\t: Intel(R) Xeon(R) Gold 6148 CPU @ 2.40GHz\n"))
    assert ghz == 2.4 and "model name" in source
    assert isa.clock_ghz([0], _tree(tmp_path / "c", "processor\t: 0\n")) == (None, "no clock reported")


def test_cpuinfo_fields_are_the_first_processors():
    fields = isa.cpuinfo_fields("processor\t: 0\nmodel\t\t: 17\n\nprocessor\t: 1\nmodel\t\t: 99\n")
    assert fields["model"] == "17"


def _peak(best: float, ghz: float | None = 2.6, flop: int | None = 32) -> ArithmeticPeak:
    return ArithmeticPeak(isa="avx512", threads=2, gflop_per_s=Repeated(best, best, 0.02, 5), flop_per_cycle=flop,
                          pipes="Zen 4: 2 x 256-bit FMA pipes", ghz=ghz, ghz_source="/proc/cpuinfo's cpu MHz",
                          bf16_factor=2)


def test_theoretical_peak_and_the_clock_the_loop_implies():
    peak = _peak(233.0)
    assert peak.theoretical("f32") == pytest.approx(2 * 32 * 2.6)
    assert peak.theoretical("bf16") == pytest.approx(2 * 64 * 2.6)
    assert peak.theoretical("f16") is None
    assert peak.implied_ghz == pytest.approx(233.0 / 64)
    assert _peak(100.0, ghz=None).theoretical() is None and _peak(100.0, flop=None).implied_ghz is None


def _roofs(peak: ArithmeticPeak) -> MachineRoofs:
    return MachineRoofs(fingerprint={}, key="k", measured="2026-11-29T01:00:00+00:00", seconds=4.0, threads=2,
                        cpus=[0, 1], peak=peak)


@pytest.mark.parametrize(("best", "said"), [
    (233.0, "the loop implies 3.64 GHz: the cores run above the reported clock"),
    (160.0, None),
    (80.0, "the loop reaches 48% of it"),
])
def test_the_peak_line_says_where_the_loop_and_the_derivation_part(best: float, said: str | None):
    line = next(line for line in roofs_lines(_roofs(_peak(best))) if line.startswith("the cores' f32 peak"))
    assert f"{best:.0f} GFLOP/s measured by a register-only avx512 FMA loop" in line
    assert "theoretical 166 at the reported 2.60 GHz" in line
    if said is None:
        assert "implies" not in line and "reaches" not in line
    else:
        assert said in line


def test_the_table_gives_the_loop_and_the_derived_peaks_apart():
    rows = roofs_table(_roofs(_peak(233.0))).rows
    assert [(r["roof"], r["dtype"]) for r in rows] == [("FMA peak", "f32"), ("theoretical", "f32"),
                                                      ("theoretical", "bf16")]
    assert rows[1]["runs"] is None and "2 threads x 32 FLOP/cycle x 2.60 GHz" in rows[1]["how"]
    assert "64 FLOP/cycle" in rows[2]["how"]
    underived = roofs_table(_roofs(_peak(233.0, flop=None))).rows
    assert [r["roof"] for r in underived] == ["FMA peak"]


def test_a_cap_that_is_no_isa_is_refused(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv(isa.MAX_ISA_ENV, "avx1024")
    with pytest.raises(ValueError, match="unknown instruction set 'avx1024'"):
        isa.roofs_isa()
    monkeypatch.setenv(isa.MAX_ISA_ENV, "SSE2")
    assert isa.roofs_isa() == "sse2"
