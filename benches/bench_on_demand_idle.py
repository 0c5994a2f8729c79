"""What `cpuprof run --on-demand` costs a program while no window is open (issue 40, target 2: at
least 0.99 of the program's speed alone: nothing should be observed, so nothing should be paid).

Each round runs one decode program two ways, in an order rotated every round: alone, and under
``cpuprof run --on-demand`` with no window ever opened (``--roofs off``: the roofs' child before a
program is start-up, not the program's speed). The program builds cpuprof's built-in model
(Llama-3.2-1B's shapes, --layers of them, random weights), decodes a few warm-up tokens, then times
--tokens more itself and prints tokens/s, so the interpreter's, torch's and cpuprof's start-up are
outside the figure. Printed: each variant's median tokens/s with its min-max, and the median of the
per-round ratios to the program alone with their min-max.

    python benches/bench_on_demand_idle.py                       # 10 rounds, 2 layers, 32 tokens
    python benches/bench_on_demand_idle.py --rounds 12 --layers 4
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from _common import machine_line, median, render_table, rotated, span

PROGRAM = """
import sys, time
import torch
from cpuprof.workload import build_model, resolve_config, run_decode

cfg = resolve_config("llama-3.2-1b", {"layers": int(sys.argv[1])})
model = build_model(cfg, torch.bfloat16)
tokens = int(sys.argv[2])
run_decode(model, cfg, prompt_len=16, new_tokens=4, warmup=0)  # warm-up: kernels chosen, caches touched
result = run_decode(model, cfg, prompt_len=16, new_tokens=tokens, warmup=2)
print(f"THROUGHPUT {result.tokens_per_s:.3f}")
"""

VARIANTS = {
    "alone": [],
    "cpuprof run --on-demand, no window": ["-m", "cpuprof", "run", "--threads", "2", "--roofs", "off",
                                           "--on-demand"],
}


def run(prefix: list[str], program: Path, layers: int, tokens: int, out: Path) -> float:
    args = [sys.executable, *prefix]
    if prefix:
        args += ["--out", str(out), "--overwrite", "--", "python"]
    args += [str(program), str(layers), str(tokens)]
    result = subprocess.run(args, capture_output=True, text=True, timeout=900)
    match = re.search(r"THROUGHPUT ([\d.]+)", result.stdout)
    if match is None:
        raise SystemExit(f"{' '.join(args[:6])}...: exit {result.returncode}\n{result.stderr[-2000:]}")
    return float(match.group(1))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=10, help="rotated rounds, at least 10 (default 10)")
    parser.add_argument("--layers", type=int, default=2, help="layers of Llama-3.2-1B's shapes (default 2)")
    parser.add_argument("--tokens", type=int, default=32, help="timed decode steps (default 32)")
    args = parser.parse_args()
    if args.rounds < 10:
        raise SystemExit("--rounds: at least 10 (single rounds on shared machines move by 20%)")
    print(machine_line())
    print(f"decode of Llama-3.2-1B's shapes, {args.layers} layers, bf16, {args.tokens} timed tokens; "
          f"{args.rounds} rounds rotated")
    names = list(VARIANTS)
    figures: dict[str, list[float]] = {name: [] for name in names}
    with tempfile.TemporaryDirectory(prefix="cpuprof-bench-ondemand-") as scratch:
        program = Path(scratch) / "decode.py"
        program.write_text(PROGRAM)
        for k in range(args.rounds):
            for name in rotated(names, k):
                figures[name].append(run(VARIANTS[name], program, args.layers, args.tokens, Path(scratch) / "out"))
            print(f"  round {k + 1}: " + ", ".join(f"{n} {figures[n][-1]:.2f}" for n in names), flush=True)
    alone = figures["alone"]
    rows = []
    for name in names:
        ratios = [v / a for v, a in zip(figures[name], alone, strict=True)]
        rows.append([name, f"{median(figures[name]):.2f}", span(figures[name]), f"{median(ratios):.3f}",
                     span(ratios, "{:.3f}")])
    print(render_table(["variant", "tokens/s", "min-max", "vs alone", "ratio min-max"], rows))
    ratio = median([v / a for v, a in zip(figures[names[1]], alone, strict=True)])
    print(f"target: at least 0.99 of the program alone with no window open: {'met' if ratio >= 0.99 else 'missed'} "
          f"({ratio:.3f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
