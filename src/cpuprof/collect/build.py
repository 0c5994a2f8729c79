"""The core's typed snapshot turned into the profile model: the one place the two meet."""

from __future__ import annotations

import errno
import os
from typing import Any

from ..model import (
    CPU_EVENT,
    EXACT,
    Collection,
    DroppedEvent,
    EventInfo,
    IdleThread,
    Limits,
    Meta,
    NativeFrame,
    OpInput,
    OpStat,
    Overhead,
    Profile,
    SampleTimeline,
    Sampling,
    Spans,
    StackCount,
    Stacks,
    Status,
    ThreadStat,
)
from ..native import kind_name


def _inputs(snapshot_inputs: list[Any]) -> list[OpInput]:
    """The core's flat input list (a tensor list is followed by its items) as nested inputs."""
    out: list[OpInput] = []
    i = 0
    while i < len(snapshot_inputs):
        item = snapshot_inputs[i]
        i += 1
        if kind_name(item.kind) == "tensor_list":
            items = [_single(x) for x in snapshot_inputs[i:i + item.list_len]]
            i += item.list_len
            out.append(OpInput(kind="tensor_list", items=items))
        else:
            out.append(_single(item))
    return out


def _single(item: Any) -> OpInput:
    kind = kind_name(item.kind)
    if kind == "tensor":
        return OpInput(kind=kind, dtype=item.dtype, sizes=list(item.sizes), strides=list(item.strides))
    if kind == "unknown_shape":
        return OpInput(kind=kind, dtype=item.dtype)
    return OpInput(kind=kind)


def _errno_text(err: int, perm_hint: str) -> str:
    name = errno.errorcode.get(err, str(err))
    if err == errno.EMFILE:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        return (f"{name}: file-descriptor limit (ulimit -n {soft}, the last {reserved_fds(soft)} left to the "
                "program; raise it with ulimit -n)")
    hint = {errno.EPERM: perm_hint, errno.EACCES: " (perf_event_paranoid)"}.get(err, "")
    return f"{name}, {os.strerror(err)}{hint}"


def reserved_fds(soft_limit: int) -> int:
    """The core's reserve of descriptors for the program (perf_events.cpp, limits.h)."""
    from .. import defaults

    return min(defaults.CORE_LIMITS["kFdReserveMax"], max(defaults.CORE_LIMITS["kFdReserveMin"], soft_limit // 4))


def _sampling_error(err: int) -> str | None:
    if err == 0:
        return None
    if err < 0:
        return "not sampled (the thread was not found while the session ran)"
    return "not sampled: " + _errno_text(
        err, " (its sample ring refused even at its smallest: over kernel.perf_event_mlock_kb and RLIMIT_MEMLOCK "
             "for an unprivileged user; or perf_event_paranoid)")


def _counting_error(err: int) -> str | None:
    return _errno_text(err, " (perf_event_paranoid, or a seccomp filter)") if err > 0 else None


def _cpu_time_not_counted(dropped: list[DroppedEvent]) -> str:
    """Why no thread's CPU time was counted: the reason its event was dropped for the session."""
    reason = next((d.reason for d in dropped if d.name == CPU_EVENT), "it was not among the events asked for")
    return f"{CPU_EVENT} (CPU time) was not counted: {reason}"


def _stacks(snap: Any, index_of_slot: dict[int, int], op_ids: set[int],
            with_timeline: bool = True) -> tuple[Sampling, Stacks]:
    from .symbols import Symbolizer

    sp = snap.sampling
    symbolizer = Symbolizer()
    frames: list[NativeFrame] = []
    frame_index: dict[tuple[str, str], int] = {}
    pc_index: dict[int, int] = {}

    def frame_of(pc: int) -> int:
        known = pc_index.get(pc)
        if known is not None:
            return known
        f = symbolizer.frame(pc)
        key = (f.name, f.module)
        index = frame_index.get(key)
        if index is None:
            index = frame_index[key] = len(frames)
            frames.append(f)
        pc_index[pc] = index
        return index

    pcs, offsets = sp.frames.tolist(), sp.offsets.tolist()
    stacks: list[list[int]] = [[]]  # stack 0: no stack
    for i in range(1, len(offsets)):
        stacks.append([frame_of(pc) for pc in pcs[offsets[i - 1]:offsets[i]]])
    entries, path_offsets = sp.path_entries.tolist(), sp.path_offsets.tolist()
    paths: list[list[int]] = [[]]
    for i in range(1, len(path_offsets)):
        paths.append([e for e in entries[path_offsets[i - 1]:path_offsets[i]] if e in op_ids])
    values = sp.count_values.tolist()
    counts = []
    for k, (stack, path, slot, entry, samples, cpu) in enumerate(zip(
            sp.count_stack.tolist(), sp.count_path.tolist(), sp.count_slot.tolist(), sp.count_entry.tolist(),
            sp.count_samples.tolist(), sp.count_cpu_ns.tolist(), strict=True)):
        thread = index_of_slot.get(slot)
        if thread is None or entry not in op_ids:
            continue
        counts.append(StackCount(stack=stack, path=path, thread=thread, op=entry, samples=samples, cpu_ns=cpu,
                                 values=values[k] if k < len(values) else []))
    timeline = None
    if with_timeline and len(sp.timeline_time):
        keep = [i for i, slot in enumerate(sp.timeline_slot.tolist()) if slot in index_of_slot]
        timeline = SampleTimeline(
            time_ns=[int(sp.timeline_time[i]) for i in keep],
            thread=[index_of_slot[int(sp.timeline_slot[i])] for i in keep],
            op=[int(sp.timeline_entry[i]) for i in keep], stack=[int(sp.timeline_stack[i]) for i in keep],
            cpu_us=[int(sp.timeline_cpu_us[i]) for i in keep], path=[int(sp.timeline_path[i]) for i in keep])
    sampling = Sampling(
        hz=sp.sample_hz, stack_bytes=sp.stack_bytes, samples=sp.samples, lost=sp.samples_lost,
        unwind={kind_name(stop): int(n) for stop, n in sp.unwind_stops.items() if n},
        frames_by_frame_pointer=sp.frames_by_frame_pointer, frames_by_scanning=sp.frames_by_scanning,
        ambiguous_workers=sp.ambiguous_workers, late_op_events=sp.late_op_events,
        switch_records=sp.switch_records, cpu_by_interval_ns=sp.cpu_by_interval_ns,
        cpu_by_sample_ns=sp.cpu_by_sample_ns,
        op_events_dropped=sp.op_events_dropped, stacks_truncated=sp.stacks_truncated,
        counts_dropped=sp.counts_dropped, timeline_dropped=sp.timeline_dropped,
        jit_symbols=symbolizer.jit_symbols, unresolved_frames=symbolizer.unresolved,
    )
    return sampling, Stacks(frames=frames, stacks=stacks, counts=counts, paths=paths, timeline=timeline)


def _team_columns(snap: Any) -> list[int]:
    """The team is every thread read for ops; a member that did nothing during the session (it had
    worked before it, so it joined at once) is idle here, like any thread that never worked."""
    return [k for k, slot in enumerate(snap.counter_threads)
            if snap.threads[slot].dispatch or any(snap.threads[slot].totals)]


def _thread_stats(snap: Any, counter_threads: list[int], names: list[str]) -> list[ThreadStat]:
    threads: list[ThreadStat] = []
    for slot in counter_threads:
        t = snap.threads[slot]
        run_delay = sched_cpu = None
        if t.run_delay_ns_at_open >= 0 and t.run_delay_ns_at_stop >= 0:
            run_delay = t.run_delay_ns_at_stop - t.run_delay_ns_at_open
            sched_cpu = t.cpu_ns_at_stop - t.cpu_ns_at_open
        threads.append(ThreadStat(
            tid=t.tid, name=t.name, role="dispatch" if t.dispatch else "worker",
            counters=dict(zip(names, (int(v) for v in t.totals), strict=True)),
            scaled=[n for n, s in zip(names, t.scaled, strict=True) if s],
            uncounted=[n for n, c in zip(names, t.counted, strict=True) if not c],
            opened_ns=t.opened_ns, run_delay_ns=run_delay, sched_cpu_ns=sched_cpu,
            samples=t.samples, samples_lost=t.samples_lost,
            sample_ring_pages=t.ring_pages, sample_ring_pages_asked=t.ring_pages_asked,
            sampling_error=_sampling_error(t.sample_errno) if snap.sampling.enabled else None,
            counting_error=_counting_error(t.open_errno) if not all(t.counted) else None,
        ))
    return threads


def _idle_threads(snap: Any, team: set[int], names: list[str], dropped: list[DroppedEvent]) -> list[IdleThread]:
    # Whether a thread did work is read from its CPU time: with task-clock not counted in this
    # session (dropped at the descriptor limit, say), a thread that shows nothing may well have
    # worked, so it is uncounted, with the reason, never "did no work".
    no_cpu_time = None if CPU_EVENT in names else _cpu_time_not_counted(dropped)
    return [IdleThread(tid=t.tid, name=t.name,
                       uncounted=(_counting_error(t.open_errno) if not any(t.counted) else None) or no_cpu_time)
            for slot, t in enumerate(snap.threads) if slot not in team]


def _op_stats(snap: Any, columns: list[int], names: list[str]) -> list[OpStat]:
    by_index = {e.index: e for e in snap.entries}

    def region_path(index: int) -> list[str]:
        parts: list[str] = []
        seen: set[int] = set()
        while index and index in by_index and index not in seen:
            seen.add(index)
            parts.append(by_index[index].name)
            index = by_index[index].region
        return list(reversed(parts))

    counters_self = snap.counters_self[:, columns, :]  # [entry][thread][event]
    counters_incl = snap.counters_incl[:, columns, :]
    return [OpStat(
        id=e.index, kind=kind_name(e.kind), name=e.name, region=region_path(e.region), calls=e.calls,
        incl_ns=e.incl_ns, self_ns=min(e.self_ns, e.incl_ns), max_ns=e.max_ns,
        counters_self={n: counters_self[row, :, k].tolist() for k, n in enumerate(names)},
        counters_incl={n: counters_incl[row, :, k].tolist() for k, n in enumerate(names)},
        inputs=_inputs(e.inputs) if e.has_inputs else None, inputs_truncated=e.inputs_truncated,
        samples=e.samples, alloc_bytes=e.alloc_bytes, allocs=e.allocs, freed_bytes=e.freed_bytes,
        frees=e.frees,
    ) for row, e in enumerate(snap.entries)]


def _spans(snap: Any, index_of_slot: dict[int, int], mode: str) -> Spans | None:
    if not snap.span_capacity:
        return None
    import numpy as np

    sp = snap.spans
    start, dur = sp.start_ns, sp.dur_ns
    # One ring per dispatching thread; merged here in the order the spans ended.
    order = np.argsort(start + dur, kind="stable")
    thread = [index_of_slot.get(int(s), -1) for s in sp.thread_slot[order]]
    return Spans(
        op=sp.entry[order].tolist(), thread=thread, depth=sp.depth[order].tolist(),
        start_ns=start[order].tolist(), dur_ns=dur[order].tolist(),
        # Per-span counter deltas exist only where every op boundary was read (exact mode).
        counters=snap.span_counters[order].tolist() if mode == EXACT else [[] for _ in range(len(order))],
    )


def build_profile(snap: Any, meta: Meta, dropped: list[DroppedEvent], complete: bool = True) -> Profile:
    """Builds the Profile from a ``_native.SessionSnapshot``."""
    from ..machine.capabilities import collection_capabilities

    names = [e.name for e in snap.events]
    mode = snap.mode.name  # the core's CountingMode enum, named as the profile names modes
    stopped_ns = snap.stopped_ns if not snap.running and snap.stopped_ns else snap.now_ns
    columns = _team_columns(snap)
    counter_threads = [snap.counter_threads[k] for k in columns]
    index_of_slot = {slot: i for i, slot in enumerate(counter_threads)}
    ops = _op_stats(snap, columns, names)
    profile = Profile(
        meta=meta,
        status=Status(complete=complete),
        collection=Collection(
            mode=mode,
            events=[EventInfo(name=e.name, kind=kind_name(e.kind), user_only=e.user_only) for e in snap.events],
            record_shapes=snap.record_shapes, started_ns=snap.started_ns, stopped_ns=stopped_ns,
            scaled_events=list(snap.scaled_events), memory_reported=snap.memory_reported,
        ),
        capabilities=collection_capabilities(),
        threads=_thread_stats(snap, counter_threads, names),
        idle_threads=_idle_threads(snap, set(index_of_slot), names, dropped),
        ops=ops,
        overhead=Overhead(hook_ns=snap.hook_ns, ops=snap.ops_seen, discovery_cpu_ns=snap.discovery_cpu_ns,
                          discovery_ticks=snap.discovery_ticks, samples=snap.samples,
                          idle_reads_skipped=snap.idle_reads_skipped, thread_scans=snap.thread_scans,
                          scan_setup_cpu_ns=snap.scan_setup_cpu_ns),
        limits=Limits(
            op_capacity=snap.op_capacity, ops_overflowed=snap.ops_overflowed, span_capacity=snap.span_capacity,
            spans_dropped=snap.spans.dropped, too_deep=snap.too_deep, unattributed_ops=snap.unattributed_ops,
            max_threads=snap.max_threads, threads_beyond_limit=snap.threads_beyond_limit,
            memory_bytes=snap.memory_bytes, unmatched_ends=snap.unmatched_ends, truncated_ops=snap.truncated_ops,
        ),
        dropped_events=list(dropped),
        spans=_spans(snap, index_of_slot, mode),
    )
    if snap.sampling.enabled:
        # A checkpoint of a running session leaves the sample timeline out: it is written once, at the end.
        # Built at every checkpoint (every sampled profile keeps one), it took the decode's own thread
        # more than half its time (5.29 tokens/s without checkpoints, 2.25 with them).
        profile.sampling, profile.stacks = _stacks(snap, index_of_slot, {op.id for op in ops},
                                                   with_timeline=not snap.running)
    profile.validate()
    return profile
