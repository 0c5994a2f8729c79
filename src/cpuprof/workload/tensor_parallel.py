"""A tensor-parallel rank's side of torch.distributed: joining the group, and timing every all-reduce.

The rendezvous is torch.distributed's own (``init_process_group`` with the env:// method the
launcher fills, as torchrun does: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT). Ranks start, import
torch and build their shards at their own pace, so the rendezvous and the barrier before prefill
wait up to ``RANK_STARTUP_TIMEOUT_S`` (or the rank timeout, if longer). The model's all-reduces run in
a group of the same ranks whose timeout is the launcher's rank timeout, so a rank whose peer died
or hung fails with gloo's error instead of waiting for the default half hour, and saves what it
measured.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable
from contextlib import AbstractContextManager

import torch.distributed as dist
from torch import Tensor

from ..defaults import RANK_STARTUP_TIMEOUT_S
from ..model import Collectives
from ..model.workload import ALL_REDUCE_REGION


def join_group(backend: str, timeout_s: float) -> dist.ProcessGroup:
    """Joins the process group the launcher's environment describes; returns the group of the same
    ranks whose collectives fail after ``timeout_s``, for the model's all-reduces."""
    if backend == "ccl":
        import oneccl_bindings_for_pytorch  # type: ignore[import-not-found]  # noqa: F401  (registers ccl)
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=max(timeout_s, RANK_STARTUP_TIMEOUT_S)))
    group = dist.new_group(timeout=datetime.timedelta(seconds=timeout_s))
    assert group is not None  # every rank is a member
    return group


class AllReduceRecorder:
    """The model's reduce function: ``dist.all_reduce`` (sum), each call timed on CLOCK_MONOTONIC.

    The dispatcher's ``c10d::allreduce_`` op only enqueues the work for gloo's thread; the wait
    for the other ranks and the transfer happen in ``wait()``, after the op. Timing the call as
    the model sees it (enqueue to result) is what a decode step pays. Every forward pass makes
    ``calls_per_forward`` calls, so the n-th call belongs to forward n // calls_per_forward: the
    prefill, then the decode steps in order.
    """

    def __init__(self, region: Callable[[str], AbstractContextManager[object]] | None,
                 calls_per_forward: int, group: dist.ProcessGroup | None = None) -> None:
        self.record = Collectives(kind="all_reduce")
        self.region = region
        self.calls_per_forward = calls_per_forward
        self.group = group  # None: the default group

    def __call__(self, tensor: Tensor) -> Tensor:
        enter = time.monotonic_ns()
        if self.region is not None:
            with self.region(ALL_REDUCE_REGION):
                dist.all_reduce(tensor, group=self.group)
        else:
            dist.all_reduce(tensor, group=self.group)
        leave = time.monotonic_ns()
        r = self.record
        r.enter_ns.append(enter)
        r.exit_ns.append(leave)
        r.payload_bytes.append(tensor.numel() * tensor.element_size())
        r.step.append(len(r.step) // self.calls_per_forward - 1)
        return tensor

