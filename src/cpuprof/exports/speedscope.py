"""speedscope's JSON file format (https://www.speedscope.app/file-format-schema.json).

speedscope opens this file directly, shows one profile at a time and lets the user switch among
them, so each sampled thread becomes its own "sampled" profile (left-heavy, sandwich and time-order
views of that thread alone), and, when there are several threads, a first "all threads" profile
keeps every stack under its thread's root frame so the threads can be compared side by side.

Frames live once in ``shared.frames`` and samples refer to them by index. speedscope's frames have
only ``name``, ``file``, ``line`` and ``col``; a frame's ``file`` is what speedscope shows as its
origin, so Python frames carry their real file and line, and every other frame carries a short
label of its kind (``[op]``, ``[region]``, ``[compute]``...) there instead.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, TextIO

from ..analysis.flame import FlameFrame, FlameStack

if TYPE_CHECKING:
    from ..reports.base import Role
    from ..reports.sources import OutputOptions, Source, SourceKind


SCHEMA_URL = "https://www.speedscope.app/file-format-schema.json"
ALL_THREADS = "all threads"

# speedscope's ValueUnit enum has no "samples" or event names: those are plain counts ("none").
_UNITS = {"nanoseconds": "nanoseconds", "samples": "none"}

# cpuprof names Python frames "function (file.py:123)"; the file part is greedy so a path holding
# ':' still splits at the last one, which is the line number's.
_PYTHON_FRAME = re.compile(r"^(?P<name>.+?) \((?P<file>[^()]+):(?P<line>\d+)\)$")


def speedscope_unit(unit: str) -> str:
    """speedscope's ValueUnit for a cpuprof weight unit."""
    return _UNITS.get(unit, "none")


def frame_entry(frame: FlameFrame) -> dict[str, Any]:
    """The shared.frames entry for one frame."""
    if frame.kind == "python":
        m = _PYTHON_FRAME.match(frame.name)
        if m:
            return {"name": m["name"], "file": m["file"], "line": int(m["line"])}
    return {"name": frame.name, "file": f"[{frame.kind}]"}


def _number(weight: float) -> int | float:
    # Integral weights (sample and event counts, whole nanoseconds) stay integers so the file
    # reads as the counts it holds rather than "12.0".
    return int(weight) if float(weight).is_integer() else float(weight)


def _total(weights: list[int | float]) -> int | float:
    # Integers sum exactly in Python; fsum keeps float sums from drifting over many samples.
    if all(isinstance(w, int) for w in weights):
        return sum(weights)
    return _number(math.fsum(weights))


def _profile_name(root: FlameFrame | None, thread: int, unit: str) -> str:
    if root is None:
        name = f"T{thread}"
    elif root.name.startswith("[") and root.name.endswith("]"):
        name = root.name[1:-1]
    else:
        name = root.name
    return _with_event(name, unit)


def _with_event(name: str, unit: str) -> str:
    # An event's weight becomes unit "none", so the profile name is the only place that says
    # what was counted.
    return name if unit in _UNITS else f"{name} ({unit})"


class _Frames:
    """Indices into shared.frames, one per distinct (name, kind), in order of first use."""

    def __init__(self) -> None:
        self.index: dict[FlameFrame, int] = {}
        self.entries: list[dict[str, Any]] = []

    def __call__(self, frame: FlameFrame) -> int:
        i = self.index.get(frame)
        if i is None:
            i = self.index[frame] = len(self.entries)
            self.entries.append(frame_entry(frame))
        return i


def _sampled(name: str, unit: str, stacks: list[tuple[tuple[FlameFrame, ...], float]],
             frames: _Frames) -> dict[str, Any]:
    # Equal stacks are summed and the rest sorted by frame names (kinds break ties between frames
    # sharing a name), so the same profile always gives the same file.
    merged: dict[tuple[FlameFrame, ...], float] = {}
    for key, weight in stacks:
        merged[key] = merged.get(key, 0) + weight
    ordered = sorted(merged.items(), key=lambda kv: (tuple(f.name for f in kv[0]), tuple(f.kind for f in kv[0])))
    samples = [[frames(f) for f in key] for key, _ in ordered]
    weights = [_number(w) for _, w in ordered]
    return {
        "type": "sampled",
        "name": name,
        "unit": speedscope_unit(unit),
        "startValue": 0,
        "endValue": _total(weights),
        "samples": samples,
        "weights": weights,
    }


def build(stacks: Iterable[FlameStack], name: str, unit: str, exporter: str) -> dict[str, Any]:
    """The speedscope document for merged stacks (``analysis.flame.merged_stacks``).

    ``unit`` is cpuprof's weight unit: "nanoseconds", "samples" or a counted event's name.
    """
    by_thread: dict[int, list[tuple[tuple[FlameFrame, ...], float]]] = {}
    everything: list[tuple[tuple[FlameFrame, ...], float]] = []
    roots: dict[int, FlameFrame] = {}
    for s in stacks:
        if not math.isfinite(s.weight) or s.weight < 0:
            # speedscope refuses negative weights when it opens the file; fail here instead.
            raise ValueError(f"stack weight {s.weight!r} on thread {s.thread}: expected a finite value >= 0")
        if s.weight == 0:
            continue  # speedscope drops zero weights anyway
        frames = s.frames
        if frames and frames[0].kind == "thread":
            roots.setdefault(s.thread, frames[0])
            frames = frames[1:]
        by_thread.setdefault(s.thread, []).append((frames, s.weight))
        everything.append((s.frames, s.weight))

    shared = _Frames()
    profiles: list[dict[str, Any]] = []
    if len(by_thread) > 1:
        profiles.append(_sampled(_with_event(ALL_THREADS, unit), unit, everything, shared))
    for thread in sorted(by_thread):
        profiles.append(_sampled(_profile_name(roots.get(thread), thread, unit), unit, by_thread[thread], shared))
    return {
        "$schema": SCHEMA_URL,
        "name": name,
        "exporter": exporter,
        "activeProfileIndex": 0,
        "shared": {"frames": shared.entries},
        "profiles": profiles,
    }


def write(stacks: Iterable[FlameStack], out: TextIO, name: str, unit: str, exporter: str) -> None:
    """Writes the document as compact JSON: speedscope files of long runs are large."""
    json.dump(build(stacks, name, unit, exporter), out, separators=(",", ":"))
    out.write("\n")


def check_indices(doc: dict[str, Any]) -> list[str]:
    """What speedscope's JSON schema cannot say about a document: every frame index in a sample or
    event names an entry of shared.frames, and each sampled profile has one weight per sample.
    Returns the problems found; an empty list means none."""
    problems: list[str] = []
    n_frames = len(doc.get("shared", {}).get("frames", []))

    def bad(index: object) -> bool:
        return isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < n_frames

    for p, profile in enumerate(doc.get("profiles", [])):
        if profile.get("type") == "sampled":
            samples, weights = profile.get("samples", []), profile.get("weights", [])
            if len(samples) != len(weights):
                problems.append(f"profile {p}: {len(samples)} samples but {len(weights)} weights")
            for s, sample in enumerate(samples):
                problems += [f"profile {p} sample {s}: frame index {i!r} not in 0..{n_frames - 1}"
                             for i in sample if bad(i)]
        elif profile.get("type") == "evented":
            problems += [f"profile {p} event {e}: frame index {ev.get('frame')!r} not in 0..{n_frames - 1}"
                         for e, ev in enumerate(profile.get("events", [])) if bad(ev.get("frame"))]
    return problems


class SpeedscopeOutput:
    """``flamegraph --format speedscope``: https://www.speedscope.app reads it."""

    name = "speedscope"
    suffix = ".json"
    other_suffixes: tuple[str, ...] = ()
    reads: tuple[SourceKind, ...] = ("stacks",)
    role: Role = "export"
    help = "speedscope JSON, one sampled profile per thread (https://www.speedscope.app)"

    def write(self, source: Source, out: TextIO, options: OutputOptions) -> int:
        from ..reports.sources import StacksSource

        assert isinstance(source, StacksSource)
        graph = source.graph
        write(graph.stacks, out, name=graph.title, unit=graph.unit, exporter=graph.exporter)
        return len(graph.stacks)
