"""The child-run base: what every launched child does, whatever it runs, in one place.

A launched child (``python -m cpuprof.launch.<child> out_dir/launch.json``) is started by
:mod:`cpuprof.launch.parent` already pinned, memory-bound and with the OpenMP environment set.
Whatever it runs (a built-in decode: :mod:`.child`; the user's program: :mod:`.script_child`),
it does the same things at its start and at its end, here:

- reads ``launch.json`` (:func:`read_launch_file`; the parent wrote it with :func:`write_launch_file`);
- holds SIGINT and SIGTERM from the child's first line (:mod:`.child_signals`), so that an
  interrupt at any moment, imports included, is the interrupted ending;
- records a crash's Python stacks (:func:`record_crashes`) and removes oneDNN's perf map at exit
  (the launcher removes it when the child could not: killed);
- builds the profiler from :class:`~cpuprof.launch.options.ProfileOptions`, event names checked
  once, before any slow setup (:meth:`ChildRun.make_profiler`);
- reads back the settings in force (:meth:`ChildRun.read_settings`);
- saves ``profile.json`` with the settings, roofs and status, and ``roofline.svg`` beside it
  (:meth:`ChildRun.save`), every few seconds while it runs (:meth:`ChildRun.checkpoint_if_due`);
- turns every ending into an exit code of :mod:`cpuprof.exit_codes` and, when it failed, one
  ``cpuprof: error:`` line naming what failed, where, and what was kept (:meth:`ChildRun.execute`).

A new kind of child subclasses :class:`ChildRun`, provides ``steps()`` (and, if it has a workload
of its own, ``contribute()``) and has a ``main`` of one line: ``child_main(argv, ItsConfig, ItsRun)``.

Kept free of torch and numpy at import: the script child imports it before the user's program
runs, and the program should import those itself, if at all.
"""

from __future__ import annotations

import faulthandler
import math
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO, TypeVar

from .. import exit_codes
from ..errors import CpuprofError, FileFormatError
from ..model import PROFILE_FILENAME, MachineRoofs, Meta, Profile, Requested, RoofProbe, Settings, Status, Topology
from ..model.io import FileKind, read_versioned, write_versioned
from ..output_file import write_text
from ..safe_text import printable, say
from . import child_signals
from .child_signals import SignalReceived
from .distributed_rank import RankWatch
from .options import CRASH_FILENAME, ProfileOptions
from .progress import Progress

C = TypeVar("C")

# What the launcher tells its child. Version 1 is the first with a header; files written before
# (the same content, no header) are read as version 1.
LAUNCH_FILE = FileKind(name="launch file", format="cpuprof-launch", version=1, filename="launch.json",
                       written_by="cpuprof decode, run or calibrate", headerless_version=1)
LAUNCH_FILENAME = LAUNCH_FILE.filename
ROOFLINE_FILENAME = "roofline.svg"  # beside profile.json: the GEMMs on the roofline chart
CHECKPOINT_REASON = "checkpoint: the run was still going"
# Set by the parent when cpuprof, not the user, asked oneDNN for a perf map (see launch.parent).
REMOVE_PERF_MAP = "CPUPROF_REMOVE_PERF_MAP"


# -- the launch file --------------------------------------------------------------------------------
def write_launch_file(out_dir: Path, config: object) -> Path:
    """``out_dir/launch.json``: the child's config (a dataclass) with the launch file's header."""
    return write_versioned(out_dir / LAUNCH_FILENAME, LAUNCH_FILE, config)


def read_launch_file(path: str | os.PathLike[str], config_type: type[C]) -> C:
    """A launch file (or launch.json in a directory) as ``config_type``; FileFormatError otherwise."""
    return read_versioned(path, LAUNCH_FILE, config_type)


# -- start and end of the process -------------------------------------------------------------------
def record_crashes(out_dir: str | os.PathLike[str]) -> TextIO:
    """A crash leaves every thread's Python stack in ``out_dir/crash.txt``, where the parent's error
    line points; the file stays open (and empty) for the child's life (faulthandler holds it), and
    the parent removes it when there was no crash."""
    crash_file = open(Path(out_dir) / CRASH_FILENAME, "w")  # noqa: SIM115
    faulthandler.enable(crash_file, all_threads=True)
    return crash_file


def perf_map_path(pid: int) -> Path:
    """Where a process's JIT symbols go for perf (oneDNN's kernels, when asked): perf's own convention."""
    return Path(f"/tmp/perf-{pid}.map")


def remove_perf_map() -> None:
    """The perf map oneDNN wrote because the launcher asked for it: read by now, not kept."""
    if os.environ.get(REMOVE_PERF_MAP) == "1":
        try:
            perf_map_path(os.getpid()).unlink(missing_ok=True)
        except OSError:
            pass  # /tmp not writable, say: the map stays, as it would without cpuprof


def error_line(message: str) -> None:
    """The child's one error line; the launcher finds it (``cpuprof: error: ``) in a rank's log."""
    print(f"cpuprof: error: {printable(message)}", file=sys.stderr)


def process_meta() -> Meta:
    """The profile's meta for a child that saves before the profiler started (nothing profiled)."""
    import datetime
    import socket

    from .. import __version__
    from ..collect.session import launch_command

    torch = sys.modules.get("torch")
    return Meta(created=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                cpuprof_version=__version__, torch_version=getattr(torch, "__version__", None),
                python=sys.version.split()[0], hostname=socket.gethostname(), pid=os.getpid(), argv=list(sys.argv),
                ppid=os.getppid(), command=launch_command())


# -- the run ----------------------------------------------------------------------------------------
class ChildRun:
    """One launched child's run: its profiler, settings, roofs and stage, so that any ending saves
    a consistent profile and says in one line what happened.

    A kind of child subclasses it and provides:

    - ``steps()``: the work, in stages (set ``self.stage`` as it goes: "building the model"), making
      the profiler with ``make_profiler()`` before its slow setup, starting and stopping
      ``self.prof`` around what it measures, and calling ``checkpoint_if_due()`` as it progresses;
    - ``contribute(profile, complete)`` (optional): what it adds to every saved profile (its
      workload, figures so far);
    - ``where()`` (optional): how far it got, for the error line ("after 3 of 32 decode steps");
    - ``close()`` (optional): what to leave whatever happened (a process group);
    - ``work``: how the error line names the work ("decoding").

    :meth:`execute` runs ``steps()`` and turns every ending into an exit code: done (OK), bad input
    found here (USAGE, one line, nothing saved), a failure (FAILED, what was measured saved, one
    line), SIGINT/SIGTERM (INTERRUPTED, what was measured saved). A child whose endings differ
    (``cpuprof run``: the program's own status) overrides ``execute`` and keeps the rest.
    """

    work = "the run"

    def __init__(self, out: str | os.PathLike[str], profile: ProfileOptions, requested: Requested, cpu_set: str,
                 topology: Topology, checkpoint_s: float = math.inf) -> None:
        self.out = Path(out)
        self.profile_options = profile
        self.progress = Progress()
        self.prof: Any = None
        self.stage = "starting"
        self.settings = Settings(requested=requested, cpu_set=cpu_set, topology=topology)
        self.roofs: MachineRoofs | None = None
        self.checkpoint_s = checkpoint_s
        self.started = time.monotonic()
        self.last_checkpoint = self.started
        self.rank_watch = RankWatch()

    # -- what a kind of child provides ----------------------------------------------------------
    def steps(self) -> None:
        raise NotImplementedError(f"{type(self).__name__} must say what it runs")

    def contribute(self, profile: Profile, complete: bool) -> None:
        """Adds this kind's own results to a profile about to be saved (nothing, by default)."""

    def where(self) -> str:
        return f"while {self.stage}"

    def close(self) -> None:
        """Leaves whatever the run joined; called once the process is about to exit, however the
        run ended, even inside an import of torch cut short: it must not import torch (a module
        half imported is in ``sys.modules`` and breaks a new import), only use what is loaded."""

    def leave(self) -> bool:
        """:meth:`close`, its failure one line instead of a traceback; False when it failed."""
        try:
            self.close()
        except Exception as exc:
            error_line(f"{self.work} ended, but leaving what it joined failed ({type(exc).__name__}: {exc})")
            return False
        return True

    # -- the profiler -----------------------------------------------------------------------------
    def make_profiler(self, modules: bool | Any = False) -> Any:
        """The one place a child turns its ProfileOptions into ``cpuprof.profile(...)``. The event
        names are checked here, so a typo fails now, not after minutes of setup; None (and no
        profiler) when profiling is off. Not started: the child starts it where measuring begins."""
        options = self.profile_options
        if not options.enabled:
            return None
        from .. import events, native, profile

        events.validate_names(events.resolve(options.events), native.load())
        self.prof = profile(options.events, mode=options.mode, record_shapes=options.record_shapes,
                            sample_hz=options.sample_hz, stack_bytes=options.stack_bytes, timeline=options.timeline,
                            python_stacks=options.python_hz > 0, python_hz=options.python_hz or 1,
                            python_sampler=options.python_sampler, modules=modules)
        return self.prof

    @property
    def profiled(self) -> bool:
        return self.prof is not None and self.prof.started

    def watch_rank(self) -> None:
        """Once torch is imported: the process's rank is read again just before its program destroys
        its torch.distributed group, which most do as they end, before the final save."""
        self.rank_watch.watch_destroy()

    def stop_profiler(self) -> None:
        if self.prof is not None and self.prof.running:
            self.prof.stop()

    # -- the settings -----------------------------------------------------------------------------
    def read_settings_at_start(self) -> None:
        """The settings in force as profiling begins: what the launch is judged by, so that a program
        that later sets its own threads or binding is told apart from a launch that did not take."""
        from .in_force import read_in_force

        self.settings.at_start = read_in_force()

    def read_settings(self, tensors: Any = None) -> None:
        """The settings in force now (threads' affinity, OpenMP runtime, allocator, memory policy,
        and where ``tensors``' pages are), and how the ones profiling began with (or these, when
        those were not read) differ from the ones asked for."""
        from .in_force import compare, read_in_force

        in_force = read_in_force(tensors)
        self.settings.in_force = in_force
        self.settings.warnings = compare(self.settings.requested, self.settings.at_start or in_force)

    # -- saving -----------------------------------------------------------------------------------
    def current_profile(self, complete: bool, reason: str | None = None) -> Profile:
        """What the profiler has so far (or an empty profile when it never started), with this
        kind's results, the settings, roofs and status: what :meth:`save` writes."""
        profile = (self.prof.profile or self.prof.snapshot()) if self.profiled else Profile(meta=process_meta())
        self.contribute(profile, complete)
        if "torch.distributed" in sys.modules:  # never imported here: a save may run inside torch's import
            profile.distributed = self.rank_watch.read()
        profile.settings = self.settings
        profile.roofs = self.roofs
        profile.status = Status(complete=complete, reason=reason)
        return profile

    def save(self, complete: bool, reason: str | None = None) -> Path:
        """profile.json (:meth:`current_profile`); roofline.svg beside it."""
        profile = self.current_profile(complete, reason)
        path = profile.save(self.out)
        if profile.profiled and profile.roofs is not None:
            from ..analysis.roofline import gemm_groups
            from ..exports import roofline_svg

            title = f"{profile.workload.model.name}: " if profile.workload is not None else ""
            svg = roofline_svg.render(gemm_groups(profile), profile.roofs, title=f"{title}GEMMs against the roofs")
            chart = self.out / ROOFLINE_FILENAME
            try:
                write_text(chart, svg)
            except OSError as exc:  # the profile is saved and holds what the chart shows: not a failure
                chart.unlink(missing_ok=True)
                say(f"cpuprof: warning: {chart} could not be written ({exc.strerror or exc}); {path} holds what it "
                    "shows")
        return path

    def checkpoint_if_due(self) -> None:
        """Saves the profile so far when ``checkpoint_s`` has passed since the last save: a crash or
        a kill later still leaves what was measured on disk."""
        if time.monotonic() - self.last_checkpoint >= self.checkpoint_s:
            self.save(complete=False, reason=CHECKPOINT_REASON)
            self.last_checkpoint = time.monotonic()

    # -- endings ----------------------------------------------------------------------------------
    def failed_reason(self, what: str) -> str:
        tail = "" if self.profiled else "; nothing was profiled because of it"
        return f"{what} {self.where()}{tail}"

    def fail(self, what: str, debug_hint: bool = False) -> int:
        """Saves what was measured and says, in the one error line, what failed and where that is."""
        first = what.strip().splitlines()[0] if what.strip() else what
        try:
            self.stop_profiler()
            self.save(complete=False, reason=self.failed_reason(f"failed: {first}"))
            kept = f"; what was measured is in {self.out / 'profile.json'}"
        except Exception as save_exc:  # keep the first failure the one reported
            kept = f"; saving the profile failed too ({type(save_exc).__name__}: {save_exc})"
        hint = " (set CPUPROF_DEBUG=1 for the traceback)" if debug_hint else ""
        error_line(f"{self.failed_reason(f'{self.work} failed: {first}')}{kept}{hint}")
        return exit_codes.FAILED

    def not_saved(self, exc: OSError) -> int:
        """The work is done but its profile could not be written (a full disk): the one error line
        says exactly that, and why, and the figures held in memory are printed (on stderr: stdout
        may be a data format) so the run's answer is not lost with the file."""
        target = self.out / PROFILE_FILENAME
        try:
            from ..reports import render

            render(self.current_profile(complete=True), sys.stderr)
        except Exception as render_exc:  # the error line below matters more than the figures
            say(f"cpuprof: the figures could not be printed either ({type(render_exc).__name__}: {render_exc})")
        left = f"; {target} is an earlier checkpoint, not this result" if target.is_file() else ""
        error_line(f"{self.work} finished {self.where()}, but its profile could not be written to {target}: "
                   f"{exc.strerror or exc}{left}")
        return exit_codes.FAILED

    def interrupted(self, name: str) -> int:
        """SIGINT/SIGTERM: the profile so far is saved as incomplete (the launcher's line says where)."""
        try:
            self.stop_profiler()
            self.save(complete=False, reason=self.failed_reason(f"interrupted by {name}"))
        except Exception as exc:  # the interrupt stays the ending: one line, no traceback
            error_line(f"{self.work} was interrupted by {name} {self.where()}; saving the profile failed "
                       f"({type(exc).__name__}: {exc})")
        return exit_codes.INTERRUPTED

    def handle_signals(self) -> None:
        """SIGINT and SIGTERM raise SignalReceived where the run is, once; later ones are ignored.
        One that came before (while the child imported its modules) is raised now."""
        child_signals.raise_on_signal()

    def execute(self) -> int:
        """Runs ``steps()`` and saves the complete profile; every other ending as the class says."""
        try:
            self.handle_signals()
            self.steps()
            try:
                with self.progress.keep_alive(lambda: "saving the profile"):  # the profile is stopped: not profiled
                    self.save(complete=True)
            except OSError as exc:
                return self.not_saved(exc)
            return exit_codes.OK
        except BaseException as exc:
            # The ending is decided: saving what was measured runs to its end, signals are held.
            child_signals.defer()
            return self.ending_of(exc)

    def ending_of(self, exc: BaseException) -> int:
        """The exit code of a run that raised ``exc``, its profile saved and its one line said."""
        self.progress.done("")
        # A signal raised inside a class body being created (a module imported lazily at that moment)
        # reaches here wrapped: Python 3.11 reports it as "Error calling __set_name__", caused by it.
        exc = signal_within(exc) or exc
        if isinstance(exc, SignalReceived):
            return self.interrupted(exc.args[0])
        if isinstance(exc, KeyboardInterrupt):
            return self.interrupted("SIGINT")
        if isinstance(exc, CpuprofError):
            if exc.exit_code == exit_codes.USAGE:  # bad input found here: one line, nothing ran
                error_line(str(exc))
                return exit_codes.USAGE
            return self.fail(str(exc))
        if not isinstance(exc, Exception) or os.environ.get("CPUPROF_DEBUG"):
            raise exc  # SystemExit and the like are no failure of the run; a debug run wants the traceback
        return self.fail(f"{type(exc).__name__}: {exc}", debug_hint=True)


def signal_within(exc: BaseException) -> BaseException | None:
    """The signal (SignalReceived, KeyboardInterrupt) an exception was raised from, if any."""
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, SignalReceived | KeyboardInterrupt):
            return cause
        seen.add(id(cause))
        cause = cause.__cause__ or (None if cause.__suppress_context__ else cause.__context__)
    return None


def child_main(argv: list[str], config_type: type[C], make_run: Callable[[C], ChildRun]) -> int:
    """A child process from start to exit: ``argv[1]`` is its launch file.

    The child module called :func:`child_signals.defer` on its first line, so a signal while it
    imported is held until the run's ``execute`` raises it where it is handled. Once the ending is
    decided, signals are held again: the cleanup and the interpreter's shutdown run to their end
    (a signal raised into them would print a traceback and could change the exit status), and a
    run that ended well but was interrupted during them says so in its status."""
    child_signals.defer()
    run: ChildRun | None = None
    left = True
    try:
        try:
            config = read_launch_file(argv[1], config_type)
        except FileFormatError as exc:
            error_line(str(exc))
            return exit_codes.USAGE
        run = make_run(config)
        record_crashes(run.out)
        code = run.execute()
    finally:
        child_signals.defer()
        remove_perf_map()
        if run is not None:
            left = run.leave()
    if not left and code == exit_codes.OK:
        return exit_codes.FAILED
    if code == exit_codes.OK and child_signals.take_pending() is not None:
        return exit_codes.INTERRUPTED
    return code


def program_context(run: ChildRun, note: bool = True, kept_probe: RoofProbe | None = None) -> None:
    """The settings in force as the program ends, and the roofs a decode or `cpuprof calibrate`
    measured under this same launch, if any: a program's run is its own, so they are never
    measured here. ``note``: say so when there are none. ``kept_probe``: the launcher's probe that
    found those roofs off and kept them (--roofs cached), given with them when it was of this entry."""
    from ..machine import roofs

    run.read_settings()
    cpus = sorted(run.settings.requested.cpus or os.sched_getaffinity(0))
    run.roofs, why = roofs.cached(run.settings.requested.threads, cpus)
    if run.roofs is not None and kept_probe is not None and kept_probe.cached_measured == run.roofs.measured:
        run.roofs.probe = kept_probe
    if run.roofs is None and note:
        missing = why or "the cache has no roofs measured for this machine, torch and launch"
        for measured_next in ("; measuring again", ": measuring again"):  # a program's run measures none
            missing = missing.removesuffix(measured_next)
        run.progress.done(f"note: {missing}, so GEMMs are not judged against "
                          "them (measure them with: python -m cpuprof calibrate and the same launch options)")
