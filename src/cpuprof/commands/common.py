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
from ..errors import UsageError
from ..launch.options import ProfileOptions
from ..model import Profile


def _bounded(kind: Callable[[str], float], minimum: float, inclusive: bool, expected: str) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {expected}, not {text!r}") from None
        if value < minimum or (not inclusive and value == minimum):
            raise argparse.ArgumentTypeError(f"expected {expected}, not {text}")
        return value

    return parse


positive_int = _bounded(int, 1, True, "a positive whole number")
non_negative_int = _bounded(int, 0, True, "0 or more")
positive_float = _bounded(float, 0.0, False, "a positive number")


def write_output(output: str, write: Callable[[TextIO], int]) -> int:
    """Runs ``write`` on standard output ('-') or on a file that appears whole or not at all;
    returns what ``write`` returned. An unwritable path is a one-line UsageError."""
    if output == "-":
        return write(sys.stdout)
    target = Path(output)
    if target.is_dir():
        raise UsageError(f"{output} is a directory; give a file name")
    tmp = target.with_name(target.name + ".tmp")
    try:
        with open(tmp, "w") as f:
            result = write(f)
        tmp.replace(target)
    except OSError as exc:
        raise UsageError(f"cannot write {output}: {exc.strerror or exc}") from exc
    finally:
        tmp.unlink(missing_ok=True)
    return result


def add_profiling_arguments(group: argparse._ArgumentGroup, program: str) -> None:
    """How the profiler runs: the flags decode and run share. ``program`` names what py-spy runs
    beside ("the decode")."""
    group.add_argument("--events", default=defaults.DEFAULT_EVENTS,
                       help="events and presets, comma separated (default: default)")
    group.add_argument("--mode", default=defaults.DEFAULT_MODE, choices=defaults.MODES,
                       help="sampled (default): the kernel samples every thread on its CPU clock and each sample is "
                            "charged to the op its thread worked for, with its native stack (low overhead, "
                            "statistical per op); exact: every working thread read at every op boundary (exact "
                            "per op, a few µs per op)")
    group.add_argument("--sample-hz", type=positive_int, default=defaults.SAMPLE_HZ,
                       help=f"sampled mode: samples per second of each thread's CPU time (default "
                            f"{defaults.SAMPLE_HZ}, {defaults.MIN_SAMPLE_HZ} to {defaults.MAX_SAMPLE_HZ})")
    group.add_argument("--stack-bytes", type=non_negative_int, default=defaults.STACK_BYTES,
                       help=f"sampled mode: user stack copied per sample to unwind native stacks (default "
                            f"{defaults.STACK_BYTES}, up to {defaults.MAX_STACK_BYTES}, a multiple of 8; 0: leaf only)")
    group.add_argument("--python-hz", type=non_negative_int, metavar="HZ",
                       help=f"sampled mode: run py-spy beside {program} at HZ samples per second, for the Python "
                            f"frames above the ops in stacks (up to {defaults.MAX_PYTHON_HZ}; default 0, none, or "
                            f"{defaults.PYTHON_HZ} with --flamegraph; py-spy's own CPU time competes with {program} "
                            "where no CPU is spare)")
    group.add_argument("--no-shapes", dest="record_shapes", action="store_false",
                       help="do not key ops by their inputs")
    group.add_argument("--timeline", type=non_negative_int, default=0, metavar="N",
                       help="keep the last N op spans of each op-running thread (default 0)")


def add_output_arguments(group: argparse._ArgumentGroup, command: str) -> None:
    """Where the profile goes and how its report is shown: the flags decode and run share."""
    from ..reports import FORMATS

    group.add_argument("--out", metavar="DIR",
                       help=f"where the profile is saved (default cpuprof-out/{command}-<time>)")
    group.add_argument("--format", default="terminal", choices=FORMATS,
                       help="the report on stdout: terminal (default), markdown or json")
    group.add_argument("--json", action="store_true", help="same as --format json")
    group.add_argument("--flamegraph", action="store_true",
                       help="also write flame.svg (merged Python, op and native stacks of every thread, by samples) "
                            "and trace.json (Chrome/Perfetto) next to the profile")
    group.add_argument("--top", type=positive_int, default=defaults.TOP_OPS,
                       help=f"ops listed in the report (default {defaults.TOP_OPS})")


def python_hz(args: argparse.Namespace) -> int:
    if args.python_hz is not None:
        return int(args.python_hz)
    return defaults.PYTHON_HZ if args.flamegraph else 0


def profile_options(args: argparse.Namespace, enabled: bool = True) -> ProfileOptions:
    """The profiling flags (add_profiling_arguments) as typed options."""
    return ProfileOptions(enabled=enabled, events=args.events, mode=args.mode, sample_hz=args.sample_hz,
                          stack_bytes=args.stack_bytes, record_shapes=args.record_shapes, timeline=args.timeline,
                          python_hz=python_hz(args))


def check_profile_options(p: ProfileOptions, flamegraph: bool) -> None:
    """What can be wrong with the profiling options, found before a child starts (UsageError)."""
    from ..collect.session import check_options

    check_options(p.mode, p.sample_hz, p.stack_bytes, defaults.OP_CAPACITY, p.timeline, defaults.MAX_THREADS)
    if flamegraph and (p.mode != "sampled" or not p.enabled):
        raise UsageError("--flamegraph draws the samples' stacks: it needs the sampled mode (the default)")
    if p.python_hz > defaults.MAX_PYTHON_HZ:
        raise UsageError(f"--python-hz {p.python_hz}: expected 0 (no Python stacks) to {defaults.MAX_PYTHON_HZ}")


def show_results(profile: Profile, out_dir: Path, fmt: str, top: int, flamegraph: bool) -> None:
    """A launched run's report on stdout, then where its profile (and flame graph) were saved."""
    from ..reports import render

    render(profile, sys.stdout, format=fmt, top=top)
    what = "profile" if profile.profiled else "results (not profiled)"
    where = (f"{what} saved in {out_dir}; re-render with: python -m cpuprof report {out_dir}"
             + (" --format markdown" if fmt == "markdown" else ""))
    # The report owns stdout in the data formats; the location goes to stderr there.
    stream = sys.stdout if fmt == "terminal" else sys.stderr
    stream.write(("\n" if fmt == "terminal" else "") + where + "\n")
    if flamegraph and profile.stacks is not None:
        stream.write(write_flamegraph(profile, out_dir) + "\n")


def write_flamegraph(profile: Profile, out_dir: Path) -> str:
    """flame.svg and trace.json beside the profile; returns the line that says where."""
    from ..exports import trace
    from .flamegraph import write

    svg, trace_file = out_dir / "flame.svg", out_dir / "trace.json"
    write_output(str(svg), lambda out: write(profile, out, "svg"))
    write_output(str(trace_file), lambda out: trace.write(profile, out))
    return (f"flame graph: {svg} (open in a browser: click to zoom, Ctrl-F to search); "
            f"trace: {trace_file} (https://ui.perfetto.dev)")
