"""A torch.distributed job whose answer is known, for the tests of ranks (followed, merged across
"hosts"): two gloo ranks over loopback, rank 1 sleeping before each all-reduce and measuring how
long it really slept, which is how long rank 0 waits at them; and a free port for its store."""

from __future__ import annotations

import socket

# The sleep is well above what a loaded 2-CPU machine delays a process by (8 ms once let rank 0 arrive
# after the sleeper at 3 steps of 20 in a merged run, which then named rank 1 late at only 17).
STEPS, LATE_MS = 20, 20.0

# The steps, as a function of the rank: `late_rank_steps(rank)` returns what rank 1 slept, in ms.
LATE_RANK_STEPS = f"""
import time

import torch
import torch.distributed as dist


def late_rank_steps(rank):
    torch.set_num_threads(1)
    t, w = torch.ones(1024), torch.randn(128, 128)
    slept = 0.0
    for step in range({STEPS}):
        for _ in range(5):
            w @ w
        if rank == 1:
            began = time.perf_counter()
            time.sleep({LATE_MS} / 1e3)
            slept += time.perf_counter() - began
        dist.all_reduce(t)
    assert t[0].item() == 2 ** {STEPS}
    if rank == 1:
        print(f"rank 1 slept {{slept * 1e3:.3f}} ms", flush=True)
    dist.barrier()
    dist.destroy_process_group()  # before the process ends: its rank is read just before
"""


def slept_ms(stdout: str) -> float:
    """What rank 1 said it slept, from the program's output."""
    return float(stdout.split("rank 1 slept ")[1].split(" ms")[0])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
