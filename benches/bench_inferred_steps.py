"""The decode steps cpuprof infers from a program's op stream, against the program's own count.

Each round runs each program under ``cpuprof run`` (programs in an order rotated every round) and
compares what the report's step detector found with what the program measured of itself:

- transformers ``generate()`` (tests/fixtures/scripts/generate_timed.py: a StoppingCriteria called
  once per generated token times the decode steps): a tiny Llama at batch 1, a tiny Qwen2 at batch 2,
  and 4 layers of Llama-3.2-1B's shapes (bf16, its 128,256-token vocabulary) at batch 1. Compared:
  the decode steps found (N - 1 expected) and tokens/s over them / the script's own tokens/s.
- vLLM offline ``LLM.generate`` (its default multi-process mode; the worker followed): 4 prompts of
  64 tokens. Compared: the tokens the worker's steps sampled / the tokens vLLM returned (1.0
  expected, warm-up apart), and the steps' tokens/s (all steps: prefill, decode, mixed) / vLLM's
  own (the tokens it returned over its ``generate`` call's wall time, which also holds its
  scheduling before the first step and after the last).

Printed per program: the median ratio with its min–max over the rounds. vLLM needs its CPU backend
(README command 2); without it, or with ``--no-vllm``, that program is left out.

    python benches/bench_inferred_steps.py              # 5 rounds, ~10 min here
    python benches/bench_inferred_steps.py --rounds 2 --no-vllm
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

from _common import machine_line, median, render_table, rotated, span

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from cpuprof.analysis.processes import busiest  # noqa: E402
from cpuprof.analysis.steps import DECODE, Steps, decode_tokens_per_s, find_steps  # noqa: E402
from cpuprof.model import Profile  # noqa: E402
from cpuprof.model.run_layout import load_processes  # noqa: E402

SCRIPT = ROOT / "tests" / "fixtures" / "scripts" / "generate_timed.py"
NEW_TOKENS = 24
GENERATE_PROGRAMS = {"llama b1": ("llama", 1), "qwen2 b2": ("qwen2", 2), "llama-1b-shaped b1": ("llama-1b-shaped", 1)}

VLLM_PROMPTS, VLLM_TOKENS = 4, 64
VLLM_GENERATE = f"""
import sys
import time

from vllm import LLM, SamplingParams


def main():
    llm = LLM(model=sys.argv[1], dtype="bfloat16", max_model_len=512, enforce_eager=True)
    prompts = [" ".join(f"w{{(i * 7 + j) % 4000 + 3}}" for j in range(16)) for i in range({VLLM_PROMPTS})]
    began = time.perf_counter()
    outputs = llm.generate(prompts, SamplingParams(max_tokens={VLLM_TOKENS}, ignore_eos=True, temperature=0))
    elapsed = time.perf_counter() - began
    tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
    print(f"TOKENS {{tokens}} THROUGHPUT {{tokens / elapsed:.3f}}")


if __name__ == "__main__":
    main()
"""


def cpuprof_run(out: Path, program: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    args = [sys.executable, "-m", "cpuprof", "run", "--threads", "2", "--out", str(out), "--overwrite", "--",
            "python", *program]
    result = subprocess.run(args, capture_output=True, text=True, timeout=1800, env=env)
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed ({result.returncode}):\n{result.stderr[-2000:]}")
    return result


def generate_round(family: str, batch: int, work: Path) -> tuple[float, float]:
    """(decode steps found / N - 1, inferred tokens/s / the script's own)."""
    timing = work / "timing.json"
    cpuprof_run(work / "out", [str(SCRIPT), family, str(batch), str(NEW_TOKENS), str(timing)])
    own = json.loads(timing.read_text())
    found = find_steps(Profile.load(work / "out"))
    if not isinstance(found, Steps):
        raise SystemExit(f"{family}: no steps found: {found}")
    decode = found.of_kind(DECODE)
    script = own["tokens_per_call"] * (own["calls"] - 1) / own["decode_s"]
    return len(decode) / (NEW_TOKENS - 1), decode_tokens_per_s(decode) / script


def vllm_round(model: Path, work: Path) -> tuple[float, float]:
    """(tokens the worker's steps sampled / tokens vLLM returned, the steps' tokens/s / vLLM's own)."""
    program = work / "generate.py"
    program.write_text(textwrap.dedent(VLLM_GENERATE))
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1"}
    result = cpuprof_run(work / "out", [str(program), str(model)], env=env)
    found_line = re.search(r"TOKENS (\d+) THROUGHPUT ([0-9.]+)", result.stdout)
    if found_line is None:
        raise SystemExit(f"vLLM printed no throughput:\n{result.stdout[-2000:]}")
    returned, throughput = int(found_line.group(1)), float(found_line.group(2))
    worker = busiest(load_processes(work / "out"))
    found = find_steps(worker.profile) if worker is not None else "no worker profile"
    if not isinstance(found, Steps):
        raise SystemExit(f"vLLM: no steps found in the worker: {found}")
    sampled = sum(s.sequences for s in found.steps)
    wall = sum(s.wall_ns for s in found.steps) / 1e9
    return sampled / returned, (sampled / wall) / throughput


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--no-vllm", action="store_true", help="leave vLLM's offline generate out")
    args = parser.parse_args()
    programs = list(GENERATE_PROGRAMS)
    model = None
    if not args.no_vllm and importlib.util.find_spec("vllm") is not None:
        from tests.vllm_checkpoint import write_checkpoint

        model = Path(tempfile.mkdtemp(prefix="cpuprof-bench-model-"))
        write_checkpoint(model)
        programs.append("vLLM offline")
    print(machine_line())
    print(f"{args.rounds} rounds; generate(): {NEW_TOKENS} new tokens; vLLM: {VLLM_PROMPTS} prompts x {VLLM_TOKENS}")
    counts: dict[str, list[float]] = {p: [] for p in programs}
    rates: dict[str, list[float]] = {p: [] for p in programs}
    for k in range(args.rounds):
        for name in rotated(programs, k):
            with tempfile.TemporaryDirectory(prefix="cpuprof-bench-") as work:
                if name == "vLLM offline":
                    assert model is not None
                    count, rate = vllm_round(model, Path(work))
                else:
                    count, rate = generate_round(*GENERATE_PROGRAMS[name], Path(work))
            counts[name].append(count)
            rates[name].append(rate)
            print(f"  round {k + 1} {name}: count ratio {count:.3f}, tokens/s ratio {rate:.3f}", flush=True)
    rows = [[p, f"{median(counts[p]):.3f}", span(counts[p], "{:.3f}"), f"{median(rates[p]):.3f}",
             span(rates[p], "{:.3f}")] for p in programs]
    print()
    print(render_table(["program", "count ratio", "min–max", "tokens/s ratio", "min–max"], rows))
    print("count ratio: generate(): decode steps found / (N - 1); vLLM: tokens sampled in the steps found / tokens "
          "returned. tokens/s ratio: inferred / the program's own (vLLM's own includes its scheduling outside steps)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
