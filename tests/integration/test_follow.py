"""``cpuprof run`` follows the Python processes its program starts (multiprocessing with each start
method, subprocess children) into DIR/processes/PID, keeps a killed worker's profile, and leaves no
process behind. Known answers: the workers' ATen op calls, counted exactly, add up to what the
program ran."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from tests.cli_runs import cpuprof, one_line_error

from cpuprof.launch.followed_run import followed_alive
from cpuprof.model import Profile, format_cpulist
from cpuprof.model.run_layout import load_processes

MM_PER_TASK = 25
TASKS = 4

POOL_PROGRAM = f"""
import multiprocessing as mp
import sys


def work(n):
    import torch

    a, b = torch.ones(16, 32), torch.ones(32, 8)
    for _ in range(n):
        torch.mm(a, b)
    return n


if __name__ == "__main__":
    method = sys.argv[1]
    if "torch-first" in sys.argv:  # the program's own process imports torch before its workers start
        import torch

        torch.mm(torch.ones(2, 2), torch.ones(2, 2))
    with mp.get_context(method).Pool(2) as pool:
        print("done", sum(pool.map(work, [{MM_PER_TASK}] * {TASKS})))
"""


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def _mm_calls(profile) -> int:
    return sum(op.calls for op in profile.ops if op.kind == "op" and op.name == "aten::mm")


def _followed(out: Path):
    return [p for p in load_processes(out) if p.followed]


@pytest.mark.parametrize("method, extra", [("spawn", []), ("forkserver", []), ("fork", []),
                                          ("fork", ["torch-first"])],
                         ids=["spawn", "forkserver", "fork", "fork-after-torch"])
def test_every_pool_worker_is_profiled_whatever_the_start_method(tmp_path: Path, method: str, extra: list[str]):
    program = _write(tmp_path, "pool.py", POOL_PROGRAM)
    out = tmp_path / "out"
    result = cpuprof("run", "--threads", "1", "--out", str(out), "--", "python", str(program), method, *extra,
                     timeout=300)
    assert result.returncode == 0, result.stderr
    assert f"done {MM_PER_TASK * TASKS}" in result.stdout
    followed = _followed(out)
    assert followed, result.stderr
    # Known answer: every mm the workers ran is in exactly one worker's profile.
    assert sum(_mm_calls(p.profile) for p in followed) == MM_PER_TASK * TASKS
    for p in followed:
        assert p.profile.meta.role is not None and "PoolWorker" in p.profile.meta.role
        assert p.directory == out / "processes" / str(p.profile.meta.pid)
        # The pool's own shutdown of its workers (SIGTERM from Pool.terminate) is their normal end.
        assert p.profile.status.complete, p.profile.status.reason
    assert "PARTIAL" not in result.stdout
    assert "Processes" in result.stdout and "PoolWorker" in result.stdout
    # The merged report re-renders from the directory, in a data format too.
    again = cpuprof("report", str(out), "--format", "json")
    assert again.returncode == 0, again.stderr
    sections = {s["id"]: s for s in json.loads(again.stdout)["sections"]}
    pids = {row["pid"] for row in sections["processes"]["tables"][0]["rows"]}
    assert {p.profile.meta.pid for p in followed} <= pids
    # What observing cost each process, as it measured it: a row per profiled process, its figures
    # the profile's own; a start-up in each (a process that started its own Python imported cpuprof
    # as it started: milliseconds), less than the worker's life.
    costs = {row["pid"]: row for row in sections["processes"]["tables"][1]["rows"]}
    for p in followed:
        cost, overhead = costs[p.profile.meta.pid], p.profile.overhead
        assert overhead is not None and cost["callbacks_ns"] == overhead.hook_ns  # 0 for a worker given no task
        assert cost["collector_cpu_ns"] == overhead.discovery_cpu_ns > 0
        assert 0 < cost["boot_ns"] < 10_000_000_000, cost
        if method != "fork":
            assert cost["boot_ns"] > 1_000_000, cost
        taken = overhead.hook_ns + overhead.checkpoint_ns + cost["boot_ns"]  # on the program's own threads
        assert cost["share"] == pytest.approx(taken / (p.profile.collection.wall_ns + cost["boot_ns"]))
        assert 0 < cost["share"] < 1, cost


def test_a_subprocess_python_child_is_followed_and_no_follow_turns_it_off(tmp_path: Path):
    child = _write(tmp_path, "child.py", """
        import torch

        for _ in range(7):
            torch.mm(torch.ones(4, 4), torch.ones(4, 4))
    """)
    program = _write(tmp_path, "parent.py", f"""
        import subprocess, sys

        subprocess.run([sys.executable, {str(child)!r}], check=True)
        import torch

        torch.mm(torch.ones(2, 2), torch.ones(2, 2))
    """)
    out = tmp_path / "out"
    result = cpuprof("run", "--out", str(out), "--", "python", str(program), timeout=300)
    assert result.returncode == 0, result.stderr
    (followed,) = _followed(out)
    assert _mm_calls(followed.profile) == 7
    assert followed.profile.meta.role == "python child.py"
    assert followed.profile.meta.ppid == next(p for p in load_processes(out) if not p.followed).profile.meta.pid

    out2 = tmp_path / "out2"
    result = cpuprof("run", "--no-follow", "--out", str(out2), "--", "python", str(program), timeout=300)
    assert result.returncode == 0, result.stderr
    assert not (out2 / "processes").exists()
    assert "Processes" not in result.stdout


# A worker that runs mm until it is stopped.
WORKER_FOREVER = """
import multiprocessing as mp
import os
import signal
import sys
import time
from pathlib import Path


def work():
    import torch

    a = torch.ones(16, 16)
    while True:
        torch.mm(a, a)
        time.sleep(0.001)
"""

KILLED_WORKER = WORKER_FOREVER + """
if __name__ == "__main__":
    worker = mp.get_context("spawn").Process(target=work)
    worker.start()
    checkpoint = Path(sys.argv[1]) / "processes" / str(worker.pid) / "profile.json"
    deadline = time.monotonic() + 120
    while not checkpoint.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    os.kill(worker.pid, signal.SIGKILL)
    worker.join()
    print("worker exit code", worker.exitcode)
"""


def test_a_worker_killed_by_sigkill_keeps_its_last_checkpoint(tmp_path: Path):
    program = _write(tmp_path, "killed.py", KILLED_WORKER)
    out = tmp_path / "out"
    result = cpuprof("run", "--out", str(out), "--", "python", str(program), str(out), timeout=300)
    assert result.returncode == 0, result.stderr
    assert "worker exit code -9" in result.stdout
    (followed,) = _followed(out)
    assert not followed.profile.status.complete
    assert _mm_calls(followed.profile) > 0
    assert "last checkpoint" in result.stdout


# A worker whose main thread waits in a lock nobody releases (as a pool worker waits on the task
# queue's lock that Pool.terminate() holds) and whose SIGTERM the kernel hands to another thread:
# Python runs its handler only in the main thread, between bytecodes, which never come.
SIGTERM_ELSEWHERE = """
import multiprocessing as mp
import signal
import threading
import time


def work():
    import torch

    torch.mm(torch.ones(8, 8), torch.ones(8, 8))
    held = threading.Lock()
    held.acquire()

    def shoot():
        time.sleep(0.5)
        signal.pthread_kill(threading.get_ident(), signal.SIGTERM)  # to this thread, not the main one

    threading.Thread(target=shoot).start()
    held.acquire()


if __name__ == "__main__":
    worker = mp.get_context("spawn").Process(target=work)
    worker.start()
    worker.join(60)
    print("worker exit code", worker.exitcode)
    if worker.exitcode is None:
        worker.kill()
"""


def test_a_sigterm_that_reaches_another_thread_still_ends_a_followed_process(tmp_path: Path):
    program = _write(tmp_path, "elsewhere.py", SIGTERM_ELSEWHERE)
    out = tmp_path / "out"
    result = cpuprof("run", "--out", str(out), "--", "python", str(program), timeout=300)
    assert result.returncode == 0, result.stderr
    assert "worker exit code -15" in result.stdout  # died of the SIGTERM, within the join's minute
    (followed,) = _followed(out)
    assert not followed.profile.status.complete
    assert _mm_calls(followed.profile) == 1


# A worker with a SIGTERM handler of its own, installed after cpuprof's: a graceful shutdown that
# takes longer than cpuprof's watcher waits for its own handler.
OWN_SIGTERM_HANDLER = """
import multiprocessing as mp
import os
import signal
import sys
import threading
import time
from pathlib import Path


def work(ready):
    import torch

    torch.mm(torch.ones(8, 8), torch.ones(8, 8))
    asked = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: asked.set())
    Path(ready).touch()
    while not asked.is_set():
        time.sleep(0.01)
    time.sleep(2)  # the graceful part
    torch.mm(torch.ones(8, 8), torch.ones(8, 8))


if __name__ == "__main__":
    ready = Path(sys.argv[1])
    worker = mp.get_context("spawn").Process(target=work, args=(str(ready),))
    worker.start()
    deadline = time.monotonic() + 120
    while not ready.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    os.kill(worker.pid, signal.SIGTERM)
    worker.join(60)
    print("worker exit code", worker.exitcode)
"""


def test_a_followed_process_with_its_own_sigterm_handler_shuts_down_its_own_way(tmp_path: Path):
    program = _write(tmp_path, "own_handler.py", OWN_SIGTERM_HANDLER)
    out = tmp_path / "out"
    result = cpuprof("run", "--out", str(out), "--", "python", str(program), str(tmp_path / "ready"), timeout=300)
    assert result.returncode == 0, result.stderr
    assert "worker exit code 0" in result.stdout  # not cut short by cpuprof's SIGTERM watcher
    (followed,) = _followed(out)
    assert followed.profile.status.complete
    assert _mm_calls(followed.profile) == 2


FOREVER = WORKER_FOREVER + """
if __name__ == "__main__":
    worker = mp.get_context(sys.argv[1]).Process(target=work, daemon=False)
    worker.start()
    while True:
        time.sleep(0.1)
"""


@pytest.mark.parametrize("method", ["spawn", "fork"])
def test_ctrl_c_keeps_every_profile_and_leaves_no_process_behind(tmp_path: Path, method: str):
    """A worker the program joins forever: a SIGINT to the launcher alone (kill -INT) ends the program,
    then its worker, each saving its profile. A forked worker inherits the program's environment as
    it was at exec, without the follow variables: it is found by its pid and start time."""
    program = _write(tmp_path, "forever.py", FOREVER)
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "cpuprof", "run", "--out", str(out), "--", "python",
                             str(program), method], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not followed_alive(out):
            assert time.monotonic() < deadline and proc.poll() is None, "the worker was never followed"
            time.sleep(0.1)
        time.sleep(0.5)  # the worker runs its ops
        proc.send_signal(signal.SIGINT)  # to the launcher alone, as `kill -INT` would
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr
    assert followed_alive(out) == []
    (followed,) = _followed(out)
    assert _mm_calls(followed.profile) > 0
    assert os.path.exists(out / "profile.json")


def test_a_sitecustomize_the_boot_directory_hides_still_runs(tmp_path: Path):
    """A followed Python runs cpuprof's sitecustomize first, then the one it stands before."""
    from cpuprof.launch.followed_run import boot_dir

    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "sitecustomize.py").write_text("import os\nos.environ['THEIRS_RAN'] = '1'\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([boot_dir(), str(theirs)]),
           "CPUPROF_FOLLOW": str(tmp_path / "follow.json")}
    result = subprocess.run([sys.executable, "-c", "import os, sys; print(os.environ.get('THEIRS_RAN'), "
                             f"{boot_dir()!r} in sys.path, 'torch' in sys.modules)"],
                            env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["1", "False", "False"]
    assert result.stderr == ""


SERVER = """
import sys
import time
from pathlib import Path

import torch

torch.zeros(256, 256).fill_(1.0)  # start-up, which a window past it leaves out
Path(sys.argv[1]).write_text("ready")
a = torch.ones(32, 32)
stop = Path(sys.argv[2])
deadline = time.monotonic() + float(sys.argv[3])
while time.monotonic() < deadline and not stop.exists():
    torch.mm(a, a)
    time.sleep(0.001)
"""


def _op_names(profile) -> set[str]:
    return {op.name for op in profile.ops if op.kind == "op"}


def test_a_delayed_window_leaves_out_the_start_up_and_lasts_its_duration(tmp_path: Path):
    program = _write(tmp_path, "server.py", SERVER)
    out = tmp_path / "out"
    result = cpuprof("run", "--delay", "1", "--duration", "1.5", "--out", str(out), "--", "python", str(program),
                     str(tmp_path / "ready"), str(tmp_path / "never"), "5", timeout=300)
    assert result.returncode == 0, result.stderr
    (program_profile,) = load_processes(out)
    profile = program_profile.profile
    assert profile.status.complete
    assert "aten::fill_" not in _op_names(profile) and _mm_calls(profile) > 0
    # The window's length is the collection's: 1.5 s, give or take a start and a stop.
    assert 1.4e9 <= profile.collection.wall_ns <= 3.0e9


def test_a_delay_longer_than_the_program_says_so(tmp_path: Path):
    program = _write(tmp_path, "server.py", SERVER)
    result = cpuprof("run", "--delay", "60", "--out", str(tmp_path / "out"), "--", "python", str(program),
                     str(tmp_path / "ready"), str(tmp_path / "never"), "0.2", timeout=300)
    assert result.returncode == 1
    line = one_line_error(result)
    assert "nothing was profiled" in line and "before the window opened (--delay 60)" in line


def _wait_for(path: Path, proc: subprocess.Popen, what: str, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert proc.poll() is None, f"the run ended before {what}"
        assert time.monotonic() < deadline, f"no {what} in {timeout_s} s"
        time.sleep(0.05)


def test_on_demand_windows_are_saved_each_as_its_own_run(tmp_path: Path):
    program = _write(tmp_path, "server.py", SERVER)
    out, ready, stop = tmp_path / "out", tmp_path / "ready", tmp_path / "stop"
    proc = subprocess.Popen([sys.executable, "-m", "cpuprof", "run", "--on-demand", "--out", str(out), "--", "python",
                             str(program), str(ready), str(stop), "300"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(ready, proc, "start of the program")
        for window in (1, 2):
            started = cpuprof("signal", str(proc.pid), "start")
            assert started.returncode == 0, started.stderr
            _wait_for(out / f"window-{window}", proc, f"window {window}")
            time.sleep(0.5)
            assert cpuprof("signal", str(proc.pid), "stop").returncode == 0
            _wait_for(out / f"window-{window}" / "profile.json", proc, f"window {window}'s profile")
        stop.write_text("stop")
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, stderr
    for window in (1, 2):
        (saved,) = load_processes(out / f"window-{window}")
        assert _mm_calls(saved.profile) > 0 and "aten::fill_" not in _op_names(saved.profile)
    assert "2 windows saved" in stdout
    # Re-rendered later, the run is its windows: listed, the last one's report shown (not a stub).
    shown = cpuprof("report", str(out))
    assert shown.returncode == 0, shown.stderr
    assert "an --on-demand run of 2 windows; the report is of the last, window-2" in shown.stderr
    assert "aten::mm" in shown.stdout
    own = cpuprof("report", str(out / "profile.json"))
    assert "profiled in windows, not here" in " ".join(own.stdout.split()) and "--no-profile" not in own.stdout


def test_signal_refuses_what_is_not_an_on_demand_launcher(tmp_path: Path):
    line = one_line_error(cpuprof("signal", str(os.getpid()), "start"))
    assert "is not a `cpuprof run --on-demand` launcher" in line
    assert "no process" in one_line_error(cpuprof("signal", "999999999", "stop"))
    program = _write(tmp_path, "x.py", "print('never run')\n")
    result = cpuprof("run", "--on-demand", "--delay", "1", "--", "python", str(program))
    assert result.returncode == 2 and "--delay and --duration do not apply" in one_line_error(result)


SETS_ITS_OWN_THREADS = """
import multiprocessing as mp
import os
import sys


def worker():
    import torch

    # As vLLM's worker does: it was given its thread count, then binds itself once torch is loaded.
    os.sched_setaffinity(0, {int(sys.argv[1])})
    torch.set_num_threads(1)
    torch.mm(torch.ones(64, 64), torch.ones(64, 64))


if __name__ == "__main__":
    import torch

    torch.set_num_threads(1)  # the program's own process changes what the launch set
    os.environ["OMP_NUM_THREADS"] = "1"  # and its workers start with it, as vLLM's are
    process = mp.get_context("spawn").Process(target=worker, name="Binder")
    process.start()
    process.join()
    print("exit", process.exitcode)
"""


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="binding to one CPU changes nothing with one CPU")
def test_a_program_that_sets_its_own_threads_and_binding_is_reported_not_warned(tmp_path: Path):
    """Known answers: the program's process goes from the launch's 2 threads to 1; its worker starts
    with OMP_NUM_THREADS=1 (set by the program: a note, not a launch warning) and moves itself from
    every CPU to one."""
    cpu = max(os.sched_getaffinity(0))
    program = _write(tmp_path, "binder.py", SETS_ITS_OWN_THREADS)
    out = tmp_path / "out"
    # Known answers need a shell without OpenMP variables of its own (they are what a worker gets back).
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "KMP_", "GOMP_", "MKL_"))}
    result = cpuprof("run", "--threads", "2", "--out", str(out), "--", "python", str(program), str(cpu), timeout=300,
                     env=env)
    assert result.returncode == 0, result.stderr
    assert "exit 0" in result.stdout
    everyone = load_processes(out)
    top = next(p for p in everyone if not p.followed)
    (worker,) = [p for p in everyone if p.followed]
    assert top.profile.settings.warnings == []  # the launch took: the program changed it afterwards
    assert worker.profile.settings.warnings == []
    # The launch's variables are the program's process's: the worker got back the ones from before the
    # launch (no OMP_PROC_BIND: nothing bound it as it started), keeping the one its program set.
    assert worker.profile.settings.from_program == ["OMP_NUM_THREADS=1"]
    assert "OMP_PROC_BIND" not in worker.profile.settings.at_start.env
    assert top.profile.settings.at_start.env["OMP_PROC_BIND"] == "close"
    text = " ".join(result.stdout.split())  # the report's lines are wrapped to the terminal
    top_line = text.split("(binder.py) (pid")[1].split(" Binder (pid")[0]
    assert "changed its settings after its import of torch: torch threads 2 → 1" in top_line, top_line
    assert "in its environment, for the processes it starts: OMP_NUM_THREADS 2 → 1" in top_line, top_line
    # The busiest process is the worker: its Settings section has both kinds of line.
    worker_changes = text.split("changed since its import of torch")[1].split("Machine roofs")[0]
    assert "torch threads" not in worker_changes  # it began with 1: not a change of its own
    # from the CPUs it began on to the one it bound itself to
    began = next(t for t in worker.profile.settings.at_start.threads if t.tid == worker.profile.meta.pid)
    # The program's main thread is bound to one CPU by the launch's OpenMP binding; the worker it
    # started inherited that CPU, and began on the launch's set, given back (vLLM's engine core ran on
    # the worker's one CPU under `run` while the other idled). A mutation that keeps what it inherited fails.
    launch = top.profile.settings.requested.cpus
    program_main = next(t for t in top.profile.settings.at_start.threads if t.tid == top.profile.meta.pid)
    assert len(program_main.affinity) == 1, program_main
    assert began.affinity == launch
    bound = format_cpulist(program_main.affinity)
    # The program's process ran no OpenMP team before it started the worker: a front end, whose threads
    # on the binding's one CPU the worker gave the launch's set (they would share it with the worker).
    front_end = top.profile.settings.front_end
    assert front_end is not None
    assert (front_end.pid, front_end.by_pid) == (top.profile.meta.pid, worker.profile.meta.pid)
    assert (front_end.cpus_from, front_end.cpus_to) == (program_main.affinity, launch) and front_end.threads >= 1
    ended = next(t for t in top.profile.settings.in_force.threads if t.tid == top.profile.meta.pid)
    assert ended.affinity == launch
    assert worker.profile.settings.given_back == [
        f"CPU set {bound} → {format_cpulist(launch)} as it started (it inherited the CPU set of "
        "the OpenMP-bound thread that started it, not the launch's)",
        f"its parent's {front_end.threads} thread{'s' if front_end.threads != 1 else ''} on CPUs {bound} → the "
        f"launch's (pid {front_end.pid}, a front end: it started this process before running an OpenMP team)"]
    assert "CPU sets cpuprof gave back, the launch's binding having narrowed them: CPU set" in text
    assert top.profile.settings.given_back == [
        f"{front_end.threads} thread{'s' if front_end.threads != 1 else ''} on CPUs {bound} → the launch's "
        f"{format_cpulist(launch)}, by process {worker.profile.meta.pid} as it imported torch: the program's process "
        "started it before running an OpenMP team (a front end, which the launch's binding had put on one CPU)"]
    assert "moved from CPUs" not in top_line, top_line  # cpuprof's move, said as such, not the program's
    assert f"1 thread moved from CPUs {format_cpulist(began.affinity)} to CPUs {cpu}" in worker_changes, worker_changes
    assert "launch's variables being the program's process's): OMP_NUM_THREADS=1" in text
    assert "tokens: a program's are counted from the decode steps found in its op stream" in text


FRONT_END = """
import multiprocessing as mp
import os
import subprocess
import sys
import threading

import torch


def worker():
    import torch

    torch.mm(torch.ones(8, 8), torch.ones(8, 8))


if __name__ == "__main__":
    if "team-first" in sys.argv:  # the program does OpenMP work of its own first: its team forms, bound
        torch.ones(1 << 22).add_(1)
    # A thread started before the worker, as a server's are: it inherits its starter's CPU set.
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait)
    thread.start()
    if "shell" in sys.argv:  # the worker's parent is a shell, not the program: nothing of the program's moves
        code = "import torch; torch.mm(torch.ones(8, 8), torch.ones(8, 8))"
        subprocess.run(f"true && {sys.executable} -c '{code}'", shell=True, check=True)
        print("exit", 0)
    else:
        process = mp.get_context("spawn").Process(target=worker)
        process.start()
        process.join()
        print("exit", process.exitcode)
    if "team-after" in sys.argv:  # a team formed after the program was given the launch's set
        torch.ones(1 << 22).add_(1)
    print("main", sorted(os.sched_getaffinity(0)), "thread", sorted(os.sched_getaffinity(thread.native_id)))
    stop.set()
"""


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="binding to one CPU changes nothing with one CPU")
@pytest.mark.parametrize("order", ["front-end", "team-first", "team-after", "shell"])
def test_a_front_end_is_given_the_launchs_cpus_and_a_program_with_a_team_keeps_its_binding(tmp_path: Path,
                                                                                           order: str):
    """Known answers: the launch's binding puts the program's initial thread, and the threads it
    starts, on the first place's CPU. A program that starts a torch worker before it has run an
    OpenMP team is a front end: its threads are on the launch's whole set once the worker has
    imported torch (read by the program itself). A program whose team ran first keeps its binding;
    one whose team formed after is warned that the team's first thread is not bound; one whose worker
    a shell started (the worker's parent is not the program) keeps its binding."""
    program = _write(tmp_path, "front.py", FRONT_END)
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "KMP_", "GOMP_", "MKL_"))}
    result = cpuprof("run", "--threads", "2", "--out", str(out), "--", "python", str(program), order, timeout=300,
                     env=env)
    assert result.returncode == 0, result.stderr
    assert "exit 0" in result.stdout
    everyone = load_processes(out)
    top = next(p for p in everyone if not p.followed)
    launch = top.profile.settings.requested.cpus
    began = next(t for t in top.profile.settings.at_start.threads if t.tid == top.profile.meta.pid)
    assert len(began.affinity) == 1 and set(began.affinity) < set(launch)  # the binding's, at torch's import
    line = next(x for x in result.stdout.splitlines() if x.startswith("main "))
    freed = order in ("front-end", "team-after")
    expected = launch if freed else began.affinity
    assert line == f"main {expected} thread {expected}", line
    assert (top.profile.settings.front_end is not None) is freed
    assert (out / "front_end.json").exists() is freed
    warned = [w for w in top.profile.settings.warnings if "an OpenMP team formed after its workers started" in w]
    assert bool(warned) is (order == "team-after"), top.profile.settings.warnings
    if order == "shell":
        (worker,) = [p for p in everyone if p.followed]
        assert len(worker.profile.settings.given_back) == 1  # its own set, from the shell's: nothing of its parent's


def test_a_process_named_with_escape_sequences_is_shown_not_obeyed(tmp_path: Path):
    """A script's name is the program's to choose: a terminal-title escape, a colour, BEL and a
    newline in it reach cpuprof's live lines ("following process PID (NAME)") escaped, never raw."""
    nasty = "child\x1b]0;pwned\x07\x1b[31mred\nforged.py"
    child = _write(tmp_path, nasty, """
        import torch

        torch.mm(torch.ones(4, 4), torch.ones(4, 4))
    """)
    program = _write(tmp_path, "parent.py", f"""
        import subprocess, sys

        subprocess.run([sys.executable, {str(child)!r}], check=True)
    """)
    out = tmp_path / "out"
    result = cpuprof("run", "--out", str(out), "--", "python", str(program), timeout=300)
    assert result.returncode == 0, result.stderr
    following = [line for line in result.stderr.splitlines() if "following process" in line]
    assert len(following) == 1, result.stderr
    assert "child\\x1b]0;pwned\\x07\\x1b[31mred\\nforged.py" in following[0]
    cpuprof_lines = [line for line in result.stderr.splitlines() if line.startswith("cpuprof")]
    assert not any(c in line for line in cpuprof_lines for c in "\x1b\x07"), cpuprof_lines
    assert not any(line.startswith("forged.py") for line in result.stderr.splitlines())


def test_signal_finds_a_launcher_by_its_run_directory_and_keeps_fast_requests_in_order(tmp_path: Path):
    """A launcher started with interpreter flags (or the console script) was refused, its command
    line not matching; and 20 fast start/stop pairs left "opening window 22" with the window closed
    (signals arrive in the kernel's order, and a pending one absorbs the next). Found by the run
    directory it holds, each request queued in order: 20 windows, the last closed."""
    from cpuprof.cli import main
    from cpuprof.launch.window import CONTROL_FILE, WindowControl, control_path
    from cpuprof.model.io import read_versioned

    program = _write(tmp_path, "server.py", SERVER)
    out, ready, stop = tmp_path / "out", tmp_path / "ready", tmp_path / "stop"
    proc = subprocess.Popen([sys.executable, "-X", "dev", "-m", "cpuprof", "run", "--on-demand", "--out", str(out),
                             "--", "python", str(program), str(ready), str(stop), "300"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(ready, proc, "start of the program")
        for _ in range(20):  # in this process, back to back: as fast as requests can come
            assert main(["signal", str(proc.pid), "start"]) == 0
            assert main(["signal", str(proc.pid), "stop"]) == 0
        deadline = time.monotonic() + 60
        while read_versioned(control_path(out), CONTROL_FILE, WindowControl) != WindowControl(20, False, proc.pid):
            assert time.monotonic() < deadline, read_versioned(control_path(out), CONTROL_FILE, WindowControl)
            time.sleep(0.05)
        stop.write_text("stop")
        _, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    windows = [line for line in stderr.splitlines() if " window " in line and line.startswith("cpuprof: ")]
    assert [line.split(" (")[0] for line in windows if "opening" in line or "closing" in line][-2:] == [
        "cpuprof: opening window 20", "cpuprof: closing window 20"]
    assert not any("already" in line for line in windows), windows
    assert not (out / ".window-requests").exists()


def _fill(disk: Path, leave_bytes: int) -> Path:
    """Fills ``disk`` (a tmpfs of the test's) to all but about ``leave_bytes``."""
    filler = disk / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while os.write(fd, b"\0" * 4096):
            pass
    except OSError:  # full
        pass
    finally:
        os.close(fd)
    os.truncate(filler, max(0, filler.stat().st_size - leave_bytes))
    return filler


def test_a_window_lost_to_a_full_disk_is_one_line_the_program_runs_on_and_later_windows_are_saved(tmp_path: Path):
    """The disk full when a window closes: the window's profile cannot be written. Once a traceback,
    the next window announced but never written and exit 0; now one line naming the window, the program
    runs on, the next window is saved once there is room, and the exit code says a profile was lost."""
    from cpuprof.cli import main

    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(disk)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (needs CAP_SYS_ADMIN)")
    program = _write(tmp_path, "server.py", SERVER)
    out, ready, stop = disk / "out", tmp_path / "ready", tmp_path / "stop"
    proc = subprocess.Popen([sys.executable, "-m", "cpuprof", "run", "--on-demand", "--out", str(out), "--", "python",
                             str(program), str(ready), str(stop), "300"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(ready, proc, "start of the program")
        filler = _fill(disk, leave_bytes=16384)  # room for the requests, not for a window's profile
        assert main(["signal", str(proc.pid), "start"]) == 0
        _wait_for(out / "window-1", proc, "window 1")
        time.sleep(0.5)
        assert main(["signal", str(proc.pid), "stop"]) == 0
        time.sleep(2)  # the window's save fails meanwhile
        assert proc.poll() is None, "the run ended with the disk full"
        filler.unlink()  # room again
        assert main(["signal", str(proc.pid), "start"]) == 0
        _wait_for(out / "window-2", proc, "window 2")
        time.sleep(0.5)
        assert main(["signal", str(proc.pid), "stop"]) == 0
        _wait_for(out / "window-2" / "profile.json", proc, "window 2's profile")
        stop.write_text("stop")
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)
    assert "Traceback" not in stderr, stderr
    lost = [line for line in stderr.splitlines() if "window 1 lost: its profile could not be saved in" in line]
    assert len(lost) == 1 and "No space left on device" in lost[0], stderr
    assert "aten::mm" in stdout and "1 window saved (the report above is of window-2)" in stdout
    assert proc.returncode == 1
    assert "cpuprof: error: window 1 lost: process" in stderr.splitlines()[-1]


def test_a_process_that_execs_is_saved_first_and_says_so(tmp_path: Path):
    """exec replaces the process: no atexit, no handler runs. A followed process that exec'd lost every
    op ("killed before its first checkpoint"); a program that exec'd made the run exit 1 though it
    exited 0. Known answers: 3 mm before the program's exec and 5 in the Python it became (followed);
    7 in a followed child before its own exec into a Python that runs none."""
    second = _write(tmp_path, "second.py", """
        import torch

        for _ in range(5):
            torch.mm(torch.ones(4, 4), torch.ones(4, 4))
    """)
    child = _write(tmp_path, "child.py", """
        import os, sys
        import torch

        for _ in range(7):
            torch.mm(torch.ones(4, 4), torch.ones(4, 4))
        os.execv(sys.executable, [sys.executable, "-c", "print('became something else')"])
    """)
    program = _write(tmp_path, "main.py", f"""
        import os, subprocess, sys
        import torch

        subprocess.run([sys.executable, {str(child)!r}], check=True)
        for _ in range(3):
            torch.mm(torch.ones(2, 2), torch.ones(2, 2))
        os.execl(sys.executable, sys.executable, {str(second)!r})
    """)
    out = tmp_path / "out"
    result = cpuprof("run", "--out", str(out), "--", "python", str(program), timeout=300)
    assert result.returncode == 0, result.stderr
    assert "became something else" in result.stdout
    own = Profile.load(out)
    assert _mm_calls(own) == 3 and "the program exec'd" in (own.status.reason or "")
    followed = {p.profile.meta.role: p.profile for p in load_processes(out) if p.followed}
    assert _mm_calls(followed["python child.py"]) == 7
    assert "it exec'd" in (followed["python child.py"].status.reason or "")
    assert _mm_calls(followed["python second.py"]) == 5  # the program it became, under the same pid
    assert "exec'd" in result.stderr and "killed before its first checkpoint" not in result.stdout


def test_a_forked_worker_under_no_follow_never_runs_cpuprofs_handlers(tmp_path: Path):
    """The workers a fork Pool starts inherit the program's process; without --no-follow's profile of
    their own they are the program's alone: the pool's SIGTERM at its end kills them as it would
    without cpuprof, with nothing of cpuprof's printed (no Terminated traceback from its handler)."""
    program = _write(tmp_path, "pool.py", POOL_PROGRAM)
    out = tmp_path / "out"
    result = cpuprof("run", "--no-follow", "--threads", "1", "--out", str(out), "--", "python", str(program), "fork",
                     "torch-first", timeout=300)
    assert result.returncode == 0, result.stderr
    assert f"done {MM_PER_TASK * TASKS}" in result.stdout
    assert "Traceback" not in result.stderr and "Terminated" not in result.stderr, result.stderr
    assert not _followed(out)
    assert "PARTIAL" not in result.stdout
