"""``cpuprof flamegraph DIR -o flame.svg``: a saved profile's merged stacks as a flame graph,
folded stacks or speedscope JSON (chosen by -o's suffix or --format)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TextIO

from ..analysis import flame
from ..errors import UsageError
from ..model import Profile
from .common import write_output

FORMATS = ("svg", "folded", "speedscope")
SUFFIXES = {".svg": "svg", ".folded": "folded", ".txt": "folded", ".json": "speedscope"}


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "flamegraph", help="a sampled profile's stacks as a flame graph (SVG), folded stacks or speedscope JSON",
        description="Merged stacks of every sampled thread: its Python frames (py-spy), the regions and ATen ops "
                    "it worked for, and the native frames its CPU was in. OpenMP workers' samples sit under the "
                    "ops of the thread they worked for.")
    p.add_argument("path", help="directory written by cpuprof, or a profile.json")
    p.add_argument("-o", "--output", required=True, metavar="FILE",
                   help="where to write: .svg (flame graph), .folded or .txt (flamegraph.pl's input), .json "
                        "(speedscope); '-' for standard output")
    p.add_argument("--format", choices=FORMATS, help="override the format the suffix implies")
    p.add_argument("--weight", default="samples",
                   help="samples (default), cpu (CPU time) or a counted event's name (e.g. page-faults)")
    p.add_argument("--thread", metavar="T", help="one thread: its label (T1) or tid; default all, merged")
    p.add_argument("--no-python", dest="python", action="store_false", help="leave py-spy's Python frames out")
    p.set_defaults(run=run)


def output_format(output: str, fmt: str | None) -> str:
    if fmt:
        return fmt
    chosen = SUFFIXES.get(Path(output).suffix.lower())
    if chosen is None:
        raise UsageError(f"-o {output}: say which format with --format ({', '.join(FORMATS)}); the suffix "
                         f"does not tell (.svg, .folded, .txt or .json)")
    return chosen


def write(profile: Profile, out: TextIO, fmt: str, weight: str = "samples", thread: str | None = None,
          python: bool = True, title: str | None = None) -> int:
    """Writes the merged stacks in ``fmt``; returns how many distinct stacks."""
    stacks = flame.merged_stacks(profile, weight=weight, thread=thread, python_stacks=python)
    unit = flame.weight_unit(profile, weight)
    name = title or _title(profile, weight, thread)
    if fmt == "folded":
        from ..exports import folded

        folded.write(stacks, out)
    elif fmt == "svg":
        from ..exports import svg

        svg.write(stacks, out, title=name, unit=unit, subtitle=_subtitle(profile))
    else:
        from ..exports import speedscope

        speedscope.write(stacks, out, name=name, unit=unit, exporter=f"cpuprof {profile.meta.cpuprof_version}")
    return len(stacks)


def _title(profile: Profile, weight: str, thread: str | None) -> str:
    what = profile.workload.model.name if profile.workload else "profile"
    threads = f"thread {thread}" if thread and thread != "all" else "all threads"
    return f"cpuprof: {what}, {threads}, weighted by {weight}"


def _subtitle(profile: Profile) -> str:
    parts = []
    if profile.sampling is not None:
        parts.append(f"{profile.sampling.samples:,} samples at {profile.sampling.hz} Hz per thread")
        py = profile.sampling.python
        if py is not None:
            parts.append(f"Python frames: {py.source} at {py.hz} Hz" if not py.error else "no Python frames")
    return "; ".join(parts)


def run(args: argparse.Namespace) -> int:
    profile = Profile.load(args.path)
    fmt = output_format(args.output, args.format)
    n = write_output(args.output, lambda out: write(profile, out, fmt, args.weight, args.thread, args.python))
    if args.output != "-":
        print(f"wrote {args.output} ({fmt}, {n:,} stacks weighted by {args.weight})", file=sys.stderr)
    return 0
