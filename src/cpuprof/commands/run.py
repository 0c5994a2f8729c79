"""``cpuprof run -- python script.py [args]``: any PyTorch program, launched and profiled like decode."""

from __future__ import annotations

import argparse
import os
import re
import signal
import sys
from pathlib import Path
from typing import Any

from .. import exit_codes
from .. import options_spec as spec
from ..analysis.processes import has_followed, unsaved_processes
from ..errors import ChildFailed, CpuprofError, UsageError
from ..launch import environment, parent, run_dir
from ..launch.followed_run import end_followed
from ..launch.options import ProfileOptions
from ..launch.script_child import MODULE, ScriptConfig, ScriptTarget
from ..launch.window import WindowControl, WindowPlan, window_dir, windows_of, write_control
from ..machine.topology import read_topology
from ..model import PROFILE_FILENAME, Profile
from ..safe_text import cpuprof_command
from .common import (
    add_output_arguments,
    add_profiling_arguments,
    check_profile_options,
    profile_options,
    show_results,
)
from .decode import add_launch_arguments, launch_from_args

FORMS = "python script.py [args] or python -m module [args]"
# Names that mean "a Python": python, python3, python3.11. The program runs under the Python that
# runs cpuprof, since that is where torch and cpuprof's native module are installed.
PYTHON_NAME = re.compile(r"python(\d+(\.\d+)?)?")
MODULE_NAME = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "run", help="profile any PyTorch program: run [options] -- python script.py [args]",
        usage="python -m cpuprof run [launch options] [profiling options] [output options] "
              "-- python script.py [args]  (or -- python -m module [args])",
        description="Runs a Python program (a transformers generate script, say) unchanged, in a child launched "
                    "like decode's: pinned to the threads/CPUs/NUMA node asked for, with the OpenMP runtime, "
                    "allocator and memory policy set before torch loads. Profiling starts when the program first "
                    "imports torch and covers every ATen op across every thread; torch.profiler.record_function "
                    "and cpuprof.region blocks are regions. When the program ends (or is interrupted) the profile "
                    "is saved and the report follows the program's own output on stdout. The exit code is the "
                    "program's (1 if it raised, 130 if interrupted, 128 + N if signal N ended it, as a shell "
                    "says).")
    add_launch_arguments(p)
    r = p.add_argument_group("several processes, torchrun-style: each pinned to its share of the machine and profiled")
    spec.add_arguments(r, spec.PROCESSES)
    spec.add_arguments(p.add_argument_group("the processes the program starts"), spec.FOLLOW)
    spec.add_arguments(p.add_argument_group("a window of a long-running program (a server)"), spec.WINDOW)
    add_profiling_arguments(p.add_argument_group("profiling"), "the program")
    add_output_arguments(p.add_argument_group("output"), "run")
    p.add_argument("command", nargs=argparse.REMAINDER, metavar="-- python script.py [args]",
                   help=f"the program, after --: {FORMS}")
    p.set_defaults(run=run)


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
        raise UsageError(f"{python}: cpuprof runs Python programs: expected {FORMS} after --")
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


def window_plan(args: argparse.Namespace) -> WindowPlan:
    """--delay, --duration and --on-demand as one plan; UsageError for the pairs that contradict."""
    plan = spec.build(WindowPlan, spec.WINDOW, args)
    if plan.on_demand and (plan.delay_s or plan.duration_s is not None):
        raise UsageError("--on-demand windows open and close with `cpuprof signal`: --delay and --duration do not "
                         "apply to them")
    if plan.on_demand and args.nproc is not None:
        raise UsageError("--on-demand with --nproc is not supported: give --delay and --duration, which every "
                         "process applies from its own import of torch")
    return plan


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


def run(args: argparse.Namespace) -> int:
    target = script_target(args.command)
    launch = launch_from_args(args)
    profile = profile_options(args)
    check_profile_options(profile, args.flamegraph)
    window_plan(args)  # its contradictions, before anything starts
    with run_dir.claimed(args.out, "run", overwrite=args.overwrite) as out_dir:
        return run_in(args, target, launch, profile, out_dir)


def run_in(args: argparse.Namespace, target: ScriptTarget, launch: environment.LaunchSettings,
           profile: ProfileOptions, out_dir: Path) -> int:
    fmt = "json" if args.json else args.format
    if args.nproc is not None:
        return run_processes(args, target, launch, profile, out_dir, fmt)
    if args.ranks_per_node is not None:
        raise UsageError("--ranks-per-node places the processes of --nproc N; give --nproc")
    plan = window_plan(args)
    resolved, config = prepare(target, launch, profile, out_dir, follow=args.follow, window=plan)
    try:
        outcome = run_program(resolved, config, out_dir, args.follow)
    finally:
        if args.follow:
            end_followed(out_dir.resolve())  # none outlives the run, however it ended
    if plan.on_demand and outcome.profile is not None:
        show_windows(out_dir, fmt, args.top)
        return exit_code(outcome)
    if args.follow and (has_followed(out_dir) or unsaved_processes(out_dir)):
        show_processes(out_dir, fmt, args.top)
        return exit_code(outcome)
    if outcome.profile is not None:
        show_results(outcome.profile, outcome.out_dir, fmt, args.top, args.flamegraph)
    return exit_code(outcome)


# After a SIGINT or SIGTERM sent to the launcher alone (a terminal's Ctrl-C reaches every process of
# the program), how long the program gets to end its followed processes itself before they are asked
# to: a program that joins a worker that never ends would otherwise wait forever.
FOLLOWED_STOP_AFTER_S = 2.0


def run_program(resolved: environment.ResolvedLaunch, config: ScriptConfig, out_dir: Path,
                follow: bool) -> parent.DecodeOutcome:
    """The script child, supervised; once a signal was passed on to it, and it has not ended within
    FOLLOWED_STOP_AFTER_S, the followed processes are stopped too (they save their profiles)."""
    import math
    import threading
    import time

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

    with parent.Supervision() as group, WindowSignals(out_dir.resolve(), config.window.on_demand):
        group.add(parent.start_child(resolved, config, out_dir, profiled=True, module=MODULE))
        (ended,) = group.wait(timeout_s=math.inf, on_poll=on_poll)
    return parent.finish_child(out_dir, ended.returncode, interrupted=ended.interrupted)


class WindowSignals:
    """run --on-demand: SIGUSR1 (``cpuprof signal PID start``) opens the next window and SIGUSR2
    (``stop``) closes it, by rewriting the control file every profiled process polls."""

    def __init__(self, root: Path, on_demand: bool) -> None:
        self.root = root
        self.on_demand = on_demand
        self.control = WindowControl()
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> WindowSignals:
        if self.on_demand:
            write_control(self.root, self.control)
            self._previous = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGUSR1, signal.SIGUSR2)}
            print(f"cpuprof: the program runs unprofiled; open a window with: python -m cpuprof signal {os.getpid()} "
                  "start (and close it with ... stop)", file=sys.stderr, flush=True)
        return self

    def __exit__(self, *_exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _on_signal(self, signum: int, _frame: object) -> None:
        opening = signum == signal.SIGUSR1
        if opening == self.control.open:
            state = "open" if opening else "closed"
            print(f"cpuprof: window {self.control.window} is already {state}", file=sys.stderr, flush=True)
            return
        window = self.control.window + 1 if opening else self.control.window
        self.control = WindowControl(window=window, open=opening)
        write_control(self.root, self.control)
        what = "opening" if opening else "closing"
        print(f"cpuprof: {what} window {window} ({window_dir(self.root, window)})", file=sys.stderr, flush=True)


def show_windows(out_dir: Path, fmt: str, top: int) -> None:
    """run --on-demand: the last window's report, then every window's directory."""
    from ..reports import OutputOptions, ProcessesSource, ProfileSource, get_output

    windows = [w for w in windows_of(out_dir) if has_followed(w) or (w / PROFILE_FILENAME).exists()]
    stream = sys.stdout if fmt == "terminal" else sys.stderr
    if not windows:
        stream.write("no window was opened: nothing was profiled (open one with: python -m cpuprof signal "
                     "<launcher pid> start)\n")
        return
    last = windows[-1]
    source: Any = ProcessesSource.load(last) if has_followed(last) else ProfileSource(Profile.load(last))
    get_output(fmt, source.kind, roles=("report",)).write(source, sys.stdout, OutputOptions(top=top))
    shown = "; ".join(cpuprof_command("report", str(w)) for w in windows)
    stream.write(("\n" if fmt == "terminal" else "") + f"{len(windows)} window{'s' if len(windows) != 1 else ''} "
                 f"saved (the report above is of {last.name}); each window's report: {shown}\n")


def show_processes(out_dir: Path, fmt: str, top: int) -> None:
    """The merged report of the program's processes on stdout, then where their profiles are."""
    from ..reports import OutputOptions, ProcessesSource, get_output

    source = ProcessesSource.load(out_dir)
    get_output(fmt, "processes", roles=("report",)).write(source, sys.stdout, OutputOptions(top=top))
    stream = sys.stdout if fmt == "terminal" else sys.stderr
    followed = sum(1 for p in source.processes if p.followed)
    stream.write(("\n" if fmt == "terminal" else "") + f"profiles of {followed} followed process"
                 f"{'es' if followed != 1 else ''} saved in {out_dir}/processes/PID, the program's in {out_dir}; "
                 f"re-render this report with: {cpuprof_command('report', str(out_dir))}\n")


def run_processes(args: argparse.Namespace, target: ScriptTarget, launch: environment.LaunchSettings,
                  profile: ProfileOptions, out_dir: Path, fmt: str) -> int:
    """run --nproc N: the program N times, torchrun-style, each pinned and profiled; one merged report."""
    from ..launch import ranks
    from .group import group_exit, show_group

    def prepare_rank(_place: ranks.RankPlacement, rank_launch: environment.LaunchSettings,
                     rank_dir: Path) -> tuple[environment.ResolvedLaunch, ScriptConfig]:
        return prepare(target, rank_launch, profile, rank_dir, follow=args.follow, window=window_plan(args))

    run = ranks.run_group(launch, out_dir, args.nproc, args.ranks_per_node, prepare_rank, mode="nproc", backend=None,
                          timeout_s=args.rank_timeout, profiled=True, module=MODULE)
    if args.follow:
        for rank in run.ranks:  # none of a rank's followed processes outlives the run
            end_followed((out_dir / rank.dir).resolve())
    show_group(run, out_dir, fmt, also=f"; each process's own output (rank 0's is above): {out_dir}/rank-N/child.log")
    return group_exit(run, out_dir, member="process")


# What the script child exits with when the program was interrupted (SIGINT, SIGTERM) after the
# child had said so itself, in its one line, when it had nothing to save (see script_child).
_INTERRUPTED_BY_THE_CHILD = (exit_codes.INTERRUPTED, exit_codes.of_signal(signal.SIGTERM))


def exit_code(outcome: parent.DecodeOutcome) -> int:
    """The program's exit status, as a shell would give it (128 + N for signal N); one error line
    (after the report) when it did not end well."""
    rc = outcome.returncode
    if outcome.interrupted and outcome.profile is None and rc not in _INTERRUPTED_BY_THE_CHILD:
        # Interrupted before its handlers were set (Python still starting): it said nothing.
        raise ChildFailed(parent.failure_message(outcome, child="the program") or "the program was interrupted",
                          exit_codes.INTERRUPTED)
    if rc < 0:
        raise ChildFailed(parent.failure_message(outcome, child="the program's process")
                          or f"the program's process ended with {rc}", exit_codes.of_program(rc, outcome.interrupted))
    if outcome.profile is None:
        if rc == exit_codes.OK:
            raise CpuprofError(f"the program's process ended without saving a profile in {outcome.out_dir}")
        return exit_codes.of_program(rc, outcome.interrupted)  # the child said why in its own line
    if rc == exit_codes.OK:
        return rc
    reason = outcome.profile.status.reason or f"the program exited with status {rc}"
    raise ChildFailed(f"{reason}; what was measured is in {outcome.out_dir / PROFILE_FILENAME}",
                      exit_codes.of_program(rc, outcome.interrupted))
