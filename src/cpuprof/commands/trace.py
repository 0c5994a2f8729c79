"""``cpuprof trace DIR -o trace.json``: a saved profile as a Chrome/Perfetto trace."""

from __future__ import annotations

import argparse
from pathlib import Path

from .. import options_spec as spec
from ..exports import trace as trace_export
from ..model import Profile
from ..model.io import is_directory, present
from ..model.ranks import RANKS_FILENAME, MultiRun
from ..model.run_layout import has_followed, iter_processes
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
    elif is_directory(directory) and has_followed(directory) and (ranks := followed_ranks(directory)):
        t0 = min(started for *_, started in ranks)
        loaded = ((rank, Profile.load(where)) for rank, where, _, _, _ in ranks)  # one at a time
        n = write_output(args.output, lambda out: trace_export.write_ranks(
            loaded, out, [(host, offset) for _, _, host, offset, _ in ranks], t0))
        if args.output != "-":
            say(f"wrote {args.output} ({n:,} trace events): the {len(ranks)} ranks of the run's torch.distributed "
                "job, a process each on one clock")
        return 0
    else:
        source = ProfileSource(load_profiled(args.path, "timeline"))
    output = get_output("trace", source.kind)
    n = write_output(args.output, lambda out: output.write(source, out, OutputOptions()))
    if args.output != "-":
        say(f"wrote {args.output} ({n:,} trace events)")
    return 0


def followed_ranks(directory: Path) -> list[tuple[int, Path, str, int, int]]:
    """The processes of a run (of a merged run's hosts) that are ranks of one torch.distributed job
    (the job with the most ranks here), by rank: each one's directory, host label, clock offset and
    start on the aligned clock; empty where fewer than two are. Each profile is dropped once read."""
    jobs: dict[tuple[str | None, int], list[tuple[int, Path, str, int, int]]] = {}
    for p in iter_processes(directory):
        d, collection = p.profile.distributed, p.profile.collection
        if d is not None and collection is not None and p.profile.spans is not None:
            offset = p.clock_offset_ns or 0
            jobs.setdefault((d.store, d.world_size), []).append(
                (d.rank, p.directory, p.host or "", offset, collection.started_ns + offset))
    biggest = max(jobs.values(), key=len, default=[])
    return sorted(biggest, key=lambda rank: rank[0]) if len(biggest) >= 2 else []
