"""Running ``python -m cpuprof`` as a user would, for the integration tests, and reading its one
error line."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any


def cpuprof(*args: str, timeout: float = 600, **kwargs: Any) -> subprocess.CompletedProcess:
    """``python -m cpuprof ARGS`` in a child, its output captured as text. One that outlives
    ``timeout`` fails with where each of its processes was stuck (a hang seen once in CI is
    otherwise a bare timeout, with nothing to go on), and none of them is left running."""
    # A session of its own: on a timeout the whole group is killed at once, with the processes a pool
    # would start again behind a kill of one of them.
    proc = subprocess.Popen([sys.executable, "-m", "cpuprof", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True, **kwargs)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        tree = [proc.pid, *_descendants(proc.pid)]
        where = "\n".join(_where_stuck(pid) for pid in tree)
        for pid in tree:  # stopped first, so that none starts another while they are killed
            _signal(pid, signal.SIGSTOP)
        _signal(-proc.pid, signal.SIGKILL)
        for pid in tree:  # any that left the group
            _signal(pid, signal.SIGKILL)
        try:
            stdout, stderr = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:  # a grandchild outside the group still holds the pipes
            stdout, stderr = "(not read: a process outside the run's group kept its pipes open)", ""
        raise AssertionError(f"{exc}\nwhere its processes were:\n{where}\nstdout:\n{stdout}\n"
                             f"stderr:\n{stderr}") from None
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


def _signal(pid: int, signum: int) -> None:
    """``pid`` (or, negative, a process group) sent ``signum``; gone already is fine."""
    try:
        if pid < 0:
            os.killpg(-pid, signum)
        else:
            os.kill(pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue  # it ended between the listing and the read
            children.setdefault(parent, []).append(int(entry.name))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _where_stuck(pid: int) -> str:
    """Each thread's name, state and kernel wait channel, py-spy's Python stacks, and gdb's native
    stacks of every thread (py-spy shows only the threads that run Python) where gdb is installed
    (both need ptrace: where Yama or a container forbids it, they say so, and the wait channels stand)."""
    lines = [f"pid {pid}:"]
    try:
        for task in sorted(Path(f"/proc/{pid}/task").iterdir(), key=lambda t: int(t.name)):
            stat = (task / "stat").read_text()
            name, state = stat[stat.index("(") + 1:stat.rindex(")")], stat.rsplit(")", 1)[1].split()[0]
            lines.append(f"  tid {task.name} {name!r} state {state} wchan {(task / 'wchan').read_text()}")
    except OSError as exc:
        lines.append(f"  ({exc})")
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    commands = [[spy, "dump", "--pid", str(pid)]]
    if shutil.which("gdb"):
        commands.append(["gdb", "-p", str(pid), "-batch", "-nx", "-ex", "thread apply all bt 30"])
    for command in commands:
        try:
            dump = subprocess.run(command, capture_output=True, text=True, timeout=60)
            lines.append(dump.stdout + dump.stderr)
        except (OSError, subprocess.TimeoutExpired) as exc:
            lines.append(f"  {command[0]}: {exc}")
    return "\n".join(lines)


def cpuprof_ok(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """As :func:`cpuprof`, for a run that must succeed."""
    result = cpuprof(*args, timeout=timeout)
    assert result.returncode == 0, result.stderr
    return result


def one_line_error(result: subprocess.CompletedProcess, only_cpuprof_lines: bool = False) -> str:
    """The run's one ``cpuprof: error:`` line, with no traceback. ``only_cpuprof_lines``: stderr must
    hold nothing but cpuprof's own lines (progress, warnings, the error), no program's output."""
    assert "Traceback" not in result.stderr, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    if only_cpuprof_lines:
        assert all(line.startswith("cpuprof: ") for line in lines), result.stderr
    errors = [line for line in lines if line.startswith("cpuprof: error: ")]
    assert len(errors) == 1, result.stderr
    return errors[0]


def wait_for_child(launch_file: Path, deadline_s: float = 60) -> None:
    """Waits until a process runs on ``launch_file``: the launcher has started its child (which may
    still be starting Python)."""
    needle = str(launch_file).encode()
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    if needle in (entry / "cmdline").read_bytes():
                        return
                except OSError:
                    pass  # it ended between the listing and the read
        time.sleep(0.005)
    raise AssertionError(f"no child started on {launch_file}")


def interrupt_once_started(args: list[str], launch_file: Path) -> subprocess.CompletedProcess:
    """``python -m cpuprof ARGS``, sent SIGINT the moment a child runs on ``launch_file`` (which may
    still be starting Python); its output once it has ended."""
    import signal

    proc = subprocess.Popen([sys.executable, "-m", "cpuprof", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        wait_for_child(launch_file)
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
