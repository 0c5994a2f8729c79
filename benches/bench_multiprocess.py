"""One process × 2 threads against two tensor-parallel ranks × 1 thread and two instances × 1 thread.

Each variant is a whole ``python -m cpuprof decode`` (default preset unless --preset), run in
rounds whose order rotates every round, so machine drift favours no variant. Printed per variant:
tokens/s (the group's: a tensor-parallel pair decodes one stream, so its rate is its slowest
rank's; two instances decode two streams, so theirs add up), the median step latency a user of
one stream sees, and what the profiles say explains the difference: for tensor-parallel, the
share of a step spent in all-reduces and in waiting for the other rank, with the time per call.

    python benches/bench_multiprocess.py                      # 10 rounds, llama-3.2-1b, ~15 min here
    python benches/bench_multiprocess.py --preset tiny --rounds 3 --new-tokens 16   # a quick look
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from _common import machine_line, median, render_table, rotated, span

from cpuprof.analysis.compare import run_metrics
from cpuprof.analysis.decode import decode_figures
from cpuprof.analysis.ranks import group_figures, load_profiles
from cpuprof.model import Profile
from cpuprof.model.ranks import RANKS_FILENAME, MultiRun

VARIANTS = {
    "1 process x 2 threads": ["--threads", "2"],
    "tp 2 ranks x 1 thread": ["--tp", "2", "--threads", "1"],
    "2 instances x 1 thread": ["--instances", "2", "--threads", "1"],
}


def decode(args: list[str], out: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "cpuprof", "decode", *args, "--out", str(out)],
                            capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"decode {' '.join(args)} failed:\n{result.stderr[-2000:]}")


def figures(out: Path) -> dict:
    """tokens/s of the group, p50 step (ms) of one stream, and the tensor-parallel split, from the saved run."""
    if not (out / RANKS_FILENAME).is_file():
        profile = Profile.load(out)
        f = profile.workload.figures
        return {"tokens_per_s": f.tokens_per_s, "p50_ms": f.p50_ms, **_traffic([profile])}
    run = MultiRun.load(out)
    profiles = load_profiles(run, out)
    group = group_figures(run, profiles)
    result = {"tokens_per_s": group.tokens_per_s,
              "p50_ms": statistics.mean(r.p50_ms for r in group.ranks if r.p50_ms is not None),
              **_traffic([p for p in profiles if p is not None])}
    splits = [r.split for r in group.ranks if r.split is not None]
    if splits:
        result["collective_share"] = statistics.mean(s.all_reduce_ns / s.step_ns for s in splits)
        result["wait_share"] = statistics.mean(s.wait_ns / s.step_ns for s in splits)
        result["per_call_ms"] = statistics.mean(s.transfer_ns / s.calls_per_step for s in splits) / 1e6
        result["compute_ms"] = statistics.mean(s.compute_ns for s in splits) / 1e6
    return result


def _traffic(profiles: list[Profile]) -> dict:
    """Memory traffic of all the processes together (each one's bytes per token x its tokens/s), and
    the OpenMP team's wait (spin + sleep) share where a process has a team."""
    out: dict = {"gb_per_s": sum(decode_figures(p.workload).effective_gb_per_s or 0.0 for p in profiles)}
    waits = []
    for p in profiles:
        m = run_metrics(p)
        if m is not None and m.spin_share is not None and m.sleep_share is not None and (m.threads or 1) > 1:
            waits.append(m.spin_share + m.sleep_share)
    if waits:
        out["omp_wait_share"] = statistics.mean(waits)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--preset", default="llama-3.2-1b")
    ap.add_argument("--new-tokens", type=int, default=24)
    ap.add_argument("--profile", action="store_true",
                    help="profile every run (default: --no-profile for the figures; one profiled run of each "
                         "variant at the end explains them)")
    args = ap.parse_args()
    common = ["--preset", args.preset, "--new-tokens", str(args.new_tokens), "--roofs", "off"]
    print(machine_line())
    print(f"{args.preset}, {args.new_tokens} new tokens, {args.rounds} rounds in rotated order; "
          f"{'profiled' if args.profile else 'not profiled'}")
    results: dict[str, list[dict]] = {name: [] for name in VARIANTS}
    with tempfile.TemporaryDirectory() as tmp:
        for k in range(args.rounds):
            for name in rotated(list(VARIANTS), k):
                extra = [] if args.profile else ["--no-profile"]
                out = Path(tmp) / f"{k}-{name.replace(' ', '_')}"
                decode([*common, *VARIANTS[name], *extra], out)
                results[name].append(figures(out))
            print(f"round {k + 1}/{args.rounds}: " + ", ".join(
                f"{name} {results[name][-1]['tokens_per_s']:.2f} tok/s" for name in VARIANTS), flush=True)
        explained = {}
        for name in VARIANTS:
            out = Path(tmp) / f"explain-{name.replace(' ', '_')}"
            decode([*common, *VARIANTS[name]], out)
            explained[name] = figures(out)

    base = "1 process x 2 threads"
    rows, explanations = [], []
    for name in VARIANTS:
        rates = [r["tokens_per_s"] for r in results[name]]
        ratios = [r["tokens_per_s"] / b["tokens_per_s"] for r, b in zip(results[name], results[base], strict=True)]
        p50 = [r["p50_ms"] for r in results[name]]
        sd = statistics.stdev(rates) if len(rates) > 1 else 0.0
        rows.append([name, f"{median(rates):.2f}", span(rates), f"{sd:.2f}", f"{median(ratios):.2f}x",
                     span(ratios, "{:.2f}"), f"{median(p50):.0f}"])
        e = explained[name]
        parts = [f"{e['tokens_per_s']:.2f} tok/s, memory traffic {e['gb_per_s']:.1f} GB/s (all processes)"]
        if "omp_wait_share" in e:
            parts.append(f"OpenMP threads waiting (spin + sleep) {e['omp_wait_share'] * 100:.0f}% of the team's "
                         "op time")
        if "collective_share" in e:
            parts.append(f"{e['collective_share'] * 100:.0f}% of a step in all-reduces ({e['wait_share'] * 100:.1f}% "
                         f"waiting for the other rank), {e['per_call_ms']:.2f} ms per call; the rest, computing the "
                         f"rank's half of the model, {e['compute_ms']:.0f} ms per step")
        explanations.append(f"{name}: " + "; ".join(parts))
    print()
    print(render_table(["variant", "tok/s", "min-max", "sd", "vs 1x2", "ratio min-max", "p50 ms"], rows))
    print("\ntok/s: the group's (tp: one stream, its slowest rank's rate; instances: two streams, summed); "
          "p50 ms: the median step latency of one stream; ratios are per round, against the same round's 1 x 2.")
    print("From one profiled run of each:")
    for line in explanations:
        print(f"  {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
