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
from tests.cli_runs import cpuprof

from cpuprof.analysis.processes import load_processes
from cpuprof.launch.followed_run import FOLLOW_FILE

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
    assert "Processes" in result.stdout and "PoolWorker" in result.stdout
    # The merged report re-renders from the directory, in a data format too.
    again = cpuprof("report", str(out), "--format", "json")
    assert again.returncode == 0, again.stderr
    sections = {s["id"]: s for s in json.loads(again.stdout)["sections"]}
    pids = {row["pid"] for row in sections["processes"]["tables"][0]["rows"]}
    assert {p.profile.meta.pid for p in followed} <= pids


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


FOREVER = WORKER_FOREVER + """
if __name__ == "__main__":
    worker = mp.get_context("spawn").Process(target=work, daemon=False)
    worker.start()
    while True:
        time.sleep(0.1)
"""


def _followed_alive(out: Path) -> list[int]:
    marker = f"CPUPROF_FOLLOW={out / FOLLOW_FILE.filename}".encode()
    alive = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker in (entry / "environ").read_bytes().split(b"\0"):
                    state = (entry / "stat").read_text().rsplit(")", 1)[-1].split()[0]
                    if state != "Z":
                        alive.append(int(entry.name))
            except OSError:
                pass
    return alive


def test_ctrl_c_keeps_every_profile_and_leaves_no_process_behind(tmp_path: Path):
    program = _write(tmp_path, "forever.py", FOREVER)
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "cpuprof", "run", "--out", str(out), "--", "python",
                             str(program)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not (out / "processes").is_dir() or not any((out / "processes").iterdir()):
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
    assert _followed_alive(out) == []
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
