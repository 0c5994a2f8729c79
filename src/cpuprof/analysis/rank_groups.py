"""The ranks of a torch.distributed job that ``cpuprof run`` followed, whatever started them
(torchrun, ``mp.spawn``, vLLM's tensor-parallel workers): set side by side at their collectives.

Each process says its rank (``Profile.distributed``); the processes that met at one store make one
job. A collective is found in each rank's op timeline by what times its whole flight, the wait for
the other ranks included:

- gloo runs every collective on a thread of its own, in a RecordFunction it names ``gloo:<kind>``
  that begins as that thread takes the work and ends as the collective completes (the dispatcher's
  ``c10d::allreduce_`` op only enqueues it, and the program then waits in ``Work.wait()``,
  outside any op);
- vLLM's CPU backend reduces in shared memory inside one synchronous op (``_C::shm_allreduce``,
  ``_C::shm_gather``, ...);
- other backends: the c10d op itself, the only span there is (its time may be the enqueue alone).

Every rank of a job makes the same collectives in the same order, so the k-th call of a kind on
every rank is one collective. The ranks of one machine time their spans on its CLOCK_MONOTONIC, so
their entries compare directly: the last rank to enter a collective is the one every other waited
for, and a rank's wait is from its entry to that last entry (capped at its call's length).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from ..model import Profile
from ..units import fmt_ns, fmt_percent
from .report_model import Column, Section, Table
from .steps import Steps, find_steps

BACKEND_SPAN_PREFIXES = ("gloo:", "_C::shm_")
C10D_OP_PREFIXES = ("c10d::", "_c10d_functional::", "c10d_functional::")
# A rank arriving this much after the first is late; closer, which rank came last is noise.
LATE_ARRIVAL_NS = 50_000
# A rank that waits this share of its collectives' time for a late one is held back by it: name it.
HELD_BACK_SHARE = 0.2


@dataclass
class RankTimeline:
    """What one rank's profile says of its collectives: all that is kept of the profile once read
    (a job of 64 ranks keeps 64 of these, not their profiles)."""

    rank: int
    world_size: int
    backend: str | None
    store: str | None
    pid: int
    role: str
    hostname: str
    # Per kind of collective ("gloo:all_reduce"), each call's entry and exit, in call order.
    calls: dict[str, tuple[list[int], list[int]]] = field(default_factory=dict)
    in_collectives_ns: int = 0  # the union of its collectives' spans
    overlapped_ns: int = 0  # of that, time its dispatching threads ran other ops meanwhile
    first_ns: int | None = None  # entry of the first call of its most frequent collective
    last_ns: int | None = None  # exit of the last
    in_span_ns: int = 0  # its time in collectives (any kind) between those two
    spans_dropped: int = 0  # its timeline kept only the latest spans: its first calls may be missing
    complete: bool = True  # saved at its end, not at a checkpoint before a crash
    host: str | None = None  # in a merged run: its host's label
    on_common_clock: bool = True  # its times are on the other ranks' clock (one host, or its host aligned)
    clock_residual_ns: int = 0  # in a merged run: how well its host's clock is known against the reference
    # The forward passes found in its op stream (analysis.steps), on the same clock: (start, end, kind).
    steps: list[tuple[int, int, str]] = field(default_factory=list)


def rank_timeline(profile: Profile, role: str, host: str | None = None, offset_ns: int | None = 0,
                  residual_ns: int = 0) -> RankTimeline | None:
    """A rank's collectives from its op timeline, ``offset_ns`` added to its times (its host's clock
    offset in a merged run; None: a host not aligned, its times its own); None for a process in no
    torch.distributed job, or with no timeline."""
    d = profile.distributed
    if d is None or profile.spans is None:
        return None
    spans, ops = profile.spans, profile.op_by_id()
    names = {op.id: op.name for op in ops.values()}
    backend_ids = {i for i, n in names.items() if n.startswith(BACKEND_SPAN_PREFIXES)}
    timed = set(spans.op)  # what the timeline holds (a window's, or the latest spans only)
    chosen = (backend_ids & timed) or {i for i in timed if names.get(i, "").startswith(C10D_OP_PREFIXES)}
    t = RankTimeline(rank=d.rank, world_size=d.world_size, backend=d.backend, store=d.store, pid=profile.meta.pid,
                     role=role, hostname=profile.meta.hostname,
                     spans_dropped=profile.limits.spans_dropped if profile.limits is not None else 0,
                     complete=profile.status.complete, host=host, on_common_clock=offset_ns is not None,
                     clock_residual_ns=residual_ns)
    offset_ns = offset_ns or 0
    by_thread: dict[int, list[tuple[int, int, str]]] = {}
    for k in range(len(spans)):
        if spans.op[k] in chosen:
            start = spans.start_ns[k] + offset_ns
            by_thread.setdefault(spans.thread[k], []).append((start, start + spans.dur_ns[k], names[spans.op[k]]))
    flights: list[tuple[int, int, str]] = []
    for thread_flights in by_thread.values():  # a c10d op inside another (a functional collective's) is one
        thread_flights.sort(key=lambda f: (f[0], -f[1]))
        outer_end: int | None = None
        for flight in thread_flights:
            if outer_end is not None and flight[0] < outer_end:
                continue  # nested in the one kept before it: one thread's spans nest or follow
            flights.append(flight)
            outer_end = flight[1]
    flights.sort()
    for enter, exit_, name in flights:
        enters, exits = t.calls.setdefault(name, ([], []))
        enters.append(enter)
        exits.append(exit_)
    merged = _union([(a, b) for a, b, _ in flights])
    t.in_collectives_ns = sum(b - a for a, b in merged)
    if flights:
        # The span its most frequent collective covers: the steps' (a barrier at start-up would
        # stretch it over the loading of a model).
        enters, exits = max(t.calls.values(), key=lambda c: len(c[0]))
        t.first_ns, t.last_ns = enters[0], max(exits)
        t.in_span_ns = _intersection(merged, [(t.first_ns, t.last_ns)])
    t.overlapped_ns = _intersection(merged, _compute(profile, chosen, offset_ns))
    found = find_steps(profile) if flights else None
    if isinstance(found, Steps):
        t.steps = [(s.start_ns + offset_ns, s.start_ns + s.wall_ns + offset_ns, s.kind) for s in found.steps]
    return t


def _compute(profile: Profile, chosen: set[int], offset_ns: int) -> list[tuple[int, int]]:
    """When the rank's dispatching threads ran ATen ops outside its collectives: ops only (a region
    around a step is not compute), nested ones included, a collective's own inner ops left out."""
    spans, ops = profile.spans, profile.op_by_id()
    assert spans is not None
    dispatch = {i for i, th in enumerate(profile.threads) if th.role == "dispatch"}
    compute: dict[int, list[tuple[int, int]]] = {}
    inside: dict[int, list[tuple[int, int]]] = {}
    for k in range(len(spans)):
        thread = spans.thread[k]
        if thread not in dispatch:
            continue
        op = ops.get(spans.op[k])
        start = spans.start_ns[k] + offset_ns
        interval = (start, start + spans.dur_ns[k])
        if spans.op[k] in chosen or (op is not None and op.name.startswith(C10D_OP_PREFIXES)):
            inside.setdefault(thread, []).append(interval)
        elif op is not None and op.kind == "op":
            compute.setdefault(thread, []).append(interval)
    out: list[tuple[int, int]] = []
    for thread, intervals in compute.items():
        out.extend(_subtract(_union(sorted(intervals)), _union(sorted(inside.get(thread, [])))))
    return _union(sorted(out))


def _subtract(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Sorted, merged intervals ``a`` less those of ``b``."""
    out = []
    j = 0
    for lo, hi in a:
        while j < len(b) and b[j][1] <= lo:
            j += 1
        k, cursor = j, lo
        while k < len(b) and b[k][0] < hi:
            if b[k][0] > cursor:
                out.append((cursor, b[k][0]))
            cursor = max(cursor, b[k][1])
            k += 1
        if cursor < hi:
            out.append((cursor, hi))
    return out


def _union(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Sorted intervals merged where they overlap."""
    out: list[tuple[int, int]] = []
    for a, b in intervals:
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _intersection(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> int:
    """Length of the overlap of two sorted, merged interval lists."""
    i = j = total = 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        total += max(0, hi - lo)
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


@dataclass
class RankFigures:
    timeline: RankTimeline
    matched: int = 0  # its calls matched with every other rank's
    in_matched_ns: int = 0  # their time
    wait_ns: int = 0  # of that, waiting for the last rank to arrive
    arrived_last: int = 0  # matched calls it entered last, late enough to matter
    made_wait_ns: int = 0  # the other ranks' waits at the calls it entered last

    @property
    def transfer_ns(self) -> int:
        return self.in_matched_ns - self.wait_ns


@dataclass
class StepSkew:
    """One forward pass of the first matched rank, and its collectives on every rank."""

    index: int
    kind: str
    calls: int = 0
    last: dict[int, int] = field(default_factory=dict)  # rank -> its collectives in the step it entered last
    waits: dict[int, int] = field(default_factory=dict)  # rank -> its waits for the last rank in the step

    @property
    def straggler(self) -> int | None:
        """The rank that entered most of the step's late collectives last."""
        return max(self.last, key=lambda r: self.last[r]) if self.last else None


@dataclass
class JobFigures:
    """One torch.distributed job's ranks, matched at their collectives."""

    store: str | None
    world_size: int
    backend: str | None
    ranks: list[RankFigures]  # by rank
    kinds: dict[str, int]  # the collectives matched, by kind: how many calls
    steps: list[StepSkew] = field(default_factory=list)  # the first rank's steps, where its op stream shows them
    problems: list[str] = field(default_factory=list)  # why some calls or ranks could not be matched


def jobs(timelines: list[RankTimeline]) -> list[JobFigures]:
    """The jobs among the followed processes' ranks, each with its ranks matched."""
    groups: dict[tuple[str | None, int], list[RankTimeline]] = {}
    for t in timelines:
        groups.setdefault((t.store, t.world_size), []).append(t)
    return [_job(store, size, sorted(members, key=lambda t: (t.rank, t.pid)))
            for (store, size), members in sorted(groups.items(), key=lambda g: (g[0][0] or "", g[0][1]))]


def _job(store: str | None, world_size: int, members: list[RankTimeline]) -> JobFigures:
    problems = []
    seen: dict[int, RankTimeline] = {}
    for t in members:
        if t.rank in seen:  # two jobs at one store, one after the other (a restart): the later one
            problems.append(f"rank {t.rank} twice (pids {seen[t.rank].pid} and {t.pid}): the later process is kept")
        seen[t.rank] = t
    ranks = [RankFigures(t) for t in sorted(seen.values(), key=lambda t: t.rank)]
    missing = sorted(set(range(world_size)) - set(seen))
    if missing:
        problems.append(f"rank(s) {', '.join(map(str, missing))} of {world_size} saved no profile here (another "
                        "host's, or not followed): the waits are for the ranks present")
    unaligned = [f for f in ranks if not f.timeline.on_common_clock]
    if unaligned:
        hosts = sorted({f.timeline.host or "?" for f in unaligned})
        problems.append(f"host(s) {', '.join(hosts)}: clock not aligned with the others', so rank(s) "
                        f"{', '.join(str(f.timeline.rank) for f in unaligned)} are left out of the waits")
    matched_ranks = [f for f in ranks if f.timeline.on_common_clock]
    steps = [StepSkew(i, kind) for i, (_, _, kind) in enumerate(matched_ranks[0].timeline.steps)] \
        if matched_ranks else []
    ranks_kinds = _match(matched_ranks, problems, steps)
    return JobFigures(store=store, world_size=world_size, backend=members[0].backend, ranks=ranks,
                      kinds=ranks_kinds, problems=problems, steps=[s for s in steps if s.calls])


def _match(ranks: list[RankFigures], problems: list[str], steps: list[StepSkew]) -> dict[str, int]:
    """Every kind of collective all ``ranks`` (on one clock) made, matched call by call by time;
    each call counted in ``steps`` (the first rank's) it began in."""
    if len(ranks) < 2:
        return {}
    every = set().union(*(f.timeline.calls for f in ranks))
    kinds = {kind for kind in every if all(kind in f.timeline.calls for f in ranks)}
    for kind in sorted(every - kinds):
        without = [str(f.timeline.rank) for f in ranks if kind not in f.timeline.calls]
        problems.append(f"{kind}: rank(s) {', '.join(without)} made none (a subgroup's collective, or a window "
                        "that missed it): not matched")
    # A rank later than the others by less than the clocks are known to agree is not late.
    late_ns = max([LATE_ARRIVAL_NS] + [f.timeline.clock_residual_ns for f in ranks])
    step_starts = [start for start, _, _ in ranks[0].timeline.steps]
    matched: dict[str, int] = {}
    for kind in sorted(kinds):
        calls = [f.timeline.calls[kind] for f in ranks]
        counts = [len(enters) for enters, _ in calls]
        starts, common = _aligned(calls)
        if len(set(counts)) > 1:
            problems.append(f"{kind}: the ranks made {min(counts)} to {max(counts)} calls (a window opened at "
                            f"another call, a rank ended early or lost spans, or a subgroup's): {common} matched "
                            "by their times")
        matched[kind] = common
        for k in range(common):
            enters = [calls[r][0][starts[r] + k] for r in range(len(ranks))]
            exits = [calls[r][1][starts[r] + k] for r in range(len(ranks))]
            last = max(enters)
            late = max(range(len(ranks)), key=lambda r: enters[r])
            waits = [min(last - enters[r], exits[r] - enters[r]) for r in range(len(ranks))]
            for r, f in enumerate(ranks):
                f.matched += 1
                f.in_matched_ns += exits[r] - enters[r]
                f.wait_ns += waits[r]
            is_late = last - min(enters) >= late_ns
            if is_late:
                ranks[late].arrived_last += 1
                ranks[late].made_wait_ns += sum(waits)
            step = _step_of(step_starts, enters[0], ranks[0].timeline.steps)
            if step is not None:
                skew = steps[step]
                skew.calls += 1
                for r, f in enumerate(ranks):
                    skew.waits[f.timeline.rank] = skew.waits.get(f.timeline.rank, 0) + waits[r]
                if is_late:
                    rank = ranks[late].timeline.rank
                    skew.last[rank] = skew.last.get(rank, 0) + 1
    return matched


def _step_of(starts: list[int], when: int, steps: list[tuple[int, int, str]]) -> int | None:
    i = bisect.bisect_right(starts, when) - 1
    return i if i >= 0 and when < steps[i][1] else None


# How far apart two ranks' first calls of a kind may be, in calls, where they are aligned by time.
MAX_CALL_SHIFT = 64
_SHIFT_SAMPLE = 256  # calls compared for each candidate shift


def _aligned(calls: list[tuple[list[int], list[int]]]) -> tuple[list[int], int]:
    """Where each rank's matched calls of a kind start, and how many there are: rank r's call
    k + shift is the first rank's call k, for the shift that makes their ends closest (windows open
    at different calls on different ranks; a rank's ring keeps only its latest spans)."""
    counts = [len(exits) for _, exits in calls]
    reference = calls[0][1]
    shifts = [0] + [_best_shift(reference, exits) for _, exits in calls[1:]]
    first = max(max(0, -shift) for shift in shifts)
    end = min(min(counts[r] - shift for r, shift in enumerate(shifts)), counts[0])
    return [first + shift for shift in shifts], max(0, end - first)


def _best_shift(reference: list[int], exits: list[int]) -> int:
    spread = min(abs(len(reference) - len(exits)) + 2, MAX_CALL_SHIFT)
    best: tuple[int, int, int] | None = None  # (median |end difference|, |shift|, shift)
    for shift in range(-spread, spread + 1):
        lo, hi = max(0, -shift), min(len(reference), len(exits) - shift)
        if hi - lo < 1:
            continue
        step = max(1, (hi - lo) // _SHIFT_SAMPLE)
        gaps = sorted(abs(reference[k] - exits[k + shift]) for k in range(lo, hi, step))
        candidate = (gaps[len(gaps) // 2], abs(shift), shift)
        if best is None or candidate < best:
            best = candidate
    return best[2] if best is not None else 0


COLUMNS = [
    Column("rank", "rank", "int", "its rank in the job (torch.distributed)"),
    Column("pid", "pid", "int"),
    Column("role", "process", help="what the process is to its program"),
    Column("calls", "calls", "int", "its collectives matched with every other rank's"),
    Column("in_ns", "in collectives", "ns", "their time: each from its entry to its exit"),
    Column("wait_ns", "waiting", "ns", "of that, waiting for the last rank to enter the same collective"),
    Column("transfer_ns", "transfer", "ns", "of that, from the last rank's entry to its exit: the backend's own "
                                            "time (the data's movement and its threads' hand-offs)"),
    Column("share", "of its span", "share", "time in collectives over the span of its most frequent collective, "
                                            "from the first call's entry to the last one's exit (the steps, not "
                                            "start-up; the rest is computing between them)"),
    Column("overlap", "overlapped", "share", "of its time in collectives, the share its dispatching threads ran "
                                             "other ops meanwhile: compute and communication overlapped"),
    Column("last", "arrived last", "int", "collectives it entered last, at least 50 µs after the first rank"),
    Column("made_wait_ns", "others waited", "ns", "the other ranks' waits at the collectives it entered last, "
                                                  "summed over those ranks"),
]


def ranks_section(found: list[JobFigures]) -> Section | None:
    """The "Ranks" section of a run whose followed processes joined torch.distributed jobs."""
    shown = [j for j in found if len(j.ranks) >= 2 or j.problems]
    if not shown:
        return None
    lines: list[str] = []
    tables = []
    notes: list[str] = []
    for job in shown:
        where = f"store {job.store}" if job.store else "a store cpuprof could not name"
        calls = ", ".join(f"{n:,} {kind}" for kind, n in job.kinds.items()) or "none matched"
        lines.append(f"A torch.distributed job of {job.world_size} ranks ({job.backend or 'backend unknown'}, {where}):"
                     f" {len(job.ranks)} profiled here; collectives matched across them: {calls}"
)
        lines.extend(_verdict(job))
        notes.extend(job.problems)
        rows = []
        for f in job.ranks:
            t = f.timeline
            span = (t.last_ns - t.first_ns) if t.first_ns is not None and t.last_ns is not None else None
            rows.append({"rank": t.rank, "pid": t.pid, "role": t.role, "calls": f.matched, "in_ns": f.in_matched_ns,
                         "wait_ns": f.wait_ns, "transfer_ns": f.transfer_ns,
                         "share": t.in_span_ns / span if span else None,
                         "overlap": t.overlapped_ns / t.in_collectives_ns if t.in_collectives_ns else None,
                         "last": f.arrived_last, "made_wait_ns": f.made_wait_ns})
        tables.append(Table(columns=COLUMNS, rows=rows, caption=f"the job's ranks ({where}), by rank"))
    hosts = {f.timeline.host for job in shown for f in job.ranks} - {None}
    clock = ("the hosts' clocks aligned as the Clocks lines say; a rank is late only by more than their residual"
             if hosts else "the ranks' clocks are this machine's CLOCK_MONOTONIC, one for all")
    notes.append("a collective's time is its whole flight: gloo's own span on its thread (the c10d op only "
                 f"enqueues it), vLLM's shared-memory ops, or else the c10d op; {clock}")
    return Section("ranks", "Ranks: the processes of one torch.distributed job, at their collectives",
                   lines=lines, tables=tables, notes=notes)


def _verdict(job: JobFigures) -> list[str]:
    if len(job.ranks) < 2 or not job.kinds:
        return []
    lines = []
    late = max(job.ranks, key=lambda f: f.made_wait_ns)
    waiting = max(job.ranks, key=lambda f: f.wait_ns)
    if late.arrived_last and waiting.in_matched_ns and waiting.wait_ns / waiting.in_matched_ns >= HELD_BACK_SHARE:
        t = late.timeline
        lines.append(f"Straggler: rank {t.rank} ({t.role}, pid {t.pid}) entered {late.arrived_last:,} of "
                     f"{late.matched:,} collectives last; the other {len(job.ranks) - 1} rank(s) waited "
                     f"{fmt_ns(late.made_wait_ns)} for it, summed over them "
                     f"({fmt_ns(late.made_wait_ns / late.arrived_last)} a call). Its own report shows what it computed "
                     "meanwhile.")
    lines.extend(_step_lines(job))
    for f in job.ranks:
        t = f.timeline
        span = (t.last_ns - t.first_ns) if t.first_ns is not None and t.last_ns is not None else 0
        if span and f.in_matched_ns:
            lines.append(f"Rank {t.rank}: {fmt_percent(t.in_span_ns / span)} of its time in collectives (from the "
                         f"first of its most frequent one to the last), {fmt_percent(f.wait_ns / f.in_matched_ns)} "
                         "of their time waiting for the last rank")
    return lines


# Collectives every rank leaves together, as the last rank's data arrives: their ends tie the hosts'
# clocks. A broadcast's root may leave as soon as it has sent: not one of them.
SYMMETRIC_KINDS = ("all_reduce", "allreduce", "barrier", "all_gather", "allgather")


@dataclass
class HostClock:
    offset_ns: int  # added to the host's times, they are the reference host's
    residual_ns: int  # the 90th percentile of |reference end - (end + offset)| over the calls matched
    matched: int


def align_hosts(timelines: list[RankTimeline]) -> tuple[str | None, dict[str, HostClock], list[str]]:
    """Each host's clock offset against the host of the job's lowest rank, from the ends of the
    collectives its ranks and that rank made together; the reference host, the offsets, and a line
    for each host that could not be aligned. Each host's times are its own CLOCK_MONOTONIC."""
    if not timelines:
        return None, {}, []
    by_job: dict[tuple[str | None, int], list[RankTimeline]] = {}
    for t in timelines:
        by_job.setdefault((t.store, t.world_size), []).append(t)
    members = max(by_job.values(), key=lambda ts: (len({t.host for t in ts}), len(ts)))
    reference = min(members, key=lambda t: (t.rank, t.pid))
    clocks: dict[str, HostClock] = {}
    problems = []
    for (store, _), others in by_job.items():
        if others is not members:
            hosts = sorted({t.host or "?" for t in others})
            problems.append(f"host(s) {', '.join(hosts)}: ranks of another job (store {store}) than rank "
                            f"{reference.rank}'s on {reference.host} (store {reference.store}): not aligned")
    for host in sorted({t.host for t in members if t.host is not None and t.host != reference.host}):
        diffs: list[int] = []
        unsure: set[str] = set()
        for t in (t for t in members if t.host == host):
            diffs.extend(_end_differences(reference, t, unsure))
        if unsure:
            problems.append(f"host {host}: its ranks and rank {reference.rank} made different numbers of "
                            f"{', '.join(sorted(unsure))} calls (windows opened at other calls, lost spans), paired "
                            "by order: its offset may be off by whole steps, which the residual cannot show")
        if not diffs:
            problems.append(f"host {host}: its ranks made no collective with rank {reference.rank} on "
                            f"{reference.host} that ends on every rank at once: its clock is not aligned")
            continue
        diffs.sort()
        offset = diffs[len(diffs) // 2]
        deviations = sorted(abs(d - offset) for d in diffs)
        clocks[host] = HostClock(offset_ns=offset, residual_ns=deviations[min(len(deviations) - 1,
                                                                              int(0.9 * len(deviations)))],
                                 matched=len(diffs))
    return reference.host, clocks, problems


def _end_differences(reference: RankTimeline, other: RankTimeline, unsure: set[str]) -> list[int]:
    """The reference's end minus the other's, call by call (by order: the two clocks are not yet
    tied, so times cannot pair them); the kinds whose counts differ go into ``unsure``."""
    from_end = bool(reference.spans_dropped or other.spans_dropped)
    diffs = []
    for kind in set(reference.calls) & set(other.calls):
        if not any(word in kind for word in SYMMETRIC_KINDS):
            continue
        ref_exits, exits = reference.calls[kind][1], other.calls[kind][1]
        common = min(len(ref_exits), len(exits))
        if len(ref_exits) != len(exits):
            unsure.add(kind)
        for k in range(common):
            i = len(ref_exits) - common + k if from_end else k
            j = len(exits) - common + k if from_end else k
            diffs.append(ref_exits[i] - exits[j])
    return diffs


def clock_lines(reference: str | None, hosts: list[tuple[str, int | None, int | None, int]]) -> list[str]:
    """How a merged run's hosts' clocks were aligned: (label, offset, residual, matched) each."""
    if reference is None or len(hosts) < 2:
        return []
    lines = [f"Clocks: host {reference}'s is the reference; never assumed equal, each other host's offset is found "
             "from the ends of the collectives its ranks made with the reference's lowest rank (they end together, "
             "within the interconnect's latency)"]
    for label, offset, residual, matched in hosts:
        if label == reference:
            continue
        if offset is None:
            lines.append(f"  host {label}: not aligned (its times are its own clock's)")
            continue
        sign = "behind" if offset >= 0 else "ahead of"
        lines.append(f"  host {label}: its clock is {abs(offset) / 1e9:.6f} s {sign} {reference}'s; residual "
                     f"{fmt_ns(residual or 0)} (90th percentile, over {matched:,} calls)")
    return lines


# The steps a report names where the ranks waited most for each other.
WORST_STEPS = 3


def _step_lines(job: JobFigures) -> list[str]:
    """Per forward pass (the first rank's, found in its op stream): who held each one back."""
    if not job.steps:
        return []
    held = [s for s in job.steps if s.straggler is not None]
    by_rank: dict[int, int] = {}
    for s in held:
        assert s.straggler is not None
        by_rank[s.straggler] = by_rank.get(s.straggler, 0) + 1
    lines = [f"Per forward pass ({len(job.steps)} found in rank {job.ranks[0].timeline.rank}'s op stream, with "
             "collectives): " + ("; ".join(f"rank {r} entered most of the late collectives last in {n} of them"
                                           for r, n in sorted(by_rank.items(), key=lambda x: -x[1]))
                                 or "no rank was late at any")]
    worst = sorted(job.steps, key=lambda s: -sum(s.waits.values()))[:WORST_STEPS]
    for s in worst:
        if not sum(s.waits.values()):
            break
        waits = ", ".join(f"rank {r} {fmt_ns(w)}" for r, w in sorted(s.waits.items()))
        late = f"rank {s.straggler} last" if s.straggler is not None else "no rank late"
        lines.append(f"  step {s.index} ({s.kind}, {s.calls} collectives): {late}; waits {waits}")
    return lines
