"""The ranks of a torch.distributed job cpuprof run followed, set side by side at their collectives:
a real gloo job of two ranks over loopback, started with mp.spawn (the rank passed as an argument,
as vLLM's workers get theirs, not in RANK).

Known answer: rank 1 sleeps before each all-reduce, and measures how long it really slept; rank 0
enters each all-reduce that much earlier, so its waits at them sum to rank 1's measured sleep (the
program prints it). The report names rank 1 the straggler; the trace has a process per rank.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

from cli_runs import cpuprof
from gloo_jobs import LATE_RANK_STEPS, STEPS, free_port, slept_ms

from cpuprof.analysis.processes import row
from cpuprof.analysis.rank_groups import jobs
from cpuprof.model.run_layout import load_processes

JOB = LATE_RANK_STEPS + """
import sys

import torch.multiprocessing as mp


def worker(rank, port):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    late_rank_steps(rank)


if __name__ == "__main__":
    mp.spawn(worker, args=(int(sys.argv[1]),), nprocs=2)
"""


def test_a_late_rank_is_named_and_the_others_wait_for_it_as_long_as_it_was_late(tmp_path: Path):
    program = tmp_path / "job.py"
    program.write_text(textwrap.dedent(JOB))
    out = tmp_path / "out"
    port = free_port()
    result = cpuprof("run", "--out", str(out), "--", "python", str(program), str(port), timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    slept = slept_ms(result.stdout)

    rows = [row(p) for p in load_processes(out)]
    ranks = [r.rank for r in rows if r.rank is not None]
    assert sorted(t.rank for t in ranks) == [0, 1]
    assert {(t.world_size, t.backend, t.store) for t in ranks} == {(2, "gloo", f"tcp 127.0.0.1:{port}")}
    (job,) = jobs(ranks)
    assert job.kinds["gloo:all_reduce"] == STEPS and not job.problems, job
    first, late = job.ranks
    # Rank 0's waits: every all-reduce (and the barrier after them, which both reach together).
    assert abs(first.wait_ns / 1e6 - slept) <= 0.15 * slept, (first, slept)
    assert late.wait_ns < 0.1 * first.wait_ns, late
    assert late.arrived_last >= STEPS - 1 and first.arrived_last <= 1
    # What the others waited at the calls rank 1 entered last: nearly all of rank 0's waiting.
    assert 0.9 * first.wait_ns <= late.made_wait_ns <= first.wait_ns + late.wait_ns

    report = " ".join(result.stdout.split())
    assert "Ranks: the processes of one torch.distributed job" in report
    assert f"Straggler: rank 1 (SpawnProcess-2, pid {late.timeline.pid})" in report

    trace = tmp_path / "trace.json"
    traced = cpuprof("trace", str(out), "-o", str(trace))
    assert traced.returncode == 0, traced.stderr
    events = json.loads(trace.read_text())["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e.get("name") == "process_name"}
    assert names == {1: f"rank 0 (pid {first.timeline.pid})", 2: f"rank 1 (pid {late.timeline.pid})"}
    for pid in (1, 2):
        spans = [e for e in events
                 if e["pid"] == pid and e.get("cat") != "samples" and e.get("name") == "gloo:all_reduce"]
        assert len(spans) == STEPS
