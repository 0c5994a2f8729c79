"""--compile: torch.compile (inductor, frozen weights) of the built-in model, before the profile,
as a decode option and as a compare axis."""

from __future__ import annotations

import json
import statistics
import subprocess
from pathlib import Path

from cli_runs import cpuprof as _cpuprof

from cpuprof.analysis.roofline import gemm_groups
from cpuprof.launch.sweep import load
from cpuprof.model import Profile


def cpuprof(*args: str) -> subprocess.CompletedProcess:
    return _cpuprof(*args, timeout=900)


def test_compile_on_and_off_side_by_side(tmp_path: Path):
    out = tmp_path / "sweep"
    result = cpuprof("compare", "--preset", "tiny", "--new-tokens", "12", "--prompt-len", "8", "--threads", "2",
                     "--compile", "off,on", "-r", "1", "--out", str(out), "--format", "json")
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)["sections"][0]["tables"][0]["rows"]
    assert sorted(r["config"] for r in rows) == ["compile=off", "compile=on"] and all(r["status"] == "ok" for r in rows)
    runs = {load(out).configs[r.config].values["compile"]: r for r in load(out).runs}
    compiled, eager = Profile.load(runs["on"].out_dir), Profile.load(runs["off"].out_dir)
    assert compiled.workload is not None and eager.workload is not None
    assert compiled.workload.compile_s is not None and compiled.workload.compile_s > 0
    assert eager.workload.compile_s is None
    # Compilation happened before the profile: no measured step recompiles (seconds against a
    # millisecond). A preemption or a garbage collection can cost a step a few ms, never 250.
    steps = compiled.workload.step_latencies_s[compiled.workload.warmup_steps:]
    assert max(steps) < max(20 * statistics.median(steps), 0.25), steps
    # Frozen weights go to oneDNN's packed linear, which the GEMM analysis still sees as GEMMs.
    names = {op.name for op in compiled.ops}
    assert "mkldnn::_linear_pointwise" in names, sorted(names)
    assert any(op.name == "mkldnn::_linear_pointwise" for g in gemm_groups(compiled) for op in g.ops)
    assert "compiled with torch.compile" in cpuprof("report", runs["on"].out_dir).stdout


def test_compile_of_a_checkpoint_is_refused(tmp_path: Path):
    result = cpuprof("decode", "--hf", str(tmp_path), "--compile", "--out", str(tmp_path / "o"))
    assert result.returncode == 2 and "--compile compiles the built-in model" in result.stderr
    assert "Traceback" not in result.stderr
