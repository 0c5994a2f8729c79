"""How far exact mode's carried clocks are from the clocks themselves, on the built-in decode.

Exact mode carries a team member's CPU clock forward by the wall time for up to 20 µs after a read
while the member stays on its CPU (csrc/core/exact_counting.cpp), instead of a system call at every
op boundary. A test hook (``verify_saved_reads``) reads every carried clock anyway, at the same
moment, and counts the differences. This decodes with the built-in Llama (llama-3.2-1b shapes,
``--layers`` of them, bf16) under exact mode with the hook on, and prints what it counted: how many
of the clocks per op were carried, how many of those were another thread's (the OpenMP worker),
the mean and largest difference, and how many were more than 2 µs off. Checks whose own read was
interrupted (over 2 µs) tell nothing and are counted apart.

    python benches/bench_exact_carry.py                      # 4 layers, 2 threads, 24 tokens, ~30 s
    python benches/bench_exact_carry.py --threads 2 --layers 16 --new-tokens 8
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

import torch
from _common import machine_line


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    parser.add_argument("--layers", type=int, default=4, help="layers of llama-3.2-1b shapes (default 4)")
    parser.add_argument("--new-tokens", type=int, default=24, help="tokens decoded (default 24)")
    parser.add_argument("--runs", type=int, default=3, help="decodes, each its own profile (default 3)")
    args = parser.parse_args(argv)

    import cpuprof
    from cpuprof import native
    from cpuprof.workload.decode_loop import run_decode
    from cpuprof.workload.llama import build_model
    from cpuprof.workload.presets import PRESETS

    nat = native.load()
    torch.set_num_threads(args.threads)
    cfg = dataclasses.replace(PRESETS["llama-3.2-1b"], layers=args.layers)
    model = build_model(cfg, torch.bfloat16)
    run_decode(model, cfg, prompt_len=32, new_tokens=4)  # warm: the OpenMP team exists
    print(f"{machine_line()}  torch {torch.__version__}  cpuprof {cpuprof.__version__}")
    print(f"built-in llama-3.2-1b shapes, {args.layers} layers, bf16, {args.threads} threads, prompt 32, "
          f"{args.new_tokens} new tokens, exact mode, every carried clock checked")
    for run in range(args.runs):
        nat.testing.verify_saved_reads(True)
        try:
            with cpuprof.profile(mode="exact", warn=False) as prof:
                run_decode(model, cfg, prompt_len=32, new_tokens=args.new_tokens)
            s = nat.testing.saved_read_stats()
        finally:
            nat.testing.verify_saved_reads(False)
        ops = prof.profile.overhead.ops
        checked = s["carried"] - s["carried_unchecked"]
        print(f"  run {run + 1}: {ops:,} ops; {s['carried']:,} clocks carried ({s['carried'] / max(1, ops):.2f} per "
              f"op, {s['carried_other']:,} of other threads), {s['parked']:,} kept for threads off their CPU; "
              f"carried vs read: mean {s['carried_error_ns'] / max(1, checked):.0f} ns, "
              f"{s['carried_off']:,} of {checked:,} over 2 µs, largest {s['max_carried_error_ns'] / 1000:.1f} µs "
              f"({s['carried_unchecked']:,} checks interrupted, not counted)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
