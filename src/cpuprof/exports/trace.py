"""A Chrome/Perfetto trace (the Trace Event Format's JSON object form) of one profile.

One track per thread, named as the reports name it (``T0 dispatch MainThread``):
- op spans, where the run kept them (``--timeline N``), as complete events ("X") that nest by
  depth, with their inputs and, in exact mode, their counter deltas;
- what each thread's samples say it worked for, where no spans cover it: consecutive samples of
  a thread under the same op become one slice ("aten::mm", category "samples"), from a sampling
  period before the first sample to the last. On an OpenMP worker this is the only view of which
  op it was working for when;
- counter tracks ("C"): each thread's CPU use over time from its samples, in threads busy per
  10 ms bin, so the tracks stack into the team's total.

Times are microseconds from the start of the session.
"""

from __future__ import annotations

import itertools
import json
from bisect import bisect_right
from collections import defaultdict
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, TextIO

from ..analysis.labels import input_text, thread_label
from ..model import Profile

if TYPE_CHECKING:
    from ..reports.base import Role
    from ..reports.sources import OutputOptions, Source, SourceKind


PID = 1
COUNTER_BIN_NS = 10_000_000
MAX_SAMPLE_GAP_PERIODS = 3  # samples further apart than this many periods start a new slice


def _thread_name(profile: Profile, index: int) -> str:
    t = profile.threads[index]
    return f"{thread_label(index)} {t.role} {t.name}"


def build(profile: Profile) -> dict[str, Any]:
    """The trace as a JSON-ready dict."""
    if profile.collection is None:
        return {"traceEvents": [], "displayTimeUnit": "ms", "otherData": {"cpuprof": "not profiled"}}
    t0 = profile.collection.started_ns
    events: list[dict[str, Any]] = [
        {"ph": "M", "pid": PID, "tid": 0, "name": "process_name", "args": {"name": f"pid {profile.meta.pid}"}}]
    for i, t in enumerate(profile.threads):
        events.append({"ph": "M", "pid": PID, "tid": t.tid, "name": "thread_name",
                       "args": {"name": _thread_name(profile, i)}})
        events.append({"ph": "M", "pid": PID, "tid": t.tid, "name": "thread_sort_index", "args": {"sort_index": i}})

    covered: dict[int, list[tuple[int, int]]] = defaultdict(list)  # thread -> outermost span intervals
    if profile.spans is not None:
        events += _span_events(profile, t0, covered)

    timeline = profile.stacks.timeline if profile.stacks is not None else None
    if timeline is not None and profile.sampling is not None and len(timeline):
        period = int(1e9 / max(profile.sampling.hz, 1))
        events += _sample_slices(profile, timeline, t0, period, covered)
        events += _cpu_counters(profile, timeline, t0)
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {
            "cpuprof_version": profile.meta.cpuprof_version, "mode": profile.collection.mode,
            "spans_dropped": profile.limits.spans_dropped if profile.limits else 0,
            "samples_before_the_timeline": profile.sampling.timeline_dropped if profile.sampling else 0,
        },
    }


def _span_events(profile: Profile, t0: int, covered: dict[int, list[tuple[int, int]]]) -> list[dict[str, Any]]:
    assert profile.spans is not None and profile.collection is not None
    ops = profile.op_by_id()
    names = profile.collection.event_names
    sp = profile.spans
    out: list[dict[str, Any]] = []
    by_thread: dict[int, list[int]] = defaultdict(list)
    for k in range(len(sp)):
        if sp.thread[k] >= 0:
            by_thread[sp.thread[k]].append(k)
    for thread, indices in by_thread.items():
        # An op's duration leaves out the profiler's callbacks inside it, so a child can seem to
        # end up to a callback after its parent; it is drawn inside the parent, as it ran.
        indices.sort(key=lambda k: (sp.start_ns[k], sp.depth[k]))
        parents: list[tuple[int, int]] = []  # (depth, end) of the open ancestors
        for k in indices:
            start, end, depth = sp.start_ns[k] - t0, sp.start_ns[k] - t0 + sp.dur_ns[k], sp.depth[k]
            while parents and (parents[-1][0] >= depth or parents[-1][1] <= start):
                parents.pop()
            if parents:
                end = min(end, parents[-1][1])
            parents.append((depth, end))
            op = ops.get(sp.op[k])
            args: dict[str, Any] = {}
            if op is not None and op.inputs:
                args["inputs"] = ", ".join(input_text(x) for x in op.inputs)
            if op is not None and op.region:
                args["region"] = "/".join(op.region)
            for name, value in zip(names, sp.counters[k], strict=False):
                args[name] = value
            out.append({"ph": "X", "pid": PID, "tid": profile.threads[thread].tid,
                        "name": op.name if op else f"op {sp.op[k]}", "cat": op.kind if op else "op",
                        "ts": start / 1e3, "dur": (end - start) / 1e3, "args": args})
            if depth == 0:
                covered[thread].append((start, end))
    return out


def _gap_around(starts: list[int], intervals: list[tuple[int, int]], t: int) -> tuple[int, int] | None:
    """The gap between the op spans (sorted, disjoint) that holds ``t``, or None if a span does."""
    i = bisect_right(starts, t) - 1
    if i >= 0 and t < intervals[i][1]:
        return None
    low = intervals[i][1] if i >= 0 else 0
    high = intervals[i + 1][0] if i + 1 < len(intervals) else 1 << 62
    return low, high


def _sample_slices(profile: Profile, timeline: Any, t0: int, period: int,
                   covered: dict[int, list[tuple[int, int]]]) -> list[dict[str, Any]]:
    ops = profile.op_by_id()
    by_thread: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for t, thread, op in zip(timeline.time_ns, timeline.thread, timeline.op, strict=True):
        by_thread[thread].append((t - t0, op))
    out: list[dict[str, Any]] = []
    for thread, samples in by_thread.items():
        samples.sort()
        # Samples fill only the gaps between the thread's kept op spans, so slices never overlap.
        spans = sorted(covered.get(thread, []))
        starts = [a for a, _ in spans]
        runs: list[list[int]] = []  # [start, end, op, samples]
        run_gap: tuple[int, int] | None = None
        for t, op in samples:
            gap = _gap_around(starts, spans, t)
            if gap is None:
                continue
            last = runs[-1] if runs else None
            if (last is not None and last[2] == op and gap == run_gap
                    and t - last[1] <= MAX_SAMPLE_GAP_PERIODS * period):
                last[1], last[3] = t, last[3] + 1
                continue
            # A sample closes a period of CPU time: the slice starts one period earlier, but not
            # before the thread's previous slice or op span ended.
            floor = max(gap[0], last[1] if last is not None and run_gap == gap else 0, 0)
            runs.append([max(t - period, floor), t, op, 1])
            run_gap = gap
        tid = profile.threads[thread].tid
        for start, end, op_id, count in runs:
            op = ops.get(op_id)
            out.append({"ph": "X", "pid": PID, "tid": tid, "cat": "samples", "name": op.name if op else f"op {op_id}",
                        "ts": start / 1e3, "dur": (end - start) / 1e3, "args": {"samples": count}})
    return out


def _cpu_counters(profile: Profile, timeline: Any, t0: int) -> list[dict[str, Any]]:
    bins: dict[int, dict[int, int]] = defaultdict(lambda: defaultdict(int))
    for t, thread, cpu_us in zip(timeline.time_ns, timeline.thread, timeline.cpu_us, strict=True):
        # A sample closes the CPU time since the thread's previous one: spread it over the wall
        # time just before the sample, so no bin gets more than the thread could run in it.
        end = t - t0
        start = max(0, end - cpu_us * 1000)  # a first sample's time may predate the session
        b = start // COUNTER_BIN_NS
        while start < end:
            edge = min(end, (b + 1) * COUNTER_BIN_NS)
            bins[b][thread] += edge - start
            start, b = edge, b + 1
    out: list[dict[str, Any]] = []
    threads = sorted({th for b in bins.values() for th in b})
    labels = {th: thread_label(th) for th in threads}
    if not bins:
        return out
    for b in range(min(bins), max(bins) + 2):  # a closing zero so the last bin has a width
        values = bins.get(b, {})
        out.append({"ph": "C", "pid": PID, "tid": 0, "name": "CPU (threads busy)", "ts": b * COUNTER_BIN_NS / 1e3,
                    "args": {labels[th]: round(values.get(th, 0) / COUNTER_BIN_NS, 3) for th in threads}})
    return out


def write(profile: Profile, out: TextIO) -> int:
    """Writes the trace; returns how many events."""
    doc = build(profile)
    json.dump(doc, out, separators=(",", ":"))
    out.write("\n")
    return len(doc["traceEvents"])


def build_ranks(profiles: Iterable[tuple[int, Profile]], clocks: list[tuple[str, int]] | None = None,
                t0_ns: int | None = None) -> dict[str, Any]:
    """One trace of several ranks: one process per rank, on one time axis (every rank's clock is the
    machine's CLOCK_MONOTONIC), with each all-reduce a slice on the rank's dispatching thread.
    ``clocks``: ranks of several hosts, each rank's (host, clock offset), its times shifted by it.
    Given ``t0_ns`` (the earliest profile's start, shifted), ``profiles`` is read once, in order, so
    it may load each profile as it goes: one in memory at a time."""
    if t0_ns is None:
        profiles = list(profiles)
        clocks = clocks or [("", 0)] * len(profiles)
        started = [p.collection.started_ns + offset for (_, p), (_, offset) in zip(profiles, clocks, strict=True)
                   if p.collection is not None]
        if not started:
            return {"traceEvents": [], "displayTimeUnit": "ms", "otherData": {"cpuprof": "no rank was profiled"}}
        t0_ns = min(started)
    t0 = t0_ns
    events: list[dict[str, Any]] = []
    for (rank, profile), (host, offset) in zip(profiles, clocks or itertools.repeat(("", 0)), strict=False):
        if profile.collection is None:
            continue
        shift_us = (profile.collection.started_ns + offset - t0) / 1e3
        pid = rank + 1  # trace viewers treat pid 0 as special
        for event in build(profile)["traceEvents"]:
            event["pid"] = pid
            if "ts" in event:
                event["ts"] += shift_us
            if event.get("name") == "process_name":
                event["args"] = {"name": f"rank {rank} ({host + ', ' if host else ''}pid {profile.meta.pid})"}
            events.append(event)
        events.append({"ph": "M", "pid": pid, "tid": 0, "name": "process_sort_index", "args": {"sort_index": rank}})
        wl = profile.workload
        dispatch = next((t.tid for t in profile.threads if t.role == "dispatch"), profile.meta.pid)
        if wl is not None and wl.collectives is not None:
            c = wl.collectives
            for k in range(len(c.enter_ns)):
                events.append({"ph": "X", "pid": pid, "tid": dispatch, "cat": "collective", "name": c.kind,
                               "ts": (c.enter_ns[k] + offset - t0) / 1e3, "dur": (c.exit_ns[k] - c.enter_ns[k]) / 1e3,
                               "args": {"payload_bytes": c.payload_bytes[k], "step": c.step[k]}})
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def write_ranks(profiles: Iterable[tuple[int, Profile]], out: TextIO, clocks: list[tuple[str, int]] | None = None,
                t0_ns: int | None = None) -> int:
    """Writes the several ranks' trace (:func:`build_ranks`); returns how many events."""
    doc = build_ranks(profiles, clocks, t0_ns)
    json.dump(doc, out, separators=(",", ":"))
    out.write("\n")
    return len(doc["traceEvents"])


class TraceOutput:
    """``cpuprof trace``: a profile, or every rank of a group on one clock, as a Chrome/Perfetto trace."""

    name = "trace"
    suffix = ".json"
    other_suffixes: tuple[str, ...] = ()
    reads: tuple[SourceKind, ...] = ("profile", "ranks")
    role: Role = "export"
    help = "a Chrome/Perfetto trace: a track per thread, op spans, sampled work, CPU counters"

    def write(self, source: Source, out: TextIO, options: OutputOptions) -> int:
        from ..reports.sources import ProfileSource, RanksSource

        if isinstance(source, RanksSource):
            return write_ranks(source.profiles(), out)
        assert isinstance(source, ProfileSource)
        return write(source.profile, out)
