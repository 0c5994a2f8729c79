"""A window on every rank of a running torch.distributed job at once, asked through the job's own
store (``cpuprof signal tcp://HOST:PORT start|stop``), the ranks under a ``cpuprof run --on-demand``
launcher: torchrun's two ranks over loopback, one launcher (one host; each host's launcher does the
same with its own ranks, and their window-N directories merge like runs).

Known answers: both ranks say they opened and closed window 1 (the store counts their answers);
each saves it in the launcher's window-1/processes/PID, with its rank; the ranks' windows open a
call or a few apart, and their all-reduces are matched by time, one for one (neither rank is late,
so each waits little at each: matched a call off, it would wait half a step); the window holds fewer
steps than the job ran (it was opened after the job started and closed before it ended).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from cli_runs import cpuprof
from gloo_jobs import free_port

from cpuprof.analysis.processes import row
from cpuprof.analysis.rank_groups import jobs
from cpuprof.launch.job_windows import LISTENING_KEY, connect
from cpuprof.model.run_layout import load_processes, window_dir

JOB = """
import os
import sys
import time

import torch
import torch.distributed as dist

ready, stop = sys.argv[1], sys.argv[2]
dist.init_process_group("gloo")
rank = dist.get_rank()
t = torch.ones(256)
steps = 0
while True:
    time.sleep(0.02)
    flag = torch.tensor([1.0 if os.path.exists(stop) else 0.0])
    dist.all_reduce(flag)  # every rank leaves the loop at the same step
    if flag.item() > 0:
        break
    dist.all_reduce(t)
    steps += 1
    if steps == 5 and rank == 0:
        open(ready, "w").close()
if rank == 0:
    print(f"steps {steps}", flush=True)
dist.destroy_process_group()
"""


def _wait_for(what: str, check, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def test_a_window_opened_through_the_jobs_store_is_taken_by_every_rank(tmp_path: Path):
    program = tmp_path / "job.py"
    program.write_text(textwrap.dedent(JOB))
    ready, stop, out = tmp_path / "ready", tmp_path / "stop", tmp_path / "out"
    port = free_port()
    launcher = subprocess.Popen(
        [sys.executable, "-m", "cpuprof", "run", "--on-demand", "--out", str(out), "--", sys.executable, "-m",
         "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1", "--master-port", str(port),
         str(program), str(ready), str(stop)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for("the job's first steps", ready.exists)
        store = connect("127.0.0.1", port)
        _wait_for("both ranks polling the store", lambda: store.add(LISTENING_KEY, 0) >= 2)
        address = f"tcp://127.0.0.1:{port}"
        started = cpuprof("signal", address, "start")
        assert started.returncode == 0, started.stderr
        assert "window 1 asked of every rank" in started.stdout and "2 of 2 opened it" in started.stdout
        time.sleep(1.0)
        stopped = cpuprof("signal", address, "stop")
        assert stopped.returncode == 0, stopped.stderr
        assert "2 of 2 closed and saved it" in stopped.stdout
        stop.touch()
        stdout, stderr = launcher.communicate(timeout=300)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.communicate()
    assert launcher.returncode == 0, stderr[-3000:]
    steps = int(stdout.split("steps ")[1].split()[0])

    window = window_dir(out, 1)
    rows = [row(p) for p in load_processes(window)]
    ranks = [r.rank for r in rows if r.rank is not None]
    assert sorted(t.rank for t in ranks) == [0, 1], [r.role for r in rows]
    (job,) = jobs(ranks)
    calls = [len(f.timeline.calls["gloo:all_reduce"][0]) for f in job.ranks]
    # Each rank opened and closed its window within a poll (0.1 s, a few steps) of the other: the
    # calls both windows hold are matched by their times, one for one.
    matched = job.kinds["gloo:all_reduce"]
    assert min(calls) - 12 <= matched <= min(calls), (calls, job.problems)
    # Neither rank is late by design: matched right, each waits at most a few hundred µs a call; a
    # call off, it would wait half a step (10 ms and more) at each.
    assert all(f.wait_ns / f.matched < 2_000_000 for f in job.ranks), job.ranks
    # Two all-reduces a step (the flag, the tensor): the window saw some steps, not all.
    assert 2 <= max(calls) < 2 * steps, (calls, steps)
    assert not (window_dir(out, 2)).exists()

    # Bad input: one line each, no traceback.
    for target, said in ((f"tcp://127.0.0.1:{free_port()}", "cannot reach the job's store"),
                         ("tcp://nohost", "expected the launcher's pid, or a job's store"),
                         ("abc", "expected the launcher's pid, or a job's store")):
        bad = cpuprof("signal", target, "start")
        assert bad.returncode == 2 and said in bad.stderr and "Traceback" not in bad.stderr, bad.stderr
        assert bad.stderr.strip().count("\n") == 0, bad.stderr
    assert os.path.isdir(out)
