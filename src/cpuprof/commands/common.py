"""What commands share: argument types that reject bad input with argparse's one-line error,
writing an output file, and the profiling and output flags of the commands that launch a profiled
child (decode, run), with what they do once the child is done."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from .. import defaults
from .. import options_spec as spec
from ..errors import UsageError
from ..launch.options import ProfileOptions
from ..model import SAMPLED, Profile
from ..model.io import PROFILE_FILENAME, is_directory, present
from ..model.run_layout import has_followed, is_merged, iter_processes, processes_dir, windows_of
from ..output_file import write_file
from ..safe_text import cpuprof_command, say

# Argument types that reject bad input with argparse's one-line error (declared with the options).
positive_int = spec.positive_int
non_negative_int = spec.non_negative_int
positive_float = spec.positive_float


def load_run(path: str) -> Profile:
    """The profile a command on one profile reads at ``path``: the file, or a directory's own
    profile; for a merged run, or a run whose program's own process ran no torch (a launcher:
    torchrun, a serving front end), the process that ran the most op time, as its report shows,
    named in one line on stderr. A program's own process that ran no op is its launcher's."""
    directory = Path(path)
    own = Profile.load(directory) if not is_directory(directory) or present(directory / PROFILE_FILENAME) else None
    if is_directory(directory) and has_followed(directory) and (
            is_merged(directory) or own is None or not any(op.kind == "op" for op in own.ops)):
        from ..analysis.processes import busiest_row, row

        best = busiest_row([row(p) for p in iter_processes(directory)])
        if best is not None:
            say(f"cpuprof: {path}: the profile of {best.role} (pid {best.pid}), the process that ran the most op "
                f"time (another process's: {cpuprof_command('report', 'DIR')} with DIR from its report's table)")
            return Profile.load(best.directory)
    return own if own is not None else Profile.load(path)


def load_profiled(path: str, what: str) -> Profile:
    """The profile at ``path`` (:func:`load_run`) for a command that needs what was measured
    (``what``: its output); a run made with --no-profile has none, and is one line naming that."""
    profile = load_run(path)
    if profile.profiled:
        return profile
    directory = Path(path) if Path(path).is_dir() else Path(path).parent
    windows = [p.name for p in windows_of(directory)]
    if windows:
        raise UsageError(f"{path}: its windows were profiled, each into its own directory ({', '.join(windows[:3])}"
                         f"{', ...' if len(windows) > 3 else ''}): give one of those")
    if processes_dir(directory).is_dir():
        raise UsageError(f"{path}: the program's own process was not profiled (it never imported torch); the "
                         f"processes it started were: give {processes_dir(directory) / 'PID'}")
    if not profile.status.complete:
        raise UsageError(f"{path}: nothing was profiled ({profile.status.reason or 'the run did not finish'}), so "
                         f"it has no {what}")
    raise UsageError(f"{path}: this run was not profiled (it was made with --no-profile), so it has no {what}; "
                     "run it again without --no-profile")


def write_output(output: str, write: Callable[[TextIO], int]) -> int:
    """Runs ``write`` on standard output ('-') or on the file ``output`` by
    :func:`~cpuprof.output_file.write_file`'s rules (a regular file appears whole or not at all; a
    device or FIFO is written into); returns what ``write`` returned. An unwritable path is one line."""
    if output == "-":
        return write(sys.stdout)
    return write_file(output, write)


def python_hz(args: argparse.Namespace) -> int:
    if args.python_hz is not None:
        return int(args.python_hz)
    return defaults.PYTHON_HZ if args.flamegraph else 0


def profile_options(args: argparse.Namespace, enabled: bool = True, timeline: int = 0) -> ProfileOptions:
    """The profiling flags (options_spec.PROFILING) as typed options; ``timeline``: the op spans
    kept when --timeline is not given (a program's decode steps are found in them)."""
    return spec.build(ProfileOptions, [o for o in spec.PROFILING if o.flag not in ("--python-hz", "--timeline")],
                      args, enabled=enabled, python_hz=python_hz(args),
                      timeline=timeline if args.timeline is None else args.timeline)


def check_profile_options(p: ProfileOptions, flamegraph: bool) -> None:
    """What can be wrong with the profiling options, found before a child starts (UsageError)."""
    from ..collect.session import check_options

    check_options(p.mode, p.sample_hz, p.stack_bytes, defaults.OP_CAPACITY, p.timeline, defaults.MAX_THREADS)
    if flamegraph and (p.mode != SAMPLED or not p.enabled):
        raise UsageError("--flamegraph draws the samples' stacks: it needs the sampled mode (the default)")
    if p.python_hz > defaults.MAX_PYTHON_HZ:
        raise UsageError(f"--python-hz {p.python_hz}: expected 0 (no Python stacks) to {defaults.MAX_PYTHON_HZ}")


def after_report(fmt: str) -> tuple[TextIO, str]:
    """Where the lines a command adds after its report go, and what separates them from it: stdout
    after a blank line where the report is for a person; stderr where it is data (it owns stdout)."""
    from ..reports import get_renderer

    return (sys.stdout, "\n") if get_renderer(fmt).for_a_person else (sys.stderr, "")


def show_results(profile: Profile, out_dir: Path, fmt: str, top: int, flamegraph: bool,
                 whole_run: bool = False) -> None:
    """A launched run's report on stdout, then where its profile (and flame graph) were saved."""
    from ..reports import render

    render(profile, sys.stdout, format=fmt, top=top, whole_run=whole_run)
    what = "profile" if profile.profiled else "results (not profiled)"
    again = ["report", str(out_dir)] + (["--format", "markdown"] if fmt == "markdown" else [])
    where = f"{what} saved in {out_dir}; re-render with: {cpuprof_command(*again)}"
    stream, gap = after_report(fmt)
    stream.write(gap + where + "\n")
    if flamegraph and profile.stacks is not None:
        stream.write(write_flamegraph(profile, out_dir) + "\n")


def write_stacks(profile: Profile, out: TextIO, fmt: str, weight: str = "samples", thread: str | None = None,
                 python: bool = True, title: str | None = None) -> int:
    """Writes the profile's merged stacks in ``fmt`` (svg, folded, speedscope); returns how many
    distinct stacks."""
    from ..analysis.flame import flame_graph
    from ..reports import OutputOptions, StacksSource, get_output

    graph = flame_graph(profile, weight=weight, thread=thread, python_stacks=python, title=title)
    return get_output(fmt, "stacks").write(StacksSource(graph), out, OutputOptions())


def write_flamegraph(profile: Profile, out_dir: Path) -> str:
    """flame.svg and trace.json beside the profile; returns the line that says where."""
    from ..exports import trace

    svg, trace_file = out_dir / "flame.svg", out_dir / "trace.json"
    write_output(str(svg), lambda out: write_stacks(profile, out, "svg"))
    write_output(str(trace_file), lambda out: trace.write(profile, out))
    return (f"flame graph: {svg} (open in a browser: click to zoom, Ctrl-F to search); "
            f"trace: {trace_file} (https://ui.perfetto.dev)")
