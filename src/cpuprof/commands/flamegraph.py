"""``cpuprof flamegraph DIR -o flame.svg``: a saved profile's merged stacks as a flame graph,
folded stacks or speedscope JSON (chosen by -o's suffix or --format)."""

from __future__ import annotations

import argparse
from pathlib import Path

from .. import options_spec as spec
from ..errors import UsageError
from ..reports import by_suffix, get_output, output_names
from ..safe_text import say
from .common import load_profiled, write_output, write_stacks

# The outputs that draw merged stacks: svg, folded, speedscope.
FORMATS = output_names("stacks")


COMMAND = spec.Command(
    "flamegraph", help="a sampled profile's stacks as a flame graph (SVG), folded stacks or speedscope JSON",
        description="Merged stacks of every sampled thread: its Python frames, the regions and ATen ops "
                    "it worked for, and the native frames its CPU was in. OpenMP workers' samples sit under the "
                    "ops of the thread they worked for, and the Python caller of those ops where it was recorded.",
    groups=(spec.Group(None, spec.flamegraph_options()),))


def output_format(output: str, fmt: str | None) -> str:
    if fmt:
        return fmt
    chosen = by_suffix(Path(output).suffix, "stacks")
    if chosen is None:
        suffixes = [x for name in FORMATS for o in [get_output(name)] for x in (o.suffix, *o.other_suffixes)]
        raise UsageError(f"-o {output}: say which format with --format ({', '.join(FORMATS)}); the suffix "
                         f"does not tell ({', '.join(suffixes[:-1])} or {suffixes[-1]})")
    return chosen.name


def run(args: argparse.Namespace) -> int:
    profile = load_profiled(args.path, "stacks")
    fmt = output_format(args.output, args.format)
    n = write_output(args.output, lambda out: write_stacks(profile, out, fmt, args.weight, args.thread, args.python))
    if args.output != "-":
        say(f"wrote {args.output} ({fmt}, {n:,} stacks weighted by {args.weight})")
    return 0
