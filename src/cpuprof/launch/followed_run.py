"""A followed process's profile (:mod:`.followed` says how a process comes to be followed), and
what the launcher does with the followed processes once the program has ended.

Loaded in a followed process only once it has imported torch; the script child loads it to
:func:`enable` following before it runs the program.
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import defaults
from ..errors import FileFormatError
from ..model import FrontEndGivenBack, Profile, Requested, RoofProbe, Topology, format_cpulist
from ..model.io import FileKind, read_versioned, write_versioned
from ..model.run_layout import FRONT_END_FILENAME, PROCESSES_DIRNAME, process_dir, process_place, processes_dir
from ..safe_text import say
from . import follow_env
from .child_run import CHECKPOINT_REASON, ChildRun, program_context, remove_perf_map
from .environment import OWNED_VARS
from .exec_hook import save_before_exec
from .follow_env import FOLLOW_ENV, warn
from .options import ProfileOptions
from .window import WindowPlan, Windows

FOLLOW_FILE = FileKind(name="follow file", format="cpuprof-follow", version=1, filename="follow.json",
                       written_by="cpuprof run")
# Written by the process that found the program's process a front end (follow_env.free_the_front_end),
# read by the program's process for its settings.
FRONT_END_FILE = FileKind(name="front end's CPU set", format="cpuprof-front-end", version=1,
                          filename=FRONT_END_FILENAME, written_by="a process cpuprof run followed")
BOOT_DIRNAME = "follow_boot"  # holds the sitecustomize.py every followed Python runs as it starts
# A followed process spends at most 1/CHECKPOINT_SHARE of its time saving checkpoints. Not 1/20: a
# save's CPU comes out of the program's (on a machine its OpenMP team fills, out of every thread of
# the team), and a serving engine is to keep 0.95 of its throughput, all costs together; vLLM's
# worker takes about 0.4 s to save, so it saves every 40 s rather than every 8.
CHECKPOINT_SHARE = 100
START_FILENAME = "started"  # processes/<pid>/started: the process's start time, in clock ticks since boot
# How long the launcher gives followed processes still running when the program has ended to save
# their profiles (a SIGTERM asks them), before it kills them.
END_GRACE_S = 10.0
# How long the SIGTERM watcher gives the main thread's handler before it ends the process itself.
SIGTERM_HANDLER_GRACE_S = 1.0
# compare()'s warnings about the launch's thread count and variables, which a followed process's are not
_THREAD_WARNINGS = ("threads:", *(f"{key}:" for key in OWNED_VARS))


@dataclass
class FollowConfig:
    """What a followed process needs to profile itself as the run's program is profiled."""

    profile: ProfileOptions
    requested: Requested  # the launch the program was started under
    cpu_set: str
    topology: Topology
    root: str  # the run's output directory; each process saves under processes/<pid>
    window: WindowPlan = field(default_factory=WindowPlan)  # when each process profiles
    kept_probe: RoofProbe | None = None  # as ScriptConfig's: --roofs cached kept the roofs it disagreed with
    program_pid: int | None = None  # the program's process (a front end is only ever that one)


def read_front_end(root: str | os.PathLike[str], pid: int) -> FrontEndGivenBack | None:
    """What a followed process said it did to process ``pid``'s CPU set, if anything; a file that is
    not one, or about another process, says nothing (it is read back as untrusted input)."""
    path = Path(root) / FRONT_END_FILE.filename
    if not path.is_file():
        return None
    try:
        said = read_versioned(path, FRONT_END_FILE, FrontEndGivenBack)
    except (FileFormatError, OSError):
        return None
    return said if said.pid == pid else None


def boot_dir() -> str:
    return str(Path(__file__).resolve().parent / BOOT_DIRNAME)


def enable(config: FollowConfig, environ: Any = os.environ) -> Path:
    """Writes the follow file and sets ``environ`` so that every Python started with it is followed."""
    # An earlier run's processes (a directory reused with --overwrite) are not this run's.
    shutil.rmtree(processes_dir(config.root), ignore_errors=True)
    (Path(config.root) / FRONT_END_FILE.filename).unlink(missing_ok=True)
    path = write_versioned(Path(config.root) / FOLLOW_FILE.filename, FOLLOW_FILE, config)
    environ[FOLLOW_ENV] = str(path)
    previous = environ.get("PYTHONPATH")
    environ["PYTHONPATH"] = boot_dir() + (os.pathsep + previous if previous else "")
    return path


def start_followed(path: str) -> FollowedRun | None:
    """In a followed process that has just imported torch: its profile, started."""
    return FollowedRun.start_new(read_versioned(path, FOLLOW_FILE, FollowConfig))


def process_role() -> str:
    """What the process is to its program: its multiprocessing name, the title it gave itself
    (setproctitle rewrites the command line), or what python ran."""
    mp = sys.modules.get("multiprocessing")
    if mp is not None:
        name = mp.current_process().name
        if name != "MainProcess":
            return name
    try:
        cmdline = Path("/proc/self/cmdline").read_bytes().split(b"\0")
        title = cmdline[0].decode(errors="replace") if cmdline else ""
    except OSError:
        title = ""
    if title and not os.path.basename(title).startswith("python") and len([c for c in cmdline if c]) == 1:
        return title  # a title set with setproctitle: one word, no arguments
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if spec is not None and spec.name:
        return f"python -m {spec.name.removesuffix('.__main__')}"
    argv0 = sys.argv[0] if sys.argv else ""
    if argv0 in ("-c", ""):
        return "python -c"
    return f"python {os.path.basename(argv0)}"


def next_checkpoint_in(took_s: float, checkpoint_s: float) -> float:
    """Seconds to the next checkpoint after one that took ``took_s``: ``checkpoint_s``, or longer
    where saving is slow, so that saving never takes more than 1/CHECKPOINT_SHARE of the time."""
    return max(checkpoint_s, CHECKPOINT_SHARE * took_s)


class FollowedRun(ChildRun):
    """One followed process's profile: started once torch is imported, saved at the process's end
    and at checkpoints. The program runs as it would without cpuprof; nothing here raises into it."""

    work = "the followed process"

    def __init__(self, config: FollowConfig) -> None:
        pid = os.getpid()
        out = process_dir(config.root, pid)
        super().__init__(out, config.profile, config.requested, config.cpu_set, config.topology,
                         checkpoint_s=defaults.CHECKPOINT_S)
        self.config = config
        self.pid = pid
        self.ending: str | None = None  # why the profile is incomplete, once the process is ending
        self._lock = threading.RLock()  # one save at a time: the checkpoint thread's, a window's, the exit's
        self.windows: Windows | None = None
        self._saved_final = False
        self._stop = threading.Event()
        self._ending = False  # the final save has begun
        self._saved = False  # the final save is done
        self._terminated = False  # a SIGTERM came: the process dies of it once saved
        self._ending_complete = False  # the ending is the process's normal end (a pool's worker told to stop)
        self._wakeup_fds: tuple[int, int] | None = None  # the SIGTERM watcher's pipe (read, write)
        self._end_guard = threading.RLock()  # makes "the final save has begun" one thread's (a handler may re-enter)
        self._saver: threading.Thread | None = None  # the thread doing the final save
        self._final_saved = threading.Event()
        self._libc_signal: Any = None  # libc's signal(), looked up before it is needed
        self.start_ns = 0  # wall time starting the profile took (begin())
        self.checkpoints = 0  # saved by the checkpoint thread, and the wall time they took
        self.checkpoint_ns = 0

    @classmethod
    def start_new(cls, config: FollowConfig) -> FollowedRun | None:
        """A profile of this process, started; None (and one warning line) when it could not start:
        the program runs on, unprofiled."""
        began = time.perf_counter_ns()
        try:
            run = cls(config)
            run.begin(began)
        except Exception as exc:
            warn(f"not profiled: {type(exc).__name__}: {exc}")
            return None
        return run

    def begin(self, began_ns: int | None = None) -> None:
        """Creates processes/<pid>, starts the profile and arranges for it to be saved. ``began_ns``
        (perf_counter_ns): when starting it began, for the profile's own start-up figure."""
        began_ns = time.perf_counter_ns() if began_ns is None else began_ns
        self.out.mkdir(parents=True, exist_ok=True)
        # How the launcher tells this process from a later one given the same pid: its start time.
        (self.out / START_FILENAME).write_text(str(_start_time(self.pid)))
        self._free_the_front_end()
        _preload_saving()
        self.read_settings_at_start()
        self.watch_rank()
        prof = self.make_profiler()  # the events are checked here, whenever profiling starts
        if prof is None:
            return
        prof.warn = False  # the profile keeps its limitations; a line per process would bury the program's output
        plan = self.config.window
        if plan.whole:
            prof.start()
        else:
            self.prof = None  # each window makes its own
            self.windows = Windows(self, plan, self.config.root, process_place(self.pid), lock=self._lock)
            self.windows.begin()
        # Before the handlers below can save: a pool's idle worker may be told to end right away.
        self.start_ns = time.perf_counter_ns() - began_ns
        atexit.register(self.end)
        save_before_exec(self._before_exec, drop_env=(FOLLOW_ENV,))
        self._at_multiprocessing_exit()
        if _left_to_default(signal.getsignal(signal.SIGTERM)) and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._on_sigterm)
            self._watch_sigterm()
        follow_forks(self.config)
        threading.Thread(target=self._checkpoints, name="cpuprof-checkpoint", daemon=True).start()
        when = ("every op from its import of torch" if plan.whole
                else plan.describe(self.config.root).removeprefix("profiling "))
        say(f"cpuprof: following process {self.pid} ({process_role()}): {when}, into {self.out}")

    def _free_the_front_end(self) -> None:
        program = self.config.program_pid
        if program is None:
            return
        record = Path(self.config.root) / FRONT_END_FILE.filename

        said: list[bool] = []

        def say_first(threads: int, bound: list[int], launch: list[int]) -> None:
            record_of = FrontEndGivenBack(pid=program, by_pid=self.pid, threads=threads, cpus_from=bound,
                                          cpus_to=launch)
            try:
                write_versioned(record, FRONT_END_FILE, record_of)
                said.append(True)
            except OSError as exc:  # its threads are moved all the same; only the program's profile will not say so
                warn(f"the program's process is given the launch's CPU set, but saying so failed: {exc}")

        if not follow_env.free_the_front_end(program, before_moving=say_first) and said:
            record.unlink(missing_ok=True)  # no thread could be moved after all

    def _before_exec(self, program: str) -> None:
        """This process is about to exec ``program``: its final save, now. What it becomes is not
        followed (it would take this pid's directory and write over this profile)."""
        self.ending = f"it exec'd {program}: what it became is not profiled"
        self.end()
        say(f"cpuprof: process {self.pid} exec'd {program}: its profile up to the exec is saved in {self.out}")

    def _at_multiprocessing_exit(self) -> None:
        """A process multiprocessing started ends with os._exit, after its own exit function
        (which runs the finalizers with an exit priority): atexit never runs there."""
        from multiprocessing import util

        util.Finalize(self, FollowedRun.end, args=(self,), exitpriority=-100)
        # Process._bootstrap clears the finalizers before it runs the target (torch may have been
        # imported while the process object was unpickled, before that), then runs these.
        util.register_after_fork(self, FollowedRun._finalize_again)

    def _finalize_again(self) -> None:
        if os.getpid() == self.pid:
            from multiprocessing import util

            util.Finalize(self, FollowedRun.end, args=(self,), exitpriority=-100)

    def _on_sigterm(self, signum: int, _frame: object) -> None:
        """The program left SIGTERM to its default, to die of it: save, then die of it. One that
        comes while the profile is being saved (Pool.terminate sends them as workers end) waits
        for the save."""
        if os.getpid() != self.pid or self._saved:
            self._die_of_sigterm()  # a forked copy's, or the profile is saved: nothing to wait for
            return
        self._terminated = True
        if self._ending:
            if self._saver is threading.current_thread():
                return  # this thread's own save, interrupted: it dies of it when done
            # Another thread's save (the watcher's, the checkpoint's): the program must not go on
            # meanwhile, nor end before it is written.
            self._final_saved.wait(END_GRACE_S)
            self._die_of_sigterm()
            return
        if _a_pool_worker():
            # multiprocessing.Pool ends its workers with SIGTERM when it closes: the worker's own end,
            # not a cut-short profile.
            self.ending, self._ending_complete = "ended by its pool's shutdown (SIGTERM, as multiprocessing.Pool " \
                "ends its workers)", True
        else:
            self.ending = "ended by SIGTERM"
        self.end()

    def _die_of_sigterm(self) -> None:
        try:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        except ValueError:  # not the main thread (the watcher's): below Python's signal module
            if self._libc_signal is not None:
                self._libc_signal(signal.SIGTERM, None)  # SIG_DFL
            else:
                os.kill(os.getpid(), signal.SIGKILL)  # no way to the default: die anyway
        os.kill(os.getpid(), signal.SIGTERM)

    def _watch_sigterm(self) -> None:
        """Python runs a signal's handler in the main thread, between two bytecodes. A SIGTERM
        that reaches the process while its main thread waits in a lock (a pool worker waiting for
        work, which Pool.terminate() ends with SIGTERM while it holds the queue's lock), or that the
        kernel gives another thread, would wait for a bytecode that never comes, and the worker's
        owner would join it forever (a process that keeps SIGTERM's default just dies). The
        signal's wakeup byte reaches a thread of cpuprof's as well; if the handler has not begun
        within SIGTERM_HANDLER_GRACE_S, that thread saves and dies of the signal. Without it if the
        program has a wakeup fd of its own (asyncio's): then its main thread runs a loop anyway."""
        try:
            import ctypes

            libc_signal = ctypes.CDLL(None).signal  # looked up now: a dlopen while dying could block
            libc_signal.argtypes = [ctypes.c_int, ctypes.c_void_p]
            libc_signal.restype = ctypes.c_void_p
            read_fd, write_fd = os.pipe()
        except (OSError, AttributeError):
            return
        try:
            os.set_blocking(write_fd, False)
            previous = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
        except (OSError, ValueError):
            previous = None
        if previous != -1:
            if previous is not None:
                signal.set_wakeup_fd(previous)
            os.close(read_fd)
            os.close(write_fd)
            return
        self._wakeup_fds = (read_fd, write_fd)
        self._libc_signal = libc_signal
        threading.Thread(target=self._sigterm_watcher, args=(read_fd,), name="cpuprof-sigterm", daemon=True).start()

    def _sigterm_watcher(self, read_fd: int) -> None:
        while True:
            try:
                received = os.read(read_fd, 64)  # one byte per signal: its number
            except OSError:
                return
            if not received or os.getpid() != self.pid:
                return
            if signal.SIGTERM not in received or not self._handles_sigterm():
                continue  # another signal, or the program's own handler of SIGTERM since
            deadline = time.monotonic() + SIGTERM_HANDLER_GRACE_S
            while not self._terminated and time.monotonic() < deadline:
                time.sleep(0.02)
            if not self._terminated and self._handles_sigterm():  # the handler never ran: do its work
                self._on_sigterm(signal.SIGTERM, None)

    def _handles_sigterm(self) -> bool:
        return signal.getsignal(signal.SIGTERM) == self._on_sigterm

    def _checkpoints(self) -> None:
        """A checkpoint every ``checkpoint_s``, or less often where saving is slow
        (:func:`next_checkpoint_in`): a large profile on a busy machine takes a second to save, and
        that second is CPU taken from the program."""
        wait_s = self.checkpoint_s
        try:  # the first save's symbol tables, read now: a serving engine is still starting up
            from ..collect.symbols import warm_up

            warm_up()
        except Exception:  # the saves read what they need themselves
            pass
        while not self._stop.wait(wait_s):
            try:
                with self._lock:
                    if self._saved_final or os.getpid() != self.pid:
                        return
                    if self.windows is None or self.windows.is_open:  # between windows there is nothing new
                        began = time.monotonic()
                        self.save(complete=False, reason=CHECKPOINT_REASON)
                        took = time.monotonic() - began
                        self.checkpoints += 1
                        self.checkpoint_ns += int(took * 1e9)
                        wait_s = next_checkpoint_in(took, self.checkpoint_s)
            except Exception as exc:  # a full disk: the final save says so again
                warn(f"a checkpoint of the profile failed ({type(exc).__name__}: {exc})")
                return

    def read_settings(self, tensors: Any = None) -> None:
        """As the program's, but the launch's thread count and variables are the program's process's
        (this one was given back the values from before the launch as it started): no warnings about
        those; the ones it began with that differ from them, its program set for it. The launch's CPU
        set, memory policy and preloads it inherits: their warnings stay."""
        super().read_settings(tensors)
        self.settings.warnings = [w for w in self.settings.warnings if not w.startswith(_THREAD_WARNINGS)]
        if follow_env.cpus_given_back is not None:
            inherited, launch = follow_env.cpus_given_back
            self.settings.given_back = [
                f"CPU set {format_cpulist(inherited)} → {format_cpulist(launch)} as it started (it inherited the CPU "
                "set of the OpenMP-bound thread that started it, not the launch's)"]
        if follow_env.front_end_freed is not None:
            parent, threads, bound = follow_env.front_end_freed
            self.settings.given_back.append(
                f"its parent's {threads} thread{'s' if threads != 1 else ''} on CPUs {format_cpulist(bound)} → "
                f"the launch's (pid {parent}, a front end: it started this process before running an OpenMP team)")
        before = follow_env.before_launch
        began = self.settings.at_start or self.settings.in_force
        if before is None or began is None:
            return  # forked from a followed process: its parent's variables, inherited as they were
        self.settings.from_program = [
            f"{key}={began.env[key]}" if key in began.env else f"{key} unset"
            for key in OWNED_VARS if began.env.get(key) != before.get(key)
        ]

    def contribute(self, profile: Profile, complete: bool) -> None:
        from . import follow_env

        program_context(self, note=False, kept_probe=self.config.kept_probe)
        profile.meta.role = process_role()
        if profile.overhead is not None:
            profile.overhead.boot_ns = follow_env.boot_ns + self.start_ns
            profile.overhead.checkpoints = self.checkpoints
            profile.overhead.checkpoint_ns = self.checkpoint_ns

    def end(self) -> None:
        """The final save, once, whichever way the process ends first."""
        with self._end_guard:
            if os.getpid() != self.pid or self._ending:  # a forked copy (the parent saves this profile), or saving
                return
            self._ending = True
            self._saver = threading.current_thread()
        self._stop.set()
        if not self._lock.acquire(timeout=END_GRACE_S / 2):
            warn("its profile was not saved: a checkpoint held the profile too long")
            if self._terminated:  # a process told to end must end: its owner may be waiting to join it
                self._die_of_sigterm()
            return
        try:
            if self._saved_final:
                return
            self._saved_final = True
            try:
                complete = self.ending is None or self._ending_complete
                if self.windows is not None:
                    self.windows.end(complete=complete, reason=self.ending)
                else:
                    self.stop_profiler()
                    self.save(complete=complete, reason=self.ending)
            except Exception as exc:
                warn(f"its profile could not be saved ({type(exc).__name__}: {exc})")
            finally:
                remove_perf_map()
        finally:
            self._saved = True
            self._final_saved.set()
            self._lock.release()
        if self._terminated:
            self._die_of_sigterm()


_PACKAGE_DIR = str(Path(__file__).resolve().parent.parent) + os.sep


def _a_pool_worker() -> bool:
    """This process is a worker of a multiprocessing.Pool (which names them ForkPoolWorker-N,
    SpawnPoolWorker-N, ForkServerPoolWorker-N)."""
    mp = sys.modules.get("multiprocessing")
    if mp is None:
        return False
    try:
        return mp.parent_process() is not None and "PoolWorker-" in mp.current_process().name
    except Exception:  # noqa: BLE001 (the program's multiprocessing state, whatever it is, must not stop the save)
        return False


def _left_to_default(handler: object) -> bool:
    """SIGTERM's default, or a handler of cpuprof's copied into a forked child (the program's own
    process or a followed one): the program has none of its own."""
    if handler is signal.SIG_DFL:
        return True
    code = getattr(getattr(handler, "__func__", handler), "__code__", None)
    # By file: the script child's module runs as __main__, so its classes' module names say nothing.
    return code is not None and os.path.realpath(code.co_filename).startswith(_PACKAGE_DIR)


class _ForkFollower:
    """What a child that multiprocessing forks from a profiled process profiles itself with."""

    config: FollowConfig | None = None
    registered = False


_FORKS = _ForkFollower()


def follow_forks(config: FollowConfig) -> None:
    """Children that multiprocessing forks from this process (the program's own, or a followed one)
    start a profile of their own, as the spawned ones do."""
    _FORKS.config = config
    if not _FORKS.registered:
        os.register_at_fork(after_in_child=_after_fork_in_child)
        _FORKS.registered = True


def _after_fork_in_child() -> None:
    """Between fork and whatever the child does next: only note that a multiprocessing child must
    start its profile when multiprocessing runs its after-fork hooks (in ``Process._bootstrap``).
    Nothing is imported here (another thread may have held the import lock at fork); a child that
    execs (subprocess) never gets there and is followed, if it is a Python, by its environment."""
    from . import follow_env

    inherited = follow_env.current_run
    follow_env.current_run = None  # the parent's, copied: the native core has stopped it in this child
    if inherited is not None and signal.getsignal(signal.SIGTERM) == inherited._on_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # until this child's own profile sets it again
    if inherited is not None and inherited._wakeup_fds is not None:
        # The parent's watcher pipe: a signal here must not wake the parent's watcher.
        read_fd, write_fd = inherited._wakeup_fds
        try:
            previous = signal.set_wakeup_fd(-1)
            if previous not in (-1, write_fd):
                signal.set_wakeup_fd(previous)  # the program's own since: put it back
        except ValueError:
            pass
        for fd in (read_fd, write_fd):
            try:
                os.close(fd)
            except OSError:
                pass
    util = sys.modules.get("multiprocessing.util")
    if util is not None and _FORKS.config is not None:
        util.register_after_fork(_FORKS, _start_in_forked_child)


def _start_in_forked_child(forks: _ForkFollower) -> None:
    from . import follow_env

    current = follow_env.current_run
    if forks.config is not None and (current is None or current.pid != os.getpid()):
        follow_env.current_run = FollowedRun.start_new(forks.config)


# -- in the launcher, once the program has ended ------------------------------------------------------
def end_followed(root: str | os.PathLike[str]) -> None:
    """No followed process outlives the run: those still running when the program has ended get a
    SIGTERM (they save their profile), then, after END_GRACE_S, a SIGKILL (their last checkpoint
    stands). Looked for again at every poll: a pool whose owner is saving may start new workers."""
    signalled: set[int] = set()
    alive: list[int] = []
    try:
        deadline = time.monotonic() + END_GRACE_S
        while True:
            alive = followed_alive(root)
            for pid in alive:
                if pid not in signalled:
                    _signal(pid, signal.SIGTERM)
                    signalled.add(pid)
            if not alive or time.monotonic() >= deadline:
                break
            time.sleep(0.05)
    finally:  # a second Ctrl-C during the grace period still leaves none behind
        for pid in followed_alive(root):
            _signal(pid, signal.SIGKILL)


def followed_alive(root: str | os.PathLike[str]) -> list[int]:
    """The followed processes of the run in ``root`` (and its windows) still running: each is the
    pid of a processes/<pid> whose process has the start time it wrote there, and is no zombie."""
    alive = []
    for started in Path(root).glob(f"**/{PROCESSES_DIRNAME}/*/{START_FILENAME}"):
        pid_text = started.parent.name
        if not pid_text.isdigit():
            continue
        try:
            recorded = int(started.read_text())
        except (OSError, ValueError):
            continue
        pid = int(pid_text)
        if _start_time(pid) == recorded and pid not in alive:
            alive.append(pid)
    return alive


def _start_time(pid: int) -> int | None:
    """When ``pid`` started (clock ticks since boot, /proc/PID/stat field 22); None when it is gone
    or a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[-1].split()  # after the name, which may hold spaces and parentheses
    if fields[0] == "Z":
        return None
    return int(fields[19])


def _preload_saving() -> None:
    """Imports what saving a profile needs, now: a save from a signal handler or at exit must not
    wait on an import the interrupted main thread holds the lock of (a deadlock)."""
    from ..analysis import roofline  # noqa: F401
    from ..exports import roofline_svg  # noqa: F401
    from ..machine import roofs  # noqa: F401
    from . import in_force  # noqa: F401


def _signal(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except (ProcessLookupError, PermissionError):
        pass
