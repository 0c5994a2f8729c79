"""``cpuprof merge DIR... --out M``: several hosts' runs of one job as one run."""

from __future__ import annotations

import argparse
import sys

from .. import exit_codes
from .. import options_spec as spec
from ..launch.merge_hosts import merge_runs
from ..launch.run_dir import claimed
from ..safe_text import cpuprof_command, printable, say

COMMAND = spec.Command(
    "merge", help="one run from several hosts' runs of one job (a run directory each): ranks by host, clocks aligned",
    description="Each host runs its own launcher (python -m cpuprof run --out DIR -- torchrun --nnodes H "
                "--node-rank R ...); merge copies each DIR under M/hosts/HOST/ and finds each host's clock offset "
                "from the ends of the collectives its ranks made with the others (hosts' clocks are never assumed "
                "equal). report, trace, flamegraph, diff and the HTML page then read M as one run.",
    groups=(spec.Group(None, spec.merge_options()),))


def run(args: argparse.Namespace) -> int:
    with claimed(args.out, "merge", overwrite=args.overwrite) as out:
        merged = merge_runs(args.runs, out)
    for line in merged.problems:
        say(f"cpuprof: warning: {line}")
    hosts = ", ".join(f"{h.label} ({printable(h.source)})" for h in merged.hosts)
    print(f"merged {len(merged.hosts)} host{'s' if len(merged.hosts) != 1 else ''} into {printable(str(out))}: {hosts}")
    for h in merged.hosts:
        if h.reference:
            print(f"  {h.label}: the reference clock")
        elif h.offset_ns is not None:
            print(f"  {h.label}: clock offset {h.offset_ns / 1e9:+.6f} s (added to its times), residual "
                  f"{(h.residual_ns or 0) / 1e6:.3f} ms over {h.matched:,} collectives' ends")
        else:
            print(f"  {h.label}: not aligned")
    print(f"its report: {cpuprof_command('report', str(out))}; its trace: "
          f"{cpuprof_command('trace', str(out), '-o', 'trace.json')}")
    sys.stdout.flush()
    left_out = len(args.runs) - len(merged.hosts)
    return exit_codes.FAILED if left_out else exit_codes.OK
