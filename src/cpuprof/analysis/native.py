"""Where sampled CPU time went in native code: per op and per thread, by the function the CPU was
in (the stack's leaf) and by what that code is (compute kernel, OpenMP runtime, allocator, ...)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

from ..model import CATEGORIES, NativeFrame, Profile, StackCount

CATEGORY_NAMES = {
    "compute": "compute kernels (BLAS, oneDNN, ATen, JIT code)",
    "openmp": "OpenMP runtime (barriers, spinning, waking)",
    "allocator": "memory allocation",
    "interpreter": "Python interpreter",
    "framework": "PyTorch framework (dispatch, tensor bookkeeping)",
    "kernel": "operating system kernel (system calls, page faults)",
    "other": "other code",
}


@dataclass
class NativeSplit:
    cpu_ns: int = 0
    samples: int = 0
    by_category: dict[str, int] = field(default_factory=dict)  # category -> CPU ns
    by_function: dict[int, int] = field(default_factory=dict)  # leaf frame index -> CPU ns

    def share(self, category: str) -> float:
        return self.by_category.get(category, 0) / self.cpu_ns if self.cpu_ns else 0.0

    def top_functions(self, n: int = 3) -> list[tuple[int, int]]:
        return sorted(self.by_function.items(), key=lambda kv: kv[1], reverse=True)[:n]


def leaf(profile: Profile, stack: int) -> NativeFrame | None:
    assert profile.stacks is not None
    frames = profile.stacks.stacks[stack]
    return profile.stacks.frames[frames[0]] if frames else None


def _split_by(profile: Profile, key: Callable[[StackCount], int]) -> dict[int, NativeSplit]:
    """The samples grouped by ``key``, each group split by leaf category and function."""
    out: dict[int, NativeSplit] = defaultdict(NativeSplit)
    if profile.stacks is None:
        return out
    stacks = profile.stacks
    for c in stacks.counts:
        split = out[key(c)]
        split.cpu_ns += c.cpu_ns
        split.samples += c.samples
        frames = stacks.stacks[c.stack]
        category = stacks.frames[frames[0]].category if frames else "other"
        split.by_category[category] = split.by_category.get(category, 0) + c.cpu_ns
        if frames:
            split.by_function[frames[0]] = split.by_function.get(frames[0], 0) + c.cpu_ns
    return out


def by_op(profile: Profile) -> dict[int, NativeSplit]:
    """Per op id: the samples that landed in it (all threads)."""
    return _split_by(profile, lambda c: c.op)


def by_thread(profile: Profile) -> dict[int, NativeSplit]:
    """Per thread index: its samples."""
    return _split_by(profile, lambda c: c.thread)


def short_function(frame: NativeFrame, width: int = 48) -> str:
    """A function name short enough for a table cell: C++ argument lists and templates elided."""
    name = frame.name
    out, depth = [], 0
    for ch in name:  # drop "<...>" and "(...)" contents, keeping the brackets as markers
        if ch in "<(":
            if depth == 0:
                out.append(ch + "…" + (">" if ch == "<" else ")"))
            depth += 1
        elif ch in ">)":
            depth = max(0, depth - 1)
        elif depth == 0:
            out.append(ch)
    short = "".join(out)
    return short if len(short) <= width else "…" + short[-(width - 1):]


__all__ = ["CATEGORIES", "CATEGORY_NAMES", "NativeSplit", "by_op", "by_thread", "leaf", "short_function"]
