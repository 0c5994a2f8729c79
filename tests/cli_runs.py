"""Running ``python -m cpuprof`` as a user would, for the integration tests, and reading its one
error line."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any


def cpuprof(*args: str, timeout: float = 600, **kwargs: Any) -> subprocess.CompletedProcess:
    """``python -m cpuprof ARGS`` in a child, its output captured as text."""
    return subprocess.run([sys.executable, "-m", "cpuprof", *args], capture_output=True, text=True,
                          timeout=timeout, **kwargs)


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
