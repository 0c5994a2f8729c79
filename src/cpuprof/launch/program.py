"""``cpuprof run``'s launch, below the command: a Python program, unchanged, in a child launched like a
decode's (pinned, its OpenMP runtime and allocator set before torch loads), supervised until it ends,
with every process it starts followed, its windows opened and closed on ``cpuprof signal``, or N
copies of it torchrun-style (``--nproc``). The command (:mod:`cpuprof.commands.run`) turns its flags
into :class:`ProgramOptions` at the door and shows what this returns.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import shutil
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import exit_codes
from ..errors import UsageError
from ..machine.topology import read_topology
from ..model import RoofProbe
from ..model.ranks import MultiRun
from ..model.run_layout import window_dir, window_requests_dir
from ..safe_text import say
from . import environment, parent
from .followed_run import end_followed
from .options import DecodeOptions, ProfileOptions, Roofs
from .ranks import DEFAULT_TIMEOUT_S
from .script_child import MODULE, ScriptConfig, ScriptTarget
from .window import WINDOW_ACTIONS, WindowControl, WindowPlan, take_window_requests, write_control

FORMS = "python script.py [args] or python -m module [args]"
# Names that mean "a Python": python, python3, python3.11. The program runs under the Python that
# runs cpuprof, since that is where torch and cpuprof's native module are installed.
PYTHON_NAME = re.compile(r"python(\d+(\.\d+)?)?")
TRAMPOLINE = b"'" * 3 + b"exec'"  # how pip's /bin/sh launcher of a console script goes on
MODULE_NAME = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")

# `cpuprof signal PID start|stop`: what each asks of the launcher.
WINDOW_SIGNALS = dict(zip(WINDOW_ACTIONS, (signal.SIGUSR1, signal.SIGUSR2), strict=True))


@dataclass
class ProgramOptions:
    """Everything ``cpuprof run`` is asked to do, typed: the program, its launch, the profiler, the
    processes it starts (followed or not), its windows, and the copies of it (``nproc``)."""

    target: ScriptTarget
    launch: environment.LaunchSettings = field(default_factory=environment.LaunchSettings)
    profile: ProfileOptions = field(default_factory=ProfileOptions)
    follow: bool = True
    window: WindowPlan = field(default_factory=WindowPlan)
    nproc: int | None = None  # copies of the program, torchrun-style; None: one, not a group
    ranks_per_node: int | None = None
    rank_timeout_s: float = DEFAULT_TIMEOUT_S
    roofs: Roofs = "auto"  # the machine's roofs: cached, else measured once before the program starts

    def __post_init__(self) -> None:
        """What contradicts, refused before anything starts (each flag's own range is its option's)."""
        plan = self.window
        if plan.on_demand and (plan.delay_s or plan.duration_s is not None):
            raise UsageError("--on-demand windows open and close with `cpuprof signal`: --delay and --duration do "
                             "not apply to them")
        if plan.on_demand and self.nproc is not None:
            raise UsageError("--on-demand with --nproc is not supported: give --delay and --duration, which every "
                             "process applies from its own import of torch")
        if self.ranks_per_node is not None and self.nproc is None:
            raise UsageError("--ranks-per-node places the processes of --nproc N; give --nproc")


def script_target(command: list[str]) -> ScriptTarget:
    """The program after ``--``; UsageError, one line, for anything but the two forms python takes here."""
    if not command:
        raise UsageError(f"nothing to run: give the program after --, as {FORMS}")
    if command[0] != "--":
        raise UsageError(f"put -- between cpuprof's options and the program: python -m cpuprof run [options] -- "
                         f"{' '.join(command)}")
    words = command[1:]
    if not words:
        raise UsageError(f"nothing to run after --: expected {FORMS}")
    python, rest = words[0], words[1:]
    if not PYTHON_NAME.fullmatch(os.path.basename(python)):
        console = console_script(python)
        if console is None:
            raise UsageError(f"{python}: cpuprof runs Python programs: expected {FORMS} (or a Python console "
                             "script such as torchrun) after --")
        return ScriptTarget(path=console, module=None, args=rest)
    if os.sep in python and (os.path.dirname(os.path.abspath(python))
                             != os.path.dirname(os.path.abspath(sys.executable))):
        raise UsageError(f"{python}: the program runs under cpuprof's own Python ({sys.executable}), where torch "
                         "and cpuprof are installed: write python")
    if not rest:
        raise UsageError(f"{python} with no script: expected {FORMS} after --")
    if rest[0] == "-m":
        if len(rest) < 2 or not MODULE_NAME.fullmatch(rest[1]):
            given = f" {rest[1]}" if len(rest) > 1 else ""
            raise UsageError(f"python -m{given}: expected a module name, as in python -m module [args]")
        return ScriptTarget(path=None, module=rest[1], args=rest[2:])
    script = rest[0]
    if script.startswith("-"):
        raise UsageError(f"python {script}: Python's own options are not supported here; expected {FORMS}")
    if not os.path.exists(script):
        raise UsageError(f"{script}: no such script")
    if not os.path.isfile(script):
        raise UsageError(f"{script}: not a file; give the script to run")
    if not os.access(script, os.R_OK):
        raise UsageError(f"{script}: not readable")
    return ScriptTarget(path=os.path.abspath(script), module=None, args=rest[1:])


def console_script(name: str) -> str | None:
    """``name`` (torchrun, vllm) as the Python script it is: a file on PATH (or at that path) whose
    first line runs a Python, run here as ``python <it>``; None when it is not one. UsageError when
    its Python is another than cpuprof's (torch and cpuprof are installed in this one)."""
    found = name if os.sep in name else shutil.which(name)
    if found is None or not os.path.isfile(found):
        return None
    try:
        with open(found, "rb") as f:
            first, second = f.readline(512), f.readline(4096)
    except OSError:
        return None
    if not first.startswith(b"#!"):
        return None
    words = first[2:].decode(errors="replace").split()
    if words == ["/bin/sh"] and second.startswith(TRAMPOLINE):
        # pip's launcher where the interpreter's path is too long for a shebang: '''exec' "PY" "$0" "$@"
        words = [w.strip('"') for w in second.decode(errors="replace").split()[1:2]]
    if words and os.path.basename(words[0]) == "env":
        words = [w for w in words[1:] if not w.startswith("-")]
    if not words or not PYTHON_NAME.fullmatch(os.path.basename(words[0])):
        return None
    interpreter = words[0]
    if os.sep in interpreter and (os.path.dirname(os.path.abspath(interpreter))
                                  != os.path.dirname(os.path.abspath(sys.executable))):
        raise UsageError(f"{name}: a script of another Python ({interpreter}); the program runs under cpuprof's own "
                         f"({sys.executable}), where torch and cpuprof are installed: install it there")
    return os.path.abspath(found)


def prepare(target: ScriptTarget, launch: environment.LaunchSettings, profile: ProfileOptions,
            out_dir: Path, follow: bool = True,
            window: WindowPlan | None = None) -> tuple[environment.ResolvedLaunch, ScriptConfig]:
    """Checks the launch against this machine and the output directory before anything starts."""
    topology = read_topology()
    resolved = environment.validate(launch, topology)
    parent.check_out_dir(out_dir)
    config = ScriptConfig(target=target, profile=profile, launch=resolved.settings, requested=resolved.requested(),
                          cpu_set=resolved.cpu_set_description, topology=topology, out=str(out_dir.resolve()),
                          follow=follow, window=window or WindowPlan())
    return resolved, config


def run_program(options: ProgramOptions, out_dir: Path) -> parent.DecodeOutcome:
    """The program in one script child, supervised to its end; none of its followed processes
    outlives it, however it ended."""
    resolved, config = prepare(options.target, options.launch, options.profile, out_dir, follow=options.follow,
                               window=options.window)
    if options.profile.enabled:
        config = dataclasses.replace(config, kept_probe=measure_roofs_first(options.launch, config, options.roofs))
    try:
        return _supervise(resolved, config, out_dir, options.follow)
    finally:
        if options.follow:
            end_followed(out_dir.resolve())


# A cached roof measured or confirmed by a probe this recently is taken as it is: a shared machine's
# memory was seen changing state within minutes, not seconds.
PROBE_HOLDS_S = 120.0


def measure_roofs_first(launch: environment.LaunchSettings, config: ScriptConfig, mode: Roofs) -> RoofProbe | None:
    """The roofs a program's GEMMs and decode are judged against, settled before it starts, in a
    child launched as the program will be (its threads, CPUs, OpenMP runtime and memory policy), so
    that nothing of the program's runs beside it: the cached ones probed against the memory now, or
    measured where there are none or the probe disagrees; then cached, probe included, and read by
    the program's processes as they save their profiles. Never during the program. Returns the probe
    of roofs kept although it disagreed (--roofs cached), which the cache does not keep: the
    program's processes are given it to report beside the roofs."""
    from ..machine import roofs

    if mode == "off":
        return None
    requested = config.requested
    entry = roofs.launch_entry(requested.threads, requested.cpus, requested.omp, requested.mempolicy.mode,
                               requested.mempolicy.nodes)
    age = roofs.confirmed_within(entry, PROBE_HOLDS_S) if entry is not None and mode == "auto" else None
    if age is not None:  # probed (or measured) moments ago: another probe would tell nothing new
        say(f"cpuprof: machine roofs from the cache, measured or confirmed by a probe of the memory {age:.0f} s "
            f"ago (a probe holds {PROBE_HOLDS_S:.0f} s)")
        return None
    if mode == "remeasure" or entry is None:
        say("cpuprof: measuring the machine's roofs before the program starts, under its launch "
            + ("(--roofs remeasure)" if mode == "remeasure" else "(none cached for it; once; --roofs off skips this)"))
    import tempfile

    with tempfile.TemporaryDirectory(prefix="cpuprof-roofs-") as scratch:
        options = DecodeOptions(launch=launch, profile=ProfileOptions(enabled=False), roofs=mode,
                                calibrate_only=True)
        outcome = parent.launch(options, Path(scratch))
    if outcome.interrupted:
        from ..errors import ChildFailed

        raise ChildFailed("interrupted while the machine's roofs were measured, before the program started: it did "
                          "not run", exit_codes.INTERRUPTED)
    if outcome.returncode != 0 or outcome.profile is None or outcome.profile.roofs is None:
        say("cpuprof: note: the roofs could not be measured (see the lines above); the program runs, its GEMMs "
            "are not judged against them")
        return None
    probe = outcome.profile.roofs.probe
    return probe if probe is not None and probe.outcome == "kept" else None


def run_processes(options: ProgramOptions, out_dir: Path, program_output: bool = False) -> MultiRun:
    """``nproc`` copies of the program, torchrun-style, each pinned and profiled in DIR/rank-N."""
    from . import ranks

    assert options.nproc is not None

    def prepare_rank(_place: ranks.RankPlacement, rank_launch: environment.LaunchSettings,
                     rank_dir: Path) -> tuple[environment.ResolvedLaunch, ScriptConfig]:
        return prepare(options.target, rank_launch, options.profile, rank_dir, follow=options.follow,
                       window=options.window)

    run = ranks.run_group(options.launch, out_dir, options.nproc, options.ranks_per_node, prepare_rank,
                          mode="nproc", backend=None, timeout_s=options.rank_timeout_s, profiled=True, module=MODULE,
                          program_output=program_output)
    if options.follow:
        for rank in run.ranks:  # none of a rank's followed processes outlives the run
            end_followed((out_dir / rank.dir).resolve())
    return run


# After a SIGINT or SIGTERM sent to the launcher alone (a terminal's Ctrl-C reaches every process of
# the program), how long the program gets to end its followed processes itself before they are asked
# to: a program that joins a worker that never ends would otherwise wait forever.
FOLLOWED_STOP_AFTER_S = 2.0


def _supervise(resolved: environment.ResolvedLaunch, config: ScriptConfig, out_dir: Path,
               follow: bool) -> parent.DecodeOutcome:
    """The script child, supervised; once a signal was passed on to it, and it has not ended within
    FOLLOWED_STOP_AFTER_S, the followed processes are stopped too (they save their profiles)."""
    stopping: list[threading.Thread] = []
    first_signal: list[float] = []

    def on_poll() -> None:
        if not follow or not group.forwarded or stopping:
            return
        if not first_signal:
            first_signal.append(time.monotonic())
        elif time.monotonic() - first_signal[0] > FOLLOWED_STOP_AFTER_S:
            stopping.append(threading.Thread(target=end_followed, args=(out_dir.resolve(),), daemon=True))
            stopping[0].start()

    with parent.Supervision(raise_uncarried=False) as group, WindowSignals(out_dir.resolve(), config.window.on_demand):
        group.add(parent.start_child(resolved, config, out_dir, profiled=True, module=MODULE))
        (ended,) = group.wait(timeout_s=math.inf, on_poll=on_poll)
    if group.forwarded and ended.returncode == 0:
        # A program that handles the signal itself (a server's graceful shutdown) ends as it chose to:
        # its report is shown, and this says why it ended.
        name = signal.Signals(group.forwarded[0]).name
        say(f"cpuprof: the program ended by itself (status 0) after cpuprof passed it the {name} it received")
    return parent.finish_child(out_dir, ended.returncode, interrupted=ended.interrupted)


class WindowSignals:
    """run --on-demand: ``cpuprof signal PID start`` opens the next window and ``stop`` closes it,
    by rewriting the control file every profiled process polls. Each asks through the request queue
    (launch.window) and wakes the launcher with SIGUSR1 or SIGUSR2; a bare ``kill -USR1`` with nothing
    queued is taken as a start (``-USR2``, a stop)."""

    def __init__(self, root: Path, on_demand: bool) -> None:
        self.root = root
        self.on_demand = on_demand
        self.control = WindowControl(launcher=os.getpid())
        self._previous: dict[int, Any] = {}
        self._busy = False

    def __enter__(self) -> WindowSignals:
        if self.on_demand:
            # The handlers first: once the control file names this process, `signal` may come.
            self._previous = {sig: signal.signal(sig, self._on_signal) for sig in WINDOW_SIGNALS.values()}
            write_control(self.root, self.control)
            say(f"cpuprof: the program runs unprofiled; open a window with: python -m cpuprof signal {os.getpid()} "
                "start (and close it with ... stop)")
        return self

    def __exit__(self, *_exc: object) -> None:
        if not self.on_demand:
            return
        # A `signal` sent as the program ends must not kill the launcher before its report (the
        # default action of SIGUSR1/2): ignored from now on, and the control file no longer names it.
        for sig in self._previous:
            signal.signal(sig, signal.SIG_IGN)
        try:
            write_control(self.root, dataclasses.replace(self.control, launcher=0))
        except OSError:
            pass
        shutil.rmtree(window_requests_dir(self.root), ignore_errors=True)

    def _on_signal(self, signum: int, _frame: object) -> None:
        if self._busy:  # a signal while the last one's requests are applied: the loop below takes its
            return  # requests once those are done
        self._busy = True
        try:
            asked = take_window_requests(self.root)
            if not asked:  # a signal sent by hand: its number says what
                asked = [next(action for action, sig in WINDOW_SIGNALS.items() if sig == signum)]
            while asked:
                for action in asked:
                    self._apply(opening=action == "start")
                asked = take_window_requests(self.root)
        finally:
            self._busy = False

    def _apply(self, opening: bool) -> None:
        if opening == self.control.open:
            state = "open" if opening else "closed"
            say(f"cpuprof: window {self.control.window} is already {state}")
            return
        window = self.control.window + 1 if opening else self.control.window
        asked = dataclasses.replace(self.control, window=window, open=opening)
        try:
            write_control(self.root, asked)
        except OSError as exc:  # a full disk: nothing changes, the program runs on, the user may ask again
            what = "open" if opening else "close"
            say(f"cpuprof: cannot {what} window {window}: {exc}; the program runs on (ask again once there is room)")
            return
        self.control = asked
        what = "opening" if opening else "closing"
        say(f"cpuprof: {what} window {window} ({window_dir(self.root, window)})")
