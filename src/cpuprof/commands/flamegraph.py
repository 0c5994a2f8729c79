"""``cpuprof flamegraph DIR -o flame.svg``: a saved profile's merged stacks as a flame graph,
folded stacks or speedscope JSON (chosen by -o's suffix or --format)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TextIO

from ..analysis.flame import flame_graph
from ..errors import UsageError
from ..model import Profile
from ..reports import OutputOptions, StacksSource, by_suffix, get_output, output_names
from .common import load_profiled, write_output

# The outputs that draw merged stacks: svg, folded, speedscope.
FORMATS = output_names("stacks")


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "flamegraph", help="a sampled profile's stacks as a flame graph (SVG), folded stacks or speedscope JSON",
        description="Merged stacks of every sampled thread: its Python frames, the regions and ATen ops "
                    "it worked for, and the native frames its CPU was in. OpenMP workers' samples sit under the "
                    "ops of the thread they worked for, and the Python caller of those ops where it was recorded.")
    p.add_argument("path", help="directory written by cpuprof, or a profile.json")
    p.add_argument("-o", "--output", required=True, metavar="FILE",
                   help="where to write: .svg (flame graph), .folded or .txt (flamegraph.pl's input), .json "
                        "(speedscope); '-' for standard output")
    p.add_argument("--format", choices=FORMATS, help="override the format the suffix implies")
    p.add_argument("--weight", default="samples",
                   help="samples (default), cpu (CPU time) or a counted event's name (e.g. page-faults)")
    p.add_argument("--thread", metavar="T", help="one thread: its label (T1) or tid; default all, merged")
    p.add_argument("--no-python", dest="python", action="store_false", help="leave the Python frames out")
    p.set_defaults(run=run)


def output_format(output: str, fmt: str | None) -> str:
    if fmt:
        return fmt
    chosen = by_suffix(Path(output).suffix, "stacks")
    if chosen is None:
        suffixes = [x for name in FORMATS for o in [get_output(name)] for x in (o.suffix, *o.other_suffixes)]
        raise UsageError(f"-o {output}: say which format with --format ({', '.join(FORMATS)}); the suffix "
                         f"does not tell ({', '.join(suffixes[:-1])} or {suffixes[-1]})")
    return chosen.name


def write(profile: Profile, out: TextIO, fmt: str, weight: str = "samples", thread: str | None = None,
          python: bool = True, title: str | None = None) -> int:
    """Writes the merged stacks in ``fmt``; returns how many distinct stacks."""
    graph = flame_graph(profile, weight=weight, thread=thread, python_stacks=python, title=title)
    return get_output(fmt, "stacks").write(StacksSource(graph), out, OutputOptions())


def run(args: argparse.Namespace) -> int:
    profile = load_profiled(args.path, "stacks")
    fmt = output_format(args.output, args.format)
    n = write_output(args.output, lambda out: write(profile, out, fmt, args.weight, args.thread, args.python))
    if args.output != "-":
        print(f"wrote {args.output} ({fmt}, {n:,} stacks weighted by {args.weight})", file=sys.stderr)
    return 0
