"""The roofs, the GEMMs against them, the decode ceiling and the memory figures, end to end: real
decode children, real calibrations, real allocator reports."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from cli_runs import cpuprof

from cpuprof.model import Profile

TINY = ["--preset", "tiny", "--hidden", "256", "--ffn", "1024", "--layers", "2", "--prompt-len", "16",
        "--new-tokens", "12", "--threads", "2"]


@pytest.fixture(scope="module")
def decoded(tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("roofline") / "decode"
    result = cpuprof("decode", *TINY, "--out", str(out), "--format", "json")
    assert result.returncode == 0, result.stderr
    return {"out": out, "report": json.loads(result.stdout), "profile": Profile.load(out), "stderr": result.stderr}


def section(report: dict, section_id: str) -> dict:
    found = [s for s in report["sections"] if s["id"] == section_id]
    assert found, [s["id"] for s in report["sections"]]
    return found[0]


def test_decode_measures_the_roofs_and_keeps_them_in_the_profile(decoded: dict) -> None:
    roofs = decoded["profile"].roofs
    assert roofs is not None and roofs.threads == 2 and roofs.cpus == [0, 1]
    assert {b.kernel for b in roofs.bandwidth} == {"copy", "triad", "read"}
    assert roofs.memory_roof() is not None and roofs.memory_roof().kernel == "read"  # a decode only reads weights
    assert {c.dtype for c in roofs.compute} == {"f32", "bf16"}
    assert {k.dtype for k in roofs.kernel} == {"f32", "bf16"}
    bw = roofs.memory_gb_per_s()
    assert bw is not None and 1 < bw < 2000  # a DRAM bandwidth, in GB/s
    # a large GEMM does far more flops per second than a GEMV can feed from memory
    assert roofs.compute_gflop_per_s("f32") > 2 * bw  # type: ignore[operator]
    # the kernel roof is what torch's GEMV reads: never much above what memory gives (test_roofs holds
    # the calibration to that); here, on a shared host, the bandwidth can stay disturbed through every
    # measurement, and then the report must say so
    assert 0 < roofs.kernel_gb_per_s("bf16")  # type: ignore[operator]
    if roofs.kernel_above_memory() is not None:
        assert any("more than this memory roof allows" in line for line in section(decoded["report"], "roofs")["lines"])


def test_the_ceiling_is_bytes_per_token_over_the_measured_bandwidth(decoded: dict) -> None:
    profile, report = decoded["profile"], decoded["report"]
    wl = profile.workload
    bw = profile.roofs.memory_gb_per_s()
    ceiling = bw * 1e9 / wl.bytes_read_per_token
    text = "\n".join(section(report, "ceiling")["lines"])
    assert f"ceiling {ceiling:,.0f} tokens/s" in text or f"ceiling {ceiling:,.1f} tokens/s" in text, text
    # the breakdown adds up to the measured mean step, and each part is what the profile says
    rows = section(report, "ceiling")["tables"][0]["rows"]
    step = rows[-1]
    assert step["part"] == "measured step"
    assert step["ns"] == pytest.approx(sum(wl.step_latencies_s) * 1e9 / len(wl.step_latencies_s))
    # (a remainder under 0.5% of the step, where the GEMMs' analytic bytes and the step's differ,
    # gets no row of its own)
    assert sum(r["ns"] for r in rows[:-1]) == pytest.approx(step["ns"], rel=0.005)
    at_roof = next(r for r in rows if r["part"].startswith("reading the weights"))
    assert at_roof["ns"] == pytest.approx(wl.bytes_read_per_token * wl.batch / bw)
    ops_in_decode = sum(op.self_ns for op in profile.ops if op.kind == "op" and "prefill" not in op.region)
    between = next(r for r in rows if r["part"].startswith("between ops"))
    assert between["ns"] == pytest.approx(step["ns"] - ops_in_decode / len(wl.step_latencies_s))


def test_every_decode_gemm_is_judged_and_the_prefill_apart(decoded: dict) -> None:
    profile, report = decoded["profile"], decoded["report"]
    gemms = section(report, "gemms")
    rows = gemms["tables"][0]["rows"]
    by_shape = {r["shape"]: r for r in rows}
    # the decode GEMVs (one token) are memory-bound by intensity; every [1,256]x[256,256] GEMV reads
    # as one row: q and o of 2 layers each step, and the lm_head (the tiny vocabulary is 256 too)
    # each step and once for the prefill's last position
    steps = len(profile.workload.step_latencies_s)
    q_proj = by_shape["[1,256]x[256,256]ᵀ"]
    assert q_proj["roof"] == "memory"
    assert q_proj["calls"] == 2 * 2 * steps + steps + 1
    assert q_proj["verdict"]
    # decode attention over the growing KV cache is one row, its lengths a range
    attention = [r for r in rows if r["shape"].startswith("q[1,4,1,64]")]
    assert len(attention) == 1 and "…" in attention[0]["shape"], [r["shape"] for r in rows]
    # the prefill's GEMMs are their own rows (16 tokens at once)
    assert "[16,256]x[256,256]ᵀ" in by_shape


def test_roofline_chart_and_memory_section_are_written(decoded: dict) -> None:
    svg = ET.parse(decoded["out"] / "roofline.svg").getroot()
    assert svg.tag.endswith("svg")
    assert len([e for e in svg.iter() if e.tag.endswith("circle")]) >= 3
    memory = section(decoded["report"], "memory")
    text = "\n".join(memory["lines"])
    assert "KV cache" in text and "resident memory" in text
    wl = decoded["profile"].workload
    # the KV cache at the last step: 2 (k, v) x layers x positions x kv_dim x 2 bytes (bf16)
    cfg = wl.model.config
    assert wl.kv_cache[-1].bytes == 2 * cfg.layers * (16 + 12) * cfg.kv_dim * 2
    assert [p.phase for p in wl.rss_timeline][:2] == ["start", "built"]
    assert len([p for p in wl.rss_timeline if p.phase.startswith("step ")]) == 12
    assert decoded["profile"].collection.memory_reported
    assert any(op.alloc_bytes > 0 for op in decoded["profile"].ops if op.name == "aten::mm")


def test_the_second_decode_takes_the_roofs_from_the_cache(decoded: dict, tmp_path: Path) -> None:
    assert "measured the machine's roofs" in decoded["stderr"] or "from the cache" in decoded["stderr"]
    result = cpuprof("decode", *TINY, "--out", str(tmp_path / "again"), "--format", "json")
    assert result.returncode == 0, result.stderr
    again = Profile.load(tmp_path / "again")
    assert again.roofs is not None and again.roofs.key == decoded["profile"].roofs.key
    # Probed against the memory before use: taken from the cache when the probe agrees; measured again,
    # and said, when this shared machine's memory moved since (a state change between two tests).
    assert again.roofs.probe is not None
    if again.roofs.probe.outcome == "agrees":
        assert again.roofs.from_cache and "machine roofs from the cache" in result.stderr
        assert "a probe of the memory now read" in result.stderr
    else:
        assert again.roofs.probe.outcome == "remeasured" and "measuring the roofs again" in result.stderr


def test_roofs_off_gives_no_ceiling(tmp_path: Path) -> None:
    result = cpuprof("decode", *TINY, "--new-tokens", "4", "--roofs", "off", "--out", str(tmp_path / "d"),
                     "--format", "json")
    assert result.returncode == 0, result.stderr
    ids = [s["id"] for s in json.loads(result.stdout)["sections"]]
    assert "ceiling" not in ids and "roofs" not in ids and "gemms" in ids  # GEMMs keep their figures
    assert not (tmp_path / "d" / "roofline.svg").exists()


def test_calibrate_command_measures_under_the_launch(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    result = subprocess.run([sys.executable, "-m", "cpuprof", "calibrate", "--threads", "1", "--out",
                             str(tmp_path / "c"), "--format", "json"], capture_output=True, text=True, timeout=600,
                            env={**__import__("os").environ, "CPUPROF_CACHE_DIR": str(cache)})
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    rows = section(report, "roofs")["tables"][0]["rows"]
    assert {r["roof"] for r in rows} >= {"memory (read)", "memory (triad)", "memory (copy)", "FMA peak", "compute",
                                         "GEMV kernel"}
    # Measured rows repeat; a theoretical peak is derived (where this CPU's FMA pipes are known), once.
    assert all(r["best"] > 0 and (r["runs"] >= 5 if r["roof"] != "theoretical" else r["runs"] is None) for r in rows)
    if "the machine was busy while the roofs were measured" in result.stdout + result.stderr:
        pytest.skip("the machine was busy while the roofs were measured: rightly used for this run and not cached")
    saved = json.loads((cache / "roofs.json").read_text())
    assert [e["threads"] for e in saved["entries"]] == [1]


def test_calibrate_refuses_bad_launch_options_in_one_line(tmp_path: Path) -> None:
    for args, expected in ((["--threads", "0"], "--threads"), (["--numa", "7"], "7")):
        result = cpuprof("calibrate", *args, "--out", str(tmp_path / "x"))
        assert result.returncode != 0
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("cpuprof: error:") and expected in lines[0], result.stderr
        assert "Traceback" not in result.stderr


ALLOCATIONS = textwrap.dedent("""
    import json, torch, cpuprof
    a = torch.randn(256, 256)
    with cpuprof.profile("software", warn=False) as prof:
        for _ in range(10):
            b = a @ a
            c = torch.cat([a, a])
    p = prof.profile
    print(json.dumps({"reported": p.collection.memory_reported,
                      "ops": {op.name: [op.calls, op.allocs, op.alloc_bytes, op.frees, op.freed_bytes]
                              for op in p.ops if op.allocs or op.frees}}))
""")


def test_allocations_per_op_are_torch_allocator_bytes() -> None:
    result = subprocess.run([sys.executable, "-c", ALLOCATIONS], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout.strip().splitlines()[-1])
    assert data["reported"]
    ops = data["ops"]
    # every mm allocates its [256,256] f32 output, every cat its [512,256] one
    assert ops["aten::mm"][:3] == [10, 10, 10 * 256 * 256 * 4]
    assert ops["aten::cat"][:3] == [10, 10, 10 * 512 * 256 * 4]
    # the outputs die when the names are rebound, in Python between ops: 9 of each inside the session
    outside = ops["[outside ATen ops]"]
    assert outside[3] == 18 and outside[4] == 9 * 256 * 256 * 4 + 9 * 512 * 256 * 4
