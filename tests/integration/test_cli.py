"""The CLI end to end: real child processes, real pinning read back from /proc, real signals."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cpuprof.model import Profile
from cpuprof.topology import read_topology

TOPOLOGY = read_topology()
CPUS = TOPOLOGY.online_cpus
TINY = ["--preset", "tiny", "--prompt-len", "8", "--new-tokens", "12", "--warmup", "2"]


def cpuprof(*args: str, timeout: float = 300, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cpuprof", *args], capture_output=True, text=True,
                          timeout=timeout, **kwargs)


def one_line_error(result: subprocess.CompletedProcess) -> str:
    lines = [line for line in result.stderr.splitlines()
             if line.strip() and not line.startswith("cpuprof: warning:")]
    assert "Traceback" not in result.stderr, result.stderr
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("cpuprof: error: ")
    return lines[0]


def test_decode_tiny_end_to_end(tmp_path: Path):
    threads = min(2, len(CPUS))
    result = cpuprof("decode", *TINY, "--threads", str(threads), "--numa", "0", "--out", str(tmp_path), "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    profile = Profile.from_dict(data)
    assert profile.status["complete"]
    node0 = set(TOPOLOGY.node(0).cpus)
    in_force = profile.settings["in_force"]
    # pinning read back from /proc inside the child: every thread inside node 0's CPUs
    assert all(set(t["affinity"]) <= node0 for t in in_force["threads"])
    assert in_force["mempolicy"] == {"mode": "bind", "nodes": [0]}
    assert in_force["torch"]["num_threads"] == threads
    assert profile.settings["warnings"] == []
    # tokens/s agrees with the wall time of the decode loop
    wl = profile.workload
    measured = wl["new_tokens"] - wl["warmup_steps"]
    assert wl["tokens_per_s"] == pytest.approx(wl["batch"] * measured / wl["decode_wall_s"], rel=0.10)
    assert len(wl["step_latencies_s"]) == wl["new_tokens"]
    # ops were profiled across the team, and the saved profile re-renders
    assert any(op.name == "aten::mm" for op in profile.ops)
    assert Profile.load(tmp_path).to_dict() == data
    report = cpuprof("report", str(tmp_path))
    assert report.returncode == 0 and "tokens/s" in report.stdout and "aten::mm" in report.stdout


def test_decode_pinned_to_one_cpu_reads_back_that_cpu(tmp_path: Path):
    cpu = CPUS[-1]
    result = cpuprof("decode", *TINY, "--cpus", str(cpu), "--threads", "1", "--no-profile", "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr
    profile = Profile.load(tmp_path)
    threads = profile.settings["in_force"]["threads"]
    assert threads and all(t["affinity"] == [cpu] and t["last_cpu"] == cpu for t in threads)
    assert profile.collection.mode == "off"
    assert "not profiled" in result.stdout


def test_decode_with_intel_openmp(tmp_path: Path):
    result = cpuprof("decode", *TINY, "--omp", "intel", "--out", str(tmp_path))
    if result.returncode == 2 and "intel-openmp" in result.stderr:
        pytest.skip("intel-openmp is not installed in this environment")
    assert result.returncode == 0, result.stderr
    active = Profile.load(tmp_path).settings["in_force"]["openmp"]["active"]
    assert active["runtime"] == "libiomp5"


@pytest.mark.parametrize("args, words", [
    (["--numa", "7"], "--numa 7: this machine has NUMA node(s) 0"),
    (["--threads", "0"], "--threads 0: expected a positive whole number"),
    (["--threads", "abc"], "--threads abc: expected a positive whole number"),
    (["--threads", str(len(CPUS) + 1)], "pass --oversubscribe to allow it"),
    (["--cpus", str(max(CPUS) + 5)], "not on this machine (online CPUs:"),
    (["--preset", "nope"], "unknown preset 'nope'; choose one of: llama-3.2-1b, llama-3.1-8b, tiny"),
    (["--hf", "/nonexistent/model"], "--hf /nonexistent/model: not a readable directory"),
    (["--preset", "llama-3.1-8b", "--layers", "400"], "but only"),
    (["--bind", "sideways"], "--bind sideways"),
    (["--dtype", "fp8"], "--dtype fp8: choose one of bf16, fp32"),
    (["--events", "cylces"], "unknown event 'cylces'"),
])
def test_bad_input_gets_one_line_and_exit_2(tmp_path: Path, args, words):
    base = ["--preset", "tiny"] if "--preset" not in args else []
    result = cpuprof("decode", *base, *args, "--out", str(tmp_path / "out"))
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert words in one_line_error(result)


def wait_for(predicate, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError("timed out waiting")


def child_pid(parent: int) -> int | None:
    try:
        children = Path(f"/proc/{parent}/task/{parent}/children").read_text().split()
    except OSError:
        return None
    return int(children[0]) if children else None


LONG = ["decode", "--preset", "tiny", "--max-seq", "100000", "--prompt-len", "4", "--new-tokens", "90000",
        "--checkpoint-s", "0.3"]


def test_ctrl_c_leaves_partial_profile(tmp_path: Path):
    proc = subprocess.Popen([sys.executable, "-m", "cpuprof", *LONG, "--out", str(tmp_path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(lambda: (tmp_path / "profile.json").exists())  # decoding has started
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    assert "decoding was interrupted; the profile measured so far" in err
    profile = Profile.load(tmp_path)
    assert not profile.status["complete"] and "interrupted by SIGINT" in profile.status["reason"]
    assert profile.workload["steps_done"] > 0
    assert any(op.name == "aten::mm" for op in profile.ops)
    assert "PARTIAL" in out


def test_killed_child_keeps_last_checkpoint(tmp_path: Path):
    proc = subprocess.Popen([sys.executable, "-m", "cpuprof", *LONG, "--out", str(tmp_path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(lambda: (tmp_path / "profile.json").exists())
    pid = child_pid(proc.pid)
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1
    line = one_line_error(subprocess.CompletedProcess([], 1, out, err))
    assert "killed by SIGKILL" in line and "the profile measured so far" in line
    profile = Profile.load(tmp_path)
    assert not profile.status["complete"] and "checkpoint" in profile.status["reason"]
    assert profile.workload["steps_done"] > 0


def test_report_of_truncated_or_foreign_file(tmp_path: Path):
    (tmp_path / "profile.json").write_text('{"format": "cpuprof-profile", "version": 1, "meta": {')
    result = cpuprof("report", str(tmp_path))
    assert result.returncode == 2
    assert "not valid JSON" in one_line_error(result)
    (tmp_path / "profile.json").write_text('{"traceEvents": []}')
    result = cpuprof("report", str(tmp_path / "profile.json"))
    assert result.returncode == 2 and "not a cpuprof profile" in one_line_error(result)


def test_doctor(tmp_path: Path):
    text = cpuprof("doctor")
    assert text.returncode == 0, text.stderr
    for words in ("CPU ", "NUMA", "perf_event_paranoid", "PMU", "OpenMP", "py-spy", "task-clock"):
        assert words in text.stdout
    data = json.loads(cpuprof("doctor", "--json").stdout)
    status = {e["name"]: e for e in data["events"]}
    assert status["task-clock"]["ok"]
    if not data["hardware_pmu"]:
        assert not status["cycles"]["ok"] and "PMU" in status["cycles"]["reason"]


def test_unknown_command_and_option():
    result = cpuprof("decod")
    assert result.returncode == 2 and "invalid choice" in one_line_error(result)
    result = cpuprof("decode", "--thread", "2", "--presetx")
    assert result.returncode == 2
    one_line_error(result)
