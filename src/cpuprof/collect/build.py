"""The core's typed snapshot turned into the profile model: the one place the two meet."""

from __future__ import annotations

from typing import Any

from ..model import (
    Collection,
    DroppedEvent,
    EventInfo,
    IdleThread,
    Limits,
    Meta,
    OpInput,
    OpStat,
    Overhead,
    Profile,
    Spans,
    Status,
    ThreadStat,
)


def _inputs(snapshot_inputs: list[Any]) -> list[OpInput]:
    """The core's flat input list (a tensor list is followed by its items) as nested inputs."""
    out: list[OpInput] = []
    i = 0
    while i < len(snapshot_inputs):
        item = snapshot_inputs[i]
        i += 1
        if item.kind == "tensor_list":
            items = [_single(x) for x in snapshot_inputs[i:i + item.list_len]]
            i += item.list_len
            out.append(OpInput(kind="tensor_list", items=items))
        else:
            out.append(_single(item))
    return out


def _single(item: Any) -> OpInput:
    if item.kind == "tensor":
        return OpInput(kind="tensor", dtype=item.dtype, sizes=list(item.sizes), strides=list(item.strides))
    if item.kind == "unknown_shape":
        return OpInput(kind="unknown_shape", dtype=item.dtype)
    return OpInput(kind=item.kind)


def build_profile(snap: Any, meta: Meta, dropped: list[DroppedEvent], complete: bool = True) -> Profile:
    """Builds the Profile from a ``_native.SessionSnapshot``."""
    from ..machine.capabilities import collection_capabilities

    names = [e.name for e in snap.events]
    stopped_ns = snap.stopped_ns if not snap.running and snap.stopped_ns else snap.now_ns
    # The team is every thread read for ops; a member that did nothing during the session (it had
    # worked before it, so it joined at once) is idle here, like any thread that never worked.
    columns = [k for k, slot in enumerate(snap.counter_threads)
               if snap.threads[slot].dispatch or any(snap.threads[slot].totals)]
    counter_threads = [snap.counter_threads[k] for k in columns]
    index_of_slot = {slot: i for i, slot in enumerate(counter_threads)}
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
        ))
    idle = [IdleThread(tid=t.tid, name=t.name) for slot, t in enumerate(snap.threads) if slot not in index_of_slot]
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
    ops = []
    for row, e in enumerate(snap.entries):
        ops.append(OpStat(
            id=e.index, kind=e.kind, name=e.name, region=region_path(e.region), calls=e.calls,
            incl_ns=e.incl_ns, self_ns=min(e.self_ns, e.incl_ns), max_ns=e.max_ns,
            counters_self={n: counters_self[row, :, k].tolist() for k, n in enumerate(names)},
            counters_incl={n: counters_incl[row, :, k].tolist() for k, n in enumerate(names)},
            inputs=_inputs(e.inputs) if e.has_inputs else None, inputs_truncated=e.inputs_truncated,
            samples=e.samples,
        ))
    spans = None
    if snap.span_capacity:
        import numpy as np

        sp = snap.spans
        start, dur = sp.start_ns, sp.dur_ns
        # One ring per dispatching thread; merged here in the order the spans ended.
        order = np.argsort(start + dur, kind="stable")
        thread = [index_of_slot.get(int(s), -1) for s in sp.thread_slot[order]]
        exact = snap.mode == "exact"
        spans = Spans(
            op=sp.entry[order].tolist(), thread=thread, depth=sp.depth[order].tolist(),
            start_ns=start[order].tolist(), dur_ns=dur[order].tolist(),
            # Per-span counter deltas exist only where every op boundary was read (exact mode).
            counters=snap.span_counters[order].tolist() if exact else [[] for _ in range(len(order))],
        )
    profile = Profile(
        meta=meta,
        status=Status(complete=complete),
        collection=Collection(
            mode=snap.mode, events=[EventInfo(name=e.name, kind=e.kind, user_only=e.user_only) for e in snap.events],
            record_shapes=snap.record_shapes, sample_interval_us=snap.sample_interval_us,
            started_ns=snap.started_ns, stopped_ns=stopped_ns, scaled_events=list(snap.scaled_events),
        ),
        capabilities=collection_capabilities(),
        threads=threads,
        idle_threads=idle,
        ops=ops,
        overhead=Overhead(hook_ns=snap.hook_ns, ops=snap.ops_seen, discovery_cpu_ns=snap.discovery_cpu_ns,
                          discovery_ticks=snap.discovery_ticks, samples=snap.samples),
        limits=Limits(
            op_capacity=snap.op_capacity, ops_overflowed=snap.ops_overflowed, span_capacity=snap.span_capacity,
            spans_dropped=snap.spans.dropped, too_deep=snap.too_deep, unattributed_ops=snap.unattributed_ops,
            max_threads=snap.max_threads, threads_beyond_limit=snap.threads_beyond_limit,
            memory_bytes=snap.memory_bytes, unmatched_ends=snap.unmatched_ends, truncated_ops=snap.truncated_ops,
        ),
        dropped_events=list(dropped),
        spans=spans,
    )
    profile.validate()
    return profile
