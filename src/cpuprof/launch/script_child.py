"""The script child: ``python -m cpuprof.launch.script_child LAUNCH_JSON``, what ``cpuprof run`` starts.

Started by :func:`cpuprof.launch.parent.run_child` exactly like the decode child: already pinned,
memory-bound, with the OpenMP runtime preloaded and its environment set. It runs the user's
program as ``python script.py args`` or ``python -m module args`` would (``runpy``, as
``__main__``, with that ``sys.argv`` and ``sys.path[0]``), unchanged: an import hook starts
``cpuprof.profile`` the moment torch's own import completes, so everything the program does with
torch is profiled and nothing before it (the interpreter, cpuprof) is.

However the program ends (it returns, calls ``sys.exit``, raises, or SIGINT/SIGTERM stops it),
the profile is stopped and saved to ``profile.json`` with the settings read back in force; the
parent renders the report from it. Exit code: the program's own (0 when it returns, its
``sys.exit`` status, FAILED when it raised), INTERRUPTED when interrupted (:mod:`cpuprof.exit_codes`);
a program that never imported torch, or a profiler that could not start, is one error line here and
no profile. The profiler, the settings, the saving and the launch file are the child-run base's
(:class:`cpuprof.launch.child_run.ChildRun`).
"""

from __future__ import annotations

if __name__ == "__main__":  # first: a Ctrl-C while the modules below import is held for the run
    from .child_signals import defer

    defer()

import importlib.abc
import importlib.machinery
import importlib.util
import os
import runpy
import signal
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from .. import exit_codes
from ..errors import CpuprofError
from ..model import Profile, Requested, RoofProbe, Topology
from ..safe_text import say
from . import child_signals
from .child_run import ChildRun, child_main, error_line, program_context, signal_within
from .environment import LaunchSettings
from .exec_hook import save_before_exec
from .followed_run import FollowConfig, enable
from .options import ProfileOptions
from .torch_import import TorchImportHook
from .window import WindowPlan, Windows

MODULE = "cpuprof.launch.script_child"
# One Ctrl-C in a terminal reaches this process twice: from the terminal, and forwarded by the
# parent (which forwards every signal, since one sent to the parent alone must reach us too).
# A second signal this soon after the first is that same key press.
DUPLICATE_SIGNAL_S = 0.5


@dataclass
class ScriptTarget:
    """What follows ``python`` on the command line: a script file or ``-m module``, and its arguments."""

    # Absolute, as python makes a script's __file__ (runpy.run_path also makes it sys.argv[0], where
    # python would keep the path as typed).
    path: str | None
    module: str | None
    args: list[str]


@dataclass
class ScriptConfig:
    """What the script child needs: the program, how to profile it, and the launch the parent resolved."""

    target: ScriptTarget
    profile: ProfileOptions
    launch: LaunchSettings
    requested: Requested
    cpu_set: str
    topology: Topology
    out: str
    # Every Python process the program starts that imports torch is profiled too (launch.followed).
    follow: bool = True
    window: WindowPlan = field(default_factory=WindowPlan)  # when each process profiles
    # With --roofs cached: the probe that found the cached roofs off and kept them, as the launcher's
    # roofs child read it; each process's report gives it beside the roofs it reads from the cache.
    kept_probe: RoofProbe | None = None


class Terminated(BaseException):
    """SIGTERM, raised in the program like SIGINT's KeyboardInterrupt: a BaseException, so that the
    program's ``except Exception`` handlers do not swallow it."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class ProfilerFailed(BaseException):
    """The profiler could not start when torch was imported (a bad event name, a native module built
    against another torch). Raised out of the program's ``import torch``, past its handlers."""

    def __init__(self, error: CpuprofError) -> None:
        super().__init__(str(error))
        self.error = error


@dataclass
class Ending:
    """How the program ended: the exit status it gives, and why the profile is not complete."""

    status: int
    reason: str | None  # None: the program returned, or exited with status 0
    usage: bool = False  # cpuprof, not the program, refused to go on


class ScriptRun(ChildRun):
    """One run of the program: the profile it starts, and how the run ended. Its endings are the
    program's (its exit status), so it has its own ``execute``; the rest is the base's."""

    work = "the program"

    def __init__(self, config: ScriptConfig) -> None:
        super().__init__(config.out, config.profile, config.requested, config.cpu_set, config.topology)
        self.config = config
        self.start_error: CpuprofError | None = None
        self.pid = os.getpid()
        self.launcher = os.getppid()
        self.windows: Windows | None = None
        self._last_signal = -DUPLICATE_SIGNAL_S

    # -- the profile ----------------------------------------------------------------------------
    def start_profile(self) -> None:
        """Runs inside the program's first ``import torch``, just after torch has loaded."""
        if os.getpid() != self.pid:
            # A child the program forked before it imported torch: profiled as a followed process.
            if self.config.follow:
                from . import follow_env
                from .followed_run import FollowedRun

                follow_env.current_run = FollowedRun.start_new(self.follow_config())
            return
        import torch

        try:
            # As the decode child does: the launch's thread count, whatever torch read at start-up.
            torch.set_num_threads(self.config.requested.threads)
            self.read_settings_at_start()
            self.watch_rank()
            # Held before it starts: a signal between the two would otherwise lose a running session.
            prof = self.make_profiler()  # the events are checked here, whenever profiling starts
            assert prof is not None, "cpuprof run always profiles"
            if self.config.window.whole:
                prof.start()
        except CpuprofError as exc:
            self.start_error = exc
            raise ProfilerFailed(exc) from None
        if self.config.follow:
            from .followed_run import follow_forks

            follow_forks(self.follow_config())
        threads = self.config.requested.threads
        how = f"({self.config.profile.mode} mode, {threads} thread{'s' if threads != 1 else ''})"
        if self.config.window.whole:
            self.progress.done(f"torch imported: profiling every op from here {how}")
            return
        self.prof = None  # each window makes its own
        self.windows = Windows(self, self.config.window, os.path.abspath(self.config.out))
        self.windows.begin()
        self.progress.done(f"torch imported: {self.config.window.describe(self.windows.root)} {how}")

    def follow_config(self) -> FollowConfig:
        c = self.config
        return FollowConfig(profile=c.profile, requested=c.requested, cpu_set=c.cpu_set, topology=c.topology,
                            root=os.path.abspath(c.out), window=c.window, kept_probe=c.kept_probe,
                            program_pid=self.pid)

    # -- signals --------------------------------------------------------------------------------
    def on_signal(self, signum: int, _frame: object) -> None:
        if os.getpid() != self.pid:  # a child the program forked: it behaves as it would without cpuprof
            _as_by_default(signum)
            return
        now = time.monotonic()
        if now - self._last_signal < DUPLICATE_SIGNAL_S:
            return
        self._last_signal = now
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        raise Terminated(signum)

    def _after_fork_in_child(self) -> None:
        """A child the program forks never runs cpuprof's handlers (a followed one sets its own): they
        would raise cpuprof's exceptions, and print their tracebacks, in the program's workers."""
        for signum, default in ((signal.SIGINT, signal.default_int_handler), (signal.SIGTERM, signal.SIG_DFL)):
            if signal.getsignal(signum) == self.on_signal:
                signal.signal(signum, default)

    # -- the program ----------------------------------------------------------------------------
    def run_program(self) -> Ending:
        """Runs the program to its end, however it ends."""
        target = self.config.target
        try:
            if target.module is not None:
                if not _module_exists(target.module):
                    return Ending(status=exit_codes.USAGE, usage=True,
                                  reason=f"no module named {target.module!r} (python -m {target.module})")
                # As python -m does: sys.path[0] stays the working directory (already so under our -m).
                sys.argv = [target.module, *target.args]
                runpy.run_module(target.module, run_name="__main__", alter_sys=True)
            else:
                assert target.path is not None
                sys.argv = [target.path, *target.args]
                # As python script.py does: the script's own directory first on sys.path, not ours.
                sys.path[0] = os.path.dirname(os.path.realpath(target.path))
                runpy.run_path(target.path, run_name="__main__")
        except SystemExit as exc:
            return _exit_ending(exc.code)
        except KeyboardInterrupt:
            return interrupted_ending(signal.SIGINT)
        except Terminated as exc:
            return interrupted_ending(exc.signum)
        except ProfilerFailed as exc:
            return Ending(status=exc.error.exit_code, reason=str(exc.error), usage=True)
        except BaseException as exc:  # the program's own failure: its traceback, as Python would print it
            if isinstance(signal_within(exc), KeyboardInterrupt):  # a Ctrl-C inside a class being created
                return interrupted_ending(signal.SIGINT)
            _print_program_traceback(exc)
            what = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            return Ending(status=exit_codes.FAILED, reason=f"the program raised {what.splitlines()[0]}")
        return Ending(status=0, reason=None)

    # -- the end --------------------------------------------------------------------------------
    def finish(self, ending: Ending) -> int:
        """Stops the profile and saves it; the one error line when there is nothing to save."""
        if self.start_error is not None:  # even if the program caught ProfilerFailed and went on
            error_line(str(self.start_error))
            return self.start_error.exit_code
        if ending.usage:
            self.stop_profiler()
            error_line(f"{ending.reason}")
            return ending.status
        if self.windows is not None:
            return self.finish_windows(ending)
        if not self.profiled and self.followed_any():
            # The program's own process never imported torch, the processes it started did.
            self.save(complete=ending.status == exit_codes.OK, reason=ending.reason)
            return ending.status
        if not self.profiled:
            ran = f"it ran for {time.monotonic() - self.started:.1f} s"
            how = f"{ending.reason}; " if ending.reason else ""
            error_line(f"nothing was profiled: torch was never imported ({how}{ran}); cpuprof profiles a program "
                       "from its first `import torch`")
            return ending.status or exit_codes.FAILED
        self.stop_profiler()
        self.save(complete=ending.status == exit_codes.OK, reason=ending.reason)
        return ending.status

    def finish_windows(self, ending: Ending) -> int:
        """The end of a run profiled in windows: an open window is saved; the program's own
        profile.json in the output directory is its window's (--delay) or, --on-demand, its
        settings and ending, the windows being in window-N."""
        assert self.windows is not None
        complete = ending.status == exit_codes.OK
        self.windows.end(complete=complete, reason=ending.reason)
        if self.windows.opened == 0 and not self.followed_any():
            error_line(f"nothing was profiled: {self.windows.nothing_profiled()}")
            return ending.status or exit_codes.FAILED
        if self.windows.opened == 0 or self.config.window.on_demand:
            self.out, self.prof = Path(self.config.out), None
            self.save(complete=complete, reason=ending.reason)
        return ending.status

    def read_settings(self, tensors: Any = None) -> None:
        super().read_settings(tensors)
        if not self.config.follow:
            return
        from ..model import format_cpulist
        from .followed_run import read_front_end

        freed = read_front_end(self.config.out, self.pid)
        if freed is None:
            return
        self.settings.front_end = freed
        self.settings.given_back = [
            f"{freed.threads} thread{'s' if freed.threads != 1 else ''} on CPUs {format_cpulist(freed.cpus_from)} → "
            f"the launch's {format_cpulist(freed.cpus_to)}, by process {freed.by_pid} as it imported torch: the "
            "program's process started it before running an OpenMP team (a front end, which the launch's binding had "
            "put on one CPU)"]
        in_force = self.settings.in_force
        team = [t for t in in_force.threads if set(t.affinity) < set(freed.cpus_to)
                and t.affinity != freed.cpus_from] if in_force is not None else []
        if team:
            # libgomp bound its initial thread once, as it loaded: a team formed since binds its other
            # threads to their places, and the first, moved off its own, runs wherever it is scheduled.
            self.settings.warnings.append(
                f"the program's process was given the launch's CPU set as a front end, then bound {len(team)} "
                f"thread{'s' if len(team) != 1 else ''} to single places (an OpenMP team formed after its workers "
                "started): the team's first thread is not bound to its place; --bind none, or a parallel op "
                "before the workers start, keeps the team's placement whole")

    def followed_any(self) -> bool:
        from ..model.run_layout import processes_dir

        # Started, not saved: a followed process saves its profile when it ends, maybe after this one.
        base = processes_dir(self.config.out)
        return self.config.follow and base.is_dir() and any(p.name.isdigit() for p in base.iterdir())

    def contribute(self, profile: Profile, complete: bool) -> None:
        program_context(self, kept_probe=self.config.kept_probe)
        if complete:
            self.probe_memory_at_end()

    def probe_memory_at_end(self) -> None:
        """After a long program, whether the memory is still in the state its cached roof was measured
        or probed in (the program has finished its work: nothing of its own reads memory beside the
        probe). Not in a rank of a group, whose probes would read the other ranks' traffic."""
        from ..machine import roofs

        ran = time.monotonic() - self.started
        in_group = os.environ.get("WORLD_SIZE", "1").strip() not in ("", "1")
        if self.roofs is None or ran < roofs.end_probe_after_s() or in_group:
            return
        checked = roofs.probe_at_end(self.roofs)
        self.roofs.end_probe = checked
        if checked is not None and checked.outcome == "changed":
            say(f"cpuprof: note: at the end of the program the memory read {checked.gb_per_s:.1f} GB/s, "
                f"{checked.ratio:.0%} of the {checked.cached_gb_per_s:.1f} GB/s roof it is judged against: it changed "
                "state during the run")

    def before_exec(self, program: str) -> None:
        """The program is about to exec ``program``: what it measured is saved now (nothing of this
        process runs after), marked as ended by the exec."""
        what = "what it became is profiled as a followed process" if self.config.follow else \
            "what it became is not profiled"
        reason = f"the program exec'd {program}: {what}"
        if self.windows is not None:
            self.windows.end(complete=False, reason=reason)
        else:
            self.stop_profiler()
            self.save(complete=False, reason=reason if self.profiled else
                      f"the program exec'd {program} before it imported torch: nothing was profiled")
        say(f"cpuprof: the program exec'd {program}: its profile up to the exec is saved in {self.out}")

    def execute(self) -> int:
        save_before_exec(self.before_exec)
        hook = TorchImportHook(self.start_profile)
        hook.install()
        if self.config.follow:
            enable(self.follow_config())
        signal.signal(signal.SIGINT, self.on_signal)
        signal.signal(signal.SIGTERM, self.on_signal)
        os.register_at_fork(after_in_child=self._after_fork_in_child)
        early = child_signals.take_pending()  # came while this child imported its own modules
        try:
            if early is not None:
                ending = interrupted_ending(early, before_start=True)
            else:
                ending = self.run_program()
        finally:
            hook.remove()
            # Whatever arrives now would cut the saving of what was measured short.
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        try:
            return self.finish(ending)
        except Exception as exc:
            if os.environ.get("CPUPROF_DEBUG"):
                raise
            error_line(f"saving the profile failed ({type(exc).__name__}: {exc}) (set CPUPROF_DEBUG=1 for the "
                       "traceback)")
            return exit_codes.FAILED
        finally:
            if self.config.follow and os.getpid() == self.pid and os.getppid() != self.launcher:
                # The launcher died (its death sent the SIGTERM that ended the program): it cannot
                # end the followed processes, so this process does, as the launcher would have.
                from .followed_run import end_followed

                end_followed(self.config.out)


def interrupted_ending(signum: int, before_start: bool = False) -> Ending:
    """SIGINT or SIGTERM: the status a shell gives a program its signal ended, 128 + the signal's
    number (130 for Ctrl-C, 143 for SIGTERM), which is what the program would have died of here."""
    name = signal.Signals(signum).name
    when = " before it started" if before_start else ""
    return Ending(status=exit_codes.of_signal(signum), reason=f"the program was interrupted by {name}{when}")


def _as_by_default(signum: int) -> None:
    """What ``signum`` does to a Python process that never set a handler of its own."""
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def _module_exists(name: str) -> bool:
    """Whether python -m could find ``name``; finding a submodule imports its packages, as python -m does."""
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError as exc:
        if exc.name is not None and (name == exc.name or name.startswith(exc.name + ".")):
            return False  # a package on its path is missing
        raise  # a package on the path failed to import something of its own: the program's failure


def _exit_ending(code: object) -> Ending:
    """``sys.exit(code)`` as the interpreter would end: None is 0, a number its status, anything else is
    printed to stderr and is status 1."""
    if code is None:
        return Ending(status=0, reason=None)
    if isinstance(code, int):
        status = code & 0xFF  # what the parent's wait() sees
        return Ending(status=status, reason=f"the program exited with status {code}" if status else None)
    print(code, file=sys.stderr)
    return Ending(status=1, reason="the program exited with status 1")


def _print_program_traceback(exc: BaseException) -> None:
    """The program's traceback from its own first frame: runpy's and this module's frames above it
    are cpuprof's, not the program's."""
    # As the code objects name their files: runpy is "<frozen runpy>" where it is frozen.
    internal = {runpy.run_path.__code__.co_filename, _print_program_traceback.__code__.co_filename}
    tb: TracebackType | None = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename in internal:
        tb = tb.tb_next
    traceback.print_exception(type(exc), exc, tb)


def main(argv: list[str]) -> int:
    return child_main(argv, ScriptConfig, ScriptRun)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
