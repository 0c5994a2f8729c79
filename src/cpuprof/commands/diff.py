"""``cpuprof diff A B``: what changed from one saved profile (before) to another (after)."""

from __future__ import annotations

import argparse
import sys

from .. import options_spec as spec
from ..reports import DiffSource, OutputOptions, get_output
from .common import load_run

COMMAND = spec.Command(
    "diff", help="what changed between two saved profiles: ops, GEMMs, threads, counters, settings, throughput",
        description="Compares profile A (before) with profile B (after), most changed first: ops matched by name, "
                    "inputs and region (self time, per generated token when both are decodes; ops on one side only "
                    "are added or removed), GEMM shapes, regions, threads (CPU, run-queue delay), counters, the "
                    "settings that differ, and throughput and latency when both are decodes.",
    groups=(spec.Group(None, spec.diff_options()),))


def run(args: argparse.Namespace) -> int:
    source = DiffSource(load_run(args.before), load_run(args.after), args.before, args.after)
    get_output(args.format, source.kind, roles=("report",)).write(source, sys.stdout, OutputOptions(top=args.top))
    return 0
