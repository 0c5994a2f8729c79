"""py-spy beside the profiled process, for the Python half of every stack.

cpuprof's own samples see native code only; py-spy reads the interpreter's frames from outside
the process. It runs ``--nonblocking`` (blocking mode stops every OpenMP thread at each sample)
and ``--idle`` (a dispatching thread inside an op has released the GIL and may be waiting in an
OpenMP barrier: its Python stack still says who called the op), writing a Chrome trace: per
Python thread, spans of frames that begin and end at py-spy's sample times.

py-spy's trace times count from an ``Instant`` it takes at start, on CLOCK_MONOTONIC like the op
timeline, but the moment is unknown. A marker function that spins for a known interval right
after py-spy starts gives it: py-spy sees the marker begin at its first sample at or after the
marker's start and end at its first sample at or after its end, which bounds the offset to one
py-spy period; the middle of that bound is used and half its width reported.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import signal
import subprocess
import sysconfig
import tempfile
import threading
import time
from pathlib import Path

from .python_join import PythonTrace, thread_os_ids

MARKER = "_cpuprof_clock_marker"
_PR_SET_PTRACER = 0x59616D61
_PR_SET_PTRACER_ANY = -1


def executable() -> str | None:
    """The py-spy next to this interpreter (a venv need not be activated), else on PATH."""
    beside = Path(sysconfig.get_path("scripts")) / "py-spy"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("py-spy")


def _allow_ptrace_by_children() -> None:
    """Under Yama ptrace_scope 1 only ancestors may read a process's memory; py-spy is our
    child, so the process names it, as gdb's documentation describes. Only while profiling."""
    try:
        scope = Path("/proc/sys/kernel/yama/ptrace_scope").read_text().strip()
    except OSError:
        return
    if scope == "1":
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PTRACER, ctypes.c_ulong(_PR_SET_PTRACER_ANY & 0xFFFFFFFFFFFFFFFF), 0, 0, 0)


def _forbid_ptrace_by_children() -> None:
    try:
        if Path("/proc/sys/kernel/yama/ptrace_scope").read_text().strip() == "1":
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PTRACER, 0, 0, 0, 0)
    except OSError:
        pass


def _off_the_profiled_cpus() -> None:
    """py-spy inherits the pinned CPU set; where the machine has other CPUs, it runs there and
    takes no CPU time from the threads it watches."""
    try:
        others = set(range(os.cpu_count() or 1)) - os.sched_getaffinity(0)
        if others:  # the kernel ignores offline CPUs in the mask, and refuses it if all are
            os.sched_setaffinity(0, others)
    except OSError:
        pass


class PySpyError(Exception):
    """py-spy could not run or attach; the message is one line for the user."""


def _version(exe: str) -> str:
    try:
        out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return "py-spy"
    return out.strip() or "py-spy"


def _cpuprof_clock_marker(seconds: float) -> tuple[int, int]:
    """Spins in Python (holding the GIL, on the calling thread) for ``seconds``; py-spy must see
    this function by its name, MARKER."""
    start = time.monotonic_ns()
    end = start + int(seconds * 1e9)
    while time.monotonic_ns() < end:
        pass
    return start, time.monotonic_ns()


class PySpyRecorder:
    """Starts py-spy on this process; ``stop()`` returns its stacks aligned to the op timeline."""

    STARTUP_TIMEOUT_S = 15.0

    def __init__(self, hz: int) -> None:
        self.hz = hz
        exe = executable()
        if exe is None:
            raise PySpyError("py-spy is not installed (pip install py-spy)")
        self._exe = exe
        self._dir = tempfile.mkdtemp(prefix="cpuprof-pyspy-")
        self._out = Path(self._dir) / "trace.json"
        self._marker: tuple[int, int] | None = None
        self._idents: dict[int, int] = {}
        _allow_ptrace_by_children()
        try:
            self._proc = subprocess.Popen(
                [exe, "record", "--nonblocking", "--idle", "--format", "chrometrace", "--rate", str(hz),
                 "--pid", str(os.getpid()), "--output", str(self._out)],
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                # Its own process group: a Ctrl-C at the terminal must not stop it before it writes.
                start_new_session=True, preexec_fn=_off_the_profiled_cpus,
            )
        except OSError as exc:
            _forbid_ptrace_by_children()
            raise PySpyError(f"py-spy could not start: {exc.strerror or exc}") from exc
        self._stderr: list[str] = []
        self._reader = threading.Thread(target=self._read_stderr, name="cpuprof-pyspy-log", daemon=True)
        self._started = threading.Event()
        self._reader.start()
        if not self._started.wait(self.STARTUP_TIMEOUT_S) or self._proc.poll() is not None:
            reason = self._failure()
            self._kill()
            raise PySpyError(reason)
        self._remember_threads()
        # Enough py-spy periods inside the marker that it is seen whatever the phase, and whatever
        # a loaded machine delays py-spy's first samples by (40 ms was missed beside a busy suite).
        self._marker = _cpuprof_clock_marker(max(0.12, 8.0 / hz))

    def _read_stderr(self) -> None:
        assert self._proc.stdout is not None  # py-spy writes its messages there, errors included
        for line in self._proc.stdout:
            self._stderr.append(line.rstrip())
            if "Sampling process" in line:
                self._started.set()
        self._started.set()

    def _failure(self) -> str:
        lines = [line.removeprefix("py-spy>").strip() for line in self._stderr if line.strip()]
        chatter = ("Visit ", "Sampling process", "Stopped sampling", "Wrote ")
        lines = [line for line in lines if not line.startswith(chatter)]
        text = lines[-1] if lines else f"it exited (status {self._proc.poll()}) without writing its trace"
        if "ermission" in text or "ptrace" in text.lower():
            text += " (ptrace refused: run as root, or set kernel.yama.ptrace_scope to 0 or 1)"
        return f"py-spy failed: {text}"

    def _remember_threads(self) -> None:
        self._idents.update(thread_os_ids())

    def _kill(self) -> None:
        if self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()
        _forbid_ptrace_by_children()
        shutil.rmtree(self._dir, ignore_errors=True)

    def stop(self) -> PythonTrace:
        """Stops py-spy (it writes its trace on SIGINT) and reads the trace."""
        self._remember_threads()
        try:
            if self._proc.poll() is None:
                self._proc.send_signal(signal.SIGINT)
                try:
                    self._proc.wait(timeout=30)
                except subprocess.TimeoutExpired as exc:
                    raise PySpyError("py-spy did not stop within 30 s of SIGINT; no Python stacks") from exc
            self._reader.join(timeout=5)
            if not self._out.exists():
                raise PySpyError(self._failure())
            try:
                events = json.loads(self._out.read_text())
            except (OSError, ValueError) as exc:
                raise PySpyError(f"py-spy's trace could not be read: {exc}") from exc
            return self._align(events)
        finally:
            self._kill()

    def _align(self, events: list[dict]) -> PythonTrace:
        samples = errors = 0
        for line in self._stderr:
            if "Samples:" in line:  # "Wrote chrome trace to '...'. Samples: 31 Errors: 0"
                words = line.replace(".", " ").split()
                try:
                    samples = int(words[words.index("Samples:") + 1])
                    errors = int(words[words.index("Errors:") + 1])
                except (ValueError, IndexError):
                    pass
        period_ns = int(1e9 / self.hz)
        offset_ns, half_width = self._offset(events, period_ns)
        trace = PythonTrace(version=_version(self._exe), hz=self.hz, samples=samples, errors=errors,
                           clock_error_ns=half_width, idents=dict(self._idents))
        open_frames: dict[int, list[tuple[str, str, int]]] = {}
        for e in events:
            if e.get("ph") not in ("B", "E"):
                continue
            tid = int(e["tid"])
            stack = open_frames.setdefault(tid, [])
            if e["ph"] == "B":
                args = e.get("args") or {}
                stack.append((str(e.get("name", "?")), str(args.get("filename", "?")), int(args.get("line") or 0)))
            elif stack:
                stack.pop()
            # A change seen at a sample happened since the one before, a period earlier: placed
            # half a period back, it is off by at most half a period either way.
            t = int(e["ts"]) * 1000 + offset_ns - period_ns // 2
            changes = trace.changes.setdefault(tid, [])
            frozen = tuple(f for f in stack if f[0] != MARKER)
            if changes and changes[-1][0] == t:
                changes[-1] = (t, frozen)  # one sample's several B/E events: keep its final stack
            else:
                changes.append((t, frozen))
        return trace

    def _offset(self, events: list[dict], period_ns: int) -> tuple[int, int]:
        """(monotonic ns of py-spy's time zero, half the uncertainty), from the marker's frame."""
        assert self._marker is not None
        m_begin, m_end = self._marker
        begin = end = None
        for e in events:
            if e.get("name") == MARKER:
                if e.get("ph") == "B" and begin is None:
                    begin = int(e["ts"]) * 1000
                elif e.get("ph") == "E" and begin is not None and end is None:
                    end = int(e["ts"]) * 1000
        if begin is None or end is None:
            raise PySpyError("py-spy never saw cpuprof's clock marker, so its stacks cannot be placed on the "
                             "op timeline (it may have started too slowly); no Python stacks")
        # py-spy time t is monotonic o + t; the marker's begin was seen at a sample in
        # [m_begin, m_begin + period), its end at one in [m_end, m_end + period) (plus the
        # microsecond truncation of py-spy's times).
        low = max(m_begin - begin, m_end - end) - 1000
        high = min(m_begin - begin, m_end - end) + period_ns
        if low > high:  # a late sample beyond one period: trust the begin bound alone
            low, high = m_begin - begin - 1000, m_begin - begin + period_ns
        return (low + high) // 2, (high - low) // 2


def start(hz: int) -> tuple[PySpyRecorder | None, str | None]:
    """(recorder, None) or (None, the one-line reason py-spy cannot run)."""
    try:
        return PySpyRecorder(hz), None
    except PySpyError as exc:
        return None, str(exc)


__all__ = ["MARKER", "PySpyError", "PySpyRecorder", "executable", "start"]
