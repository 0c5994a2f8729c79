"""decode --quant and compare --quant for real: a profiled decode child whose projections run
through torch's int8/int4 kernels, its figures and report, and bad input refused before anything
starts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_runs import cpuprof, one_line_error

from cpuprof.model import Profile
from cpuprof.model.workload import WeightQuant
from cpuprof.workload.presets import PRESETS

TINY = PRESETS["tiny"]
SHORT = ["--preset", "tiny", "--prompt-len", "8", "--new-tokens", "12", "--warmup", "2", "--roofs", "off"]
KERNELS = {"int8": "aten::_weight_int8pack_mm", "int4": "aten::_weight_int4pack_mm_for_cpu"}


@pytest.mark.parametrize("quant, extra", [(WeightQuant("int8"), []), (WeightQuant("int4", 32), ["--group-size", "32"]),
                                          (WeightQuant("int4", 64), [])],
                         ids=["int8", "int4-g32", "int4-default-on-tiny"])
def test_a_quantized_decode_runs_its_projections_through_the_kernels_and_counts_their_bytes(
        tmp_path: Path, quant: WeightQuant, extra: list[str]):
    result = cpuprof("decode", *SHORT, "--quant", quant.mode, *extra, "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr
    profile = Profile.load(tmp_path)
    wl = profile.workload
    assert wl.model.quant == quant
    assert wl.figures is not None and wl.figures.tokens_per_s > 0
    # Known answer: 7 projections per layer and the lm_head, in the prefill's forward and each step's.
    calls = sum(op.calls for op in profile.ops if op.kind == "op" and op.name == KERNELS[quant.mode])
    assert calls == (1 + wl.new_tokens) * (TINY.layers * 7 + 1)
    assert not any(op.name in ("aten::linear", "aten::mm") for op in profile.ops if op.kind == "op")
    contexts = range(wl.prompt_len + wl.warmup_steps + 1, wl.prompt_len + wl.new_tokens + 1)
    assert wl.bytes_read_per_token == sum(TINY.bytes_read_per_token(2, c, 1, quant=quant)
                                          for c in contexts) // len(contexts)
    assert wl.model.weight_bytes == TINY.weight_bytes(2, quant)
    report = " ".join(result.stdout.split())  # lines wrapped to the terminal's width, joined
    assert f"projections and lm_head quantized weight-only ({quant.describe()}" in report
    assert "their stored size" in report  # the bytes' method says how they were counted
    assert f"quantized the projections and lm_head to {quant.mode} ({quant.describe()}) in" in result.stderr
    # The default group (128) does not divide tiny's width 64: the largest that does, said once.
    chose = "--quant int4: groups of 64 inputs (the default 128 does not divide tiny's projection widths"
    assert (chose in result.stderr) == (quant.mode == "int4" and not extra)


@pytest.mark.parametrize("args, words", [
    (["--quant", "int3"], "argument --quant: invalid choice: 'int3'"),
    (["--quant", "int4", "--group-size", "100"], "--group-size 100 is not one torch's CPU int4 kernel takes; "
                                                "choose one of: 32, 64, 128, 256"),
    (["--quant", "int4", "--group-size", "128"], "--group-size 128 does not divide the input width 64 of tiny's "
                                                "projections"),
    (["--quant", "int8", "--group-size", "32"], "--group-size sets the groups of int4 weights; it needs --quant int4"),
    (["--quant", "int4", "--group-size", "64", "--tp", "2"], "--tp 2: --group-size 64 does not divide the input "
                                                             "width 32 of tiny's projections per tensor-parallel rank"),
], ids=["int3", "group-100", "group-128-on-tiny", "group-without-int4", "tp-group"])
def test_bad_quantization_is_one_line_before_anything_starts(tmp_path: Path, args: list[str], words: str):
    result = cpuprof("decode", "--preset", "tiny", *args, "--out", str(tmp_path / "out"))
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert words in one_line_error(result)
    assert not (tmp_path / "out" / "profile.json").exists()


def test_compare_sweeps_the_quantization(tmp_path: Path):
    out = tmp_path / "sweep"
    result = cpuprof("compare", *SHORT, "--quant", "none,int8,int4", "--group-size", "32", "-r", "1",
                     "--out", str(out), "--format", "json")
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)["sections"][0]["tables"][0]["rows"]
    assert sorted(r["config"] for r in rows) == ["quant=int4", "quant=int8", "quant=none"]
    assert all(r["status"] == "ok" and r["tokens_per_s"] > 0 for r in rows)
    # The cause named first is the quantization, with the bytes a token reads in both and what they predict.
    lines = json.loads(result.stdout)["sections"][0]["lines"]
    (cause,) = [line for line in lines if line.startswith("  - quant ")]
    assert "bytes read per token" in cause and "predicts" in cause and "measured" in cause, lines
    refused = cpuprof("compare", *SHORT, "--quant", "none,int8", "--group-size", "32", "--out", str(tmp_path / "x"))
    assert refused.returncode == 2 and "it needs --quant int4" in one_line_error(refused)
    # A tensor-parallel configuration's slices are checked too, before the first run.
    refused = cpuprof("compare", *SHORT, "--tp", "1,2", "--quant", "int4", "--group-size", "64",
                      "--out", str(tmp_path / "y"))
    assert refused.returncode == 2 and "per tensor-parallel rank" in one_line_error(refused)
    assert "(configuration tp=2)" in refused.stderr and not (tmp_path / "y" / "compare.json").exists()


def test_a_quantized_decode_measures_its_kernels_roofs_and_judges_its_gemvs_by_them(tmp_path: Path):
    """With roofs (the default), the run's own quantized kernel is calibrated too (cached with the
    rest), and the GEMM table judges the int4 GEMVs against it, not against the bf16 GEMV's."""
    args = [arg for arg in SHORT if arg not in ("--roofs", "off")]
    result = cpuprof("decode", *args, "--quant", "int4", "--group-size", "32", "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr
    profile = Profile.load(tmp_path)
    assert profile.roofs is not None
    kernel = profile.roofs.kernel_roof("bf16", "i4")
    assert kernel is not None and kernel.group_size == 32 and kernel.elements_per_s is not None
    report = " ".join(result.stdout.split())
    assert "bf16 x int4 (group 32) GEMV kernel" in report and "G weights/s" in report
    assert "bf16 x int4, group 32" in report  # the roofs table's row
