"""Python stacks (py-spy's, or the in-process sampler's) joined to cpuprof's samples of the same
threads, by time.

Each sample of a dispatching thread in the sample timeline takes a Python stack: inside an op, the
caller the op hook recorded at that op's begin where there is one (exact, see
csrc/python/python_callers.h); elsewhere the stack the sampler had last seen on that thread at the
sample's time, unless the sampler read nothing within a period of it because its pacer found the
op callers said it all (csrc/python/python_read_pacer.h: the thread was beginning ops a switch
interval apart or closer), where the sample takes the caller of the thread's last op. A worker's
samples inside ops take the caller of the op it worked for, where the profile has one dispatching
thread that runs Python (a worker gets no Python frames in a gap of the op hook's record: it has
no reads of its own). The stack counts (which hold every sample, while the timeline keeps the
newest) are then split in the proportions their timeline samples show; a count none of whose
samples is in the timeline keeps no Python frames. Workers have no Python of their own: without
recorded callers (py-spy, other Pythons, several dispatching threads) they get no Python frames,
and their samples still name the op they worked for.
"""

from __future__ import annotations

import threading
from bisect import bisect_right
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from ..model import Profile, PythonFrame, PythonSampling, PythonSplit, SampleTimeline


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
    # The op hook's records (in-process sampler only): OS thread id -> (op begin ns of each change
    # of op caller, its chain id), numpy int64 arrays in time order; and the chains by id, root
    # first, None where the caller is not known from that change on (a gap, or no Python frame)
    op_callers: dict[int, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    op_caller_chains: list[tuple[tuple[str, str, int], ...] | None] = field(default_factory=lambda: [None])
    op_callers_lost: int = 0  # changes the op hook could not record (a full ring)
    # The in-process sampler's reads (None: py-spy's, which reads at every period): (n, 2) int64
    # monotonic ns, in order, of the tick each read was due at and of the read itself (later where
    # the GIL was held); and how many periods its pacer skipped, the op callers making them needless
    read_spans: np.ndarray | None = None
    ticks_covered: int = 0


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
                          stopped=trace.stopped, op_callers_lost=trace.op_callers_lost,
                          ticks_covered=trace.ticks_covered,
                          op_caller_changes=sum(sum(1 for c in chains.tolist() if trace.op_caller_chains[c] is not None)
                                                for _, chains in trace.op_callers.values()))
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
    caller_of_sample, followers = _op_callers_of_samples(profile, trace, timeline)
    caller_chains = trace.op_caller_chains
    # Where the op hook's caller holds: inside an op. Inside a region but no op, between ops, or in
    # cpuprof's callbacks (whose samples name no op path), the reads hold.
    op_ids = {op.id for op in profile.ops if op.kind == "op"}
    unread = _unread_samples(trace, timeline)

    count_of = {(c.thread, c.path, c.stack, c.op): k for k, c in enumerate(stacks.counts)}
    frame_index: dict[tuple[str, str, int], int] = {}
    stack_index: dict[tuple[int, ...], int] = {(): 0}
    stacks.python_frames, stacks.python_stacks = [], [[]]
    seen: Counter[tuple[int, int]] = Counter()  # (count, python stack) -> timeline samples
    dispatch = {i for i, t in enumerate(profile.threads) if t.role == "dispatch"}
    for t, thread, path, stack, op, caller, no_read in zip(timeline.time_ns, timeline.thread, timeline.path,
                                                           timeline.stack, timeline.op, caller_of_sample.tolist(),
                                                           unread.tolist(), strict=True):
        if thread not in dispatch and thread not in followers:
            continue
        count = count_of.get((thread, path, stack, op))
        python = caller_chains[caller] if caller and op in op_ids else None
        if thread in followers:  # a worker: the caller of the op it worked for, or no Python frames
            if python is None:
                python = ()
            else:
                info.workers_joined += 1
        else:
            if python is not None:
                info.op_callers += 1
            elif no_read and caller and caller_chains[caller] is not None:
                python = caller_chains[caller]
                info.op_callers_between += 1
            else:
                python = _read_at(changes_of.get(thread), t)
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


def _read_at(known: tuple[list[int], list[tuple[tuple[str, str, int], ...]]] | None,
             t: int) -> tuple[tuple[str, str, int], ...]:
    """The stack the sampler's reads place on the thread at time ``t`` (empty before its first)."""
    if known is None:
        return ()
    at = bisect_right(known[0], t) - 1
    return known[1][at] if at >= 0 else ()


def _unread_samples(trace: PythonTrace, timeline: SampleTimeline) -> np.ndarray:
    """Whether each timeline sample lies outside every read's reach: from half a period before the
    tick the read was due at (where the sampler places a change it saw, python_sampler._note) to a
    period after the read. There the pacer skipped the reads (the sample's thread was beginning
    ops), and its last op's caller is fresher than any read. All False where the sampler read every
    period, and after the last read of a sampler that stopped early (nothing is known there)."""
    sample_ns = np.asarray(timeline.time_ns, dtype=np.int64)
    if trace.read_spans is None:
        return np.zeros(len(sample_ns), dtype=bool)
    spans = np.asarray(trace.read_spans, dtype=np.int64).reshape(-1, 2)
    if len(spans) == 0:
        return np.ones(len(sample_ns), dtype=bool)
    period = 1_000_000_000 // max(1, trace.hz)
    # The first read not over a period before the sample; both ends only grow from read to read,
    # so no later span starts earlier than its.
    first = np.searchsorted(spans[:, 1] + period, sample_ns, side="left")
    near = (first < len(spans)) & (spans[np.minimum(first, len(spans) - 1), 0] - period // 2 <= sample_ns)
    if trace.stopped:
        near |= sample_ns > spans[-1, 1] + period
    return ~near


def _op_callers_of_samples(profile: Profile, trace: PythonTrace,
                           timeline: SampleTimeline) -> tuple[np.ndarray, set[int]]:
    """Each timeline sample's op caller chain id at its time (0: none), looked up for all samples
    at once; and the worker threads that take their dispatching thread's callers. A worker's
    samples inside ops are work for the op its dispatching thread runs at that time, so they take
    that op's caller, where the profile has one dispatching thread to take it from (with several,
    which one a worker worked for is not known sample by sample)."""
    sample_ns = np.asarray(timeline.time_ns, dtype=np.int64)
    sample_thread = np.asarray(timeline.thread, dtype=np.int64)
    caller_of_sample = np.zeros(len(sample_ns), dtype=np.int64)
    # Threads that run Python: the sampler read them, or the op hook recorded callers on them. A
    # thread that runs no Python (an OpenMP worker) is a dispatching thread if it ran an op itself,
    # but no worker works for it from Python.
    python_tids = set(trace.idents.values()) | set(trace.op_callers)
    dispatching = [i for i, stat in enumerate(profile.threads) if stat.role == "dispatch"]
    from_python = [i for i in dispatching if profile.threads[i].tid in python_tids]
    followers: set[int] = set()
    if len(from_python) == 1 and profile.threads[from_python[0]].tid in trace.op_callers:
        # Workers that run no Python of their own (not a Python thread that ran no op)
        followers = {i for i, stat in enumerate(profile.threads)
                     if stat.role == "worker" and stat.tid not in python_tids}
    for index in dispatching:
        tid = profile.threads[index].tid
        if tid not in trace.op_callers:
            continue
        times, chain_ids = trace.op_callers[tid]
        mine = np.flatnonzero(np.isin(sample_thread, [index, *followers]))
        at = np.searchsorted(times, sample_ns[mine], side="right") - 1
        caller_of_sample[mine] = np.where(at >= 0, chain_ids[np.maximum(at, 0)], 0)
    return caller_of_sample, followers


def _intern_frame(frames: list[PythonFrame], index: dict[tuple[str, str, int], int],
                  frame: tuple[str, str, int]) -> int:
    known = index.get(frame)
    if known is None:
        known = index[frame] = len(frames)
        frames.append(PythonFrame(function=frame[0], file=frame[1], line=frame[2]))
    return known
