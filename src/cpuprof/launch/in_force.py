"""The child side of the launcher: what is really in force inside this process.

Environment variables and launcher flags say what was *asked*; a shell's ``LD_PRELOAD``, a
library that calls ``sched_setaffinity``, or an OpenMP runtime that ignores a variable can all
make the truth differ. This module reads the truth back from the kernel (``/proc/self``,
``get_mempolicy``, ``move_pages``) and from the libraries actually mapped, and :func:`compare`
turns any difference from what was requested into one-line warnings.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ..machine import numa
from ..machine.libraries import mappings
from ..machine.openmp import openmp_from_mappings
from ..model import (
    AllocatorInfo,
    InForce,
    MemPolicy,
    OpenMPInfo,
    Requested,
    ThreadPlacement,
    TorchThreads,
    WeightPages,
    format_cpulist,
)
from .environment import OWNED_VARS

_ALLOCATOR_RE = re.compile(r"lib(jemalloc|tcmalloc(?:_minimal)?)(-[0-9a-f]+)?\.so(\.\d+)*")
_ENV_PREFIXES = ("OMP_", "KMP_", "GOMP_", "MKL_")
_ENV_NAMES = ("LD_PRELOAD", "MALLOC_CONF")
# The OpenMP runtime --omp asks for, by the name used in OpenMPRuntime entries.
_RUNTIME_FOR_OMP = {"gnu": "libgomp", "intel": "libiomp5"}


def parse_task_stat(text: str) -> tuple[str, str, int]:
    """(comm, state, last CPU) from a /proc/.../stat line.

    comm may itself contain spaces and parentheses, so it is everything between the first "("
    and the *last* ")"; fields after it are counted from there (state is field 3, the last CPU
    field 39).
    """
    head, _, rest = text.rpartition(")")
    fields = rest.split()
    return head.partition("(")[2], fields[0], int(fields[39 - 3])


def read_threads() -> list[ThreadPlacement]:
    """Every thread of this process: tid, name, state, affinity and last CPU."""
    threads = []
    for tid in sorted(int(entry) for entry in os.listdir("/proc/self/task")):
        try:
            name, state, last_cpu = parse_task_stat(Path(f"/proc/self/task/{tid}/stat").read_text())
            affinity = sorted(os.sched_getaffinity(tid))
        except (FileNotFoundError, ProcessLookupError):
            continue  # the thread exited while we looked
        threads.append(ThreadPlacement(tid=tid, name=name, state=state, affinity=affinity, last_cpu=last_cpu))
    return threads


def read_allocators(maps: list[tuple[int, int, str]]) -> list[AllocatorInfo]:
    """Replacement allocators (jemalloc, tcmalloc) mapped into this process."""
    found = []
    for path in dict.fromkeys(path for _, _, path in maps):
        match = _ALLOCATOR_RE.fullmatch(os.path.basename(path.removesuffix(" (deleted)")))
        if match:
            found.append(AllocatorInfo(allocator=match.group(1).split("_")[0], path=path))
    return found


def read_torch() -> TorchThreads | None:
    """torch's thread settings, only if torch is already imported (never imports it)."""
    torch = sys.modules.get("torch")
    if torch is None or not hasattr(torch, "get_num_threads"):
        return None
    return TorchThreads(num_threads=torch.get_num_threads(), num_interop_threads=torch.get_num_interop_threads(),
                        parallel_info=torch.__config__.parallel_info())


def read_mempolicy() -> MemPolicy:
    """The memory policy of the calling thread, or the error that prevented reading it."""
    try:
        mode, nodes = numa.get_mempolicy()
    except OSError as exc:
        return MemPolicy(mode="unknown", error=str(exc))
    return MemPolicy(mode=mode, nodes=nodes)


def weight_pages(tensors: Iterable[Any], max_pages: int = 65536) -> WeightPages:
    """Per-node page counts over the storages of CPU ``tensors`` (e.g. model.parameters()).

    Storages are counted once even when tensors share them (tied embeddings, views); at most
    ``max_pages`` pages are queried, sampled evenly.
    """
    regions: dict[int, int] = {}
    for tensor in tensors:
        if tensor.device.type != "cpu":
            continue
        storage = tensor.untyped_storage()
        address, nbytes = storage.data_ptr(), storage.nbytes()
        if address and nbytes:
            regions[address] = max(regions.get(address, 0), nbytes)
    return numa.regions_page_nodes(regions.items(), max_pages)


def read_in_force(tensors: Iterable[Any] | None = None) -> InForce:
    """The settings in force in this process; pass the model's tensors to also learn on which
    nodes the weights live."""
    maps = mappings()
    return InForce(
        pid=os.getpid(),
        threads=read_threads(),
        mempolicy=read_mempolicy(),
        openmp=openmp_from_mappings(maps),
        allocators=read_allocators(maps),
        torch=read_torch(),
        env={key: value for key, value in sorted(os.environ.items())
             if key.startswith(_ENV_PREFIXES) or key in _ENV_NAMES},
        weight_pages=weight_pages(tensors) if tensors is not None else None,
    )


def _nodes_text(nodes: Iterable[int]) -> str:
    text = format_cpulist(list(nodes))
    return f"node(s) {text}" if text else "no nodes"


def compare(requested: Requested, in_force: InForce) -> list[str]:
    """One-line warnings for every way ``in_force`` differs from ``requested``.

    Checks that cannot be made (torch not imported, weights not given) are skipped.
    """
    warnings: list[str] = []
    if in_force.torch is not None and in_force.torch.num_threads != requested.threads:
        warnings.append(f"threads: asked {requested.threads} but torch uses {in_force.torch.num_threads}")

    for key, wanted in requested.env.items():
        have = in_force.env.get(key)
        if have != wanted:
            have_text = "it unset" if have is None else have
            warnings.append(f"{key}: asked {wanted} but the process has {have_text}")
    for key in OWNED_VARS:
        if key not in requested.env and key in in_force.env:
            warnings.append(f"{key}: the launch leaves it unset but the process has {in_force.env[key]}")

    allowed = set(requested.cpus)
    outside: dict[tuple[int, ...], list[str]] = {}
    for thread in in_force.threads:
        extra = tuple(sorted(set(thread.affinity) - allowed))
        if extra:
            outside.setdefault(extra, []).append(f"{thread.tid} ({thread.name})")
    for extra, names in outside.items():
        warnings.append(
            f"affinity: thread(s) {', '.join(names)} may run on CPU(s) {format_cpulist(list(extra))}, "
            f"outside the requested {format_cpulist(list(allowed))}"
        )

    warnings.extend(_compare_openmp(requested, in_force.openmp))
    warnings.extend(_compare_allocator(requested, in_force.allocators))

    asked = requested.mempolicy
    policy = in_force.mempolicy
    asked_text = f"{asked.mode} to {_nodes_text(asked.nodes)}"
    if policy.error:
        warnings.append(f"memory policy: asked {asked_text} but it could not be read ({policy.error})")
    elif (policy.mode, list(policy.nodes)) != (asked.mode, list(asked.nodes)):
        warnings.append(
            f"memory policy: asked {asked_text} but it is {policy.mode}"
            + (f" to {_nodes_text(policy.nodes)}" if policy.nodes else "")
        )

    pages = in_force.weight_pages
    if pages and asked.mode == "bind":
        bound = set(asked.nodes)
        elsewhere = {node: count for node, count in pages.nodes.items() if node not in bound}
        if elsewhere:
            resident = sum(pages.nodes.values())
            warnings.append(
                f"weights: {sum(elsewhere.values())} of {resident} resident sampled pages are on "
                f"{_nodes_text(elsewhere)}, outside the bound {_nodes_text(bound)}"
            )
    return warnings


def _compare_openmp(requested: Requested, openmp: OpenMPInfo) -> list[str]:
    wanted = _RUNTIME_FOR_OMP[requested.omp]
    asked = f"OpenMP: asked {requested.omp} ({wanted})"
    if openmp.active is not None:
        if openmp.active.runtime != wanted:
            return [f"{asked} but OpenMP calls go to {openmp.active.runtime} ({openmp.active.path})"]
        return []
    if not openmp.loaded:
        return [f"{asked} but no OpenMP runtime is loaded"]
    names = ", ".join(f"{entry.runtime} ({entry.path})" for entry in openmp.loaded)
    if all(entry.runtime != wanted for entry in openmp.loaded):
        return [f"{asked} but only {names} is loaded"]
    return [f"{asked}; {names} are loaded and which one serves OpenMP calls is unknown"]


def _compare_allocator(requested: Requested, allocators: list[AllocatorInfo]) -> list[str]:
    wanted = requested.allocator
    names = {entry.allocator for entry in allocators}
    paths = ", ".join(entry.path for entry in allocators)
    if wanted == "default" and names:
        return [f"allocator: asked the default (glibc malloc) but {paths} is loaded"]
    if wanted != "default" and wanted not in names:
        found = f"only {paths} is loaded" if names else "it is not loaded"
        return [f"allocator: asked {wanted} but {found}"]
    if len(names) > 1:
        return [f"allocator: asked {wanted} but several are loaded: {paths}"]
    return []
