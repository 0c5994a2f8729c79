"""A followed process's place in a torch.distributed job: its rank, the job's size and backend, and
the store its ranks met at, which tells two jobs of one run apart.

Read from torch.distributed itself, never guessed from the environment: vLLM's workers and
``mp.spawn`` pass the rank as an argument, not in RANK. A program that destroys its group before
it ends (most do, in their shutdown) would leave nothing to read at the final save, so the group
is also read just before ``destroy_process_group`` runs, and the last reading is kept.
"""

from __future__ import annotations

import functools
import os
import sys
from typing import Any

from ..model import DistributedRank


def read_rank() -> DistributedRank | None:
    """This process's rank in the default group; None where torch.distributed is not initialized
    (or not built in)."""
    try:
        import torch.distributed as dist

        if not dist.is_available() or not dist.is_initialized():
            return None
        backend = dist.get_backend()
        local = os.environ.get("LOCAL_RANK", "")
        return DistributedRank(rank=dist.get_rank(), world_size=dist.get_world_size(),
                               backend=str(backend) if backend else None, store=_store_address(),
                               local_rank=int(local) if local.isdigit() else None)
    except Exception:  # a half-torn-down group while the process ends: nothing to read
        return None


def _store_address() -> str | None:
    from torch.distributed import distributed_c10d

    try:
        store: Any = distributed_c10d._get_default_store()
    except Exception:
        return None
    for _ in range(8):  # PrefixStore wraps the store the ranks actually met at
        inner = getattr(store, "underlying_store", None)
        if inner is None:
            break
        store = inner
    host, port, path = getattr(store, "host", None), getattr(store, "port", None), getattr(store, "path", None)
    if host is not None and port is not None:
        return f"tcp {host}:{port}"
    if path:
        return f"file {path}"
    return None


class RankWatch:
    """Keeps the last reading of the process's rank: at each save, and just before the program
    destroys its default group."""

    def __init__(self) -> None:
        self.last: DistributedRank | None = None

    def read(self) -> DistributedRank | None:
        now = read_rank()
        if now is not None:
            self.last = now
        return self.last

    def watch_destroy(self) -> None:
        """Wraps torch.distributed.destroy_process_group: the rank is read before the group goes."""
        if "torch.distributed" not in sys.modules:  # torch imports it itself; never imported here for it
            return
        try:
            import torch.distributed as dist
            from torch.distributed import distributed_c10d
        except Exception:
            return
        original = getattr(distributed_c10d, "destroy_process_group", None)
        if original is None or getattr(original, "_cpuprof_wrapped", False):
            return

        @functools.wraps(original)
        def destroy_process_group(*args: Any, **kwargs: Any) -> Any:
            group = args[0] if args else kwargs.get("group")
            if group is None or group is getattr(dist.group, "WORLD", None):  # the default group: the process's
                self.read()
            return original(*args, **kwargs)

        destroy_process_group._cpuprof_wrapped = True  # type: ignore[attr-defined]
        distributed_c10d.destroy_process_group = destroy_process_group
        if getattr(dist, "destroy_process_group", None) is original:
            dist.destroy_process_group = destroy_process_group
