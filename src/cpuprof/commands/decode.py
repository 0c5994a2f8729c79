"""``cpuprof decode``: LLM decoding, pinned and profiled, with the settings in force."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TextIO

from .. import defaults
from ..errors import UsageError
from ..launch import environment, parent
from ..launch.options import DecodeOptions, WorkloadOptions
from ..model import Profile
from ..workload.dtypes import DTYPE_NAMES
from .common import (
    add_output_arguments,
    add_profiling_arguments,
    check_profile_options,
    positive_float,
    positive_int,
    profile_options,
    show_results,
    write_flamegraph,
)

# Model-shape overrides: flag -> ModelConfig field.
OVERRIDES = {"layers": "layers", "hidden": "hidden", "heads": "heads", "kv_heads": "kv_heads",
             "ffn": "ffn", "vocab": "vocab", "max_seq": "max_seq"}
PRESET_NAMES = ("llama-3.2-1b", "llama-3.1-8b", "tiny")


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "decode", help="profile LLM decoding in a child pinned to the threads/CPUs/NUMA node asked for",
        description="Runs a Llama-architecture decoder (random weights from a seed, or a local HF checkpoint) "
                    "in a child process configured before torch loads, profiles every ATen op across every "
                    "thread, and reports throughput, latency, the settings in force and where the time goes.")
    add_workload_arguments(p)
    add_launch_arguments(p)
    add_rank_arguments(p)
    c = p.add_argument_group("profiling")
    c.add_argument("--no-profile", dest="profile", action="store_false",
                   help="decode without the profiler (a baseline)")
    add_profiling_arguments(c, "the decode")
    c.add_argument("--roofs", default="auto", choices=("auto", "remeasure", "off"),
                   help="the machine's measured roofs (memory bandwidth, compute, GEMV kernel) every GEMM and the "
                        "decode ceiling are judged against: auto (default) takes them from the cache for this "
                        "machine, torch and launch, or measures them first (a few seconds, once); remeasure; off")
    o = p.add_argument_group("output")
    add_output_arguments(o, "decode")
    o.add_argument("--html", action="store_true",
                   help="also write report.html beside the profile: the report with its charts, one self-contained "
                        "page that opens offline")
    o.add_argument("--checkpoint-s", type=positive_float, default=defaults.CHECKPOINT_S, metavar="S",
                   help=f"save the profile so far every S seconds while decoding (default {defaults.CHECKPOINT_S:g})")
    p.set_defaults(run=run)


def add_workload_arguments(p: argparse.ArgumentParser, sweep: bool = False) -> None:
    """The workload flags decode and compare share; with ``sweep``, --dtype and --batch take lists."""
    w = p.add_argument_group("workload")
    w.add_argument("--preset", default="llama-3.2-1b", help=f"{', '.join(PRESET_NAMES)} (default llama-3.2-1b)")
    for flag in OVERRIDES:
        w.add_argument(f"--{flag.replace('_', '-')}", dest=flag, type=int, metavar="N",
                       help=f"override the preset's {flag.replace('_', ' ')}")
    w.add_argument("--dtype", default="bf16", help=f"{' or '.join(DTYPE_NAMES)} (default bf16)"
                   + ("; a comma list sweeps them" if sweep else ""))
    w.add_argument("--prompt-len", type=int, default=32, help="prompt tokens for prefill (default 32)")
    w.add_argument("--new-tokens", type=int, default=32, help="decode steps (default 32)")
    w.add_argument("--batch", type=str if sweep else int, default="1" if sweep else 1,
                   help="sequences decoded together (default 1)" + ("; a list or range sweeps them" if sweep else ""))
    w.add_argument("--warmup", type=int, default=2, help="decode steps left out of tokens/s (default 2)")
    w.add_argument("--sampling", default="greedy", help="greedy (default) or topk")
    w.add_argument("--top-k", type=positive_int, default=50,
                   help="with --sampling topk: sample among the k most likely tokens (default 50)")
    w.add_argument("--seed", type=int, default=0,
                   help="seed of the random weights, the prompt and top-k sampling (default 0)")
    w.add_argument("--hf", metavar="PATH", help="decode a local Hugging Face checkpoint (needs transformers)")
    compile_help = ("torch.compile the built-in model (inductor, weights frozen as constants, so oneDNN packs them "
                    "once instead of on every call); compiled before the profile starts, outside the figures")
    if sweep:
        w.add_argument("--compile", default=None, metavar="on,off", help=compile_help + "; on,off sweeps both")
    else:
        w.add_argument("--compile", action="store_true", help=compile_help)


def add_launch_arguments(p: argparse.ArgumentParser) -> None:
    """The launch options decode and calibrate share: the same flags mean the same launch."""
    launch = p.add_argument_group("launch: threads, pinning, OpenMP, NUMA")
    launch.add_argument("--threads", help="OpenMP/torch threads (default: every CPU of the chosen set)")
    launch.add_argument("--numa", metavar="NODE", help="bind CPUs and memory to this NUMA node")
    launch.add_argument("--cpus", metavar="LIST", help="explicit CPU list, e.g. 0-3,8")
    launch.add_argument("--bind", default="close", help="close (default), spread or none")
    launch.add_argument("--omp", default="gnu", help="gnu (torch's libgomp, default) or intel (libiomp5, preloaded)")
    launch.add_argument("--blocktime", metavar="MS",
                        help="ms an idle OpenMP thread spins before sleeping (KMP_BLOCKTIME / GOMP_SPINCOUNT)")
    launch.add_argument("--allocator", default="default", help="default, jemalloc or tcmalloc (preloaded)")
    launch.add_argument("--oversubscribe", action="store_true", help="allow more threads than CPUs")


def add_rank_arguments(p: argparse.ArgumentParser) -> None:
    r = p.add_argument_group(
        "several processes: tensor-parallel ranks or independent instances, each pinned to its share of the machine "
        "(the NUMA nodes in order; a node's CPUs split evenly between its ranks) and profiled; one merged report")
    r.add_argument("--tp", type=positive_int, metavar="N",
                   help="split the built-in model tensor-parallel over N processes (attention heads and MLP width "
                        "sharded, an all-reduce after attention and after the MLP), through torch.distributed")
    r.add_argument("--instances", type=positive_int, metavar="N",
                   help="N independent decoders side by side, for aggregate throughput")
    r.add_argument("--ranks-per-node", type=positive_int, metavar="K",
                   help="ranks on each NUMA node (default: as few as fit, one per node when there are enough)")
    r.add_argument("--backend", default="gloo",
                   help="torch.distributed backend for --tp: gloo (default) or ccl (needs Intel's oneCCL bindings)")
    r.add_argument("--rank-timeout", type=positive_float, default=120.0, metavar="S",
                   help="how long ranks wait for each other in an all-reduce of the model, and how long the others get "
                        "to end once one rank has failed before they are stopped (default 120; starting up, ranks "
                        "wait for each other up to 300 s, or this if longer)")


def options_from_args(args: argparse.Namespace) -> DecodeOptions:
    """The CLI's strings parsed into typed options (UsageError, one line, for anything malformed)."""
    overrides = {field: getattr(args, flag) for flag, field in OVERRIDES.items() if getattr(args, flag) is not None}
    launch = launch_from_args(args)
    return DecodeOptions(
        workload=WorkloadOptions(
            preset=args.preset, overrides=overrides, dtype=args.dtype, prompt_len=args.prompt_len,
            new_tokens=args.new_tokens, batch=args.batch, warmup=args.warmup, sampling=args.sampling,
            top_k=args.top_k, seed=args.seed, hf=args.hf, compile=args.compile is True),
        launch=launch,
        profile=profile_options(args, enabled=args.profile),
        out=args.out, checkpoint_s=args.checkpoint_s, roofs=args.roofs,
    )


def launch_from_args(args: argparse.Namespace) -> environment.LaunchSettings:
    topology = None
    cpus = None
    if args.cpus is not None:
        from ..machine.topology import read_topology

        topology = read_topology()
        cpus = environment.parse_cpus(args.cpus, topology)
    return environment.LaunchSettings(
        threads=environment.parse_threads(args.threads) if args.threads is not None else None,
        numa=environment.parse_numa(args.numa) if args.numa is not None else None,
        cpus=cpus, bind=args.bind, omp=args.omp,
        blocktime_ms=environment.parse_blocktime(args.blocktime) if args.blocktime is not None else None,
        allocator=args.allocator, oversubscribe=args.oversubscribe,
    )


def run(args: argparse.Namespace) -> int:
    options = options_from_args(args)
    check_profile_options(options.profile, args.flamegraph)
    out_dir = Path(options.out) if options.out else parent.default_out_dir()
    fmt = "json" if args.json else args.format
    if args.tp is not None or args.instances is not None:
        return run_ranks(args, options, out_dir, fmt)
    if args.ranks_per_node is not None:
        raise UsageError("--ranks-per-node places the processes of --tp N or --instances N; give one of them")
    outcome = parent.launch(options, out_dir)
    if outcome.profile is not None:
        show_results(outcome.profile, outcome.out_dir, fmt, args.top, args.flamegraph)
        if args.html:
            # as show_results: the report owns stdout in the data formats, so the location goes to stderr
            stream = sys.stdout if fmt == "terminal" else sys.stderr
            stream.write(write_html(outcome.profile, outcome.out_dir, args.top) + "\n")
    return parent.check_outcome(outcome)


def run_ranks(args: argparse.Namespace, options: DecodeOptions, out_dir: Path, fmt: str) -> int:
    """decode --tp N / --instances N: every rank launched, profiled and saved; one merged report."""
    from ..analysis.ranks import load_profiles
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
        from ..reports.html_ranks import write_ranks_html
        from .common import write_output

        page = out_dir / "report.html"

        def write_page(out: TextIO) -> int:
            write_ranks_html(run, out_dir, out)
            return 0

        write_output(str(page), write_page)
        stream.write(f"HTML report of the group: {page}; each rank's is beside its profile\n")
    for rank, profile in zip(run.ranks, load_profiles(run, out_dir), strict=True):
        if profile is None:
            continue
        if args.flamegraph and profile.stacks is not None:
            stream.write(f"rank {rank.rank}: " + write_flamegraph(profile, out_dir / rank.dir) + "\n")
        if args.html:
            stream.write(f"rank {rank.rank}: " + write_html(profile, out_dir / rank.dir, args.top) + "\n")
    return group_exit(run, out_dir)


def write_html(profile: Profile, out_dir: Path, top: int) -> str:
    """report.html beside the profile; returns the line that says where."""
    from ..reports.html import write_profile_html
    from .common import write_output

    page = out_dir / "report.html"

    def write(out: TextIO) -> int:
        write_profile_html(profile, out, top=top)
        return 0

    write_output(str(page), write)
    return f"HTML report: {page} (one self-contained page with charts: open it in a browser, offline)"
