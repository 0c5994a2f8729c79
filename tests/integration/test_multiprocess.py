"""`decode --tp N` and `--instances N` for real: ranks in their own pinned processes meeting through
torch.distributed (gloo on localhost), every rank profiled, one merged report; a rank killed or
hung ends the run with every rank's profile saved."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from cli_runs import cpuprof, one_line_error

from cpuprof.model import Profile
from cpuprof.model.ranks import MultiRun

TINY = ["--preset", "tiny", "--prompt-len", "8", "--warmup", "2", "--roofs", "off"]
TINY_LAYERS = 2
# Long enough that a signal sent once decoding has started always finds it running.
LONG = ["--new-tokens", "90000", "--max-seq", "100000", "--checkpoint-s", "0.3"]  # never ends by itself
TWO_CPUS = len(os.sched_getaffinity(0)) >= 2
needs_two_cpus = pytest.mark.skipif(not TWO_CPUS, reason="two ranks of one thread each need two usable CPUs")


def rank_profiles(out: Path) -> list[Profile]:
    run = MultiRun.load(out)
    return [Profile.load(out / r.dir) for r in run.ranks]


@needs_two_cpus
def test_tensor_parallel_ranks_all_reduce_per_layer_and_decode_the_single_process_tokens(tmp_path: Path):
    steps = 8
    out = tmp_path / "tp"
    result = cpuprof("decode", *TINY, "--dtype", "fp32", "--new-tokens", str(steps), "--tp", "2", "--threads", "1",
                     "--out", str(out), "--format", "json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    single = tmp_path / "single"
    alone = cpuprof("decode", *TINY, "--dtype", "fp32", "--new-tokens", str(steps), "--threads", "1", "--no-profile",
                    "--out", str(single))
    assert alone.returncode == 0, alone.stderr
    expected_tokens = Profile.load(single).workload.output_ids

    profiles = rank_profiles(out)
    assert len(profiles) == 2
    forwards = 1 + steps  # the prefill, then one forward per decode step
    cpus = []
    for rank, p in enumerate(profiles):
        wl = p.workload
        assert wl.rank.mode == "tp" and wl.rank.rank == rank and wl.rank.world_size == 2
        # every layer all-reduces after attention and after the MLP: seen by the op hook and by the model
        # (one entry per region the op ran in: attention, mlp, the prefill's)
        calls = sum(o.calls for o in p.ops if o.kind == "op" and o.name == "c10d::allreduce_")
        assert calls == 2 * TINY_LAYERS * forwards
        assert len(wl.collectives.enter_ns) == 2 * TINY_LAYERS * forwards
        assert sorted(set(wl.collectives.step)) == list(range(-1, steps))
        # fp32 [1, 1, 64] partial sums in a decode step; the prefill reduces all 8 prompt positions
        decode_payloads = {b for b, s in zip(wl.collectives.payload_bytes, wl.collectives.step, strict=True) if s >= 0}
        assert decode_payloads == {64 * 4}
        assert wl.output_ids == expected_tokens, (rank, wl.output_ids, expected_tokens)
        cpus.append(set(wl.rank.cpus))
        for t in p.settings.in_force.threads:  # pinned where it was placed
            assert set(t.affinity) <= set(wl.rank.cpus), (t, wl.rank.cpus)
    assert cpus[0].isdisjoint(cpus[1])

    split = next(s for s in report["sections"] if s["id"] == "collectives")["tables"][0]["rows"]
    assert [row["rank"] for row in split] == [0, 1]
    for row in split:
        assert row["calls"] == pytest.approx(2 * TINY_LAYERS)
        assert row["compute_ns"] + row["transfer_ns"] + row["wait_ns"] == pytest.approx(row["step_ns"], rel=1e-6)
        assert 0 <= row["wait_ns"] <= row["step_ns"]
        assert row["op_calls"] == 2 * TINY_LAYERS * forwards
        assert 0 < row["backend_cpu"] < 1  # gloo's own threads (gloo_tcp_loop, pt_gloo_runloop) did the transfers
        assert 0 <= row["main_wait"] < 1
    ranks = next(s for s in report["sections"] if s["id"] == "ranks")["tables"][0]["rows"]
    assert [r["status"] for r in ranks] == ["ok", "ok"]

    # re-rendered from disk, and a trace with one process per rank
    again = cpuprof("report", str(out))
    assert again.returncode == 0 and "waiting for the slowest rank" in again.stdout, again.stderr
    trace_file = tmp_path / "trace.json"
    traced = cpuprof("trace", str(out), "-o", str(trace_file))
    assert traced.returncode == 0, traced.stderr
    events = json.loads(trace_file.read_text())["traceEvents"]
    names = {e["args"]["name"] for e in events if e.get("name") == "process_name"}
    assert names == {f"rank {r} (pid {p.meta.pid})" for r, p in enumerate(profiles)}
    slices = [e for e in events if e.get("cat") == "collective"]
    assert len(slices) == 2 * 2 * TINY_LAYERS * forwards


@needs_two_cpus
def test_sampled_tokens_of_two_ranks_equal_one_process(tmp_path: Path):
    """Top-k sampling draws from the whole distribution, so any difference in the logits would show
    (greedy on a random tiny model tends to repeat one token); fp32 sums agree across the split."""
    args = [*TINY, "--dtype", "fp32", "--new-tokens", "24", "--sampling", "topk", "--threads", "1", "--no-profile"]
    tp = cpuprof("decode", *args, "--tp", "2", "--out", str(tmp_path / "tp"))
    one = cpuprof("decode", *args, "--out", str(tmp_path / "one"))
    assert tp.returncode == 0 and one.returncode == 0, tp.stderr + one.stderr
    expected = Profile.load(tmp_path / "one").workload.output_ids
    assert len(set(expected[0])) > 5  # a sequence that can tell two models apart
    for p in rank_profiles(tmp_path / "tp"):
        assert p.workload.output_ids == expected


@needs_two_cpus
def test_instances_decode_side_by_side_and_their_throughput_adds_up(tmp_path: Path):
    out = tmp_path / "inst"
    result = cpuprof("decode", *TINY, "--new-tokens", "12", "--instances", "2", "--threads", "1",
                     "--out", str(out), "--format", "json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    profiles = rank_profiles(out)
    rates = [p.workload.figures.tokens_per_s for p in profiles]
    lines = next(s for s in report["sections"] if s["id"] == "ranks")["lines"]
    assert f"Aggregate throughput {sum(rates):.2f} tokens/s" in lines[0]
    assert profiles[0].workload.output_ids == profiles[1].workload.output_ids  # same seed, same model
    assert all(p.workload.collectives is None and p.workload.rank.mode == "instances" for p in profiles)
    assert set(profiles[0].workload.rank.cpus).isdisjoint(profiles[1].workload.rank.cpus)
    assert not any(s["id"] == "collectives" for s in report["sections"])
    assert "[instance 0 of 2]" in result.stderr and "[rank 0" not in result.stderr  # its progress, relayed


def _wait_for_decoding(out: Path, rank: int, deadline_s: float = 120) -> int:
    """The rank's pid, once its first checkpoint shows it decoding."""
    deadline = time.monotonic() + deadline_s
    path = out / f"rank-{rank}" / "profile.json"
    while time.monotonic() < deadline:
        if path.is_file():
            try:
                p = Profile.load(path)
            except Exception:
                p = None  # caught between write and rename
            if p is not None and p.workload is not None and p.workload.steps_done > 0:
                return p.meta.pid
        time.sleep(0.2)
    raise AssertionError(f"rank {rank} never checkpointed a decode step")


def _long_decode(out: Path, args: list[str],
                 meddle: Callable[[subprocess.Popen], None]) -> subprocess.CompletedProcess:
    """A long tiny decode of two processes (one thread each) in the background; ``meddle`` does
    something to it (or to the launcher, its argument) while it runs; returns how it ended."""
    parent = subprocess.Popen([sys.executable, "-m", "cpuprof", "decode", *TINY, *LONG, *args, "--threads", "1",
                               "--out", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        meddle(parent)
        stdout, stderr = parent.communicate(timeout=120)
    finally:
        if parent.poll() is None:
            parent.kill()
    return subprocess.CompletedProcess(parent.args, parent.returncode, stdout, stderr)


@needs_two_cpus
def test_a_killed_rank_ends_the_run_with_every_rank_profile_saved(tmp_path: Path):
    out = tmp_path / "killed"

    def kill_rank_1(_launcher: subprocess.Popen) -> None:
        os.kill(_wait_for_decoding(out, 1), signal.SIGKILL)

    ended = _long_decode(out, ["--tp", "2", "--rank-timeout", "20"], kill_rank_1)
    assert ended.returncode != 0
    stdout = ended.stdout
    error = one_line_error(ended)
    assert "rank 1 was killed by SIGKILL" in error, error
    run = MultiRun.load(out)
    assert run.finished and run.ranks[1].returncode == -signal.SIGKILL
    assert run.ranks[0].returncode not in (0, None)  # its peer vanished mid all-reduce
    for p in rank_profiles(out):
        assert not p.status.complete and p.workload.steps_done > 0  # what each measured is kept
    assert "PARTIAL" in stdout  # the merged report still comes, marked


@needs_two_cpus
def test_ctrl_c_reaches_every_rank_and_each_saves_its_profile(tmp_path: Path):
    out = tmp_path / "interrupted"

    def interrupt_the_launcher(parent: subprocess.Popen) -> None:
        _wait_for_decoding(out, 0)
        _wait_for_decoding(out, 1)
        parent.send_signal(signal.SIGINT)  # to the launcher alone: it passes the signal on

    ended = _long_decode(out, ["--instances", "2"], interrupt_the_launcher)
    assert ended.returncode == 130
    error = one_line_error(ended)
    # independent instances, not ranks of a group: said as such
    assert "instance 0 was interrupted" in error or "instance 1 was interrupted" in error, error
    for p in rank_profiles(out):
        assert not p.status.complete and "interrupted by SIGINT" in p.status.reason
        assert 0 < p.workload.steps_done < 90000


@needs_two_cpus
def test_a_hung_rank_is_stopped_after_the_timeout(tmp_path: Path):
    out = tmp_path / "hung"
    stopped: list[int] = []

    def stop_rank_1(_launcher: subprocess.Popen) -> None:
        stopped.append(_wait_for_decoding(out, 1))
        os.kill(stopped[0], signal.SIGSTOP)  # alive, holding its peer in an all-reduce, never answering

    try:
        # The all-reduces' timeout: long enough that rank 1's first checkpoint (symbol tables loaded
        # while rank 0 waits in an all-reduce) cannot exceed it on a loaded machine.
        ended = _long_decode(out, ["--tp", "2", "--rank-timeout", "10"], stop_rank_1)
    finally:
        for pid in stopped:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
    error = one_line_error(ended)
    assert error.startswith("cpuprof: error: rank 0: "), error  # the rank that waited in vain fails first
    run = MultiRun.load(out)
    assert run.finished and run.ranks[0].returncode == 1
    assert run.ranks[1].returncode == -signal.SIGKILL  # stopped: it could not even take the interrupt
    profile0 = Profile.load(out / "rank-0")
    assert not profile0.status.complete and "failed" in (profile0.status.reason or "")


@pytest.mark.parametrize("args, message", [
    (["--tp", "3"], "--tp 3: tiny's heads (4) do not divide into 3 equal parts"),
    (["--tp", "2", "--instances", "2"], "--tp and --instances: choose one"),
    (["--tp", "2", "--compile"], "--tp runs the model eagerly"),
    (["--tp", "2", "--backend", "mpi"], "argument --backend: invalid choice: 'mpi'"),
    (["--instances", "64"], "64 ranks on node"),
    (["--ranks-per-node", "2"], "--ranks-per-node places the processes of --tp N or --instances N"),
    (["--tp", "0"], "--tp: expected a positive whole number"),
])
def test_bad_multiprocess_input_gets_one_line(args: list[str], message: str, tmp_path: Path):
    result = cpuprof("decode", *TINY, "--new-tokens", "4", *args, "--out", str(tmp_path / "x"), timeout=120)
    assert result.returncode != 0
    assert message in one_line_error(result)


ALL_REDUCE_SCRIPT = """
import sys
import torch
import torch.distributed as dist

dist.init_process_group("gloo")  # env://: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT from the launcher
rank, world = dist.get_rank(), dist.get_world_size()
t = torch.zeros(1024)
for _ in range(int(sys.argv[1])):
    t.fill_(rank + 1)
    dist.all_reduce(t)
assert t[0].item() == world * (world + 1) / 2
if len(sys.argv) > 2 and rank == int(sys.argv[2]):
    sys.exit(3)
print(f"rank {rank} of {world} done")
dist.destroy_process_group()
"""


@needs_two_cpus
def test_run_nproc_starts_a_torchrun_style_group_and_profiles_every_process(tmp_path: Path):
    script = tmp_path / "allreduce.py"
    script.write_text(ALL_REDUCE_SCRIPT)
    out = tmp_path / "np"
    result = cpuprof("run", "--nproc", "2", "--threads", "1", "--out", str(out), "--format", "json", "--",
                     "python", str(script), "30")
    assert result.returncode == 0, result.stderr
    # rank 0's own output, relayed: on stderr, marked, where stdout holds a data format ...
    assert "[rank 0 of 2] rank 0 of 2 done" in result.stderr
    assert "rank 1 of 2 done" in (out / "rank-1" / "child.log").read_text()
    rows = next(s for s in json.loads(result.stdout)["sections"] if s["id"] == "ranks")["tables"][0]["rows"]
    assert [r["op_calls"] for r in rows] == [30, 30]
    assert [r["op_bytes"] for r in rows] == [30 * 1024 * 4] * 2
    for r in rows:
        assert 0 < r["busy"] <= 1.0 + 1e-9  # one torch thread each, gloo's own thread mostly waiting
    cpus = [set(Profile.load(out / f"rank-{k}").settings.requested.cpus) for k in range(2)]
    assert cpus[0].isdisjoint(cpus[1])
    # ... and on stdout as the program printed it, beside a report for a person
    again = cpuprof("run", "--nproc", "2", "--threads", "1", "--out", str(tmp_path / "np2"), "--", "python",
                    str(script), "3")
    assert again.returncode == 0, again.stderr
    assert "rank 0 of 2 done\n" in again.stdout and "rank 0 of 2 done" not in again.stderr


@needs_two_cpus
def test_run_nproc_reports_the_process_that_failed_with_its_status(tmp_path: Path):
    script = tmp_path / "allreduce.py"
    script.write_text(ALL_REDUCE_SCRIPT)
    out = tmp_path / "np"
    result = cpuprof("run", "--nproc", "2", "--threads", "1", "--out", str(out), "--", "python", str(script), "5", "1")
    assert result.returncode == 3
    error = one_line_error(result)
    assert "rank 1 failed with exit code 3" in error, error
    assert MultiRun.load(out).ranks[0].returncode == 0
    assert (out / "rank-1" / "profile.json").is_file()
