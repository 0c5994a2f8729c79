"""A program's steady state: its op tables over its decode steps, and its start-up on its own.

A program's run starts with what it does once: loading weights, initialising them, filling a KV
cache, prepacking, warming up. Its op table over the whole run is led by these (a serving engine's
worker by the fill of a KV cache of gigabytes), and the decode a user cares about sits below them.
Once the decode steps are found in the op stream (:mod:`.steps`), the op and GEMM tables are
re-made over them, from the op timeline's spans, and the start-up (everything before the first
step) is summed apart.

What the spans give exactly, over any stretch of time: each op key's calls, its self and total wall
time. What they do not: its per-thread CPU and other counters, which the native core sums per key
over the whole run. A key whose calls all fall in the steps keeps them whole; one with calls outside
them too (a projection of the prefill and of the decode steps has one key when its shapes are the
same) has them scaled by the share of its self time inside the steps, and the report says how many.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..model import OpStat, Profile, Spans
from ..units import fmt_ns, fmt_percent
from .labels import inputs_text
from .report_model import Column, Section, Table
from .steps import Steps

STARTUP_TOP = 5  # rows of the start-up's op table


@dataclass
class KeyTime:
    """One op key's calls and wall time over a stretch of the run."""

    calls: int = 0
    self_ns: int = 0
    incl_ns: int = 0
    max_ns: int = 0

    def add(self, self_ns: int, dur_ns: int) -> None:
        self.calls += 1
        self.self_ns += self_ns
        self.incl_ns += dur_ns
        self.max_ns = max(self.max_ns, dur_ns)


@dataclass
class SteadyState:
    profile: Profile  # the profile with its ops re-made over the steps (the view every table reads)
    start_ns: int  # the first step's start
    end_ns: int  # the last step's end
    startup_ns: int  # from the profile's start to the first step
    after_ns: int  # from the last step's end to the profile's end
    startup_ops: list[tuple[OpStat, KeyTime]]  # op keys by their self time before the first step
    scaled_keys: int  # keys with calls in and outside the steps: their counters scaled by self time


def steady_state(profile: Profile, steps: Steps) -> SteadyState | str:
    """``profile`` over its ``steps``, or why it cannot be split (one line)."""
    spans, c = profile.spans, profile.collection
    if spans is None or c is None or not steps.steps:
        return "no op timeline"
    start = steps.steps[0].start_ns
    end = max(s.start_ns + s.wall_ns for s in steps.steps)
    uncovered = _threads_not_covered(profile, spans, start)
    if uncovered:
        return (f"the timeline dropped spans of {uncovered} thread(s) after the first step began "
                "(--timeline N keeps more)")
    inside: dict[int, KeyTime] = {}
    since: dict[int, KeyTime] = {}  # every span from the first step's start on, the steps' and after
    for i, self_ns in enumerate(_span_self_times(spans)):
        at = spans.start_ns[i]
        if at < start:
            continue
        since.setdefault(spans.op[i], KeyTime()).add(self_ns, spans.dur_ns[i])
        if at < end:
            inside.setdefault(spans.op[i], KeyTime()).add(self_ns, spans.dur_ns[i])
    ops, scaled = [], 0
    startup: list[tuple[OpStat, KeyTime]] = []
    for op in profile.ops:
        if op.kind == "special":  # CPU outside ops, in cpuprof's callbacks: not kept per stretch of time
            continue
        later = since.get(op.id, KeyTime())
        before = KeyTime(calls=max(0, op.calls - later.calls), self_ns=max(0, op.self_ns - later.self_ns),
                         incl_ns=max(0, op.incl_ns - later.incl_ns))
        if before.calls:
            startup.append((op, before))
        time = inside.get(op.id)
        if time is None:
            continue
        whole = time.calls == op.calls
        scaled += not whole
        ops.append(_over(op, time, whole))
    startup.sort(key=lambda pair: pair[1].self_ns, reverse=True)
    view = dataclasses.replace(profile, ops=ops,
                               collection=dataclasses.replace(c, started_ns=start, stopped_ns=end))
    return SteadyState(profile=view, start_ns=start, end_ns=end, startup_ns=max(0, start - c.started_ns),
                       after_ns=max(0, c.stopped_ns - end), startup_ops=startup, scaled_keys=scaled)


def _threads_not_covered(profile: Profile, spans: Spans, start: int) -> int:
    """Dispatching threads whose ring of spans was full and kept nothing from before ``start``: some
    of their spans in the steps may be gone."""
    capacity = profile.limits.span_capacity if profile.limits is not None else 0
    if not capacity or not (profile.limits and profile.limits.spans_dropped):
        return 0
    first: dict[int, int] = {}
    count: dict[int, int] = {}
    for thread, at in zip(spans.thread, spans.start_ns, strict=True):
        first[thread] = min(first.get(thread, at), at)
        count[thread] = count.get(thread, 0) + 1
    return sum(1 for t, n in count.items() if n >= capacity and first[t] > start)


def _span_self_times(spans: Spans) -> list[int]:
    """Each span's wall time less its direct children's, the nesting read per thread from depths in
    start order (a parent's duration leaves out the profiler's time under it: it may seem to end
    before its children, so ends do not say it)."""
    self_ns = list(spans.dur_ns)
    order = sorted(range(len(spans.op)), key=lambda i: (spans.thread[i], spans.start_ns[i], spans.depth[i]))
    stack: list[int] = []
    thread = None
    for i in order:
        if spans.thread[i] != thread:
            stack, thread = [], spans.thread[i]
        while stack and spans.depth[stack[-1]] >= spans.depth[i]:
            stack.pop()
        if stack:
            self_ns[stack[-1]] -= spans.dur_ns[i]
        stack.append(i)
    return [max(0, v) for v in self_ns]


def _over(op: OpStat, time: KeyTime, whole: bool) -> OpStat:
    """``op`` over the steps: its calls and times from the spans; its counters, samples and
    allocations whole, or scaled by the share of its self (total) time that fell in the steps."""
    if whole:
        self_share = incl_share = 1.0
    else:
        self_share = time.self_ns / op.self_ns if op.self_ns else time.calls / max(1, op.calls)
        incl_share = time.incl_ns / op.incl_ns if op.incl_ns else self_share

    def scale(values: dict[str, list[int]], share: float) -> dict[str, list[int]]:
        return {event: [round(v * share) for v in per_thread] for event, per_thread in values.items()}

    return dataclasses.replace(
        op, calls=time.calls, self_ns=time.self_ns, incl_ns=time.incl_ns, max_ns=time.max_ns,
        counters_self=scale(op.counters_self, self_share), counters_incl=scale(op.counters_incl, incl_share),
        samples=round(op.samples * self_share), alloc_bytes=round(op.alloc_bytes * self_share),
        allocs=round(op.allocs * self_share), freed_bytes=round(op.freed_bytes * self_share),
        frees=round(op.frees * self_share))


def startup_section(state: SteadyState, profile: Profile, n_steps: int) -> Section:
    """What the program did before its first step, and which stretch the tables below cover."""
    c = profile.collection
    assert c is not None
    wall = c.wall_ns or 1
    steps_ns = state.end_ns - state.start_ns
    in_ops = sum(t.self_ns for op, t in state.startup_ops if op.kind == "op")
    lines = [f"{fmt_ns(state.startup_ns)} before the first step ({fmt_percent(state.startup_ns / wall)} of the "
             f"{fmt_ns(c.wall_ns)} profiled), whatever the program did first (imports, building or loading the "
             f"model, initialising weights and caches, warm-up): {fmt_ns(in_ops)} of it in ATen ops, the rest in "
             "Python and the framework outside them"
             + (f"; {fmt_ns(state.after_ns)} after the last step" if state.after_ns else ""),
             f"the op, region and GEMM tables below are over the {n_steps} steps only ({fmt_ns(steps_ns)}, "
             f"{fmt_percent(steps_ns / wall)} of the run), made from the op timeline; the threads and contention "
             "tables are over the whole run (their counters are not kept per stretch of time); `--whole-run` "
             "shows every table over the whole run"]
    if state.scaled_keys:
        lines.append(f"{state.scaled_keys} op key(s) ran in the steps and outside them: their CPU and other "
                     "counters are scaled by the share of their self time inside the steps (the calls and times are "
                     "exact)")
    columns = [Column("op", "op"), Column("inputs", "inputs"), Column("calls", "calls", "int"),
               Column("self", "self", "ns", help="wall time in the op itself before the first step"),
               Column("share", "% start-up", "share", help="self / the time before the first step")]
    rows = [{"op": op.name, "inputs": inputs_text(op), "calls": t.calls, "self": t.self_ns,
             "share": t.self_ns / state.startup_ns if state.startup_ns else None}
            for op, t in [pair for pair in state.startup_ops if pair[0].kind == "op"][:STARTUP_TOP]]
    tables = [Table(columns, rows, caption=f"top {len(rows)} ops of the start-up by self time")] if rows else []
    return Section("startup", "Start-up (before the first step)", lines, tables)
