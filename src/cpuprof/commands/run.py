"""``cpuprof run -- python script.py [args]``: any PyTorch program, unchanged, launched like decode's
child and profiled the same way. The flags become :class:`~cpuprof.launch.program.ProgramOptions` here,
at the door; :mod:`cpuprof.launch.program` runs the program, and this shows what it returns.
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path
from typing import Any

from .. import defaults, exit_codes
from .. import options_spec as spec
from ..errors import ChildFailed, CpuprofError
from ..launch import parent, program, run_dir
from ..launch.program import ProgramOptions
from ..launch.window import WindowPlan
from ..model import PROFILE_FILENAME, Profile
from ..model.run_layout import has_followed, lost_windows, unsaved_processes, windows_of
from ..safe_text import cpuprof_command
from .common import (
    after_report,
    check_profile_options,
    profile_options,
    show_results,
)
from .decode import launch_from_args

COMMAND = spec.Command(
    "run", help="profile any PyTorch program: run [options] -- python script.py [args]",
    usage="python -m cpuprof run [launch options] [profiling options] [output options] -- python script.py [args]  "
          "(or -- python -m module [args])",
    description="Runs a Python program (a transformers generate script, say) unchanged, in a child launched like "
                "decode's: pinned to the threads/CPUs/NUMA node asked for, with the OpenMP runtime, allocator and "
                "memory policy set before torch loads. Profiling starts when the program first imports torch and "
                "covers every ATen op across every thread; torch.profiler.record_function and cpuprof.region blocks "
                "are regions. When the program ends (or is interrupted) the profile is saved and the report follows "
                "the program's own output on stdout. The exit code is the program's (1 if it raised, 130 if "
                "interrupted, 128 + N if signal N ended it, as a shell says).",
    groups=(
        spec.LAUNCH_GROUP,
        spec.Group("several processes, torchrun-style: each pinned to its share of the machine and profiled",
                   spec.PROCESSES),
        spec.Group("the processes the program starts", spec.FOLLOW),
        spec.Group("a window of a long-running program (a server)", spec.WINDOW),
        spec.Group("profiling", (*spec.for_program(spec.PROFILING, "the program"), spec.PROGRAM_ROOFS)),
        spec.Group("output", (*spec.output_options("run"), spec.WHOLE_RUN)),
        spec.Group(None, (spec.PROGRAM,)),
    ))


def program_options(args: argparse.Namespace) -> ProgramOptions:
    """The flags, typed and checked, before anything starts."""
    options = ProgramOptions(target=spec.PROGRAM.value(args), launch=launch_from_args(args),
                             profile=profile_options(args, timeline=defaults.PROGRAM_TIMELINE), follow=args.follow,
                             window=spec.build(WindowPlan, spec.WINDOW, args), nproc=args.nproc,
                             ranks_per_node=args.ranks_per_node, rank_timeout_s=args.rank_timeout, roofs=args.roofs)
    check_profile_options(options.profile, args.flamegraph)
    return options


def run(args: argparse.Namespace) -> int:
    options = program_options(args)
    fmt = "json" if args.json else args.format
    with run_dir.claimed(args.out, "run", overwrite=args.overwrite) as out_dir:
        if options.nproc is not None:
            return show_processes_group(options, out_dir, fmt)
        outcome = program.run_program(options, out_dir)
        if options.window.on_demand and outcome.profile is not None:
            show_windows(out_dir, fmt, args.top, args.whole_run)
            lost = lost_windows(out_dir)
            if lost and outcome.returncode == exit_codes.OK:
                numbers = ", ".join(str(n) for n in sorted({n for n, _ in lost}))
                raise CpuprofError(f"window{'s' if len(lost) > 1 else ''} {numbers} lost: {lost[0][1]}"
                                   f"{f' (and {len(lost) - 1} more)' if len(lost) > 1 else ''}; the other windows "
                                   "are saved")
        elif options.follow and (has_followed(out_dir) or unsaved_processes(out_dir)):
            show_processes(out_dir, fmt, args.top, args.whole_run)
        elif outcome.profile is not None:
            show_results(outcome.profile, outcome.out_dir, fmt, args.top, args.flamegraph, args.whole_run)
        return exit_code(outcome)


def show_windows(out_dir: Path, fmt: str, top: int, whole_run: bool = False) -> None:
    """run --on-demand: the last window's report, then every window's directory."""
    from ..reports import OutputOptions, ProcessesSource, ProfileSource, get_output

    windows = [w for w in windows_of(out_dir) if has_followed(w) or (w / PROFILE_FILENAME).exists()]
    stream, gap = after_report(fmt)
    if not windows:
        stream.write("no window was opened: nothing was profiled (open one with: python -m cpuprof signal "
                     "<launcher pid> start)\n")
        return
    last = windows[-1]
    source: Any = ProcessesSource.load(last) if has_followed(last) else ProfileSource(Profile.load(last))
    get_output(fmt, source.kind, roles=("report",)).write(source, sys.stdout, OutputOptions(top, whole_run))
    shown = "; ".join(cpuprof_command("report", str(w)) for w in windows)
    stream.write(gap + f"{len(windows)} window{'s' if len(windows) != 1 else ''} "
                 f"saved (the report above is of {last.name}); each window's report: {shown}\n")


def show_processes(out_dir: Path, fmt: str, top: int, whole_run: bool = False) -> None:
    """The merged report of the program's processes on stdout, then where their profiles are."""
    from ..reports import OutputOptions, ProcessesSource, get_output

    source = ProcessesSource.load(out_dir)
    get_output(fmt, "processes", roles=("report",)).write(source, sys.stdout, OutputOptions(top, whole_run))
    stream, gap = after_report(fmt)
    followed = sum(1 for r in source.rows if r.followed)
    stream.write(gap + f"profiles of {followed} followed process"
                 f"{'es' if followed != 1 else ''} saved in {out_dir}/processes/PID, the program's in {out_dir}; "
                 f"re-render this report with: {cpuprof_command('report', str(out_dir))}\n")


def show_processes_group(options: ProgramOptions, out_dir: Path, fmt: str) -> int:
    """run --nproc N: the merged report of the copies, and one exit code."""
    from ..reports import get_renderer
    from .group import group_exit, show_group

    # Rank 0's own output on stdout as the program printed it, beside a report for a person; a data
    # format keeps stdout for its data (the output stays in rank-0/child.log, marked, on stderr).
    run = program.run_processes(options, out_dir, program_output=get_renderer(fmt).for_a_person)
    show_group(run, out_dir, fmt, also=f"; each process's own output (rank 0's is above): {out_dir}/rank-*/child.log")
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
