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

from dataclasses import dataclass, field

from ..model import Profile
from ..units import fmt_ns, fmt_percent
from .report_model import Column, Section, Table

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


def rank_timeline(profile: Profile, role: str, host: str | None = None, offset_ns: int = 0) -> RankTimeline | None:
    """A rank's collectives from its op timeline, ``offset_ns`` added to its times (its host's clock
    offset in a merged run); None for a process in no torch.distributed job, or with no timeline."""
    d = profile.distributed
    if d is None or profile.spans is None:
        return None
    spans, ops = profile.spans, profile.op_by_id()
    names = {op.id: op.name for op in ops.values()}
    backend_ids = {i for i, n in names.items() if n.startswith(BACKEND_SPAN_PREFIXES)}
    present = {i for i in backend_ids if ops[i].calls}
    chosen = present or {i for i, n in names.items() if n.startswith(C10D_OP_PREFIXES) and ops[i].calls}
    t = RankTimeline(rank=d.rank, world_size=d.world_size, backend=d.backend, store=d.store, pid=profile.meta.pid,
                     role=role, hostname=profile.meta.hostname,
                     spans_dropped=profile.limits.spans_dropped if profile.limits is not None else 0,
                     complete=profile.status.complete, host=host)
    flights: list[tuple[int, int, str]] = []
    for k in range(len(spans)):
        op = spans.op[k]
        if op in chosen and (op in backend_ids or spans.depth[k] == 0):  # a c10d op nests its own
            start = spans.start_ns[k] + offset_ns
            flights.append((start, start + spans.dur_ns[k], names[op]))
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
    dispatch = {i for i, th in enumerate(profile.threads) if th.role == "dispatch"}
    compute = _union(sorted((spans.start_ns[k] + offset_ns, spans.start_ns[k] + offset_ns + spans.dur_ns[k])
                            for k in range(len(spans))
                            if spans.depth[k] == 0 and spans.thread[k] in dispatch and spans.op[k] not in chosen
                            and not names.get(spans.op[k], "").startswith(C10D_OP_PREFIXES)))
    t.overlapped_ns = _intersection(merged, compute)
    return t


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
class JobFigures:
    """One torch.distributed job's ranks, matched at their collectives."""

    store: str | None
    world_size: int
    backend: str | None
    ranks: list[RankFigures]  # by rank
    kinds: dict[str, int]  # the collectives matched, by kind: how many calls
    aligned_at_end: bool  # a rank kept only its latest spans: the calls were matched from the last
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
    aligned_at_end = any(f.timeline.spans_dropped for f in ranks)
    if aligned_at_end and not all(f.timeline.complete for f in ranks):
        problems.append("a rank's timeline kept only its latest spans and another did not end normally: its "
                        "collectives cannot be matched")
        ranks_kinds: dict[str, int] = {}
    else:
        ranks_kinds = _match(ranks, aligned_at_end, problems)
    return JobFigures(store=store, world_size=world_size, backend=members[0].backend, ranks=ranks,
                      kinds=ranks_kinds, aligned_at_end=aligned_at_end, problems=problems)


def _match(ranks: list[RankFigures], from_end: bool, problems: list[str]) -> dict[str, int]:
    if len(ranks) < 2:
        return {}
    kinds = set(ranks[0].timeline.calls)
    for f in ranks[1:]:
        kinds &= set(f.timeline.calls)
    matched: dict[str, int] = {}
    for kind in sorted(kinds):
        calls = [f.timeline.calls[kind] for f in ranks]
        counts = [len(enters) for enters, _ in calls]
        common = min(counts)
        if len(set(counts)) > 1:
            problems.append(f"{kind}: the ranks made {min(counts)} to {max(counts)} calls (one ended early or lost "
                            f"spans): {common} matched " + ("from the last" if from_end else "from the first"))
        matched[kind] = common
        for k in range(common):
            idx = [(len(enters) - common + k) if from_end else k for enters, _ in calls]
            enters = [calls[r][0][i] for r, i in enumerate(idx)]
            exits = [calls[r][1][i] for r, i in enumerate(idx)]
            last = max(enters)
            late = max(range(len(ranks)), key=lambda r: enters[r])
            waits = [min(last - enters[r], exits[r] - enters[r]) for r in range(len(ranks))]
            for r, f in enumerate(ranks):
                f.matched += 1
                f.in_matched_ns += exits[r] - enters[r]
                f.wait_ns += waits[r]
            if last - min(enters) >= LATE_ARRIVAL_NS:
                ranks[late].arrived_last += 1
                ranks[late].made_wait_ns += sum(waits)
    return matched


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
    Column("made_wait_ns", "others waited", "ns", "the other ranks' waits at the collectives it entered last"),
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
                     + (" (matched from the last call: a rank kept only its latest spans)" if job.aligned_at_end
                        else ""))
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
    notes.append("a collective's time is its whole flight: gloo's own span on its thread (the c10d op only "
                 "enqueues it), vLLM's shared-memory ops, or else the c10d op; the ranks' clocks are this "
                 "machine's CLOCK_MONOTONIC, one for all")
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
                     f"{late.matched:,} collectives last; the other ranks waited {fmt_ns(late.made_wait_ns)} for it "
                     f"({fmt_ns(late.made_wait_ns / late.arrived_last)} a call). Its own report shows what it "
                     "computed meanwhile.")
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
        diffs = []
        for t in (t for t in members if t.host == host):
            diffs.extend(_end_differences(reference, t))
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


def _end_differences(reference: RankTimeline, other: RankTimeline) -> list[int]:
    from_end = bool(reference.spans_dropped or other.spans_dropped)
    diffs = []
    for kind in set(reference.calls) & set(other.calls):
        if not any(word in kind for word in SYMMETRIC_KINDS):
            continue
        ref_exits, exits = reference.calls[kind][1], other.calls[kind][1]
        common = min(len(ref_exits), len(exits))
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
