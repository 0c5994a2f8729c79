"""vLLM's offline throughput with and without cpuprof following its processes.

Each round runs one ``LLM.generate`` script four ways, in an order rotated every round: alone;
under ``cpuprof run`` (the engine core and worker followed and profiled); under ``cpuprof run
--no-follow`` (only the front end profiled: what following adds over it); alone with vLLM's own
torch profiler on (``profiler_config={"profiler": "torch", ...}`` at its defaults, started with
``llm.start_profile()`` before the timed call and stopped after it, so writing its trace is outside
the timing): the tool a vLLM user picks today. Beside them, ``--variants`` can add "torch's floor":
alone, with RecordFunction callbacks that do nothing registered in every process of the engine as
cpuprof registers its op hook (``benches/floor_site``), what any RecordFunction profiler pays before
it does anything; and "cpuprof run --on-demand (no window)": launched and followed as following is,
but never observed, what the launch itself costs. The script times its own ``generate`` call
(engine start-up is outside it) and prints tokens/s; printed per variant: the
median tokens/s with its min–max, and the median per-round ratio to the run without cpuprof.

Needs vLLM's CPU backend (README command 2 installs it). It writes a random 4-layer Llama
(hidden 512, 8 heads, 4 KV heads, FFN 1536, vocab 4096, bf16; ``--shapes 1b``: Llama-3.2-1B's
layer shapes, hidden 2048, FFN 8192) with a word-level tokenizer into a temporary directory: nothing
is downloaded. Each run starts an engine (~30 s here), so:

    python benches/bench_vllm_follow.py                       # 10 rounds, ~20 min here
    python benches/bench_vllm_follow.py --rounds 3 --tokens 32  # a quick look
    python benches/bench_vllm_follow.py --shapes 1b             # ops long enough to show only cpuprof's own cost
    python benches/bench_vllm_follow.py --variants "cpuprof run (following),torch's floor"   # cpuprof beyond torch
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

from _common import machine_line, median, render_table, rotated, span

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.vllm_checkpoint import LLAMA_1B_SHAPES, write_checkpoint  # noqa: E402 (one checkpoint writer for both, without pytest)

GENERATE = """
import sys
import time

from vllm import LLM, SamplingParams


def main():
    traces = sys.argv[4] if len(sys.argv) > 4 else ""
    profiler = {"profiler_config": {"profiler": "torch", "torch_profiler_dir": traces}} if traces else {}
    llm = LLM(model=sys.argv[1], dtype="bfloat16", max_model_len=512, enforce_eager=True, **profiler)
    prompts = [" ".join(f"w{(i * 7 + j) % 4000 + 3}" for j in range(16)) for i in range(int(sys.argv[3]))]
    params = SamplingParams(max_tokens=int(sys.argv[2]), ignore_eos=True, temperature=0)
    llm.generate(prompts[:1], SamplingParams(max_tokens=2))  # warm-up
    if traces:
        llm.start_profile()
    began = time.perf_counter()
    outputs = llm.generate(prompts, params)
    elapsed = time.perf_counter() - began
    if traces:
        llm.stop_profile()
    tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
    print(f"THROUGHPUT {tokens / elapsed:.3f}")


if __name__ == "__main__":
    main()
"""

VLLM_PROFILER = "vLLM's torch profiler"
FLOOR = "torch's floor"
# Launched and followed as following is, but no window ever opened: what the launch itself (its
# binding, its environment, cpuprof's boot in each process) costs, apart from observing.
ON_DEMAND = "cpuprof run --on-demand (no window)"
VARIANTS = {
    "no cpuprof": [],
    "cpuprof run (following)": ["-m", "cpuprof", "run", "--threads", "2"],
    "cpuprof run --no-follow": ["-m", "cpuprof", "run", "--threads", "2", "--no-follow"],
    ON_DEMAND: ["-m", "cpuprof", "run", "--threads", "2", "--on-demand"],
    VLLM_PROFILER: [],
    FLOOR: [],
}
DEFAULT_VARIANTS = [name for name in VARIANTS if name not in (FLOOR, ON_DEMAND)]
# The floor's callbacks are installed by a sitecustomize in every Python the script starts.
FLOOR_SITE = Path(__file__).resolve().parent / "floor_site"


FOLLOWING = "cpuprof run (following)"
# A lever measured beside the others: `following{--sample-hz 10 --no-shapes}` is following with those
# flags of `cpuprof run` added (CPUPROF_ variables as VAR=value among them go to the environment);
# `on-demand{--bind none}` the same for the launch that observes nothing.
LEVER = re.compile(r"^(following|on-demand)\{(.*)\}$")
LEVER_BASES = {"following": FOLLOWING, "on-demand": ON_DEMAND}


def command_of(name: str) -> tuple[list[str], dict[str, str]]:
    """The interpreter's arguments before the script, and the environment added, for variant ``name``."""
    lever = LEVER.match(name)
    if lever is None:
        return VARIANTS[name], {}
    words = lever.group(2).split()
    env = dict(w.split("=", 1) for w in words if "=" in w and not w.startswith("-"))
    flags = [w for w in words if not ("=" in w and not w.startswith("-"))]
    return [*VARIANTS[LEVER_BASES[lever.group(1)]], *flags], env


def run(name: str, script: Path, model: Path, tokens: int, prompts: int, out: Path) -> float:
    prefix, added = command_of(name)
    args = [sys.executable, *prefix]
    if prefix:
        args += ["--out", str(out), "--overwrite", "--", "python"]
    args += [str(script), str(model), str(tokens), str(prompts)]
    if name == VLLM_PROFILER:
        args.append(str(out.with_name("vllm-traces")))
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", **added}
    floor_log = out.with_name("floor-installed")
    if name == FLOOR:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(FLOOR_SITE), env.get("PYTHONPATH")]))
        env["CPUPROF_BENCH_FLOOR"] = "shapes"
        env["CPUPROF_BENCH_FLOOR_LOG"] = str(floor_log)
        floor_log.unlink(missing_ok=True)
    result = subprocess.run(args, capture_output=True, text=True, env=env, timeout=1200)
    found = re.search(r"THROUGHPUT ([0-9.]+)", result.stdout)
    if result.returncode != 0 or found is None:
        raise SystemExit(f"{' '.join(args)} failed ({result.returncode}):\n{result.stderr[-2000:]}")
    if name == FLOOR:  # the front end, the engine core and the worker: else the floor measured nothing
        installed = set(floor_log.read_text().split()) if floor_log.exists() else set()
        if len(installed) < 3:
            raise SystemExit(f"{FLOOR}: the empty callbacks were installed in {len(installed)} processes, not the "
                             "front end, engine core and worker")
    return float(found.group(1))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--tokens", type=int, default=64, help="new tokens per prompt")
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--shapes", choices=("small", "1b"), default="small",
                        help="the checkpoint's layer shapes: small (hidden 512) or 1b (Llama-3.2-1B's)")
    parser.add_argument("--variants", help="comma-separated variants to run (default: the four above; not the "
                                           "floor nor --on-demand); "
                                           "no cpuprof is always run; following{FLAGS} adds `cpuprof run` flags "
                                           "(and VAR=value to the environment) to following, e.g. "
                                           "'following{--sample-hz 10}', on-demand{FLAGS} to the launch "
                                           "with no window")
    args = parser.parse_args()
    names = [n.strip() for n in args.variants.split(",")] if args.variants else DEFAULT_VARIANTS
    for name in names:
        if name not in VARIANTS and not LEVER.match(name):
            parser.error(f"--variants: {name}: not one of {', '.join(VARIANTS)}, nor following{{FLAGS}} "
                         "or on-demand{FLAGS}")
    names = ["no cpuprof", *(n for n in names if n != "no cpuprof")]
    print(machine_line())
    with tempfile.TemporaryDirectory(prefix="cpuprof-bench-vllm-") as tmp:
        work = Path(tmp)
        model = work / "model"
        if args.shapes == "1b":
            write_checkpoint(model, LLAMA_1B_SHAPES)
        else:
            write_checkpoint(model)
        script = work / "generate.py"
        script.write_text(textwrap.dedent(GENERATE))
        results: dict[str, list[float]] = {name: [] for name in names}
        for k in range(args.rounds):
            for name in rotated(names, k):
                results[name].append(run(name, script, model, args.tokens, args.prompts, work / "out"))
            print(f"round {k + 1}/{args.rounds}: " + ", ".join(f"{n} {results[n][-1]:.1f}" for n in names),
                  flush=True)
    base = results["no cpuprof"]
    rows = []
    for name in names:
        ratios = [v / b for v, b in zip(results[name], base, strict=True)]
        rows.append([name, f"{median(results[name]):.1f}", span(results[name], "{:.1f}"),
                     f"{median(ratios):.2f}", span(ratios)])
    print(render_table(["variant", "tokens/s (median)", "min-max", "ratio to no cpuprof", "min-max"], rows))
    if FOLLOWING in results and VLLM_PROFILER in results:
        paired = [f / v for f, v in zip(results[FOLLOWING], results[VLLM_PROFILER], strict=True)]
        print(f"following / {VLLM_PROFILER}, paired per round: {median(paired):.3f} ({span(paired)})")
    if FOLLOWING in results and FLOOR in results:
        beyond = [(v - f) / b * 100 for v, f, b in zip(results[FLOOR], results[FOLLOWING], base, strict=True)]
        print(f"following's cost beyond {FLOOR}, paired per round: {median(beyond):.1f} points of bare "
              f"({span(beyond, '{:.1f}')})")
    for name in names:
        lever = LEVER.match(name)
        against = LEVER_BASES[lever.group(1)] if lever else None
        if against not in results:
            continue
        gains = [(v - f) / b * 100 for v, f, b in zip(results[name], results[against], base, strict=True)]
        print(f"{name} against {against}, paired per round: {median(gains):+.1f} points of bare "
              f"({span(gains, '{:+.1f}')})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
