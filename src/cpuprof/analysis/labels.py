"""Short, unambiguous names for what reports show: op inputs, threads, regions."""

from __future__ import annotations

from ..model import OpInput, OpStat, Profile

_SCALAR_TEXT = {"none": "None", "int": "int", "float": "float", "bool": "bool", "int_list": "ints",
                "other": "other", "undefined": "undef"}


def _contiguous_strides(sizes: list[int]) -> list[int]:
    strides, step = [], 1
    for size in reversed(sizes):
        strides.append(step)
        step *= max(size, 1)
    return list(reversed(strides))


def layout_mark(sizes: list[int], strides: list[int] | None) -> str:
    """'' for contiguous, 'ᵀ' for a transposed matrix view (a weight used as [in, out]),
    '*' for any other strided layout. Dims of size 1 have no meaningful stride and are skipped."""
    if not strides or len(strides) != len(sizes):
        return ""
    expected = _contiguous_strides(sizes)
    if all(s == e or size == 1 for s, e, size in zip(strides, expected, sizes, strict=True)):
        return ""
    if len(sizes) >= 2:
        swapped = sizes[:-2] + [sizes[-1], sizes[-2]]
        t = _contiguous_strides(swapped)
        transposed = t[:-2] + [t[-1], t[-2]]
        if all(s == e or size == 1 for s, e, size in zip(strides, transposed, sizes, strict=True)):
            return "ᵀ"
    return "*"


def input_text(inp: OpInput) -> str:
    if inp.kind == "tensor":
        sizes = inp.sizes or []
        return f"{inp.dtype}[{','.join(map(str, sizes))}]{layout_mark(sizes, inp.strides)}"
    if inp.kind == "unknown_shape":
        return f"{inp.dtype}[?]"
    if inp.kind == "tensor_list":
        return "(" + ", ".join(input_text(i) for i in inp.items or []) + ")"
    return _SCALAR_TEXT.get(inp.kind, inp.kind)


def inputs_text(op: OpStat, max_len: int = 64) -> str:
    """The op's inputs, cut at an input boundary once longer than ``max_len`` ("+2 more")."""
    if op.inputs is None:
        return ""
    parts = [input_text(i) for i in op.inputs]
    text = ""
    for k, part in enumerate(parts):
        candidate = f"{text}, {part}" if text else part
        if len(candidate) > max_len and text:
            return f"{text}, +{len(parts) - k} more"
        text = candidate
    return text + (", …" if op.inputs_truncated else "")


def common_region_prefix(profile: Profile) -> list[str]:
    """The regions that enclose every op inside any region (a model's root module, say), which
    would only repeat on every row."""
    paths = [op.region for op in profile.ops if op.kind == "op" and op.region]
    if not paths:
        return []
    prefix = list(paths[0])
    for path in paths[1:]:
        keep = 0
        while keep < min(len(prefix), len(path)) and prefix[keep] == path[keep]:
            keep += 1
        prefix = prefix[:keep]
    return prefix


def region_text(op: OpStat, skip: int = 0) -> str:
    """The op's regions without the first ``skip``; an op directly in the last skipped region is
    shown in it, not in none."""
    if skip and len(op.region) == skip:
        return op.region[-1]
    return "/".join(op.region[skip:])


def thread_label(index: int) -> str:
    return f"T{index}"


def team_order(profile: Profile) -> list[int]:
    """Indices into profile.threads, dispatching threads first, then by tid."""
    return sorted(range(len(profile.threads)),
                  key=lambda i: (profile.threads[i].role != "dispatch", profile.threads[i].tid))
