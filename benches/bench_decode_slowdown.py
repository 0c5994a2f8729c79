"""Slowdown of LLM decoding under cpuprof (sampled, sampled + Python stacks, exact) and torch.profiler.

What it measures
----------------
In-process (default): builds the built-in random-weight Llama once (default: llama-3.2-1b shapes
cut to 4 layers, bf16, 2 threads; about 0.5 B parameters, 1 GB of weights), then runs
``cpuprof.workload.run_decode`` (prefill of --prompt-len tokens, --new-tokens timed decode steps,
the first --warmup left out) under each variant, interleaved round after round with the order
rotated every round, because the machine is small, shared and noisy:

  none                       no profiler; the model's region factory is the default no-op
  cpuprof sampled            cpuprof.profile(mode="sampled"), events "default", sample_hz 1000 (the
                             default: the kernel samples every thread 1000 times per second of its
                             CPU time, with 8192 bytes of user stack unwound by the collector thread),
                             record_shapes=True, python_stacks=False, and model.region =
                             cpuprof.region (what `cpuprof decode` does when it profiles)
  cpuprof sampled + Python   the same with python_stacks=True: cpuprof's in-process sampler reads
                             every thread's Python stack at 100 Hz and they are joined to the samples
  cpuprof exact              mode="exact" (every working thread's counters read at every op boundary),
                             python_stacks=False
  torch.profiler             activities=[CPU], record_shapes=True, with_stack=True (no regions)

``--breakdown`` adds variants that tell the parts of sampled mode's cost apart: regions alone
(model.region = cpuprof.region, no profiler), sampled mode without regions, and sampled mode
at a 10x lower sampling rate (fewer samples to take, copy and unwind).

The profiler is started just before run_decode and stopped after it, as the CLI's child does;
tokens/s is run_decode's (measured decode steps only). What sampled + Python adds to tokens/s is
the sampler thread taking the GIL to read the stacks while the decode runs (on 2 CPUs, a thread
competing with the two OpenMP threads). The figure reported for each variant is
the median over rounds of (variant tokens/s ÷ that round's "none" tokens/s), with its min–max;
"decode time" is the inverse, so "+2.0%" means each token took 2% longer. For cpuprof variants
the table also shows cpuprof's own overhead accounting, as shares of the profiled wall time:
its callbacks on the dispatching thread (overhead.hook_ns; this excludes torch's RecordFunction
work), the collector thread's CPU time (overhead.discovery_cpu_ns: thread discovery, draining the
sample rings, joining samples to ops and unwinding their stacks; it competes with the two OpenMP
threads for the two cores) and the samples taken (overhead.samples).

--cli: instead runs the whole command line, `python -m cpuprof decode --preset P --json --out DIR`
against the same with `--no-profile` (and with `--mode exact` or Python stacks if asked via --variants),
as separate processes, interleaved, reading tokens/s from the saved profile
(workload.tokens_per_s). The cpuprof runs pass `--sample-hz`, and `--python-hz 0` except
sampled-py (`--python-hz 100`). Its default preset is tiny (an op-bound
toy: it shows the per-op cost at its worst); pass `--preset llama-3.2-1b` for the real 1B model
(16 layers unless --layers is given).

Targets (from the issue; the output says met or missed for each):
  the default mode (sampled at 1 kHz per thread, with stacks) keeps at least 98% of the bare
  tokens/s: "cpuprof sampled"'s median tokens/s ratio to none >= 0.98;
  exact mode adds at most 15% to decode time: "cpuprof exact"'s median added decode time <= 15%.

Run
---
    python benches/bench_decode_slowdown.py                     # 1B shapes, 4 layers, 11 rounds
    python benches/bench_decode_slowdown.py --breakdown         # + regions / no-regions / 10x lower rate
    python benches/bench_decode_slowdown.py --sample-hz 4000
    python benches/bench_decode_slowdown.py --cli               # whole CLI, tiny preset
    python benches/bench_decode_slowdown.py --cli --preset llama-3.2-1b --rounds 3
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from _common import machine_line, median, render_table, rotated, span

from cpuprof import defaults  # the limits only: this does not import torch

# torch.profiler (kineto) prints STAGE/USDT lines at every start/stop below log level 6 (set to override).
os.environ.setdefault("KINETO_LOG_LEVEL", "6")

# Targets from the issue: the default sampled mode keeps this share of the bare tokens/s; exact
# mode adds at most this much decode time.
SAMPLED_TARGET_RATIO = 0.98
EXACT_TARGET_PCT = 15.0


def pct_slower(ratio: float) -> float:
    """Tokens/s ratio (variant ÷ none) as % added decode time per token."""
    return (1.0 / ratio - 1.0) * 100.0 if ratio > 0 else float("nan")


# -- variants -------------------------------------------------------------------------------------
@dataclass
class Variant:
    name: str
    kind: str  # none | cpuprof | torch
    mode: str = "sampled"
    regions: bool = False
    sample_hz: int = 1000
    python_stacks: bool = False
    tps: list[float] = field(default_factory=list)
    ratio: list[float] = field(default_factory=list)  # tokens/s ÷ the same round's none
    p50_ms: list[float] = field(default_factory=list)  # median step latency of each run
    p50_ratio: list[float] = field(default_factory=list)  # none's p50 ÷ this p50, same round
    hook_pct: list[float] = field(default_factory=list)
    collector_pct: list[float] = field(default_factory=list)
    hook_ns_per_op: list[float] = field(default_factory=list)
    ops_per_forward: list[float] = field(default_factory=list)
    tick_us: list[float] = field(default_factory=list)  # collector CPU per tick
    samples: list[float] = field(default_factory=list)  # kernel samples taken in the run


def make_variants(args: argparse.Namespace) -> list[Variant]:
    slow = args.slow_hz or max(defaults.MIN_SAMPLE_HZ, args.sample_hz // 10)
    known = {
        "none": Variant("none", "none"),
        "sampled": Variant("cpuprof sampled", "cpuprof", "sampled", True, args.sample_hz),
        "sampled-py": Variant("cpuprof sampled + Python", "cpuprof", "sampled", True, args.sample_hz,
                              python_stacks=True),
        "exact": Variant("cpuprof exact", "cpuprof", "exact", True, args.sample_hz),
        "torch": Variant("torch.profiler", "torch"),
        # --breakdown: the parts of sampled mode's cost
        "regions": Variant("regions only (no profiler)", "none", regions=True),
        "sampled-noregions": Variant("cpuprof sampled, no regions", "cpuprof", "sampled", False, args.sample_hz),
        "sampled-slow": Variant(f"cpuprof sampled, {slow} Hz", "cpuprof", "sampled", True, slow),
    }
    if args.cli:
        for name in ("torch", "regions", "sampled-noregions"):
            known.pop(name)
    wanted = [v.strip() for v in args.variants.split(",") if v.strip()]
    if args.breakdown:
        wanted += ["regions", "sampled-noregions", "sampled-slow"] if not args.cli else ["sampled-slow"]
    unknown = [w for w in wanted if w not in known]
    if unknown:
        raise SystemExit(f"bench_decode_slowdown: unknown variant(s) {', '.join(unknown)}; "
                         f"choose from {', '.join(known)}")
    return [known["none"]] + [known[w] for w in dict.fromkeys(wanted) if w != "none"]


# -- in-process -----------------------------------------------------------------------------------
def run_in_process(args: argparse.Namespace, variants: list[Variant]) -> None:
    import torch

    import cpuprof
    from cpuprof.workload import build_model, run_decode
    from cpuprof.workload.llama import no_region
    from cpuprof.workload.presets import resolve_config

    torch.set_num_threads(args.threads)
    overrides = {"layers": args.layers} if args.layers else {}
    cfg = resolve_config(args.preset, overrides)
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[args.dtype]
    print(f"model: {cfg.name}, {cfg.layers} layers, hidden {cfg.hidden}, vocab {cfg.vocab}, "
          f"{cfg.param_count() / 1e9:.2f} B params, {args.dtype}; {args.threads} threads; "
          f"prompt {args.prompt_len}, {args.new_tokens} new tokens ({args.warmup} warm-up)")
    started = time.monotonic()
    model = build_model(cfg, dtype, seed=0)
    print(f"built in {time.monotonic() - started:.1f} s", file=sys.stderr, flush=True)
    dropped_said = pyspy_said = False

    def one(v: Variant) -> tuple[float, dict[str, float]]:
        nonlocal dropped_said, pyspy_said
        model.region = cpuprof.region if v.regions else no_region
        extra: dict[str, float] = {}
        gc.collect()
        if v.kind == "cpuprof":
            prof = cpuprof.profile(args.events, mode=v.mode, record_shapes=args.record_shapes,
                                   sample_hz=v.sample_hz, python_stacks=v.python_stacks, warn=False)
            ctx: contextlib.AbstractContextManager = prof
        elif v.kind == "torch":
            from torch.profiler import ProfilerActivity
            from torch.profiler import profile as torch_profile

            ctx = torch_profile(activities=[ProfilerActivity.CPU], record_shapes=True, with_stack=True)
        else:
            ctx = contextlib.nullcontext()
        with ctx:
            result = run_decode(model, cfg, prompt_len=args.prompt_len, new_tokens=args.new_tokens,
                                warmup=args.warmup, seed=0)
        if v.kind == "cpuprof":
            p = prof.profile
            wall = max(1, p.collection.stopped_ns - p.collection.started_ns)
            extra = {"hook_pct": 100.0 * p.overhead.hook_ns / wall,
                     "collector_pct": 100.0 * p.overhead.discovery_cpu_ns / wall,
                     "hook_ns_per_op": p.overhead.per_op_ns,
                     "ops_per_forward": p.overhead.ops / (args.new_tokens + 1),
                     "tick_us": p.overhead.discovery_cpu_ns / max(1, p.overhead.discovery_ticks) / 1e3,
                     "samples": p.overhead.samples}
            if not dropped_said and prof.dropped:
                names = ", ".join(d.name for d in prof.dropped)
                print(f"(cpuprof dropped {names}: {prof.dropped[0].reason})", file=sys.stderr)
                dropped_said = True
            py = p.sampling.python if p.sampling is not None else None
            if v.python_stacks and not pyspy_said and py is not None:  # once: did the sampler really run?
                print(f"(Python stacks: {py.error})" if py.error else
                      f"(Python stacks: {py.source} at {py.hz} Hz, {py.samples} stacks, {py.joined} samples joined)",
                      file=sys.stderr)
                pyspy_said = True
        model.region = no_region
        extra["p50_ms"] = result.figures.p50_ms
        return result.tokens_per_s, extra

    interleave(args, variants, one)


# -- whole CLI ------------------------------------------------------------------------------------
def run_cli(args: argparse.Namespace, variants: list[Variant]) -> None:
    base_cmd = [sys.executable, "-m", "cpuprof", "decode", "--preset", args.preset, "--dtype", args.dtype,
                "--threads", str(args.threads), "--prompt-len", str(args.prompt_len),
                "--new-tokens", str(args.new_tokens), "--warmup", str(args.warmup), "--json"]
    if args.layers:
        base_cmd += ["--layers", str(args.layers)]
    shown = " ".join(["python"] + base_cmd[1:])
    print(f"command: {shown} --out DIR  [--no-profile | --mode sampled|exact "
          f"--sample-hz {args.sample_hz} --events {args.events}"
          f"{'' if args.record_shapes else ' --no-shapes'} [--python-hz 0 unless sampled-py]]")
    workdir = Path(tempfile.mkdtemp(prefix="bench_decode_cli_"))

    def one(v: Variant) -> tuple[float, dict[str, float]]:
        out = workdir / f"run-{time.monotonic_ns()}"
        cmd = base_cmd + ["--out", str(out)]
        if v.kind == "none":
            cmd.append("--no-profile")
        else:
            cmd += ["--mode", v.mode, "--sample-hz", str(v.sample_hz), "--events", args.events]
            cmd += ["--python-hz", "100" if v.python_stacks else "0"]
            if not args.record_shapes:
                cmd.append("--no-shapes")
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"bench_decode_slowdown: {' '.join(cmd)} failed ({proc.returncode}): "
                             f"{proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else ''}")
        data = json.loads((out / "profile.json").read_text())
        shutil.rmtree(out, ignore_errors=True)
        extra: dict[str, float] = {}
        if v.kind == "cpuprof":
            o, c = data["overhead"], data["collection"]
            wall = max(1, c["stopped_ns"] - c["started_ns"])
            extra = {"hook_pct": 100.0 * o["hook_ns"] / wall, "collector_pct": 100.0 * o["discovery_cpu_ns"] / wall,
                     "hook_ns_per_op": o["hook_ns"] / max(1, o["ops"]),
                     "ops_per_forward": o["ops"] / (args.new_tokens + 1),
                     "tick_us": o["discovery_cpu_ns"] / max(1, o["discovery_ticks"]) / 1e3,
                     "samples": o.get("samples", 0)}
        figures = data["workload"]["figures"]
        extra["p50_ms"] = float(figures["p50_ms"])
        return float(figures["tokens_per_s"]), extra

    try:
        interleave(args, variants, one)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


# -- the interleaving and the report -------------------------------------------------------------
def interleave(args: argparse.Namespace, variants: list[Variant], one) -> None:
    base = variants[0]
    total = args.warmup_rounds + args.rounds
    started = time.monotonic()
    for r in range(total):
        record = r >= args.warmup_rounds
        results: dict[str, float] = {}
        p50: dict[str, float] = {}
        for v in rotated(variants, r):
            tps, extra = one(v)
            results[v.name] = tps
            p50[v.name] = extra["p50_ms"]
            if record:
                v.tps.append(tps)
                for key, value in extra.items():
                    getattr(v, key).append(value)
        if record:
            for v in variants:
                v.ratio.append(results[v.name] / results[base.name])
                v.p50_ratio.append(p50[base.name] / p50[v.name])
        line = "  ".join(f"{v.name} {results[v.name]:.2f}" for v in variants)
        print(f"  round {r + 1}/{total}{'' if record else ' (warm-up)'}: {line} tokens/s "
              f"[{time.monotonic() - started:.0f} s]", file=sys.stderr, flush=True)


def report(args: argparse.Namespace, variants: list[Variant]) -> None:
    rows = []
    base = variants[0]
    for v in variants:
        is_base = v.kind == "none" and not v.regions
        ratio = median(v.ratio)
        rows.append([
            v.name,
            f"{median(v.tps):.2f}",
            span(v.tps),
            "-" if is_base else f"{ratio:.3f}x",
            "-" if is_base else span(v.ratio, "{:.3f}"),
            "-" if is_base else f"{pct_slower(ratio):+.1f}%",
            "-" if is_base else f"{pct_slower(max(v.ratio)):+.1f}..{pct_slower(min(v.ratio)):+.1f}%",
            "-" if is_base else f"{max(v.tps) / max(base.tps):.3f}x",
            "-" if is_base else f"{median(v.p50_ratio):.3f}x",
            f"{median(v.hook_ns_per_op):.0f}" if v.hook_ns_per_op else "-",
            f"{median(v.ops_per_forward):.0f}" if v.ops_per_forward else "-",
            f"{median(v.hook_pct):.2f}%" if v.hook_pct else "-",
            f"{median(v.collector_pct):.2f}%" if v.collector_pct else "-",
            f"{median(v.tick_us):.0f}" if v.tick_us else "-",
            f"{median(v.samples):.0f}" if v.samples else "-",
        ])
    print()
    print(render_table(["variant", "tokens/s", "min–max", "vs none", "ratio min–max", "decode time",
                        "time min..max", "best vs best", "p50 step", "hook ns/op", "ops/fwd", "hook % wall",
                        "collector % wall", "µs/tick", "samples"], rows))
    print()
    print("vs none: median over rounds of tokens/s ÷ that round's none; decode time: the same as time per")
    print("token (+ = slower). hook ns/op, hook % wall, collector % wall: cpuprof's self-measured overhead")
    print("(its callbacks on the dispatching thread; the collector thread's CPU: thread discovery, draining")
    print("sample rings, unwinding) over the profiled wall time; the Python sampler's CPU is not in them.")
    print("µs/tick: collector CPU time per tick; samples: kernel samples taken in the run (median).")
    print("ops/fwd: ops seen ÷ forward passes (prefill + decode steps). best vs best: the variant's fastest run ÷")
    print("none's fastest (noise here only ever slows a run down, so the fastest runs are the least disturbed).")
    print("p50 step: median over rounds of (none's median step latency ÷ the variant's), a tokens/s ratio that")
    print("a burst of noise hitting a few steps of one run does not move.")
    noise = max(base.tps) / min(base.tps)
    if noise > 1.25:
        print(f"WARNING: the baseline's tokens/s varied {noise:.2f}x between rounds: the machine's load changed "
              f"during the run (now: {machine_line().split('  ')[-1]}); trust the medians and best-vs-best less, "
              f"or rerun when it is quiet.")
    print()
    for v in variants[1:]:
        if v.ratio:
            r = median(v.ratio)
            q = median(v.p50_ratio)
            print(f"{v.name}: {r:.3f}x tokens/s ({abs(pct_slower(r)):.1f}% {'slower' if r < 1 else 'faster'}); "
                  f"median step {q:.3f}x ({abs(pct_slower(q)):.1f}% {'slower' if q < 1 else 'faster'})")
    by_name = {v.name: v for v in variants}
    print()
    sampled = by_name.get("cpuprof sampled")
    if sampled is None or not sampled.ratio:
        print("target: sampled mode not measured (add it with --variants)")
    else:
        r = median(sampled.ratio)
        verdict = "MET" if r >= SAMPLED_TARGET_RATIO else f"MISSED by {SAMPLED_TARGET_RATIO - r:.3f}"
        print(f"target: the default mode (sampled at {sampled.sample_hz} Hz per thread, with stacks) keeps at least "
              f"{SAMPLED_TARGET_RATIO:.0%} of the bare tokens/s -> {verdict} (measured {r:.3f}x, rounds "
              f"{min(sampled.ratio):.3f}..{max(sampled.ratio):.3f}; "
              f"{median(sampled.p50_ratio):.3f}x on the median step)")
    exact = by_name.get("cpuprof exact")
    if exact is None or not exact.ratio:
        print("target: exact mode not measured (add it with --variants)")
    else:
        added = pct_slower(median(exact.ratio))
        verdict = "MET" if added <= EXACT_TARGET_PCT else f"MISSED by {added - EXACT_TARGET_PCT:.1f} points"
        print(f"target: exact mode adds at most {EXACT_TARGET_PCT:.0f}% to decode time -> {verdict} "
              f"(measured {added:+.1f}%, rounds {pct_slower(max(exact.ratio)):+.1f}.."
              f"{pct_slower(min(exact.ratio)):+.1f}%; {pct_slower(median(exact.p50_ratio)):+.1f}% on the median step)")
    parts = [f"{v.name} {pct_slower(median(v.ratio)):+.1f}%" for v in variants[1:] if v.ratio]
    print(f"summary: decode time vs no profiler ({median(variants[0].tps):.2f} tokens/s): " + ", ".join(parts))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cli", action="store_true",
                        help="compare whole `python -m cpuprof decode` runs (profiled vs --no-profile)")
    parser.add_argument("--preset", default=None,
                        help="model preset (default llama-3.2-1b in-process, tiny with --cli)")
    parser.add_argument("--layers", type=int, default=None,
                        help="override the preset's layers (default 4 in-process for llama-3.2-1b; "
                             "the preset's own otherwise)")
    parser.add_argument("--dtype", default="bf16", choices=("bf16", "fp32"))
    parser.add_argument("--threads", type=int, default=2, help="torch/OpenMP threads (default 2)")
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=24,
                        help="decode steps per run (default 24: short runs, many rounds, so the pairs "
                             "compared stay close in time on a shared machine)")
    parser.add_argument("--warmup", type=int, default=2, help="decode steps left out of tokens/s (default 2)")
    parser.add_argument("--rounds", type=int, default=11, help="measured rounds of every variant (default 11)")
    parser.add_argument("--warmup-rounds", type=int, default=1, help="unrecorded rounds first (default 1)")
    parser.add_argument("--variants", default="sampled,sampled-py,exact,torch",
                        help="compared with none, comma separated: sampled, sampled-py, exact, torch, regions, "
                             "sampled-noregions, sampled-slow (default sampled,sampled-py,exact,torch; with "
                             "--cli: sampled; --cli has no torch, regions or sampled-noregions)")
    parser.add_argument("--breakdown", action="store_true",
                        help="add regions, sampled-noregions and sampled-slow: regions alone, sampled mode "
                             "without regions, sampled mode at a 10x lower sampling rate")
    parser.add_argument("--slow-hz", type=int, default=None,
                        help="sampling rate of sampled-slow (default --sample-hz ÷ 10)")
    parser.add_argument("--events", default="default", help="cpuprof events (default: default)")
    parser.add_argument("--sample-hz", type=int, default=defaults.SAMPLE_HZ,
                        help=f"cpuprof sampled-mode samples per second of each thread's CPU time "
                             f"(default {defaults.SAMPLE_HZ})")
    parser.add_argument("--no-shapes", dest="record_shapes", action="store_false",
                        help="cpuprof without record_shapes (default: on)")
    args = parser.parse_args(argv)
    if args.cli and "torch" in args.variants and args.variants == parser.get_default("variants"):
        args.variants = "sampled"
    if args.preset is None:
        args.preset = "tiny" if args.cli else "llama-3.2-1b"
    if args.layers is None and not args.cli and args.preset == "llama-3.2-1b":
        args.layers = 4
    if args.rounds < 1 or args.warmup_rounds < 0 or args.threads < 1:
        parser.error("--rounds and --threads must be positive, --warmup-rounds 0 or more")
    for flag, hz in (("--sample-hz", args.sample_hz), ("--slow-hz", args.slow_hz)):
        if hz is not None and not defaults.MIN_SAMPLE_HZ <= hz <= defaults.MAX_SAMPLE_HZ:
            parser.error(f"{flag}: expected {defaults.MIN_SAMPLE_HZ} to {defaults.MAX_SAMPLE_HZ}")
    variants = make_variants(args)
    what = "whole CLI, separate processes" if args.cli else "in-process"
    print(f"bench_decode_slowdown ({what}): {', '.join(v.name for v in variants)}; "
          f"{args.rounds} rounds (+{args.warmup_rounds} warm-up), interleaved, order rotated")
    print(f"cpuprof: events {args.events}, sampled at {args.sample_hz} Hz per thread, "
          f"record_shapes {'on' if args.record_shapes else 'off'}, model regions on, "
          f"Python stacks only in sampled-py"
          + ("" if args.cli else "; torch.profiler: record_shapes + with_stack, no regions"))
    print(machine_line())
    try:
        if args.cli:
            run_cli(args, variants)
        else:
            run_in_process(args, variants)
    except Exception as exc:  # a clear line, not a traceback, for the usual failures (e.g. usage)
        if os.environ.get("BENCH_DEBUG"):
            raise
        print(f"bench_decode_slowdown: error: {type(exc).__name__}: {exc} (BENCH_DEBUG=1 for the traceback)",
              file=sys.stderr)
        return 1
    report(args, variants)
    return 0


if __name__ == "__main__":
    sys.exit(main())
