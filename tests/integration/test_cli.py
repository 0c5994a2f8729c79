"""The CLI end to end: real child processes, real pinning read back from /proc, real signals."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_runs import cpuprof, interrupt_once_started
from cli_runs import one_line_error as _one_line_error

from cpuprof.machine.topology import read_topology
from cpuprof.model import Profile
from cpuprof.workload.presets import PRESETS


def one_line_error(result: subprocess.CompletedProcess) -> str:
    """The one error line; anything else on stderr is cpuprof's own progress or warning lines."""
    return _one_line_error(result, only_cpuprof_lines=True)


TOPOLOGY = read_topology()
CPUS = TOPOLOGY.online_cpus
TINY = ["--preset", "tiny", "--prompt-len", "8", "--new-tokens", "12", "--warmup", "2"]


def test_decode_tiny_end_to_end(tmp_path: Path):
    threads = min(2, len(CPUS))
    result = cpuprof("decode", *TINY, "--threads", str(threads), "--numa", "0", "--out", str(tmp_path), "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)  # the report's tables as data; the location goes to stderr
    assert report["format"] == "cpuprof-report"
    assert f"profile saved in {tmp_path}" in result.stderr
    profile = Profile.load(tmp_path)
    assert profile.status.complete
    # the command the user typed, not the internal child's, in the meta and the HTML page's header
    command = ["python", "-m", "cpuprof", "decode", *TINY, "--threads", str(threads), "--numa", "0", "--out",
               str(tmp_path), "--json"]
    assert profile.meta.command == command
    html = cpuprof("report", str(tmp_path), "--format", "html")
    assert html.returncode == 0 and f"command: {shlex.join(command)}" in html.stdout.replace("&#x27;", "'")
    node0 = set(TOPOLOGY.node(0).cpus)
    in_force = profile.settings.in_force
    # pinning read back from /proc inside the child: every thread inside node 0's CPUs
    assert all(set(t.affinity) <= node0 for t in in_force.threads)
    assert in_force.mempolicy.mode == "bind" and in_force.mempolicy.nodes == [0]
    # the roofs judged against are node 0's, under the decode's threads; a cached one was probed before use
    roofs = profile.roofs
    assert roofs is not None and set(roofs.cpus) <= node0 and roofs.threads == threads and roofs.memory_gb_per_s()
    assert not roofs.from_cache or (roofs.probe is not None and roofs.probe.outcome in ("agrees", "remeasured"))
    assert in_force.torch.num_threads == threads
    assert profile.settings.warnings == []
    # tokens/s agrees with the wall time of the decode loop
    wl = profile.workload
    measured = wl.new_tokens - wl.warmup_steps
    assert wl.figures.tokens_per_s == pytest.approx(wl.batch * measured / wl.decode_wall_s, rel=0.10)
    assert len(wl.step_latencies_s) == wl.new_tokens
    # ops were profiled across the team, and the saved profile re-renders in every format
    assert any(op.name == "aten::mm" for op in profile.ops)
    # every sampled profile keeps its newest samples one by one (bounded): the threads-over-time chart's
    assert profile.stacks.timeline is not None and len(profile.stacks.timeline) > 0
    assert "this profile kept no sample timeline" not in html.stdout
    ops = next(s for s in report["sections"] if s["id"] == "ops")["tables"][0]["rows"]
    assert any(row["op"] == "aten::mm" for row in ops)
    for fmt, words in (("terminal", "Top ops"), ("markdown", "## Top ops"), ("json", '"cpuprof-report"')):
        again = cpuprof("report", str(tmp_path), "--format", fmt)
        assert again.returncode == 0 and words in again.stdout and "tokens/s" in again.stdout


def test_decode_pinned_to_one_cpu_reads_back_that_cpu(tmp_path: Path):
    cpu = CPUS[-1]
    result = cpuprof("decode", *TINY, "--cpus", str(cpu), "--threads", "1", "--no-profile", "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr
    profile = Profile.load(tmp_path)
    threads = profile.settings.in_force.threads
    assert threads and all(t.affinity == [cpu] and t.last_cpu == cpu for t in threads)
    assert not profile.profiled
    assert profile.roofs is None and "roofs" not in result.stderr  # shown nowhere, so neither measured nor probed
    assert "not profiled (--no-profile)" in result.stdout
    assert f"results (not profiled) saved in {tmp_path}" in result.stdout


def test_decode_with_intel_openmp(tmp_path: Path):
    result = cpuprof("decode", *TINY, "--omp", "intel", "--out", str(tmp_path))
    if result.returncode == 2 and "intel-openmp" in result.stderr:
        pytest.skip("intel-openmp is not installed in this environment")
    assert result.returncode == 0, result.stderr
    active = Profile.load(tmp_path).settings.in_force.openmp.active
    assert active.runtime == "libiomp5" and active.ompt


@pytest.mark.parametrize("args, words", [
    (["--numa", "7"], "--numa 7: this machine has NUMA node(s) 0"),
    (["--threads", "0"], "--threads 0: expected a positive whole number"),
    (["--threads", "abc"], "--threads abc: expected a positive whole number"),
    (["--threads", str(len(CPUS) + 1)], "pass --oversubscribe to allow it"),
    (["--cpus", str(max(CPUS) + 5)], "not on this machine (online CPUs:"),
    # Enumerations are argparse choices (from the options spec): refused before anything starts.
    (["--preset", "nope"], "argument --preset: invalid choice: 'nope'"),
    (["--hf", "/nonexistent/model"], "--hf /nonexistent/model: not a readable directory"),
    (["--preset", "llama-3.1-8b", "--layers", "400"], "but only"),
    (["--bind", "sideways"], "argument --bind: invalid choice: 'sideways'"),
    (["--omp", "llvm"], "argument --omp: invalid choice: 'llvm'"),
    (["--allocator", "mimalloc"], "argument --allocator: invalid choice: 'mimalloc'"),
    (["--sampling", "nucleus"], "argument --sampling: invalid choice: 'nucleus'"),
    (["--dtype", "fp8"], "argument --dtype: invalid choice: 'fp8'"),
    (["--python-sampler", "austin"], "argument --python-sampler: invalid choice: 'austin'"),
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
    try:
        out, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:  # the interrupt was lost: what the child said is the clue
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(f"the decode went on after its SIGINT:\n{err[-4000:]}") from None
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    assert "decoding was interrupted; the profile measured so far" in err
    profile = Profile.load(tmp_path)
    assert not profile.status.complete and "interrupted by SIGINT" in profile.status.reason
    assert profile.workload.steps_done > 0 and profile.workload.figures is not None
    assert any(op.name == "aten::mm" for op in profile.ops)
    assert "PARTIAL" in out
    # The bytes a token read, over the steps it measured, as a whole decode counts them (known answer
    # from the preset's shape): its throughput and its ceiling then agree that steps were measured.
    wl = profile.workload
    contexts = range(wl.prompt_len + wl.warmup_steps + 1, wl.prompt_len + wl.steps_done + 1)
    tiny = PRESETS["tiny"]
    assert wl.bytes_read_per_token == sum(tiny.bytes_read_per_token(2, c, 1, 1) for c in contexts) // len(contexts)
    assert "no decode step was measured" not in out


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
    assert not (tmp_path / "crash.txt").exists()  # nothing could record a SIGKILL
    profile = Profile.load(tmp_path)
    assert not profile.status.complete and "checkpoint" in profile.status.reason
    assert profile.workload.steps_done > 0


def test_crashed_child_leaves_its_threads_stacks(tmp_path: Path):
    """A native crash (SIGSEGV) is a bug: the error points at the threads' stacks at that moment."""
    proc = subprocess.Popen([sys.executable, "-m", "cpuprof", *LONG, "--out", str(tmp_path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(lambda: (tmp_path / "profile.json").exists())
    pid = child_pid(proc.pid)
    assert pid is not None
    os.kill(pid, signal.SIGSEGV)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1
    line = one_line_error(subprocess.CompletedProcess([], 1, out, err))
    assert "killed by SIGSEGV" in line and f"stacks at the crash are in {tmp_path / 'crash.txt'}" in line
    crash = (tmp_path / "crash.txt").read_text()
    assert "Segmentation fault" in crash and "decode_loop.py" in crash, crash


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
    assert "for OpenMP thread statistics" not in text.stdout  # no report shows them yet
    data = json.loads(cpuprof("doctor", "--json").stdout)
    status = {e["name"]: e for e in data["events"]}
    assert status["task-clock"]["ok"]
    if not data["hardware_pmu"]:
        assert not status["cycles"]["ok"] and "PMU" in status["cycles"]["reason"]
    # doctor and --omp intel use the same search for libiomp5
    if data["intel_openmp"]:
        assert "not installed" not in text.stdout


def test_unknown_command_and_option():
    result = cpuprof("decod")
    assert result.returncode == 2 and "invalid choice" in one_line_error(result)
    result = cpuprof("decode", "--thread", "2", "--presetx")
    assert result.returncode == 2
    one_line_error(result)


@pytest.mark.parametrize("make, words", [
    (lambda d: d / "file", "exists and is not a directory"),
    (lambda d: d / "file" / "sub", "is not a directory"),
    (lambda d: Path("/proc/cpuprof-out"), "cannot write there"),
])
def test_out_paths_are_checked_before_anything_runs(tmp_path: Path, make, words):
    (tmp_path / "file").write_text("x")
    out = make(tmp_path)
    result = cpuprof("decode", "--preset", "tiny", "--out", str(out))
    assert result.returncode == 2
    assert words in one_line_error(result) and f"--out {out}" in result.stderr


@pytest.mark.parametrize("args, words", [
    (["decode", "--top", "0"], "expected a positive whole number"),
    (["report", "x", "--top", "-1"], "expected a positive whole number"),
    (["report", "x", "--format", "xml"], "invalid choice: 'xml'"),
    (["decode", "--timeline", "-5"], "expected 0 or more"),
])
def test_bad_numbers_and_choices_are_usage_errors(args, words):
    result = cpuprof(*args)
    assert result.returncode == 2 and words in one_line_error(result)


def test_help_explains_every_option():
    text = cpuprof("decode", "--help").stdout
    for flag in ("--top-k", "--seed", "--mode", "--timeline", "--format"):
        block = text.split(flag, 1)[1].split("\n  --", 1)[0]
        assert len(block.strip()) > 10, flag
    assert "sampler thread" not in text


def test_progress_reaches_logs_when_not_a_terminal(tmp_path: Path):
    """stderr is a pipe here, as in CI: the run says what it is doing, in whole lines."""
    result = cpuprof("decode", *TINY, "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("cpuprof: ")]
    assert any(line.startswith("cpuprof: built tiny") for line in lines)
    assert any("decoding: step" in line for line in lines)
    assert any("tokens/s after" in line for line in lines)
    assert "\r" not in result.stderr
    assert not (tmp_path / "crash.txt").exists()  # kept only when the child crashed


def _busy_competitor(cpu: int) -> subprocess.Popen:
    code = (f"import os, time\nos.sched_setaffinity(0, {{{cpu}}})\n"
            "end = time.time() + 60\nwhile time.time() < end: pass\n")
    return subprocess.Popen([sys.executable, "-c", code])


RUN_QUEUE = ["decode", "--preset", "tiny", "--max-seq", "1024", "--prompt-len", "8", "--new-tokens", "600",
             "--warmup", "2",
             "--threads", "1", "--format", "json"]


def _warnings(result: subprocess.CompletedProcess) -> list[str]:
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)["warnings"]


def test_run_queue_delay_is_warned_about_only_when_a_cpu_is_shared(tmp_path: Path):
    cpu = CPUS[-1]
    # Alone on its CPU, the thread waits only for whatever else this shared machine runs there now
    # and then: one quiet run of three is enough to show the warning is not given without cause.
    for attempt in range(3):
        quiet = _warnings(cpuprof(*RUN_QUEUE, "--cpus", str(cpu), "--out", str(tmp_path / f"quiet-{attempt}")))
        if not any("waited for a CPU" in w for w in quiet):
            break
    else:
        raise AssertionError(f"a CPU of its own, yet 'waited for a CPU' in each of 3 runs: {quiet}")
    competitor = _busy_competitor(cpu)
    try:
        time.sleep(0.2)
        shared = _warnings(cpuprof(*RUN_QUEUE, "--cpus", str(cpu), "--out", str(tmp_path / "shared")))
    finally:
        competitor.kill()
        competitor.wait()
    waiting = [w for w in shared if "waited for a CPU" in w]
    assert waiting, shared
    profile = Profile.load(tmp_path / "shared")
    dispatch = next(t for t in profile.threads if t.role == "dispatch")
    # Two busy tasks on one CPU: the decode thread waits for about half of the time.
    assert dispatch.run_delay_ns > 0.2 * profile.collection.wall_ns


@pytest.mark.parametrize("limit", [12, 16, 32])
def test_decode_under_a_low_descriptor_limit_names_what_was_not_counted(tmp_path: Path, limit: int):
    import re
    import resource

    def low_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))

    result = subprocess.run([sys.executable, "-m", "cpuprof", "decode", *TINY, "--threads", "2",
                             "--out", str(tmp_path)], capture_output=True, text=True, timeout=300,
                            preexec_fn=low_limit)
    assert result.returncode == 0, result.stderr
    assert "Too many open files" not in result.stderr + result.stdout
    profile = Profile.load(tmp_path)
    assert profile.workload.steps_done == profile.workload.new_tokens
    names_the_limit = re.compile(rf"ulimit -n (is )?{limit}\b")
    # every thread is either counted in full, or named with the reason
    for t in profile.threads:
        assert not t.uncounted or (t.counting_error and "ulimit -n" in t.counting_error), t
    uncounted = [t for t in profile.idle_threads if t.uncounted]
    for t in uncounted:
        assert names_the_limit.search(t.uncounted), t
    if uncounted or any(t.uncounted for t in profile.threads):
        assert "could not be counted" in result.stdout or "not counted on some threads" in result.stdout
    if limit == 16:  # the worker needs descriptors the reserve keeps for the program
        assert uncounted or any(t.uncounted for t in profile.threads)
    if limit == 12:  # not even task-clock: no thread's CPU time says whether it worked
        assert not profile.has_event("task-clock")
        assert profile.idle_threads and uncounted == profile.idle_threads
        assert "did no work" not in result.stdout, result.stdout
        assert "their CPU time not counted" in result.stdout


def test_ctrl_c_while_the_child_is_still_starting_is_an_interrupt(tmp_path: Path):
    """The child has no handler of its own yet (Python itself is starting): it dies of the
    KeyboardInterrupt with status 1, or of the signal. The launcher passed the signal on, so the
    run was interrupted, whatever the status says."""
    out = tmp_path / "early"
    ended = interrupt_once_started(["decode", *TINY, "--out", str(out)], out / "launch.json")
    assert ended.returncode == 130, ended.stderr
    errors = [line for line in ended.stderr.splitlines() if line.startswith("cpuprof: error: ")]
    assert len(errors) == 1 and errors[0].startswith("cpuprof: error: decoding was interrupted"), ended.stderr
