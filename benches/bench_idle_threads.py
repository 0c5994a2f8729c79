"""The collector's CPU beside idle threads: a serving engine's worker has dozens of threads that never
run an op (vLLM's CPU worker: 47, 43 of them idle backends), and what cpuprof's collector thread
spends per second must not grow with them (issue 40, target 4: within 1.5x of the 3-thread figure
with 64 and 256 idle threads).

What it measures
----------------
In one process: K idle Python threads (each blocked on an Event, as a backend's idle thread is) are
started, then a cpuprof session in the default mode (sampled, shapes recorded, as `run` profiles a
program) while a working team of 2 OpenMP threads runs 256x256 matmuls for --seconds. The figure
is the collector thread's CPU time (the profile's ``overhead.discovery_cpu_ns``: the thread that
discovers threads, drains sample rings and joins samples to ops) per second of the session's wall
time. K in (3, 64, 256) run interleaved, round after round, in an order rotated every round (a
shared machine's noise comes in bursts); each figure is the median over rounds with its min-max,
and the ratio against K=3 is the ratio of medians, with the spread of the per-round ratios.

Run
---
    python benches/bench_idle_threads.py                   # 10 rounds, 1 s each
    python benches/bench_idle_threads.py --rounds 12 --seconds 2
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

from _common import machine_line, rotated

IDLE_COUNTS = (3, 64, 256)
TARGET_RATIO = 1.5


def one_session(idle: int, seconds: float) -> tuple[float, int]:
    """The collector's CPU ns per wall second, and the threads the profile saw, with ``idle`` idle
    threads alive for the whole session."""
    import torch

    import cpuprof

    stop = threading.Event()
    threads = [threading.Thread(target=stop.wait, name=f"idle-{k}", daemon=True) for k in range(idle)]
    for t in threads:
        t.start()
    a = torch.rand(256, 256)
    try:
        with cpuprof.profile(mode="sampled", record_shapes=True) as prof:
            end = time.perf_counter() + seconds
            while time.perf_counter() < end:
                torch.mm(a, a)
    finally:
        stop.set()
        for t in threads:
            t.join()
    profile = prof.profile
    assert profile.collection is not None and profile.overhead is not None
    wall_s = profile.collection.wall_ns / 1e9
    return profile.overhead.discovery_cpu_ns / wall_s, len(profile.threads)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=10, help="rotated rounds, at least 10 (default 10)")
    parser.add_argument("--seconds", type=float, default=1.0, help="each session's length (default 1 s)")
    args = parser.parse_args()
    if args.rounds < 10:
        raise SystemExit("--rounds: at least 10 (single rounds on shared machines move by 20%)")
    import torch

    torch.set_num_threads(2)
    print(machine_line())
    print(f"collector CPU per wall second beside K idle threads; 2-thread matmul team, {args.seconds:.1f} s "
          f"sessions, {args.rounds} rounds rotated")
    per: dict[int, list[float]] = {k: [] for k in IDLE_COUNTS}
    seen: dict[int, set[int]] = {k: set() for k in IDLE_COUNTS}
    for round_ in range(args.rounds):
        for idle in rotated(list(IDLE_COUNTS), round_):
            cpu, threads = one_session(idle, args.seconds)
            per[idle].append(cpu)
            seen[idle].add(threads)
    base = statistics.median(per[IDLE_COUNTS[0]])
    print(f"{'idle threads':>12}  {'threads seen':>12}  {'collector CPU/s':>16}  {'min-max':>17}  "
          f"{'vs 3':>6}  {'ratio min-max':>13}")
    worst = 0.0
    for idle in IDLE_COUNTS:
        values = per[idle]
        ratios = [v / b for v, b in zip(values, per[IDLE_COUNTS[0]], strict=True) if b]
        ratio = statistics.median(values) / base if base else float("nan")
        if idle != IDLE_COUNTS[0]:
            worst = max(worst, ratio)
        shown = "-".join(str(n) for n in sorted({min(seen[idle]), max(seen[idle])}))
        print(f"{idle:>12}  {shown:>12}  {statistics.median(values) / 1e6:>13.2f} ms  "
              f"{min(values) / 1e6:>7.2f}-{max(values) / 1e6:<7.2f}ms  {ratio:>6.2f}  "
              f"{min(ratios):>6.2f}-{max(ratios):<6.2f}")
    verdict = "met" if worst <= TARGET_RATIO else "missed"
    print(f"target: at most {TARGET_RATIO}x the 3-idle-thread figure with 64 and 256: {verdict} "
          f"(worst {worst:.2f}x)")


if __name__ == "__main__":
    main()
