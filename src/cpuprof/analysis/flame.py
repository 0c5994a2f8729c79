"""Merged stacks for flame graphs: each sample's thread, the Python frames and ops it worked for,
and the native frames its CPU was in.

A sample on the dispatching thread reads, root first,
``[T0 python];<python frames>;mlp;aten::linear;aten::mm;<native frames below aten::mm>``, and on an
OpenMP worker ``[T1 worker];<python frames>;mlp;aten::linear;aten::mm;<kernel or OpenMP wait>``: the
ops are the ones the worker's dispatching thread had open when the sample was taken, and the Python
frames the caller recorded for the outermost of them (where there is one, see collect/python_join).
On the dispatching thread the native frames rootward of the innermost op's own entry (``at::_ops::mm::call``) are the
interpreter and the outer ops' dispatch, which the op path already says, so they are cut there.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass

from ..errors import UsageError
from ..model import NativeFrame, Profile
from .labels import thread_label

WEIGHTS = ("samples", "cpu")  # and any counted event by name


@dataclass(frozen=True)
class FlameFrame:
    name: str
    kind: str  # "thread", "python", "region", "op", "special", or a native category


@dataclass
class FlameStack:
    frames: tuple[FlameFrame, ...]  # root first
    weight: float
    thread: int


_PARAMS = re.compile(r"\([^()]*\)")


def native_name(frame: NativeFrame) -> str:
    """A native frame's name without parameter lists (templates kept), with no ';' in it."""
    name = frame.name
    for _ in range(4):  # nested parameter lists, innermost first
        stripped = _PARAMS.sub("", name)
        if stripped == name:
            break
        name = stripped
    return name.replace(";", ":").strip() or frame.name


def _op_entry_pattern(op_name: str) -> re.Pattern[str]:
    short = op_name.split("::", 1)[-1]
    return re.compile(r"at::_ops::" + re.escape(short) + r"(?:_[a-zA-Z0-9]+)?::(?:call|redispatch)\b")


def thread_root(profile: Profile, index: int) -> str:
    t = profile.threads[index]
    return f"[{thread_label(index)} {t.role} {t.name}]"


def resolve_weight(profile: Profile, weight: str) -> tuple[str, int | None]:
    """("samples" | "cpu" | "event", the event's index) for a --weight value."""
    if weight in WEIGHTS:
        return weight, None
    names = profile.collection.event_names if profile.collection else []
    if weight in names:
        return "event", names.index(weight)
    raise UsageError(f"--weight {weight}: choose samples, cpu or a counted event ({', '.join(names) or 'none'})")


def select_threads(profile: Profile, thread: str | None) -> list[int]:
    """Indices of the threads a --thread value names: T1, a tid, or all (None)."""
    if thread in (None, "all"):
        return list(range(len(profile.threads)))
    assert thread is not None
    for i, t in enumerate(profile.threads):
        if thread in (thread_label(i), str(t.tid)):
            return [i]
    known = ", ".join(f"{thread_label(i)} (tid {t.tid})" for i, t in enumerate(profile.threads))
    raise UsageError(f"--thread {thread}: no such thread in this profile; it has {known or 'no sampled threads'}")


def merged_stacks(profile: Profile, weight: str = "samples", thread: str | None = None,
                  python_stacks: bool = True) -> list[FlameStack]:
    """Every (thread, op path, native stack) of the samples as one root-first stack and its weight."""
    if profile.stacks is None or not profile.stacks.counts:
        raise UsageError("this profile has no sampled stacks (it was recorded in exact mode, or nothing was sampled)")
    kind, event = resolve_weight(profile, weight)
    threads = set(select_threads(profile, thread))
    stacks = profile.stacks
    ops = profile.op_by_id()
    cut_patterns: dict[int, re.Pattern[str]] = {}
    python = python_variants(profile) if python_stacks else {}
    merged: dict[tuple[int, tuple[FlameFrame, ...]], float] = defaultdict(float)
    for index, c in enumerate(stacks.counts):
        if c.thread not in threads:
            continue
        value = (c.samples if kind == "samples" else c.cpu_ns if kind == "cpu"
                 else (c.values[event] if event is not None and event < len(c.values) else 0))
        if not value:
            continue
        frames: list[FlameFrame] = []
        for op_id in stacks.paths[c.path] if c.path < len(stacks.paths) else []:
            op = ops[op_id]
            frames.append(FlameFrame(op.name, "region" if op.kind == "region" else "op"))
        if c.op in ops and ops[c.op].kind == "special":
            frames.append(FlameFrame(ops[c.op].name, "special"))
        native = [stacks.frames[f] for f in stacks.stacks[c.stack]]  # leaf first
        innermost = ops.get(c.op)
        if profile.threads[c.thread].role == "dispatch" and innermost is not None and innermost.kind == "op":
            pattern = cut_patterns.setdefault(c.op, _op_entry_pattern(innermost.name))
            cut = next((i for i, f in enumerate(native) if pattern.search(f.name)), None)
            if cut is not None:
                native = native[:cut]
        frames += [FlameFrame(native_name(f), f.category) for f in reversed(native)]
        root = FlameFrame(thread_root(profile, c.thread), "thread")
        for python_frames, share in python.get(index, [((), 1.0)]):
            merged[(c.thread, (root, *python_frames, *frames))] += value * share
    return [FlameStack(frames=frames, weight=w, thread=t) for (t, frames), w in merged.items()]


def python_variants(profile: Profile) -> dict[int, list[tuple[tuple[FlameFrame, ...], float]]]:
    """Per stack count: the Python stacks (root first) its samples were joined to, with the share
    of its samples each had. Counts none of whose samples was joined are absent."""
    stacks = profile.stacks
    if stacks is None or not stacks.python_splits:
        return {}
    names = [FlameFrame(f.name, "python") for f in stacks.python_frames]
    totals: dict[int, int] = defaultdict(int)
    for split in stacks.python_splits:
        totals[split.count] += split.samples
    out: dict[int, list[tuple[tuple[FlameFrame, ...], float]]] = defaultdict(list)
    for split in stacks.python_splits:
        frames = tuple(names[f] for f in reversed(stacks.python_stacks[split.stack]))
        out[split.count].append((frames, split.samples / totals[split.count]))
    return out


def weight_unit(profile: Profile, weight: str) -> str:
    kind, _ = resolve_weight(profile, weight)
    return {"samples": "samples", "cpu": "nanoseconds"}.get(kind, weight)


@dataclass
class FlameGraph:
    """A profile's merged stacks with what a flame graph's reader needs to know about them: what the
    weights count, a title and a subtitle that say what was sampled, and who wrote the file."""

    stacks: list[FlameStack]
    unit: str  # what the weights count: "samples", "nanoseconds" or a counted event's name
    title: str
    subtitle: str
    exporter: str


def flame_graph(profile: Profile, weight: str = "samples", thread: str | None = None,
                python_stacks: bool = True, title: str | None = None) -> FlameGraph:
    """The merged stacks of ``profile`` (see :func:`merged_stacks`), titled."""
    stacks = merged_stacks(profile, weight=weight, thread=thread, python_stacks=python_stacks)
    what = profile.workload.model.name if profile.workload else "profile"
    threads = f"thread {thread}" if thread and thread != "all" else "all threads"
    parts = []
    if profile.sampling is not None:
        parts.append(f"{profile.sampling.samples:,} samples at {profile.sampling.hz} Hz per thread")
        py = profile.sampling.python
        if py is not None:
            callers = "each op's caller, and " if py.op_caller_changes else ""
            parts.append(f"Python frames: {callers}{py.source} at {py.hz} Hz" if not py.error else "no Python frames")
    return FlameGraph(stacks=stacks, unit=weight_unit(profile, weight),
                      title=title or f"cpuprof: {what}, {threads}, weighted by {weight}", subtitle="; ".join(parts),
                      exporter=f"cpuprof {profile.meta.cpuprof_version}")
