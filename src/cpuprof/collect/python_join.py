"""Python stacks (py-spy's, or the in-process sampler's) joined to cpuprof's samples of the same
threads, by time.

Each sample of a dispatching thread in the sample timeline takes the Python stack the sampler had
last seen on that thread at the sample's time. The stack counts (which hold every sample, while the
timeline keeps the newest) are then split in the proportions their timeline samples show; a
count none of whose samples is in the timeline keeps no Python frames. OpenMP workers have no
Python state and get none: their samples already name the op they worked for.
"""

from __future__ import annotations

import threading
from bisect import bisect_right
from collections import Counter
from dataclasses import dataclass, field

from ..model import Profile, PythonFrame, PythonSampling, PythonSplit


@dataclass
class PythonTrace:
    """Python stacks of each thread, as changes over time on CLOCK_MONOTONIC (the op timeline's
    clock), from whichever sampler read them (py-spy, or cpuprof's own thread in the process)."""

    version: str  # the source, as the profile names it: "py-spy 0.4.3", "in-process (Python 3.11.9)"
    hz: int
    samples: int  # stacks read
    errors: int  # samples that could not be read
    clock_error_ns: int  # the alignment's half-width: a stack change is placed within this
    # thread key (py-spy's: the pthread ident) -> [(monotonic ns, stack root first as (function,
    # file, line))], in time order
    changes: dict[int, list[tuple[int, tuple[tuple[str, str, int], ...]]]] = field(default_factory=dict)
    idents: dict[int, int] = field(default_factory=dict)  # thread key -> OS thread id
    cpu_ns: int | None = None  # the sampler's own CPU time, where it ran in the process
    stopped: str | None = None  # why the sampler stopped before the profile did (its stacks kept)


def thread_os_ids() -> dict[int, int]:
    """pthread ident -> OS thread id of every thread threading knows of now (a sampler keyed by
    ident learns its threads' OS ids from this, at start and at stop)."""
    return {t.ident: t.native_id for t in threading.enumerate() if t.ident is not None and t.native_id is not None}


def failed(profile: Profile, source: str, hz: int, error: str) -> None:
    """Records why the profile has no Python stacks."""
    if profile.sampling is not None:
        profile.sampling.python = PythonSampling(source=source, hz=hz, error=error)


def join(profile: Profile, trace: PythonTrace) -> None:
    """Adds the Python stacks of ``trace`` to ``profile.stacks`` and says how well they joined."""
    stacks, sampling = profile.stacks, profile.sampling
    if stacks is None or sampling is None:
        return
    info = PythonSampling(source=trace.version, hz=trace.hz, samples=trace.samples, errors=trace.errors,
                          clock_error_ns=trace.clock_error_ns, cpu_ns=trace.cpu_ns,
                          stopped=trace.stopped)
    sampling.python = info
    timeline = stacks.timeline
    if timeline is None or not timeline.path:
        info.error = "no sample timeline to join the Python stacks to"
        return
    ident_of_tid = {tid: ident for ident, tid in trace.idents.items()}
    changes_of: dict[int, tuple[list[int], list[tuple[tuple[str, str, int], ...]]]] = {}
    for index, stat in enumerate(profile.threads):
        ident = ident_of_tid.get(stat.tid)
        if stat.role == "dispatch" and ident is not None and ident in trace.changes:
            changes = trace.changes[ident]
            changes_of[index] = ([t for t, _ in changes], [s for _, s in changes])

    count_of = {(c.thread, c.path, c.stack, c.op): k for k, c in enumerate(stacks.counts)}
    frame_index: dict[tuple[str, str, int], int] = {}
    stack_index: dict[tuple[int, ...], int] = {(): 0}
    stacks.python_frames, stacks.python_stacks = [], [[]]
    seen: Counter[tuple[int, int]] = Counter()  # (count, python stack) -> timeline samples
    dispatch = {i for i, t in enumerate(profile.threads) if t.role == "dispatch"}
    for t, thread, path, stack, op in zip(timeline.time_ns, timeline.thread, timeline.path, timeline.stack,
                                          timeline.op, strict=True):
        if thread not in dispatch:
            continue
        count = count_of.get((thread, path, stack, op))
        known = changes_of.get(thread)
        python: tuple[tuple[str, str, int], ...] = ()
        if known is not None:
            at = bisect_right(known[0], t) - 1
            if at >= 0:
                python = known[1][at]
        if not python:
            info.unmatched += 1
        else:
            info.joined += 1
        if count is None:
            continue
        key = tuple(_intern_frame(stacks.python_frames, frame_index, f) for f in reversed(python))
        python_stack = stack_index.get(key)
        if python_stack is None:
            python_stack = stack_index[key] = len(stacks.python_stacks)
            stacks.python_stacks.append(list(key))
        seen[(count, python_stack)] += 1
    stacks.python_splits = [PythonSplit(count=c, stack=s, samples=n) for (c, s), n in sorted(seen.items())]
    in_timeline: Counter[int] = Counter()
    for (c, _), n in seen.items():
        in_timeline[c] += n
    info.extrapolated = sum(stacks.counts[c].samples - n for c, n in in_timeline.items()
                            if stacks.counts[c].samples > n)


def _intern_frame(frames: list[PythonFrame], index: dict[tuple[str, str, int], int],
                  frame: tuple[str, str, int]) -> int:
    known = index.get(frame)
    if known is None:
        known = index[frame] = len(frames)
        frames.append(PythonFrame(function=frame[0], file=frame[1], line=frame[2]))
    return known
