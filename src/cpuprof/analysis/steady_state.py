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
    mid_run: bool = False  # the profile began mid-run (a window, older spans dropped, a cut first forward)
    startup_threads: int = 1  # threads that ran ops before the first step (their op times are summed)


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
    threads_before: set[int] = set()
    for i, self_ns in enumerate(_span_self_times(spans)):
        at = spans.start_ns[i]
        if at < start:
            threads_before.add(spans.thread[i])
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
    dropped = profile.limits.spans_dropped if profile.limits is not None else 0
    windowed = any(flag in profile.meta.command for flag in ("--on-demand", "--delay", "--duration"))
    return SteadyState(profile=view, start_ns=start, end_ns=end, startup_ns=max(0, start - c.started_ns),
                       after_ns=max(0, c.stopped_ns - end), startup_ops=startup, scaled_keys=scaled,
                       mid_run=bool(dropped) or steps.partial_first or windowed,
                       startup_threads=max(1, len(threads_before)))


def _threads_not_covered(profile: Profile, spans: Spans, start: int) -> int:
    """Dispatching threads whose ring of spans was full and whose oldest kept span ended after
    ``start``: spans that ended within the steps may be gone. (Rings keep the newest spans by their
    end: one long span kept, begun before the steps, says nothing of those dropped.)"""
    capacity = profile.limits.span_capacity if profile.limits is not None else 0
    if not capacity or not (profile.limits and profile.limits.spans_dropped):
        return 0
    first_end: dict[int, int] = {}
    count: dict[int, int] = {}
    for thread, at, dur in zip(spans.thread, spans.start_ns, spans.dur_ns, strict=True):
        first_end[thread] = min(first_end.get(thread, at + dur), at + dur)
        count[thread] = count.get(thread, 0) + 1
    return sum(1 for t, n in count.items() if n >= capacity and first_end[t] > start)


def _span_self_times(spans: Spans) -> list[int]:
    """Each span's wall time less its direct children's. Spans are kept in the order they ended, on
    each thread: the children of a span at depth d are the spans at depth d + 1 that ended since the
    last span at depth d did, and began after it began (a child whose parent never ended, still open
    when the profile stopped, is no child of an earlier span)."""
    self_ns = list(spans.dur_ns)
    pending: dict[tuple[int, int], list[int]] = {}  # (thread, depth) -> spans ended, their parent not yet
    for i, (thread, depth, start) in enumerate(zip(spans.thread, spans.depth, spans.start_ns, strict=True)):
        if thread < 0:  # a span of no known thread: nothing to nest it with
            continue
        for child in pending.pop((thread, depth + 1), []):
            if spans.start_ns[child] >= start:
                self_ns[i] -= spans.dur_ns[child]
        pending.setdefault((thread, depth), []).append(i)
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


# Less than this before the first step and nothing ran in it: no start-up worth a section.
MIN_STARTUP_NS = 1_000_000


def startup_section(state: SteadyState, profile: Profile, n_steps: int) -> Section | None:
    """What the program did before its first step, and which stretch the tables below cover; None
    when nothing came before it."""
    c = profile.collection
    assert c is not None
    if state.startup_ns < MIN_STARTUP_NS and not state.startup_ops:
        return None
    wall = c.wall_ns or 1
    steps_ns = state.end_ns - state.start_ns
    in_ops = sum(t.self_ns for op, t in state.startup_ops if op.kind == "op")
    if state.mid_run:
        what = ("the profile began mid-run (a window, or the timeline dropped older spans): earlier steps, if any, "
                "are in it")
    else:
        what = ("whatever the program did first (imports, building or loading the model, initialising weights and "
                "caches, warm-up)")
    threads = state.startup_threads
    where = (f"{fmt_ns(in_ops)} of it in ATen ops, the rest in Python and the framework outside them" if threads == 1
             else f"ATen ops ran {fmt_ns(in_ops)} in it, summed over {threads} threads")
    lines = [f"{fmt_ns(state.startup_ns)} before the first step ({fmt_percent(state.startup_ns / wall)} of the "
             f"{fmt_ns(c.wall_ns)} profiled), {what}: {where}"
             + (f"; {fmt_ns(state.after_ns)} after the last step" if state.after_ns else ""),
             f"the op, region and GEMM tables below are over the {n_steps} steps: from the first one's start to the "
             f"last one's end ({fmt_ns(steps_ns)}, {fmt_percent(steps_ns / wall)} of the run, pauses between steps "
             "included), made from the op timeline; over the whole run: the threads, contention, native-code and "
             "memory sections and the GEMMs' repack and OpenMP shares (their counters and samples are not kept per "
             "stretch of time); `--whole-run` shows every table over the whole run"]
    if state.scaled_keys:
        lines.append(f"{state.scaled_keys} op key(s) ran in the steps and outside them: their CPU and other "
                     "counters are scaled by the share of their self time inside the steps (the calls and times are "
                     "exact)")
    columns = [Column("op", "op"), Column("inputs", "inputs"), Column("calls", "calls", "int"),
               Column("self", "self", "ns", help="wall time in the op itself before the first step")]
    if threads == 1:  # one thread's op times are a share of the wall time; several threads' are not
        columns.append(Column("share", "% start-up", "share", help="self / the time before the first step"))
    rows = [{"op": op.name, "inputs": inputs_text(op), "calls": t.calls, "self": t.self_ns,
             "share": t.self_ns / state.startup_ns if state.startup_ns else None}
            for op, t in [pair for pair in state.startup_ops if pair[0].kind == "op"][:STARTUP_TOP]]
    tables = [Table(columns, rows, caption=f"top {len(rows)} ops before the first step by self time")] if rows else []
    return Section("startup", "Start-up (before the first step)", lines, tables)
