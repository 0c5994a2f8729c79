"""``cpuprof decode``: LLM decoding, pinned and profiled, with the settings in force."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .. import defaults
from ..errors import UsageError
from ..launch import environment, parent
from ..launch.options import DecodeOptions, ProfileOptions, WorkloadOptions
from ..model import Profile
from ..reports import FORMATS, render
from ..workload.dtypes import DTYPE_NAMES
from .common import non_negative_int, positive_float, positive_int

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
    w = p.add_argument_group("workload")
    w.add_argument("--preset", default="llama-3.2-1b", help=f"{', '.join(PRESET_NAMES)} (default llama-3.2-1b)")
    for flag in OVERRIDES:
        w.add_argument(f"--{flag.replace('_', '-')}", dest=flag, type=int, metavar="N",
                       help=f"override the preset's {flag.replace('_', ' ')}")
    w.add_argument("--dtype", default="bf16", help=f"{' or '.join(DTYPE_NAMES)} (default bf16)")
    w.add_argument("--prompt-len", type=int, default=32, help="prompt tokens for prefill (default 32)")
    w.add_argument("--new-tokens", type=int, default=32, help="decode steps (default 32)")
    w.add_argument("--batch", type=int, default=1, help="sequences decoded together (default 1)")
    w.add_argument("--warmup", type=int, default=2, help="decode steps left out of tokens/s (default 2)")
    w.add_argument("--sampling", default="greedy", help="greedy (default) or topk")
    w.add_argument("--top-k", type=positive_int, default=50,
                   help="with --sampling topk: sample among the k most likely tokens (default 50)")
    w.add_argument("--seed", type=int, default=0,
                   help="seed of the random weights, the prompt and top-k sampling (default 0)")
    w.add_argument("--hf", metavar="PATH", help="decode a local Hugging Face checkpoint (needs transformers)")
    add_launch_arguments(p)
    c = p.add_argument_group("profiling")
    c.add_argument("--no-profile", dest="profile", action="store_false",
                   help="decode without the profiler (a baseline)")
    c.add_argument("--events", default=defaults.DEFAULT_EVENTS,
                   help="events and presets, comma separated (default: default)")
    c.add_argument("--mode", default=defaults.DEFAULT_MODE, choices=defaults.MODES,
                   help="sampled (default): the kernel samples every thread on its CPU clock and each sample is "
                        "charged to the op its thread worked for, with its native stack (low overhead, "
                        "statistical per op); exact: every working thread read at every op boundary (exact "
                        "per op, a few µs per op)")
    c.add_argument("--sample-hz", type=positive_int, default=defaults.SAMPLE_HZ,
                   help=f"sampled mode: samples per second of each thread's CPU time (default {defaults.SAMPLE_HZ}, "
                        f"{defaults.MIN_SAMPLE_HZ} to {defaults.MAX_SAMPLE_HZ})")
    c.add_argument("--stack-bytes", type=non_negative_int, default=defaults.STACK_BYTES,
                   help=f"sampled mode: user stack copied per sample to unwind native stacks (default "
                        f"{defaults.STACK_BYTES}, up to {defaults.MAX_STACK_BYTES}, a multiple of 8; 0: leaf only)")
    c.add_argument("--python-hz", type=non_negative_int, metavar="HZ",
                   help=f"sampled mode: run py-spy beside the decode at HZ samples per second, for the Python frames "
                        f"above the ops in stacks (up to {defaults.MAX_PYTHON_HZ}; default 0, none, or "
                        f"{defaults.PYTHON_HZ} with --flamegraph; py-spy's own CPU time competes with the decode "
                        "where no CPU is spare)")
    c.add_argument("--no-shapes", dest="record_shapes", action="store_false", help="do not key ops by their inputs")
    c.add_argument("--timeline", type=non_negative_int, default=0, metavar="N",
                   help="keep the last N op spans of each op-running thread (default 0)")
    c.add_argument("--roofs", default="auto", choices=("auto", "remeasure", "off"),
                   help="the machine's measured roofs (memory bandwidth, compute, GEMV kernel) every GEMM and the "
                        "decode ceiling are judged against: auto (default) takes them from the cache for this "
                        "machine, torch and launch, or measures them first (a few seconds, once); remeasure; off")
    o = p.add_argument_group("output")
    o.add_argument("--out", metavar="DIR", help="where the profile is saved (default cpuprof-out/decode-<time>)")
    o.add_argument("--format", default="terminal", choices=FORMATS,
                   help="the report on stdout: terminal (default), markdown or json")
    o.add_argument("--json", action="store_true", help="same as --format json")
    o.add_argument("--flamegraph", action="store_true",
                   help="also write flame.svg (merged Python, op and native stacks of every thread, by samples) "
                        "and trace.json (Chrome/Perfetto) next to the profile")
    o.add_argument("--top", type=positive_int, default=defaults.TOP_OPS,
                   help=f"ops listed in the report (default {defaults.TOP_OPS})")
    o.add_argument("--checkpoint-s", type=positive_float, default=defaults.CHECKPOINT_S, metavar="S",
                   help=f"save the profile so far every S seconds while decoding (default {defaults.CHECKPOINT_S:g})")
    p.set_defaults(run=run)


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


def options_from_args(args: argparse.Namespace) -> DecodeOptions:
    """The CLI's strings parsed into typed options (UsageError, one line, for anything malformed)."""
    overrides = {field: getattr(args, flag) for flag, field in OVERRIDES.items() if getattr(args, flag) is not None}
    launch = launch_from_args(args)
    return DecodeOptions(
        workload=WorkloadOptions(
            preset=args.preset, overrides=overrides, dtype=args.dtype, prompt_len=args.prompt_len,
            new_tokens=args.new_tokens, batch=args.batch, warmup=args.warmup, sampling=args.sampling,
            top_k=args.top_k, seed=args.seed, hf=args.hf),
        launch=launch,
        profile=ProfileOptions(enabled=args.profile, events=args.events, mode=args.mode, sample_hz=args.sample_hz,
                               stack_bytes=args.stack_bytes, record_shapes=args.record_shapes, timeline=args.timeline,
                               python_hz=python_hz(args)),
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


def python_hz(args: argparse.Namespace) -> int:
    if args.python_hz is not None:
        return int(args.python_hz)
    return defaults.PYTHON_HZ if args.flamegraph else 0


def run(args: argparse.Namespace) -> int:
    options = options_from_args(args)
    from ..collect.session import check_options

    p = options.profile
    check_options(p.mode, p.sample_hz, p.stack_bytes, defaults.OP_CAPACITY, p.timeline, defaults.MAX_THREADS)
    if args.flamegraph and (p.mode != "sampled" or not p.enabled):
        raise UsageError("--flamegraph draws the samples' stacks: it needs the sampled mode (the default)")
    if p.python_hz > defaults.MAX_PYTHON_HZ:
        raise UsageError(f"--python-hz {p.python_hz}: expected 0 (no Python stacks) to {defaults.MAX_PYTHON_HZ}")
    out_dir = Path(options.out) if options.out else parent.default_out_dir()
    fmt = "json" if args.json else args.format
    outcome = parent.launch(options, out_dir)
    if outcome.profile is not None:
        render(outcome.profile, sys.stdout, format=fmt, top=args.top)
        what = "profile" if outcome.profile.profiled else "results (not profiled)"
        where = (f"{what} saved in {outcome.out_dir}; re-render with: python -m cpuprof report {outcome.out_dir}"
                 + (" --format markdown" if fmt == "markdown" else ""))
        # The report owns stdout in the data formats; the location goes to stderr there.
        stream = sys.stdout if fmt == "terminal" else sys.stderr
        stream.write(("\n" if fmt == "terminal" else "") + where + "\n")
        if args.flamegraph and outcome.profile.stacks is not None:
            stream.write(write_flamegraph(outcome.profile, outcome.out_dir) + "\n")
    return parent.check_outcome(outcome)


def write_flamegraph(profile: Profile, out_dir: Path) -> str:
    """flame.svg and trace.json beside the profile; returns the line that says where."""
    from ..exports import trace
    from .common import write_output
    from .flamegraph import write

    svg, trace_file = out_dir / "flame.svg", out_dir / "trace.json"
    write_output(str(svg), lambda out: write(profile, out, "svg"))
    write_output(str(trace_file), lambda out: trace.write(profile, out))
    return (f"flame graph: {svg} (open in a browser: click to zoom, Ctrl-F to search); "
            f"trace: {trace_file} (https://ui.perfetto.dev)")
