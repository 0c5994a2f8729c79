"""``cpuprof decode``: LLM decoding, pinned and profiled, with the settings in force."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .. import decode
from ..reports import terminal

# Model-shape overrides: flag -> ModelConfig field.
OVERRIDES = {"layers": "layers", "hidden": "hidden", "heads": "heads", "kv_heads": "kv_heads",
             "ffn": "ffn", "vocab": "vocab", "max_seq": "max_seq"}


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "decode", help="profile LLM decoding in a child pinned to the threads/CPUs/NUMA node asked for",
        description="Runs a Llama-architecture decoder (random weights from a seed, or a local HF checkpoint) "
                    "in a child process configured before torch loads, profiles every ATen op across every "
                    "thread, and reports throughput, latency, the settings in force and where the time goes.")
    w = p.add_argument_group("workload")
    w.add_argument("--preset", default="llama-3.2-1b", help="llama-3.2-1b (default), llama-3.1-8b or tiny")
    for flag in OVERRIDES:
        w.add_argument(f"--{flag.replace('_', '-')}", dest=flag, type=int, metavar="N",
                       help=f"override the preset's {flag.replace('_', ' ')}")
    w.add_argument("--dtype", default="bf16", help="bf16 (default) or fp32")
    w.add_argument("--prompt-len", type=int, default=32, help="prompt tokens for prefill (default 32)")
    w.add_argument("--new-tokens", type=int, default=32, help="decode steps (default 32)")
    w.add_argument("--batch", type=int, default=1, help="sequences decoded together (default 1)")
    w.add_argument("--warmup", type=int, default=2, help="decode steps left out of tokens/s (default 2)")
    w.add_argument("--sampling", default="greedy", help="greedy (default) or topk")
    w.add_argument("--top-k", type=int, default=50)
    w.add_argument("--seed", type=int, default=0)
    w.add_argument("--hf", metavar="PATH", help="decode a local Hugging Face checkpoint (needs transformers)")
    launch = p.add_argument_group("launch: threads, pinning, OpenMP, NUMA")
    launch.add_argument("--threads", help="OpenMP/torch threads (default: every CPU of the chosen set)")
    launch.add_argument("--numa", metavar="NODE", help="bind CPUs and memory to this NUMA node")
    launch.add_argument("--cpus", metavar="LIST", help="explicit CPU list, e.g. 0-3,8")
    launch.add_argument("--bind", default="close", help="close (default), spread or none")
    launch.add_argument("--omp", default="gnu", help="gnu (torch's libgomp, default) or intel (libiomp5, preloaded)")
    launch.add_argument("--blocktime", metavar="MS",
                        help="ms an idle OpenMP thread spins (KMP_BLOCKTIME / GOMP_SPINCOUNT)")
    launch.add_argument("--allocator", default="default", help="default, jemalloc or tcmalloc (preloaded)")
    launch.add_argument("--oversubscribe", action="store_true", help="allow more threads than CPUs")
    c = p.add_argument_group("profiling")
    c.add_argument("--no-profile", dest="profile", action="store_false",
                   help="decode without the profiler (a baseline)")
    c.add_argument("--events", default="default", help="events and presets, comma separated (default: default)")
    c.add_argument("--mode", default="sampled", choices=("sampled", "exact"),
                   help="sampled: counters charged to ops by a sampler (low overhead, default); "
                        "exact: read at every op boundary")
    c.add_argument("--sample-interval-us", type=int, default=4000,
                   help="sampled mode: read the team at the first op boundary after every N µs (default 4000)")
    c.add_argument("--no-shapes", dest="record_shapes", action="store_false", help="do not key ops by input shapes")
    c.add_argument("--timeline", type=int, default=0, metavar="N",
                   help="keep the last N op spans of each dispatching thread (default 0)")
    o = p.add_argument_group("output")
    o.add_argument("--out", metavar="DIR", help="where the profile is saved (default cpuprof-out/decode-<time>)")
    o.add_argument("--json", action="store_true", help="print the profile as JSON instead of the report")
    o.add_argument("--top", type=int, default=15, help="ops listed in the report (default 15)")
    o.add_argument("--checkpoint-s", type=float, default=5.0, metavar="S",
                   help="save the profile so far every S seconds while decoding (default 5)")
    p.set_defaults(run=run)


def options_from_args(args: argparse.Namespace) -> decode.DecodeOptions:
    overrides = {field: getattr(args, flag) for flag, field in OVERRIDES.items() if getattr(args, flag) is not None}
    return decode.DecodeOptions(
        preset=args.preset, overrides=overrides, dtype=args.dtype, prompt_len=args.prompt_len,
        new_tokens=args.new_tokens, batch=args.batch, warmup=args.warmup, sampling=args.sampling,
        top_k=args.top_k, seed=args.seed, hf=args.hf, threads=args.threads, numa=args.numa, cpus=args.cpus,
        bind=args.bind, omp=args.omp, blocktime=args.blocktime, allocator=args.allocator,
        oversubscribe=args.oversubscribe, profile=args.profile, events=args.events, mode=args.mode,
        sample_interval_us=args.sample_interval_us, record_shapes=args.record_shapes, timeline=args.timeline,
        out=args.out, checkpoint_s=args.checkpoint_s,
    )


def run(args: argparse.Namespace) -> int:
    options = options_from_args(args)
    out_dir = Path(options.out) if options.out else decode.default_out_dir()
    outcome = decode.launch(options, out_dir)
    if outcome.profile is not None:
        if args.json:
            json.dump(outcome.profile.to_dict(), sys.stdout, indent=1)
            sys.stdout.write("\n")
        else:
            terminal.render(outcome.profile, sys.stdout, top=args.top)
            sys.stdout.write(f"\nprofile saved in {outcome.out_dir}; re-render with: "
                             f"python -m cpuprof report {outcome.out_dir}\n")
    return decode.check_outcome(outcome)
