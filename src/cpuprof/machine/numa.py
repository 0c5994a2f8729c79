"""Thin ctypes wrappers over the kernel's NUMA memory-policy system calls.

Why not libnuma: it is an extra system package that is often missing, and the
three calls we need (``set_mempolicy``, ``get_mempolicy``, ``move_pages``) are
plain system calls reachable through libc's ``syscall``. The memory policy set
with :func:`set_mempolicy` is inherited across ``fork`` and kept across
``execve``, which is what lets the launcher bind a child before torch starts.

Every failure raises :class:`OSError` carrying the kernel's errno and a message
that names the call.
"""

from __future__ import annotations

import bisect
import ctypes
import errno
import os
import platform
from collections import Counter
from collections.abc import Iterable, Sequence

from ..model.settings import WeightPages

MPOL_DEFAULT = 0
MPOL_PREFERRED = 1
MPOL_BIND = 2
MPOL_INTERLEAVE = 3
MPOL_LOCAL = 4
MPOL_PREFERRED_MANY = 5
MPOL_WEIGHTED_INTERLEAVE = 6

MODE_NAMES: dict[int, str] = {
    MPOL_DEFAULT: "default",
    MPOL_PREFERRED: "preferred",
    MPOL_BIND: "bind",
    MPOL_INTERLEAVE: "interleave",
    MPOL_LOCAL: "local",
    MPOL_PREFERRED_MANY: "preferred_many",
    MPOL_WEIGHTED_INTERLEAVE: "weighted_interleave",
}

# get_mempolicy() reports the mode OR-ed with these flags (MPOL_F_STATIC_NODES,
# MPOL_F_RELATIVE_NODES, MPOL_F_NUMA_BALANCING); they are not part of the mode.
_MODE_FLAGS = (1 << 15) | (1 << 14) | (1 << 13)
# get_mempolicy flag: return the nodes this process may use (its cpuset's mems).
_MPOL_F_MEMS_ALLOWED = 1 << 2

# Syscall numbers are per architecture; aarch64 uses the asm-generic table.
_SYSCALLS: dict[str, dict[str, int]] = {
    "x86_64": {"set_mempolicy": 238, "get_mempolicy": 239, "move_pages": 279},
    "aarch64": {"set_mempolicy": 237, "get_mempolicy": 236, "move_pages": 239},
}

# Node masks are sized for the kernel's largest MAX_NUMNODES (1 << NODES_SHIFT,
# NODES_SHIFT <= 10), so get_mempolicy never fails with EINVAL for a short mask.
_MASK_BITS = 1024
_WORD_BITS = ctypes.sizeof(ctypes.c_ulong) * 8
_MASK_WORDS = _MASK_BITS // _WORD_BITS

_libc = ctypes.CDLL(None, use_errno=True)
_syscall = _libc.syscall
_syscall.restype = ctypes.c_long


def _call(name: str, what: str, *args: object) -> int:
    """Run one NUMA syscall; raise OSError(errno) naming the call (``what``) on failure."""
    numbers = _SYSCALLS.get(platform.machine())
    if numbers is None:
        raise OSError(
            errno.ENOSYS,
            f"{what}: NUMA syscalls are wired up for x86_64 and aarch64 only, "
            f"not {platform.machine()}",
        )
    ret = _syscall(ctypes.c_long(numbers[name]), *args)
    if ret < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what} failed: {os.strerror(err)}")
    return ret


def _nodemask(nodes: Iterable[int]) -> ctypes.Array[ctypes.c_ulong]:
    mask = (ctypes.c_ulong * _MASK_WORDS)()
    for node in nodes:
        if not 0 <= node < _MASK_BITS:
            raise OSError(errno.EINVAL, f"NUMA node {node} is out of range 0..{_MASK_BITS - 1}")
        mask[node // _WORD_BITS] |= 1 << (node % _WORD_BITS)
    return mask


def _mask_nodes(mask: ctypes.Array[ctypes.c_ulong]) -> list[int]:
    return [
        word_index * _WORD_BITS + bit
        for word_index, word in enumerate(mask)
        for bit in range(_WORD_BITS)
        if word >> bit & 1
    ]


# The kernel reads maxnode - 1 bits (a historical off-by-one that libnuma also
# compensates for), so pass one more than the mask holds.
_MAXNODE = ctypes.c_ulong(_MASK_BITS + 1)


def set_mempolicy(mode: int, nodes: Sequence[int] = ()) -> None:
    """Set the calling thread's memory policy (inherited by children and kept over execve).

    ``nodes`` must be empty for MPOL_DEFAULT (and MPOL_PREFERRED with no nodes
    means "local").
    """
    mask = _nodemask(nodes)
    _call(
        "set_mempolicy",
        f"set_mempolicy({MODE_NAMES.get(mode, mode)}, nodes {list(nodes)})",
        ctypes.c_long(mode),
        ctypes.cast(mask, ctypes.c_void_p) if nodes else ctypes.c_void_p(None),
        _MAXNODE if nodes else ctypes.c_ulong(0),
    )


def get_mempolicy() -> tuple[str, list[int]]:
    """Return the calling thread's memory policy as (mode name, nodes)."""
    mode = ctypes.c_int()
    mask = _nodemask(())
    _call(
        "get_mempolicy",
        "get_mempolicy()",
        ctypes.byref(mode),
        ctypes.cast(mask, ctypes.c_void_p),
        _MAXNODE,
        ctypes.c_void_p(None),
        ctypes.c_ulong(0),
    )
    value = mode.value & ~_MODE_FLAGS
    return MODE_NAMES.get(value, f"mode{value}"), _mask_nodes(mask)


def mems_allowed() -> list[int]:
    """Return the NUMA nodes this process may allocate from (its cpuset's mems)."""
    mask = _nodemask(())
    _call(
        "get_mempolicy",
        "get_mempolicy(MPOL_F_MEMS_ALLOWED)",
        ctypes.c_void_p(None),
        ctypes.cast(mask, ctypes.c_void_p),
        _MAXNODE,
        ctypes.c_void_p(None),
        ctypes.c_ulong(_MPOL_F_MEMS_ALLOWED),
    )
    return _mask_nodes(mask)


def page_nodes(address: int, nbytes: int, max_pages: int = 65536) -> WeightPages:
    """Count on which node each page of [address, address + nbytes) lives."""
    return regions_page_nodes([(address, nbytes)], max_pages)


def regions_page_nodes(regions: Iterable[tuple[int, int]], max_pages: int = 65536) -> WeightPages:
    """Like :func:`page_nodes` over several (address, nbytes) regions at once.

    Overlapping regions are merged so no page is counted twice, and one sampling
    stride is used across all of them, so sampled counts stay proportional.
    """
    if max_pages < 1:
        raise ValueError("max_pages must be at least 1")
    page_size = os.sysconf("SC_PAGE_SIZE")
    spans: list[tuple[int, int]] = []  # [first page, end page) in page units
    for address, nbytes in sorted(regions):
        if nbytes <= 0:
            continue
        first, end = address // page_size, -(-(address + nbytes) // page_size)
        if spans and first <= spans[-1][1]:
            spans[-1] = (spans[-1][0], max(spans[-1][1], end))
        else:
            spans.append((first, end))

    offsets = [0]  # page index (over all spans) where each span starts
    for first, end in spans:
        offsets.append(offsets[-1] + end - first)
    total = offsets[-1]
    counts = WeightPages(pages_total=total, page_size=page_size)
    if total == 0:
        return counts

    wanted = min(total, max_pages)
    pages = (ctypes.c_void_p * wanted)()
    for i in range(wanted):
        index = i * total // wanted
        span = bisect.bisect_right(offsets, index) - 1
        pages[i] = (spans[span][0] + index - offsets[span]) * page_size
    status = (ctypes.c_int * wanted)()
    _call(
        "move_pages",
        f"move_pages({wanted} pages)",
        ctypes.c_long(0),
        ctypes.c_ulong(wanted),
        pages,
        ctypes.c_void_p(None),
        status,
        ctypes.c_long(0),
    )

    for value, count in Counter(status).items():
        if value >= 0:
            counts.nodes[value] = count
        elif -value == errno.ENOENT:
            counts.not_present = count
        else:
            name = errno.errorcode.get(-value, str(-value))
            counts.errors[name] = counts.errors.get(name, 0) + count
    counts.pages_queried = wanted
    return counts
