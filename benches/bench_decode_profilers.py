"""Decode of a transformers Llama (nn.Linear layers, ``generate()``) under each profiler, side by side.

Variants, interleaved in one process with the order rotated every round:
  bare              no profiler
  cpuprof default   cpuprof.profile(): sampled mode, every thread sampled at the default rate (250 Hz of
                    its CPU time) with 8 KiB of stack, native stacks unwound
  cpuprof+python    the same with Python stacks read in the process at 100 Hz (python_stacks=True, the
                    default python_sampler="in-process": a thread of cpuprof's takes the GIL per read, at
                    the periods each op's recorded Python caller does not cover)
  cpuprof+py-spy    the same with Python stacks read by py-spy beside the process (python_sampler="py-spy")
  cpuprof exact     every working thread read at every op boundary
  torch.profiler    CPU activity, default options
  torch.profiler+shapes   record_shapes=True
  py-spy            py-spy record --nonblocking at 100 Hz on this process, alone
  floor             RecordFunction callbacks that do nothing, registered as cpuprof's are (a test hook
                    of cpuprof's native module): what torch's dispatch to any such profiler costs
  floor+shapes      the same with inputs boxed (needsInputs), as record_shapes makes torch do
  cpuprof{k=v;...}  cpuprof default with cpuprof.profile()'s keyword arguments changed, to measure one
                    lever beside the others: "cpuprof{record_shapes=0}", "cpuprof{sample_hz=250;stack_bytes=4096}";
                    test hooks too: "cpuprof{eager_workers=1}", "cpuprof{mode=exact;read_sleeping=1}",
                    "cpuprof{python_stacks=1;no_op_callers=1}", "cpuprof{python_stacks=1;every_tick=1}"

Only generate() is timed (profiler start and stop are not), through transformers' streamer: one
time per token, so tokens/s is over the decode steps after the warm-up ones. Each round runs every
variant once; the figures are the per-round ratios to bare (median, min-max over rounds).

Targets (issue 20; every CPU busy here, 2 threads on 2 CPUs, the worst case): the default mode keeps at
least 98% of bare tokens/s; with Python frames (the default sampler, in-process) at least 95%; exact
mode adds at most 15% to decode time. At least 40 rounds: single rounds on these shared machines move by 20%.

    python benches/bench_decode_profilers.py                  # ~1B-shaped layers x 4, 40 rounds
    python benches/bench_decode_profilers.py --layers 2 --rounds 10 --new-tokens 16
    python benches/bench_decode_profilers.py --breakdown      # what each layer of the default mode costs
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from _common import machine_line, median, median_ci, render_table, rotated, span

VARIANTS = ("bare", "cpuprof default", "cpuprof+python", "cpuprof+py-spy", "cpuprof exact", "torch.profiler",
            "torch.profiler+shapes", "py-spy", "floor", "floor+shapes")


# Each step adds one layer of the default mode's work to the one before it: torch's dispatch to a
# callback that needs inputs, then cpuprof's op path and collector with sampling almost off (its
# minimum rate), then sampling at the default rate.
BREAKDOWN = ("floor+shapes", "cpuprof{sample_hz=10}", "cpuprof default", "torch.profiler+shapes")
BREAKDOWN_STEPS = (("bare", "floor+shapes", "torch's RecordFunction dispatch, inputs boxed"),
                   ("floor+shapes", "cpuprof{sample_hz=10}", "cpuprof's op path and collector (sampling at 10 Hz)"),
                   ("cpuprof{sample_hz=10}", "cpuprof default", "sampling at the default rate instead of 10 Hz"))


@dataclass
class Result:
    tps: list[float] = field(default_factory=list)
    ratio: list[float] = field(default_factory=list)
    note: list[str] = field(default_factory=list)


@contextlib.contextmanager
def py_spy_alone(hz: int) -> Iterator[None]:
    from cpuprof.collect.pyspy import executable

    exe = executable()
    if exe is None:
        raise SystemExit("py-spy is not installed")
    proc = subprocess.Popen([exe, "record", "--nonblocking", "--rate", str(hz), "--format", "raw", "--pid",
                             str(os.getpid()), "--output", os.devnull], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    assert proc.stdout is not None
    for line in proc.stdout:  # started once it says so
        if "Sampling process" in line:
            break
    try:
        yield
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)


@contextlib.contextmanager
def empty_callbacks(needs_inputs: bool) -> Iterator[None]:
    from cpuprof import native

    nat = native.load()
    nat.testing.inject_empty_callbacks(True, needs_inputs)
    try:
        yield
    finally:
        nat.testing.inject_empty_callbacks(False)


def _cpuprof_defaults():  # noqa: ANN202
    from cpuprof import defaults

    return defaults


# Not options of profile(): older ways of the native core, through its test hooks, for side-by-side
# runs. eager_workers: sampled mode settles every OpenMP worker at every op boundary (before issue
# 20's lazy charging); read_sleeping / read_running: exact mode reads the clock of every team member
# asleep / on its CPU since its last read at every boundary, instead of keeping / carrying it;
# no_op_callers: Python frames from the sampler's reads alone, without each op's caller recorded by
# the op hook (before it did); no_memory: torch's allocator not asked to report allocations;
# every_tick: the in-process Python sampler reads at every period, as before its pacer skipped the
# periods the op callers cover.
TEST_HOOKS = {"eager_workers": "inject_eager_workers", "read_sleeping": "inject_read_sleeping_members",
              "read_running": "inject_read_running_members", "no_op_callers": "inject_no_python_callers",
              "no_memory": "inject_no_memory_reports", "every_tick": "inject_python_reads_every_tick"}
# Test hooks that take a number: collect_us, the collector's period in microseconds (the sample
# rings sized to it).
NUMBER_HOOKS = {"collect_us": "inject_collect_interval_us"}


def custom_options(name: str) -> dict[str, object]:
    """``cpuprof{record_shapes=0,sample_hz=250}``: cpuprof.profile()'s keyword arguments for one lever
    measured beside the others (integers as such, 0/1 for booleans where the option is one)."""
    match = re.fullmatch(r"cpuprof\{(.*)\}", name)
    if match is None:
        return {}
    options: dict[str, object] = {}
    for item in filter(None, match.group(1).split(";")):
        key, _, value = item.partition("=")
        options[key.strip()] = int(value) if value.strip().lstrip("-").isdigit() else value.strip()
    for flag in ("record_shapes", "python_stacks", *TEST_HOOKS):
        if flag in options:
            options[flag] = bool(options[flag])
    return options


def context(name: str, args: argparse.Namespace, notes: list[str]) -> contextlib.AbstractContextManager:
    import cpuprof

    if name == "bare":
        return contextlib.nullcontext()
    if name.startswith("cpuprof"):
        mode = "exact" if name == "cpuprof exact" else "sampled"
        options = dict(mode=mode, sample_hz=args.sample_hz or _cpuprof_defaults().SAMPLE_HZ,
                       python_stacks=name in ("cpuprof+python", "cpuprof+py-spy"),
                       python_sampler="py-spy" if name == "cpuprof+py-spy" else "in-process",
                       python_hz=args.python_hz, warn=False)
        options.update(custom_options(name))
        from cpuprof import native

        hooks: dict[str, object] = {hook: bool(options.pop(flag, False)) for flag, hook in TEST_HOOKS.items()}
        hooks.update({hook: int(options.pop(flag, 0)) for flag, hook in NUMBER_HOOKS.items()})  # type: ignore[call-overload]
        prof = cpuprof.profile(args.events, **options)

        @contextlib.contextmanager
        def run() -> Iterator[None]:
            try:
                for hook, value in hooks.items():  # read when the session starts (the period too)
                    getattr(native.load().testing, hook)(value)
                with prof:
                    yield
            finally:
                for hook in hooks:
                    getattr(native.load().testing, hook)(0)
            p = prof.profile
            wall = max(1, p.collection.wall_ns)
            note = (f"hook {p.overhead.per_op_ns / 1e3:.2f} µs/op, {p.overhead.ops / max(1, args.new_tokens + 1):.0f} "
                    f"ops/token, collector {100 * p.overhead.discovery_cpu_ns / wall:.1f}% of a CPU")
            switches = sum(t.counters.get("context-switches", 0) for t in p.threads)
            if switches:  # a thread preempted inside a parallel region keeps its team waiting
                note += f", {switches * 1e9 / wall:.0f} context switches/s"
            if p.sampling is not None:
                note += f", {p.sampling.samples:,} samples, {p.sampling.lost} lost"
                if p.sampling.op_events_dropped:  # a collector period longer than the op-event rings hold
                    note += f", {p.sampling.op_events_dropped:,} op events dropped"
                if p.sampling.python is not None:
                    py = p.sampling.python
                    note += f", {py.source.split()[0]} {'error: ' + py.error if py.error else f'{py.samples} stacks'}"
                    if py.ticks_covered:
                        note += f" ({py.ticks_covered} periods covered by op callers)"
                    if py.cpu_ns is not None:
                        note += f" ({100 * py.cpu_ns / wall:.2f}% of a CPU)"
            notes.append(note)

        return run()
    if name.startswith("torch.profiler"):
        from torch.profiler import ProfilerActivity, profile

        return profile(activities=[ProfilerActivity.CPU], record_shapes=name.endswith("shapes"))
    if name == "py-spy":
        return py_spy_alone(args.python_hz)
    if name.startswith("floor"):
        return empty_callbacks(needs_inputs=name.endswith("shapes"))
    raise ValueError(name)


def build_model(args: argparse.Namespace):  # noqa: ANN201  (a transformers model)
    import torch
    import transformers

    from cpuprof.workload.hf import HFModel

    config = transformers.LlamaConfig(
        hidden_size=args.hidden, intermediate_size=args.ffn, num_hidden_layers=args.layers,
        num_attention_heads=args.heads, num_key_value_heads=args.kv_heads, vocab_size=args.vocab,
        max_position_embeddings=4096, tie_word_embeddings=True)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).to(torch.bfloat16).eval()
    return HFModel(model=model, name="llama (random)", model_type="llama", dtype=torch.bfloat16)


def print_breakdown(results: dict[str, Result]) -> None:
    """Each layer's cost: the per-round difference of the two variants' ratios to bare (paired within a
    round, so a slow moment of the machine moves both), median and spread over rounds."""
    steps = [(a, b, what) for a, b, what in BREAKDOWN_STEPS if a in results and b in results]
    if not steps:
        return
    print("\nwhere the default mode's cost goes (points of bare tokens/s; per-round differences, median "
          "[95% CI of the median] (min–max)):")
    for a, b, what in steps:
        print(f"  {what}: {paired_points(results[a], results[b])}  [{a} -> {b}]")


def paired_points(a: Result, b: Result) -> str:
    """What b loses against a, in points of bare tokens/s: the per-round differences of their ratios to
    bare (paired within a round, so a slow moment of the machine moves both), median, the median's
    bootstrap 95% interval, and the spread."""
    diffs = [100 * (x - y) for x, y in zip(a.ratio, b.ratio, strict=True)]
    low, high = median_ci(diffs)
    return f"{median(diffs):.1f} [{low:.1f} to {high:.1f}] ({span(diffs, '{:.1f}')})"


def print_against(results: dict[str, Result], reference: str) -> None:
    """Each other variant against the reference (the default mode unless --against), paired round by
    round: a lever's gain is a point or two, less than one round's spread, and only the paired
    median's interval can show it."""
    others = [n for n in results if n not in ("bare", reference)]
    if reference not in results or not others:
        return
    print(f"\nagainst {reference} (points of bare tokens/s it gains, paired per round: median [95% CI] (min–max)):")
    for n in others:
        print(f"  {n}: {paired_points(results[n], results[reference])}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--warmup-rounds", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--ffn", type=int, default=8192)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=24)
    ap.add_argument("--warmup", type=int, default=2, help="decode steps left out of tokens/s")
    ap.add_argument("--events", default="default")
    ap.add_argument("--sample-hz", type=int, default=None, help="default: cpuprof's")
    ap.add_argument("--python-hz", type=int, default=100)
    ap.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated subset; bare is always first")
    ap.add_argument("--against", default=None,
                    help="the variant every other one is paired with (one of --variants; default: cpuprof default)")
    ap.add_argument("--breakdown", action="store_true",
                    help=f"the variants that split the default mode's cost: {', '.join(BREAKDOWN)}")
    args = ap.parse_args(argv)
    if args.breakdown:
        if args.variants != ",".join(VARIANTS):
            ap.error("--breakdown chooses the variants itself: leave out --variants")
        args.variants = ",".join(BREAKDOWN)
    if args.rounds < 40:
        print("note: fewer than 40 rounds; the medians move by a few points from run to run", file=sys.stderr)

    import torch

    from cpuprof.workload.hf import run_hf_decode

    torch.set_num_threads(args.threads)
    names = ["bare"] + [v for v in args.variants.split(",") if v and v != "bare"]
    unknown = {n for n in names if n not in VARIANTS and not re.fullmatch(r"cpuprof\{.*\}", n)}
    if unknown:
        raise SystemExit(f"unknown variants: {', '.join(sorted(unknown))}; choose from {', '.join(VARIANTS)}")
    if args.against is not None and args.against not in names[1:]:
        raise SystemExit(f"--against {args.against!r} is not among the variants measured: {', '.join(names[1:])}")
    print(machine_line())
    hf = build_model(args)
    params = sum(p.numel() for p in hf.model.parameters())
    print(f"transformers {__import__('transformers').__version__} LlamaForCausalLM, random weights: {args.layers} "
          f"layers, hidden {args.hidden}, ffn {args.ffn}, {params / 1e9:.2f} B params, bf16; {args.threads} threads; "
          f"prompt {args.prompt_len}, {args.new_tokens} new tokens ({args.warmup} warm-up), greedy")
    results = {n: Result() for n in names}

    def one(name: str) -> float:
        gc.collect()
        ctx = context(name, args, results[name].note)
        with ctx:
            out = run_hf_decode(hf, prompt_len=args.prompt_len, new_tokens=args.new_tokens, warmup=args.warmup)
        return out.figures.tokens_per_s

    run_one: Callable[[str], float] = one
    total = args.warmup_rounds + args.rounds
    started = time.monotonic()
    for r in range(total):
        tps = {n: run_one(n) for n in rotated(names, r)}
        if r >= args.warmup_rounds:
            for n in names:
                results[n].tps.append(tps[n])
                results[n].ratio.append(tps[n] / tps["bare"])
        line = "  ".join(f"{n} {tps[n]:.2f}" for n in names)
        print(f"  round {r + 1}/{total}{'' if r >= args.warmup_rounds else ' (warm-up)'}: {line} tokens/s "
              f"[{time.monotonic() - started:.0f} s]", file=sys.stderr, flush=True)

    rows = []
    for n in names:
        res = results[n]
        ratio = median(res.ratio)
        rows.append([n, f"{median(res.tps):.2f}", span(res.tps), f"{ratio:.3f}", span(res.ratio, "{:.3f}"),
                     f"{100 * (1 / ratio - 1):+.1f}%"])
    print()
    print(render_table(["variant", "tokens/s", "min–max", "vs bare", "min–max", "decode time"], rows))
    print("(tokens/s: median over rounds; vs bare: median of the per-round ratios, with their spread; decode time: "
          "added time per token at that median)")
    for n in names:
        if results[n].note:
            shares = [float(m.group(1)) for note in results[n].note if (m := re.search(r"collector ([\d.]+)%", note))]
            hooks = [float(m.group(1)) for note in results[n].note if (m := re.search(r"hook ([\d.]+) µs/op", note))]
            print(f"  {n}: {results[n].note[-1]} (last round); medians of {len(shares)} rounds: collector "
                  f"{median(shares):.1f}% of a CPU ({span(shares, '{:.1f}')}), hook {median(hooks):.2f} µs/op "
                  f"({span(hooks, '{:.2f}')})")
    print_breakdown(results)
    print_against(results, args.against or "cpuprof default")
    print()
    for name, floor, what in (("cpuprof default", 0.98, "cpuprof's default mode"),
                              ("cpuprof+python", 0.95, "cpuprof with Python frames (in-process, the default)"),
                              ("cpuprof+py-spy", 0.95, "cpuprof with Python frames (py-spy)")):
        if name in results:
            r = median(results[name].ratio)
            print(f"target: {what} keeps >= {100 * floor:.0f}% of bare tokens/s: {100 * r:.1f}% "
                  f"(rounds {span(results[name].ratio, '{:.3f}')}) -> {'met' if r >= floor else 'MISSED'}")
    if "cpuprof exact" in results:
        added = 1 / median(results["cpuprof exact"].ratio) - 1
        print(f"target: exact mode adds <= 15% to decode time: {100 * added:+.1f}% -> "
              f"{'met' if added <= 0.15 else 'MISSED'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
