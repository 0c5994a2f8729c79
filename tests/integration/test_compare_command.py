"""`cpuprof compare` for real: fresh decode children per run, rotated rounds, every format, a
failing configuration, Ctrl-C and --resume, and --from measuring a profile's proposals."""

from __future__ import annotations

import csv
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_runs import cpuprof, interrupt_once_started, one_line_error

from cpuprof.launch.sweep import load, process_layout
from cpuprof.machine.openmp import find_intel_openmp
from cpuprof.model import Profile
from cpuprof.model.ranks import MultiRun

SHORT = ["--preset", "tiny", "--new-tokens", "16", "--prompt-len", "8", "--warmup", "2"]


@pytest.mark.skipif(find_intel_openmp() is None, reason="libiomp5 is not installed (pip install intel-openmp)")
def test_threads_by_runtime_sweep_runs_every_configuration_and_renders_every_format(tmp_path: Path):
    out = tmp_path / "sweep"
    # 2 rounds of 4 configurations (8 decodes): the least that tests the rotation and Welch's test.
    result = cpuprof("compare", *SHORT, "--threads", "1,2", "--omp", "gnu,intel", "-r", "2", "--out", str(out),
                     "--format", "json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    rows = report["sections"][0]["tables"][0]["rows"]
    assert sorted(r["config"] for r in rows) == ["threads=1 omp=gnu", "threads=1 omp=intel",
                                                 "threads=2 omp=gnu", "threads=2 omp=intel"]
    assert all(r["runs"] == 2 and r["status"] == "ok" and r["tokens_per_s"] > 0 for r in rows)
    assert "Welch's t-test over 2 and 2 runs" in report["sections"][0]["lines"][0]
    # The explanation starts from what the two configurations it compares differ in, axis by axis.
    lines = report["sections"][0]["lines"]
    assert lines[1].startswith("What the configurations differ in"), lines
    causes = [line.removeprefix("  - ") for line in lines[2:] if line.startswith("  - ")]
    assert any(c.startswith(("threads ", "omp ")) and " → " in c for c in causes), lines
    # Progress says what runs, in whole lines, while it runs.
    assert result.stderr.count("cpuprof: [") >= 16 and "[8/8]" in result.stderr

    comparison = load(out)
    assert [c for c, _ in comparison.order[:4]] == [0, 1, 2, 3]
    assert [c for c, _ in comparison.order[4:8]] == [1, 2, 3, 0]
    assert len(comparison.runs) == 8 and all(r.status == "done" for r in comparison.runs)
    for run in comparison.runs:
        values = comparison.configs[run.config].values
        profile = Profile.load(run.out_dir)  # every run is a whole decode with its own profile
        assert profile.settings is not None and profile.settings.in_force is not None
        # What was in force is what the configuration asked for: the team size and the runtime.
        assert run.metrics is not None and run.metrics.threads == int(values["threads"])
        active = profile.settings.in_force.openmp.active
        assert active is not None and active.runtime == ("libiomp5" if values["omp"] == "intel" else "libgomp")
        assert len(run.metrics.step_ms) == 16 - 2

    for fmt, check in [("terminal", "configurations, fastest first"), ("markdown", "| configuration |")]:
        text = cpuprof("report", str(out), "--format", fmt)
        assert text.returncode == 0 and check in text.stdout, text.stderr
    lines = cpuprof("report", str(out), "--format", "csv").stdout.splitlines()
    table = list(csv.DictReader(line for line in lines if line and not line.startswith("#")))
    assert len(table) == 4 and all(float(r["tokens_per_s"]) > 0 for r in table)


def test_a_processes_sweep_runs_each_layout_as_decode_does_and_ranks_the_group(tmp_path: Path):
    """--tp and --instances as axes: one process, two tensor-parallel ranks, two instances; the
    group's figures come from the ranks' own profiles."""
    out = tmp_path / "procs"
    result = cpuprof("compare", *SHORT, "--roofs", "off", "--tp", "1,2", "--instances", "1,2", "-r", "1",
                     "--out", str(out), "--format", "json")
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)["sections"][0]["tables"][0]["rows"]
    assert sorted(r["config"] for r in rows) == ["tp=1 instances=1", "tp=1 instances=2", "tp=2 instances=1"]
    assert all(r["status"] == "ok" and r["tokens_per_s"] > 0 for r in rows), rows
    assert "rank 0 of 2" not in result.stderr  # the ranks' output stays in their logs during a sweep
    assert "1 combination(s) with both --tp and --instances above 1 left out" in result.stderr
    comparison = load(out)
    assert comparison.configs[comparison.baseline].label == "tp=1 instances=1"
    for run in comparison.runs:
        assert run.status == "done" and run.metrics is not None
        layout = process_layout(comparison.configs[run.config].values)
        if layout is None:
            assert Profile.load(run.out_dir).workload is not None and run.metrics.threads == 2  # every CPU
            continue
        group = MultiRun.load(run.out_dir)
        assert (group.mode, group.world_size) == layout and group.finished and not group.failures
        ranks = [Profile.load(Path(run.out_dir) / r.dir) for r in group.ranks]
        figures = [p.workload.figures.tokens_per_s for p in ranks if p.workload and p.workload.figures]
        assert len(figures) == 2 and run.metrics.threads == 1  # each rank on its own CPU
        if layout[0] == "instances":
            assert run.metrics.tokens_per_s == pytest.approx(sum(figures))
            assert len(run.metrics.step_ms) == 2 * (16 - 2)  # both streams' measured steps
        else:
            assert run.metrics.tokens_per_s == pytest.approx(min(figures))  # in lockstep: the slowest rank's
            assert all(p.workload and p.workload.collectives and p.workload.collectives.enter_ns for p in ranks)
            assert run.metrics.all_reduce_share is not None and 0 < run.metrics.all_reduce_share < 1
    text = cpuprof("report", str(out)).stdout
    assert "allreduce" in text and "inside all-reduces" in text  # the column and its legend
    # One rank's profile proposes nothing a single process could test: refused in one line.
    group_run = next(r for r in comparison.runs if process_layout(comparison.configs[r.config].values))
    refused = cpuprof("compare", "--from", str(Path(group_run.out_dir) / "rank-0"), "--out", str(tmp_path / "f"))
    assert refused.returncode == 2 and "a profile of one rank of a --" in one_line_error(refused)


def test_a_failing_configuration_is_reported_and_the_sweep_goes_on(tmp_path: Path):
    out = tmp_path / "numa"
    result = cpuprof("compare", *SHORT, "--threads", "1", "--numa", "0,9", "-r", "1", "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert "numa=9, run 1: failed: --numa 9: this machine has NUMA node(s)" in result.stderr
    assert "numa=0" in result.stdout and "1 of 1 failed" in result.stdout
    comparison = load(out)
    assert sorted(r.status for r in comparison.runs) == ["done", "failed"]


def test_every_configuration_failing_is_an_error(tmp_path: Path):
    result = cpuprof("compare", *SHORT, "--numa", "8,9", "-r", "1", "--out", str(tmp_path / "x"))
    assert result.returncode == 1 and "no configuration ran to the end" in one_line_error(result)


def test_ctrl_c_keeps_what_finished_and_resume_runs_the_rest(tmp_path: Path):
    out = tmp_path / "sweep"
    proc = subprocess.Popen([sys.executable, "-m", "cpuprof", "compare", *SHORT, "--threads", "1,2", "-r", "2",
                             "--out", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if (out / "compare.json").exists() and any(r.status == "done" for r in load(out).runs):
            break
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr
    line = one_line_error(subprocess.CompletedProcess([], 130, stdout, stderr))
    assert f"resume with: python -m cpuprof compare --resume {out}" in line
    kept = load(out)
    done = [r for r in kept.runs if r.status == "done"]
    assert 1 <= len(done) < 4 and "PARTIAL" in stdout
    resumed = cpuprof("compare", "--resume", str(out))
    assert resumed.returncode == 0, resumed.stderr
    assert f"{len(done)} of 4 runs already finished" in resumed.stderr
    final = load(out)
    finished = sorted((r.config, r.repetition) for r in final.runs if r.status == "done")
    assert finished == [(0, 1), (0, 2), (1, 1), (1, 2)]
    # The runs finished before the interruption were kept, not run again.
    assert all(any(r.out_dir == d.out_dir and r.metrics == d.metrics for r in final.runs) for d in done)


def test_from_a_profile_measures_what_its_figures_propose(tmp_path: Path):
    profiled = tmp_path / "one-thread"
    # Long enough (a few hundred ms) that one time slice of another task on the thread's CPU is not
    # a 5% run-queue delay, which would propose nothing for one thread instead of using both CPUs.
    first = cpuprof("decode", *SHORT, "--new-tokens", "240", "--threads", "1", "--cpus", "0,1", "--out", str(profiled),
                    "--format", "json")
    assert first.returncode == 0, first.stderr
    from cpuprof.analysis.compare import run_metrics
    from cpuprof.analysis.proposals import RUN_DELAY_PROPOSAL_SHARE
    from cpuprof.model import Profile

    metrics = run_metrics(Profile.load(profiled))
    if metrics is not None and (metrics.run_delay_share or 0) >= RUN_DELAY_PROPOSAL_SHARE:
        pytest.skip(f"the machine was busy: the decode's thread waited {metrics.run_delay_share:.0%} of the time "
                    "for a CPU, so using the second CPU is rightly not proposed")
    out = tmp_path / "proposals"
    result = cpuprof("compare", "--from", str(profiled), "-r", "2", "--out", str(out), "--format", "json")
    assert result.returncode == 0, result.stderr
    sections = {s["id"]: s for s in json.loads(result.stdout)["sections"]}
    rows = sections["proposals"]["tables"][0]["rows"]
    use_all = next(r for r in rows if r["config"] == "threads=2")
    assert "1 thread(s) on 2 CPUs" in use_all["proposal"]
    held = use_all["held"]
    assert (held in ("held", "made it slower") or held.startswith("not beyond the noise")) and use_all["p"] is not None
    comparison = load(out)
    assert comparison.configs[0].label == "as profiled" and comparison.source == str(profiled)


@pytest.mark.parametrize(("args", "words"), [
    (["--threads", "0,1"], "--threads 0: expected a positive whole number"),
    (["--omp", "gnu,llvm"], "--omp llvm: choose from"),
    (["--threads", "4-1"], "with first <= last"),
    (["--resume", "/nonexistent/sweep"], "/nonexistent/sweep: no such comparison"),
    (["--from", "/nonexistent/profile"], "/nonexistent/profile"),
])
def test_bad_input_is_one_line(args: list[str], words: str):
    result = cpuprof("compare", *SHORT, *args)
    assert result.returncode == 2 and words in one_line_error(result)


def test_an_existing_comparison_is_not_overwritten(tmp_path: Path):
    (tmp_path / "compare.json").write_text("{}")
    result = cpuprof("compare", *SHORT, "--out", str(tmp_path))
    assert result.returncode == 2 and f"--resume {tmp_path}" in one_line_error(result)


def test_ctrl_c_while_a_run_is_still_starting_stops_the_sweep(tmp_path: Path):
    """A run's child killed by the Ctrl-C before its own handler is set (status 1, or the signal) is
    an interrupted run, not a failed configuration: the sweep stops instead of going on."""
    out = tmp_path / "sweep"
    ended = interrupt_once_started(["compare", *SHORT, "--threads", "1,2", "-r", "1", "--out", str(out)],
                                   out / "config-01" / "run-1" / "launch.json")
    assert ended.returncode == 130, ended.stderr
    assert f"resume with: python -m cpuprof compare --resume {out}" in ended.stderr
    assert [r.status for r in load(out).runs] == ["interrupted"]



def test_compare_from_refuses_the_flags_it_would_ignore(tmp_path: Path):
    """--from runs the profile's own workload and launch: a --layers or --new-tokens given with it would
    be dropped without a word (a sweep of full-size runs), so it is refused before anything runs."""
    result = cpuprof("compare", "--from", str(tmp_path / "profiled"), "--layers", "2", "--new-tokens=8", "-r", "2",
                     "--out", str(tmp_path / "sweep"))
    assert result.returncode == 2, result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("cpuprof: error: --from") and "--layers, --new-tokens would be ignored" in line
    assert not (tmp_path / "sweep").exists()
