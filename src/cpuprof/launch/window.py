"""Profiling windows of a long-running program: ``run --delay S --duration D`` and ``run --on-demand``.

A serving engine's first minute is start-up (weights loaded, a KV cache of gigabytes filled): a
profile of the whole program buries the steady state a user wants to see. So a window:

- ``--delay S --duration D``: each profiled process (the program's and every followed one) starts
  its profile S seconds after its own ``import torch`` and saves it D seconds later, then runs on
  unprofiled (without ``--duration``: to its end);
- ``--on-demand``: the processes start unprofiled; ``python -m cpuprof signal PID start|stop``
  (PID of the ``cpuprof run`` launcher) makes the launcher write ``window.json`` in the output
  directory, which every profiled process polls (a ``stat`` every ``POLL_S``): each window is
  saved as its own run under ``DIR/window-N`` (the program's profile and ``processes/PID``).

What opening and closing a window cost the process (starting the profile; stopping and saving it)
is measured in the process and said in its progress lines.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import FileFormatError
from ..model.io import FileKind, read_versioned, write_versioned
from ..model.run_layout import LOST_FILENAME, window_dir, window_requests_dir
from ..safe_text import cpuprof_command, say
from .job_windows import StoreWindows

CONTROL_FILE = FileKind(name="window control file", format="cpuprof-window", version=1, filename="window.json",
                        written_by="cpuprof run --on-demand")
POLL_S = 0.1  # how often a process looks at the control file: a window opens within this


@dataclass
class WindowPlan:
    """When each process profiles: from ``delay_s`` after its import of torch, for ``duration_s``
    (None: to its end); or, ``on_demand``, when ``cpuprof signal`` says."""

    delay_s: float = 0.0
    duration_s: float | None = None
    on_demand: bool = False

    @property
    def whole(self) -> bool:
        """From the import of torch to the end: no window."""
        return not self.on_demand and self.delay_s == 0 and self.duration_s is None

    def describe(self, root: str | os.PathLike[str] | None = None) -> str:
        """When profiling starts; on demand, the command that starts it (``root``: the run directory,
        whose control file names the launcher)."""
        if self.on_demand:
            return f"profiling starts with: {signal_command(root, 'start')} (stop, in place of start, closes it)"
        when = f"{self.delay_s:g} s after it imported torch" if self.delay_s else "when it imported torch"
        until = f", for {self.duration_s:g} s" if self.duration_s is not None else ""
        return f"profiling starts {when}{until}"


@dataclass
class WindowControl:
    """What the launcher asks for: window ``window`` (1 the first; 0 none yet) open or closed.
    ``launcher``: its pid, which ``cpuprof signal PID`` checks (0 in files written before it was)."""

    window: int = 0
    open: bool = False
    launcher: int = 0


def signal_command(root: str | os.PathLike[str] | None, action: str) -> str:
    """The ``cpuprof signal`` command that asks the launcher of ``root`` to ``action`` a window, as it
    pastes (with its pid, read from the control file it wrote); where that file cannot be read, where to
    find the command instead, never a template with a placeholder."""
    if root is not None:
        try:
            launcher = read_versioned(control_path(root), CONTROL_FILE, WindowControl).launcher
        except (OSError, FileFormatError):
            launcher = 0
        if launcher > 0:
            return cpuprof_command("signal", str(launcher), action)
    return f"cpuprof signal, given the pid the launcher printed as it started, and {action}"


def control_path(root: str | os.PathLike[str]) -> Path:
    return Path(root) / CONTROL_FILE.filename


def write_control(root: str | os.PathLike[str], control: WindowControl) -> None:
    write_versioned(control_path(root), CONTROL_FILE, control)


# -- cpuprof signal -> the launcher -----------------------------------------------------------------
# A signal says only "look": two signals sent close together arrive in the kernel's order (by
# number), not the order they were sent, and a second of one kind pending is lost. So each `cpuprof
# signal` leaves its request as a file named by when it was made, and the launcher takes every
# request there is, in that order, whichever signal woke it.
WINDOW_ACTIONS = ("start", "stop")


def request_window(root: str | os.PathLike[str], action: str) -> None:
    """``cpuprof signal``'s side: ``action`` (start or stop) queued for the launcher of ``root``."""
    assert action in WINDOW_ACTIONS
    queue = window_requests_dir(root)
    queue.mkdir(exist_ok=True)
    name = f"{time.time_ns():020d}-{os.getpid()}-{action}"
    os.close(os.open(queue / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644))


def take_window_requests(root: str | os.PathLike[str]) -> list[str]:
    """The launcher's side: every action queued since it last looked, in the order asked, each once."""
    queue = window_requests_dir(root)
    try:
        names = sorted(os.listdir(queue))
    except OSError:
        return []
    actions = []
    for name in names:
        try:
            os.unlink(queue / name)
        except OSError:
            continue  # taken already, or not ours to take
        action = name.rsplit("-", 1)[-1]
        if action in WINDOW_ACTIONS:
            actions.append(action)
    return actions


def launcher_run_dir(pid: int) -> Path:
    """The run directory of the ``cpuprof run --on-demand`` launcher ``pid``, found by what it holds
    and wrote, not by its command line (a console script, ``python -X dev -m cpuprof``, a wrapper all
    look different): the lock it holds on its run directory (``/proc/PID/fd``), and the window
    control file there naming ``pid`` as its launcher. UsageError, one line, for anything else."""
    from ..errors import UsageError
    from .run_dir import LOCK_FILENAME

    if pid <= 0:
        raise UsageError(f"{pid}: not a process id")
    fds = Path(f"/proc/{pid}/fd")
    try:
        names = os.listdir(fds)
    except FileNotFoundError:
        raise UsageError(f"no process {pid}") from None
    except OSError as exc:
        raise UsageError(f"process {pid} cannot be inspected ({exc.strerror or exc})") from None
    held = []
    for fd in names:
        try:
            held.append(os.readlink(fds / fd))
        except OSError:
            continue  # closed since it was listed
    for target in held:
        if not target.endswith(f"/{LOCK_FILENAME}"):
            continue
        root = Path(target).parent
        try:
            control = read_versioned(control_path(root), CONTROL_FILE, WindowControl)
        except (OSError, FileFormatError):
            continue
        if control.launcher == pid:
            return root
    raise UsageError(f"process {pid} is not a `cpuprof run --on-demand` launcher (it holds no run directory whose "
                     "window control file names it); give the pid that `cpuprof run --on-demand` printed as it "
                     "started")


class Windows:
    """Opens and closes one process's profiling windows. ``run`` is the process's ChildRun: a window
    sets its ``out`` and its ``prof`` (a new profile per window) and saves through it; ``place`` is
    where the process saves inside a window's directory ("" for the program, "processes/PID")."""

    def __init__(self, run: Any, plan: WindowPlan, root: str, place: str = "",
                 lock: Any = None) -> None:
        self.run = run
        self.plan = plan
        self.root = root
        self.place = place
        self.lock = lock or threading.RLock()  # the run's own, where it saves from another thread too
        self.opened = 0  # windows opened so far
        self.is_open = False
        self.torch_imported = time.monotonic()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._seen: tuple[int, int] | None = None  # the control file's (inode, mtime) when last read
        self.lost_reasons: dict[int, str] = {}  # windows whose profile could not be saved (a full disk), why
        self._job_store = StoreWindows()  # a rank's job's store, once it joins one
        self._job_store_address: str | None = None
        self._job_store_next_look = 0.0

    def begin(self) -> None:
        target = self._on_demand if self.plan.on_demand else self._timed
        self._thread = threading.Thread(target=target, name="cpuprof-window", daemon=True)
        self._thread.start()

    # -- the two plans --------------------------------------------------------------------------
    def _timed(self) -> None:
        if self._stop.wait(self.plan.delay_s):
            return
        self.open(Path(self.run.out), window=1)
        if self.plan.duration_s is not None and not self._stop.wait(self.plan.duration_s):
            self.close()

    def _on_demand(self) -> None:
        while not self._stop.wait(POLL_S):
            try:
                self._follow_control()
            except Exception as exc:  # never the end of the program's windows: said, and on to the next poll
                _say(f"window control: {type(exc).__name__}: {exc}")
            self._follow_job_store()

    def _follow_job_store(self) -> None:
        """A rank of a torch.distributed job also takes the windows its job's store asks for
        (``cpuprof signal tcp://HOST:PORT``, :mod:`.job_windows`)."""
        jobs = self._job_store
        if jobs.failed:
            return
        if jobs.store is None:
            now = time.monotonic()
            if now < self._job_store_next_look:
                return
            self._job_store_next_look = now + 1.0  # torch.distributed read once a second until the job is joined
            rank_watch = getattr(self.run, "rank_watch", None)
            rank = rank_watch.read() if rank_watch is not None and "torch.distributed" in sys.modules else None
            if rank is None or rank.store is None:
                return
            self._job_store_address = rank.store
        try:
            asked = jobs.poll(self._job_store_address)
            if asked is not None:
                window, is_open = asked
                self._apply(WindowControl(window=window, open=is_open))
                jobs.acknowledge(window, is_open)
        except Exception as exc:  # the job's store is gone (its job ended) or refused: said once
            jobs.failed = True
            _say(f"the job's store ({self._job_store_address}) stopped answering ({type(exc).__name__}); windows "
                 "asked through it stop here, the launcher's still open and close")

    def _follow_control(self) -> None:
        path = control_path(self.root)
        try:
            info = path.stat()
        except OSError:
            return
        # Each write replaces the file (a new inode): a change within one tick of a coarse clock
        # shows there, where the modification time may not.
        changed = (info.st_ino, info.st_mtime_ns)
        if changed == self._seen:
            return
        self._seen = changed
        try:
            control = read_versioned(path, CONTROL_FILE, WindowControl)
        except Exception:
            self._seen = None  # being replaced: read it again next time
            return
        self._apply(control)

    def _apply(self, control: WindowControl) -> None:
        if control.open and control.window > self.opened:
            self.close()
            self.open(window_dir(self.root, control.window) / self.place, window=control.window)
        elif not control.open:
            self.close()

    # -- a window -------------------------------------------------------------------------------
    def open(self, out: Path, window: int) -> None:
        with self.lock:
            if self._stop.is_set():
                return
            try:
                out.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                self.opened = window  # asked for and missed: a later window opens as usual
                self.lost_reasons[window] = f"not opened: cannot make {out} ({exc.strerror or exc})"
                _say(f"window {window} {self.lost_reasons[window]}; the program runs on")
                return
            self.run.out = out
            began = time.perf_counter()
            prof = self.run.make_profiler()
            prof.warn = False
            prof.start()
            self.opened, self.is_open = window, True
            took = time.perf_counter() - began
        _say(f"window {window} open: profiling into {out} (starting the profile took {took * 1e3:.0f} ms)")

    def close(self, complete: bool = True, reason: str | None = None) -> bool:
        """Stops and saves the open window, if one is; True when one was."""
        with self.lock:
            if not self.is_open:
                return False
            self.is_open = False
            began = time.perf_counter()
            self.run.stop_profiler()
            try:
                self.run.save(complete=complete, reason=reason)
            except OSError as exc:  # a full disk, a quota: this window is lost, the program and later ones not
                self.lost_reasons[self.opened] = f"its profile could not be saved ({exc.strerror or exc})"
                _say(f"window {self.opened} lost: its profile could not be saved in {self.run.out} "
                     f"({exc.strerror or exc}); the program runs on, and later windows are saved when there is "
                     "room")
                return True
            took = time.perf_counter() - began
        _say(f"window {self.opened} closed: saved {Path(self.run.out) / 'profile.json'} (stopping and saving took "
             f"{took * 1e3:.0f} ms)")
        return True

    def end(self, complete: bool = True, reason: str | None = None) -> None:
        """The process is ending: no window opens from now on; one that is open is saved, with how
        the process ended; each window that could not be saved is marked where its profile would
        have been (if there is room now), so that the launcher's exit code says a profile was lost."""
        self._stop.set()
        self.close(complete, reason)
        for window, why in self.lost_reasons.items():
            try:
                where = window_dir(self.root, window) / self.place
                where.mkdir(parents=True, exist_ok=True)
                (where / LOST_FILENAME).write_text(f"process {os.getpid()}: {why}\n")
            except OSError:
                pass  # still no room: the process's own line said it

    def nothing_profiled(self) -> str:
        """Why a process that ended profiled nothing, in the words of its plan."""
        ran = time.monotonic() - self.torch_imported
        if self.plan.on_demand:
            return (f"no window was opened in the {ran:.1f} s it ran after importing torch (open one with "
                    f"{signal_command(self.root, 'start')})")
        return (f"the program ended {ran:.1f} s after it imported torch, before the window opened "
                f"(--delay {self.plan.delay_s:g})")


def _say(line: str) -> None:
    say(f"cpuprof: process {os.getpid()}: {line}")
