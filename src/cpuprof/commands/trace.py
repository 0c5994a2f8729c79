"""``cpuprof trace DIR -o trace.json``: a saved profile as a Chrome/Perfetto trace."""

from __future__ import annotations

import argparse
from pathlib import Path

from .. import options_spec as spec
from ..model.io import is_directory, present
from ..model.ranks import RANKS_FILENAME, MultiRun
from ..reports import OutputOptions, ProfileSource, RanksSource, Source, get_output
from ..safe_text import say
from .common import load_profiled, write_output

COMMAND = spec.Command(
    "trace", help="a profile as a Chrome/Perfetto trace: a track per thread, op spans, sampled work, CPU counters",
    description="Op spans need the run to keep them (decode --timeline N); every sampled run has the slices of what "
                "each thread's samples worked for and its CPU use over time. Open the file in https://ui.perfetto.dev "
                "or chrome://tracing.",
    groups=(spec.Group(None, spec.TRACE),))


def run(args: argparse.Namespace) -> int:
    directory = Path(args.path)
    source: Source
    if is_directory(directory) and present(directory / RANKS_FILENAME):
        source = RanksSource(MultiRun.load(directory), directory)
    else:
        source = ProfileSource(load_profiled(args.path, "timeline"))
    output = get_output("trace", source.kind)
    n = write_output(args.output, lambda out: output.write(source, out, OutputOptions()))
    if args.output != "-":
        say(f"wrote {args.output} ({n:,} trace events)")
    return 0
