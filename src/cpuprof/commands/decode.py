"""``cpuprof decode``: LLM decoding, pinned and profiled, with the settings in force."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING

from .. import options_spec as spec
from ..errors import UsageError
from ..launch import environment, parent, run_dir
from ..launch.options import DecodeOptions, WorkloadOptions
from ..model import Profile
from ..workload.presets import OVERRIDABLE_FIELDS
from .common import (
    after_report,
    check_profile_options,
    profile_options,
    show_results,
    write_flamegraph,
)

if TYPE_CHECKING:
    from ..reports import Source


COMMAND = spec.Command(
    "decode", help="profile LLM decoding in a child pinned to the threads/CPUs/NUMA node asked for",
    description="Runs a Llama-architecture decoder (random weights from a seed, or a local HF checkpoint) in a child "
                "process configured before torch loads, profiles every ATen op across every thread, and reports "
                "throughput, latency, the settings in force and where the time goes.",
    groups=(
        spec.Group("workload", spec.WORKLOAD),
        spec.LAUNCH_GROUP,
        spec.Group("several processes: tensor-parallel ranks or independent instances, each pinned to its share of "
                   "the machine (the NUMA nodes in order; a node's CPUs split evenly between its ranks) and profiled; "
                   "one merged report", spec.RANKS),
        spec.Group("profiling", (spec.NO_PROFILE, *spec.for_program(spec.PROFILING, "the decode"), spec.ROOFS)),
        spec.Group("output", (*spec.output_options("decode"), spec.HTML, spec.CHECKPOINT)),
    ))


def options_from_args(args: argparse.Namespace) -> DecodeOptions:
    """The CLI's strings parsed into typed options (UsageError, one line, for anything malformed)."""
    overrides = {field: getattr(args, field) for field in OVERRIDABLE_FIELDS if getattr(args, field) is not None}
    return spec.build(DecodeOptions, (spec.ROOFS, spec.CHECKPOINT), args,
                      workload=spec.build(WorkloadOptions, spec.WORKLOAD, args, overrides=overrides),
                      launch=launch_from_args(args), profile=profile_options(args, enabled=args.profile),
                      out=args.out)


def launch_from_args(args: argparse.Namespace) -> environment.LaunchSettings:
    return spec.build(environment.LaunchSettings, spec.LAUNCH, args)


def run(args: argparse.Namespace) -> int:
    options = options_from_args(args)
    check_profile_options(options.profile, args.flamegraph)
    parent.check_group_size_used(options.workload.group_size, [options.workload.quant])
    shards = (args.tp,) if args.tp is not None else (1,)
    options = dataclasses.replace(options, workload=parent.with_group_size(options.workload, [options.workload.quant],
                                                                            shards))
    # Held until the command ends: no other run writes this directory meanwhile (rank-K/ are inside it).
    with run_dir.claimed(options.out, "decode", overwrite=args.overwrite) as out_dir:
        return run_in(args, dataclasses.replace(options, out=str(out_dir)), out_dir)


def run_in(args: argparse.Namespace, options: DecodeOptions, out_dir: Path) -> int:
    fmt = "json" if args.json else args.format
    if args.tp is not None or args.instances is not None:
        return run_ranks(args, options, out_dir, fmt)
    if args.ranks_per_node is not None:
        raise UsageError("--ranks-per-node places the processes of --tp N or --instances N; give one of them")
    outcome = parent.launch(options, out_dir)
    if outcome.profile is not None:
        show_results(outcome.profile, outcome.out_dir, fmt, args.top, args.flamegraph)
        if args.html:
            stream, _ = after_report(fmt)
            stream.write(write_html(outcome.profile, outcome.out_dir, args.top) + "\n")
    return parent.check_outcome(outcome)


def run_ranks(args: argparse.Namespace, options: DecodeOptions, out_dir: Path, fmt: str) -> int:
    """decode --tp N / --instances N: every rank launched, profiled and saved; one merged report."""
    from ..launch import ranks
    from .group import group_exit, show_group

    if args.tp is not None and args.instances is not None:
        raise UsageError("--tp and --instances: choose one (tensor-parallel ranks of one model, or independent "
                         "decoders)")
    mode, n = ("tp", args.tp) if args.tp is not None else ("instances", args.instances)
    run = ranks.launch_ranks(options, out_dir, mode, n, ranks_per_node=args.ranks_per_node, backend=args.backend,
                             timeout_s=args.rank_timeout)
    stream = show_group(run, out_dir, fmt)
    if args.html:
        from ..reports import RanksSource

        page = write_page(RanksSource(run, out_dir), out_dir, args.top)
        stream.write(f"HTML report of the group: {page}; each rank's is beside its profile\n")
    for rank, profile in zip(run.ranks, run.profiles(out_dir), strict=True):
        if profile is None:
            continue
        if args.flamegraph and profile.stacks is not None:
            stream.write(f"rank {rank.rank}: " + write_flamegraph(profile, out_dir / rank.dir) + "\n")
        if args.html:
            stream.write(f"rank {rank.rank}: " + write_html(profile, out_dir / rank.dir, args.top) + "\n")
    return group_exit(run, out_dir)


def write_html(profile: Profile, out_dir: Path, top: int) -> str:
    """report.html beside the profile; returns the line that says where."""
    from ..reports import ProfileSource

    page = write_page(ProfileSource(profile), out_dir, top)
    return f"HTML report: {page} (one self-contained page with charts: open it in a browser, offline)"


def write_page(source: Source, out_dir: Path, top: int) -> Path:
    """report.html of ``source`` in ``out_dir``; returns its path."""
    from ..reports import OutputOptions, get_output
    from .common import write_output

    page = out_dir / "report.html"
    output = get_output("html", source.kind)
    write_output(str(page), lambda out: output.write(source, out, OutputOptions(top=top)))
    return page
