"""What cpuprof's OMPT tool costs a decode under Intel's OpenMP runtime, launch against launch.

The tool is loaded by the runtime as the process starts, so it cannot be switched off inside one
process: each round launches `cpuprof decode --omp intel` twice, profiled the same way, once with
the tool (OMP_TOOL_LIBRARIES set by the launcher) and once without (CPUPROF_OMPT=off), in an order
rotated every round. The figure is the per-round ratio of tokens/s (median, min-max).

Target (issue 8): the tool slows decoding by at most 2%.

    python benches/bench_ompt_overhead.py                  # Llama-3.2-1B layers x 4, 12 rounds
    python benches/bench_ompt_overhead.py --layers 2 --rounds 10
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

from _common import machine_line, median, render_table, rotated, span

VARIANTS = ("without tool", "with tool")


def launch(args: argparse.Namespace, with_tool: bool, out: str) -> tuple[float, str]:
    env = dict(os.environ)
    if not with_tool:
        env["CPUPROF_OMPT"] = "off"
    cmd = [sys.executable, "-m", "cpuprof", "decode", "--omp", "intel", "--threads", str(args.threads),
           "--layers", str(args.layers), "--prompt-len", str(args.prompt_len), "--new-tokens", str(args.new_tokens),
           "--roofs", "off", "--out", out, "--format", "json"]
    result = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
    if result.returncode != 0:
        raise SystemExit(f"decode failed ({'with' if with_tool else 'without'} the tool): "
                         f"{result.stderr.strip().splitlines()[-1:]}")
    from cpuprof.model import Profile

    profile = Profile.load(out)
    assert profile.workload is not None and profile.workload.figures is not None
    method = next(s for s in json.loads(result.stdout)["sections"] if s["id"] == "contention")["lines"][0]
    return profile.workload.figures.tokens_per_s, method


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--prompt-len", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=24)
    args = ap.parse_args(argv)
    if args.rounds < 10:
        print("note: fewer than 10 rounds; the spread will not mean much", file=sys.stderr)
    print(machine_line())
    print(f"cpuprof decode --omp intel: Llama-3.2-1B shapes x {args.layers} layers, bf16, {args.threads} threads, "
          f"prompt {args.prompt_len}, {args.new_tokens} new tokens, profiled (sampled mode) in both")
    tps: dict[str, list[float]] = {v: [] for v in VARIANTS}
    ratios: list[float] = []
    methods: dict[str, str] = {}
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            got = {}
            for v in rotated(VARIANTS, r):
                got[v], methods[v] = launch(args, v == "with tool", os.path.join(tmp, f"{r}-{v.replace(' ', '-')}"))
                tps[v].append(got[v])
            ratios.append(got["with tool"] / got["without tool"])
            print(f"  round {r + 1}/{args.rounds}: " + "  ".join(f"{v} {got[v]:.2f}" for v in VARIANTS)
                  + f" tokens/s [{time.monotonic() - started:.0f} s]", file=sys.stderr, flush=True)
    print()
    print(render_table(["launch", "tokens/s", "min–max"], [[v, f"{median(tps[v]):.2f}", span(tps[v])]
                                                            for v in VARIANTS]))
    for v in VARIANTS:
        print(f"  {v}: {methods[v][:110]}")
    ratio = median(ratios)
    print(f"with / without the tool: median {ratio:.3f} over {len(ratios)} rounds (min–max {span(ratios, '{:.3f}')})")
    print(f"target: the OMPT tool slows decoding by at most 2%: {100 * (1 - ratio):+.1f}% -> "
          f"{'met' if ratio >= 0.98 else 'MISSED'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
