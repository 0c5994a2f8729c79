"""Where the team waited instead of computing, per op and per thread, in VTune's terms.

Two methods, one report:

- OMPT (Intel's libiomp5, LLVM's libomp, launched with the tool): the runtime tells the tool every
  barrier and lock wait, with its kind; the tool reads the thread's CPU clock at both ends, so a
  wait splits exactly into spin (on CPU) and sleep (off CPU).
- samples (GNU libgomp, which never calls a tool): spin is a thread's sampled CPU time inside the
  OpenMP runtime while the op ran; sleep is the op's wall time the thread was not on a CPU (wall
  minus its CPU time). Barrier kinds, locks and serial time are not visible this way.

VTune's definitions, per op: imbalance = the barrier wait of all threads / the team size (the time
the op would save with perfect balance: the potential gain); spin overhead = the waits' CPU time;
effective CPU utilisation = CPU time not spent waiting / (wall time x team size).

Off CPU is not always a wait for the other threads: a runnable thread waiting for a CPU that
another process holds (run-queue delay) would not gain from balance. The kernel counts that delay
per thread (schedstat), not per op; the samples method spreads each thread's over the ops in
proportion to its off-CPU time in them (an estimate, said as one) and leaves it out of the waits,
so imbalance and its potential gain are the waits other than it. A team of one thread has no
imbalance: there is no other thread to balance with.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from .. import defaults
from ..model import CPU_EVENT, OpStat, Profile
from ..model.workload import ALL_REDUCE_REGION
from ..units import fmt_ns, fmt_percent, fmt_rate
from .labels import inputs_text, region_text, team_order, thread_label
from .ops import bounded_cpu
from .ranks import COLLECTIVE_OP_PREFIXES
from .report_model import Column, Section, Table

BARRIER_KINDS = ("barrier-implicit", "barrier-explicit", "barrier-reduction", "barrier-other")
LOCK_KINDS = ("lock", "nest-lock", "critical", "ordered", "atomic", "other-mutex")
TRACEPOINT_COUNTS = (
    ("syscalls:sys_enter_futex", "futex", "futex system calls of the thread while the op ran (sleeping and waking)"),
    ("lock:contention_begin", "kernel locks", "kernel lock contentions of the thread while the op ran"),
    ("sched:sched_switch", "switched out", "sched_switch tracepoint hits of the thread while the op ran"),
)
# A finding is worth a verdict line when it costs at least this share of the profiled wall time.
MIN_FINDING_SHARE = 0.01
MAX_FINDINGS = 8
TOP_ROWS = 15
# Samples below this make a per-(op, thread) spin share noise: the spin is then not estimated.
MIN_SAMPLES = 10


@dataclass
class ThreadWaits:
    """One thread's time while one op ran."""

    thread: int
    cpu_ns: float | None  # on a CPU while the op ran (task-clock; statistical in sampled mode)
    spin_ns: float | None  # on a CPU, waiting in the OpenMP runtime
    sleep_ns: float | None  # off CPU while the op ran: asleep at a barrier, or runnable and waiting
    queued_ns: float | None = None  # of sleep_ns, runnable and waiting for a CPU (estimated; samples method)
    barrier_ns: dict[str, int] = field(default_factory=dict)  # OMPT: wall time per barrier kind
    barrier_cpu_ns: int = 0  # OMPT: the on-CPU part of the barrier waits
    lock_ns: int = 0  # OMPT: lock, critical and ordered waits
    lock_cpu_ns: int = 0
    acquisitions: int = 0  # OMPT: locks, critical sections and ordered regions entered
    switches: int | None = None  # context switches while the op ran
    migrations: int | None = None

    @property
    def waiting_ns(self) -> float:
        """The time it waited for the other threads: barrier and lock waits (OMPT), else spin and the
        time off CPU other than waiting for a CPU."""
        if self.barrier_ns or self.lock_ns:
            return sum(self.barrier_ns.values()) + self.lock_ns
        return (self.spin_ns or 0.0) + max(0.0, (self.sleep_ns or 0.0) - (self.queued_ns or 0.0))


@dataclass
class OpContention:
    op: OpStat
    team: int
    threads: list[ThreadWaits]
    method: str  # "ompt" or "samples"
    parallel_regions: int = 0  # OMPT: forked while the op ran
    serial_ns: int | None = None  # OMPT: the op's wall time outside its parallel regions

    @property
    def wall_ns(self) -> int:
        return self.op.self_ns

    @property
    def barrier_ns(self) -> float:
        """Barrier waits of all threads (samples: every wait, the method cannot tell barriers apart)."""
        if self.method == "ompt":
            return float(sum(sum(t.barrier_ns.values()) for t in self.threads))
        return sum(t.waiting_ns for t in self.threads)

    @property
    def imbalance_ns(self) -> float:
        """VTune's imbalance: the barrier waits over the team size; the potential gain of perfect balance
        (none for a team of one)."""
        return self.barrier_ns / self.team if self.team > 1 else 0.0

    @property
    def spin_ns(self) -> float:
        return sum(t.spin_ns or 0.0 for t in self.threads)

    @property
    def sleep_ns(self) -> float:
        return sum(t.sleep_ns or 0.0 for t in self.threads)

    @property
    def queued_ns(self) -> float:
        return sum(t.queued_ns or 0.0 for t in self.threads)

    @property
    def lock_ns(self) -> int:
        return sum(t.lock_ns for t in self.threads)

    @property
    def effective_utilisation(self) -> float | None:
        cpu = [t.cpu_ns for t in self.threads]
        if not self.wall_ns or any(c is None for c in cpu):
            return None
        useful = sum(max(0.0, (t.cpu_ns or 0.0) - (t.spin_ns or 0.0)) for t in self.threads)
        return min(1.0, useful / (self.wall_ns * self.team))


@dataclass
class Contention:
    method: str
    method_text: str
    blind_spots: list[str]
    ops: list[OpContention]
    team: int
    wall_ns: int  # the profiled wall time
    members: list[int]  # the team's indices into Profile.threads (no communication backend's thread)
    steps: int | None  # decode steps (prefill included) the ops cover, to express costs per token

    @property
    def potential_gain_ns(self) -> float:
        return sum(o.imbalance_ns for o in self.ops)

    @property
    def spin_ns(self) -> float:
        return sum(o.spin_ns for o in self.ops)

    @property
    def sleep_ns(self) -> float:
        return sum(o.sleep_ns for o in self.ops)

    @property
    def queued_ns(self) -> float:
        return sum(o.queued_ns for o in self.ops)


def _per_op_thread_spin(profile: Profile) -> dict[tuple[int, int], tuple[int, int, int]]:
    """(op, thread) -> (samples, CPU ns, CPU ns with the leaf in the OpenMP runtime)."""
    out: dict[tuple[int, int], list[int]] = defaultdict(lambda: [0, 0, 0])
    stacks = profile.stacks
    if stacks is None:
        return {}
    for c in stacks.counts:
        cell = out[(c.op, c.thread)]
        cell[0] += c.samples
        cell[1] += c.cpu_ns
        frames = stacks.stacks[c.stack]
        if frames and stacks.frames[frames[0]].category == "openmp":
            cell[2] += c.cpu_ns
    return {k: (v[0], v[1], v[2]) for k, v in out.items()}


def _counter(op: OpStat, event: str, k: int) -> int | None:
    values = op.counters_self.get(event)
    return values[k] if values is not None and k < len(values) else None


# Scopes a communication backend records on its own threads ("gloo:all_reduce", ...).
BACKEND_SCOPE_PREFIXES = ("gloo:",)


def _is_communication(op: OpStat) -> bool:
    """An all-reduce, or an op inside one: the team waits there for the other ranks, which is
    neither imbalance nor spinning (the merged report of the ranks splits that time)."""
    return (op.name.startswith(COLLECTIVE_OP_PREFIXES) or ALL_REDUCE_REGION in op.region
            or (op.kind == "region" and op.name == ALL_REDUCE_REGION))


def _ran_on_a_backend_thread(op: OpStat, members: list[int]) -> bool:
    """A scope a communication backend's own thread opened (gloo's run loop records
    "gloo:all_reduce" there): its time is that thread's, and the team, which ran none of it, was
    not idle in it. Told apart by where its CPU went: none on the team, some elsewhere."""
    if op.name.startswith(BACKEND_SCOPE_PREFIXES):
        return True  # by name: the main thread may run a little while gloo's scope is open
    values = op.counters_self.get(CPU_EVENT)
    if not values:
        return False
    team_cpu = sum(values[k] for k in members if k < len(values))
    return team_cpu == 0 and sum(values) > 0


def analyse(profile: Profile) -> Contention | None:
    c = profile.collection
    if c is None or not profile.threads or not profile.has_event(CPU_EVENT):
        return None
    from .threads import compute_team

    members = compute_team(profile)
    team = len(members)
    found_late = {k for k in members
                  if (profile.threads[k].opened_ns or 0) > c.started_ns + defaults.THREAD_FOUND_LATE_NS}
    omp = profile.openmp
    ompt = omp is not None and omp.info.active
    spin_by = _per_op_thread_spin(profile)
    queue_share = _queue_shares(profile, members)
    waits: dict[tuple[int, int], list] = defaultdict(list)
    work: dict[tuple[int, int], list] = defaultdict(list)
    if ompt and omp is not None:
        for w in omp.waits:
            waits[(w.op, w.thread)].append(w)
        for wk in omp.work:
            work[(wk.op, wk.thread)].append(wk)
    ops: list[OpContention] = []
    for op in profile.ops:
        if op.kind == "special" or op.self_ns <= 0 or _is_communication(op) or _ran_on_a_backend_thread(op, members):
            continue
        threads = []
        regions, parallel_ns = 0, 0
        for k in members:
            raw = _counter(op, CPU_EVENT, k)
            # held to the op's wall time as the op table holds it: sampling noise capped, an
            # estimate that cannot be right withheld (None), never more CPU than wall on a thread
            cpu = bounded_cpu(profile, raw, op.self_ns)[0] if raw is not None else None
            t = ThreadWaits(thread=k, cpu_ns=float(cpu) if cpu is not None else None, spin_ns=None, sleep_ns=None,
                            switches=_counter(op, "context-switches", k), migrations=_counter(op, "cpu-migrations", k))
            if cpu is not None and cpu == 0 and k in found_late:
                pass  # found after the profile began: an op it did nothing in may have run before it existed
            elif cpu is not None:
                t.sleep_ns = float(max(0, op.self_ns - cpu))
                if not ompt and k in queue_share:  # OMPT's waits are exact, and say nothing of the run queue
                    # Spread over the ops it ran in: a thread with no CPU in an op never got to run there (it
                    # slept, or did not exist yet); one waiting for a CPU the whole op is not told from those.
                    t.queued_ns = t.sleep_ns * queue_share[k] if cpu > 0 else 0.0
            if ompt:
                for w in waits.get((op.id, k), []):
                    if w.kind in BARRIER_KINDS:
                        t.barrier_ns[w.kind] = t.barrier_ns.get(w.kind, 0) + w.wall_ns
                        t.barrier_cpu_ns += w.cpu_ns
                    elif w.kind in LOCK_KINDS:
                        t.lock_ns += w.wall_ns
                        t.lock_cpu_ns += w.cpu_ns
                t.spin_ns = float(t.barrier_cpu_ns + t.lock_cpu_ns)
                # exact: the waits' own off-CPU part (the thread's other off-CPU time is not a wait)
                t.sleep_ns = float(sum(t.barrier_ns.values()) + t.lock_ns) - t.spin_ns
                for wk in work.get((op.id, k), []):
                    t.acquisitions += wk.lock_acquisitions
                    regions += wk.parallel_regions
                    parallel_ns += wk.parallel_ns
            else:
                samples, sampled_cpu, in_runtime = spin_by.get((op.id, k), (0, 0, 0))
                if cpu is not None and samples >= MIN_SAMPLES and sampled_cpu:
                    t.spin_ns = cpu * in_runtime / sampled_cpu
                elif cpu is not None and samples == 0:
                    t.spin_ns = 0.0
            threads.append(t)
        entry = OpContention(op=op, team=team, threads=threads, method="ompt" if ompt else "samples",
                             parallel_regions=regions,
                             serial_ns=max(0, op.self_ns - parallel_ns) if ompt and regions else None)
        ops.append(entry)
    _cap_queued_at_run_delay(profile, ops)
    wl = profile.workload
    steps = (wl.steps_done + 1) if wl is not None and wl.steps_done else None
    if ompt:
        assert omp is not None
        method_text = (f"OMPT: {omp.info.runtime or 'the OpenMP runtime'} reported every barrier and lock wait to "
                       "cpuprof's tool, which read the thread's CPU clock at both ends (spin: on a CPU; sleep: off)")
        blind = ["run-queue delay per op (only per thread, from schedstat): it may be inside the waits",
                 "futex time (counts only, with --events sched)"]
    else:
        why = omp.info.error if omp is not None and omp.info.error else (
            "the OpenMP runtime here (GNU libgomp) never calls an OMPT tool")
        if profile.sampling is None:
            method_text = ("counters (exact mode): sleep = the op's wall time the thread was off CPU (its CPU time "
                           "read at the op's ends); spin is not measured: it needs samples (the default sampled "
                           f"mode) or OMPT ({why}; `decode --omp intel` gives exact barrier and lock waits)")
        else:
            method_text = ("samples: spin = a thread's sampled CPU time inside the OpenMP runtime while the op ran; "
                           f"sleep = the op's wall time the thread was off CPU ({why}; `decode --omp intel` gives "
                           "exact barrier and lock waits through OMPT)")
        blind = ["barrier kinds and lock waits (no OMPT)", "serial time within an op",
                 "run-queue delay per op: estimated, each thread's (schedstat) spread over the ops in proportion "
                 "to its time off CPU in them"]
        if not profile.has_event("syscalls:sys_enter_futex"):
            blind.append("futex calls (add --events sched where the syscalls tracepoints can be opened)")
        if profile.sampling is None:
            blind.insert(0, "spin (exact mode has no samples: only sleep = wall - CPU is known)")
    return Contention(method="ompt" if ompt else "samples", method_text=method_text, blind_spots=blind, ops=ops,
                      team=team, wall_ns=c.wall_ns, members=members, steps=steps)


def _cap_queued_at_run_delay(profile: Profile, ops: list[OpContention]) -> None:
    """A thread's estimated run-queue waits over the ops never add up to more than the run-queue delay
    schedstat measured for it: scaled down where they would (ops' off-CPU time need not be spread as
    its whole life's is)."""
    totals: dict[int, float] = defaultdict(float)
    for o in ops:
        for t in o.threads:
            totals[t.thread] += t.queued_ns or 0.0
    for k, total in totals.items():
        delay = profile.threads[k].run_delay_ns
        if delay is None or total <= delay:
            continue
        scale = delay / total
        for o in ops:
            for t in o.threads:
                if t.thread == k and t.queued_ns:
                    t.queued_ns *= scale


def _queue_shares(profile: Profile, members: list[int]) -> dict[int, float]:
    """Per team thread: the share of its time off CPU over the profile that it was runnable, waiting
    for a CPU (its schedstat run-queue delay / (profiled wall - its CPU time)); threads whose delay
    was not read are left out."""
    c = profile.collection
    shares = {}
    for k in members:
        t = profile.threads[k]
        if t.run_delay_ns is None or t.cpu_ns is None or c is None:
            continue
        # over the thread's own life in the profile: one started late was off CPU for less of it
        life = c.stopped_ns - max(c.started_ns, t.opened_ns or 0)
        off = life - t.cpu_ns
        shares[k] = min(1.0, t.run_delay_ns / off) if off > 0 else 0.0
    return shares


def _threads(n: int) -> str:
    return f"{n} thread" if n == 1 else f"{n} threads"


def _per_token(ns: float, contention: Contention) -> str:
    if not contention.steps:
        return fmt_ns(ns)
    return f"{fmt_ns(ns / contention.steps)} per token"


def findings(profile: Profile, contention: Contention) -> list[tuple[float, str]]:
    """One-line verdicts with their cost in wall ns, most costly first."""
    out: list[tuple[float, str]] = []
    floor = MIN_FINDING_SHARE * contention.wall_ns
    for o in contention.ops:
        if o.imbalance_ns < floor:
            continue
        worst = max(o.threads, key=lambda t: t.waiting_ns)
        share = worst.waiting_ns / o.wall_ns if o.wall_ns else 0.0
        spin_share = (worst.spin_ns or 0.0) / worst.waiting_ns if worst.waiting_ns else 0.0
        where = "at the implicit barrier" if o.method == "ompt" and worst.barrier_ns.get("barrier-implicit") else (
            "at barriers and locks" if o.method == "ompt" else "in the OpenMP runtime or off CPU")
        label = f"{o.op.name} {inputs_text(o.op)}".strip()
        out.append((o.imbalance_ns,
                    f"{thread_label(worst.thread)} waits {fmt_percent(share)} of {label} {where} "
                    f"({fmt_percent(spin_share)} of it spinning): imbalance, potential gain "
                    f"{_per_token(o.imbalance_ns, contention)}"))
        if o.lock_ns >= floor:
            acquisitions = sum(t.acquisitions for t in o.threads)
            out.append((o.lock_ns / o.team, f"{label}: {fmt_ns(o.lock_ns)} waiting on locks and critical sections "
                                            f"over {acquisitions:,} acquisitions"))
        if o.serial_ns is not None and o.serial_ns * (o.team - 1) / o.team >= floor:
            out.append((o.serial_ns * (o.team - 1) / o.team,
                        f"{label} runs serial for {fmt_ns(o.serial_ns)} outside its parallel regions: the other "
                        f"{o.team - 1} thread(s) idle then"))
    cpus = profile.capabilities.cpus_online if profile.capabilities else None
    if cpus is not None and contention.team > cpus:
        out.append((float(contention.wall_ns), f"{contention.team} threads share {cpus} CPUs: they wait for each "
                                               "other's CPU, and libgomp shortens its spinning when oversubscribed"))
    for k, t in enumerate(profile.threads):
        if t.run_delay_ns and t.run_delay_ns >= floor:
            out.append((float(t.run_delay_ns), f"{thread_label(k)} waited {fmt_ns(t.run_delay_ns)} for a CPU while "
                                               "runnable (run-queue delay): something else ran on its CPU"))
    return sorted(out, key=lambda f: f[0], reverse=True)[:MAX_FINDINGS]


@dataclass
class ContentionSummary:
    """The contention analysis's figures for the report: computed here, phrased by
    :func:`contention_section`."""

    contention: Contention
    team_cpu_ns: float  # CPU time of the team's threads over the profile
    balanced_tokens_per_s: float | None  # decode throughput were the waits gone (perfect balance)
    effective_utilisation: float | None  # CPU not spinning / (wall x team); None without a wall time
    idle_wall_ns: float | None  # OMPT: workers waiting to be forked again, charged to no op
    idle_spin_share: float | None  # the share of that spent on a CPU
    findings: list[tuple[float, str]]  # (cost in wall ns, verdict), most costly first
    ranked: list[OpContention]  # the ops with the most imbalance, most first
    tracepoints: list[str]  # the tracepoint events counted per (op, thread)
    ompt_dropped: tuple[int, int] | None  # OMPT tables full: (records, threads) not kept


def summarize_contention(profile: Profile, contention: Contention | None = None,
                         top: int = TOP_ROWS) -> ContentionSummary | None:
    """None where no op ran with its threads' CPU counted."""
    contention = contention if contention is not None else analyse(profile)
    if contention is None or not contention.ops:
        return None
    wall = contention.wall_ns
    team_cpu = float(sum(profile.threads[k].cpu_ns or 0 for k in contention.members))
    balanced = None
    wl = profile.workload
    if contention.steps and wl is not None and wl.figures is not None and wl.figures.tokens_per_s:
        step_ns = wl.batch * 1e9 / wl.figures.tokens_per_s  # the measured steps' mean
        per_step = contention.potential_gain_ns / contention.steps
        if 0 < per_step < step_ns:
            balanced = wl.batch * 1e9 / (step_ns - per_step)
    useful = team_cpu - contention.spin_ns
    efficiency = max(0.0, useful) / (wall * contention.team) if wall else None
    idle_wall = idle_share = None
    omp = profile.openmp
    if contention.method == "ompt" and omp is not None:
        idle = [w for w in omp.waits if w.kind == "idle"]
        if idle:
            idle_wall = float(sum(w.wall_ns for w in idle))
            idle_spin = float(sum(w.cpu_ns for w in idle))
            idle_share = idle_spin / idle_wall if idle_wall else 0.0
    dropped = None
    if omp is not None and omp.info.active and (omp.info.records_dropped or omp.info.threads_beyond_limit):
        dropped = (omp.info.records_dropped, omp.info.threads_beyond_limit)
    return ContentionSummary(
        contention=contention, team_cpu_ns=team_cpu, balanced_tokens_per_s=balanced,
        effective_utilisation=efficiency, idle_wall_ns=idle_wall, idle_spin_share=idle_share,
        findings=findings(profile, contention),
        ranked=sorted(contention.ops, key=lambda o: o.imbalance_ns, reverse=True)[:top],
        tracepoints=[event for event, _, _ in TRACEPOINT_COUNTS if profile.has_event(event)],
        ompt_dropped=dropped)


def contention_section(summary: ContentionSummary | None) -> Section | None:
    """The summary in sentences and one table: where the threads waited."""
    if summary is None:
        return None
    contention = summary.contention
    gain = contention.potential_gain_ns
    lines = [f"method: {contention.method_text}",
             f"not visible here: {'; '.join(contention.blind_spots)}"]
    wall = contention.wall_ns
    if wall:
        # Without OMPT a wait cannot be told from spinning through serial code between regions:
        # VTune calls the sum "imbalance or serial spinning", and so do we.
        what = "imbalance" if contention.method == "ompt" else "imbalance or serial spinning"
        queued = contention.queued_ns
        off = f"was off CPU {fmt_ns(contention.sleep_ns)}" + (
            f" ({fmt_ns(queued)} of it runnable, waiting for a CPU: run-queue delay, estimated)" if queued else "")
        line = f"the team ({_threads(contention.team)}) spun {fmt_ns(contention.spin_ns)} and {off} while ops ran; "
        if contention.team == 1:
            line += "a team of one thread has no imbalance (no other thread to balance with)"
        else:
            waits = "waits other than for a CPU" if queued else "waits"
            line += (f"{what} ({waits} / team size): potential gain {fmt_ns(gain)} of {fmt_ns(wall)} profiled "
                     f"({fmt_percent(gain / wall)})")
        if contention.steps and contention.team > 1:
            line += f", {_per_token(gain, contention)}"
            if summary.balanced_tokens_per_s is not None:
                line += (f": with perfect balance decode would run at up to "
                         f"{fmt_rate(summary.balanced_tokens_per_s)} tokens/s")
        lines.append(line)
    if summary.effective_utilisation is not None:
        lines.append(f"effective CPU utilisation {fmt_percent(summary.effective_utilisation)} "
                     f"(CPU time not spent spinning / (wall time x {_threads(contention.team)}))")
    if summary.idle_wall_ns is not None:
        lines.append(f"workers idle between parallel regions (waiting to be forked again, charged to no op): "
                     f"{fmt_ns(summary.idle_wall_ns)}, {fmt_percent(summary.idle_spin_share or 0.0)} of it "
                     "spinning (KMP_BLOCKTIME: how long before they sleep)")
    lines += [f"finding: {text}" for _, text in summary.findings] or ["no wait costs 1% of the profiled time or more"]
    ompt = contention.method == "ompt"
    columns = [Column("op", "op"), Column("inputs", "inputs"),
               Column("region", "region", help="the enclosing regions (regions themselves: their time between ops)"),
               Column("thread", "thread"),
               Column("wall", "op wall", "ns", help="the op's self wall time, summed over calls"),
               Column("cpu", "CPU", "ns", help="the thread's CPU time while the op ran"),
               Column("spin", "spin", "ns", help="on a CPU, waiting in the OpenMP runtime" + (
                   " (OMPT: CPU clock across each wait)" if ompt else " (samples in the runtime)")),
               Column("sleep", "off CPU", "ns", help=(
                   "OMPT: the waits' time off a CPU (asleep at a barrier or lock)" if ompt else
                   "wall time the thread was not on a CPU: asleep at a barrier or lock, or runnable and waiting for "
                   "a CPU"))]
    if not ompt:
        columns.append(Column("queued", "queued", "ns", help=(
            "of off CPU, runnable and waiting for a CPU another thread or process held (run-queue delay): "
            "estimated, the thread's delay (schedstat) spread over the ops in proportion to its time off CPU; "
            "not a wait for the team, so not in imbalance")))
    if ompt:
        columns += [Column("barrier", "barrier", "ns", help="OMPT: wall time in barriers (all kinds)"),
                    Column("kinds", "barrier kinds", help="OMPT: the barrier kinds it waited at, most first"),
                    Column("lock", "lock", "ns", help="OMPT: wall time waiting for locks, critical and ordered"),
                    Column("acq", "acquired", "count", help="OMPT: locks, critical sections, ordered regions entered")]
    columns += [Column("imbalance", "imbalance", "ns", help="the op's waits of all threads (other than for a CPU) / "
                                                            "team size: what perfect balance would save (VTune's "
                                                            "potential gain); none for a team of one"),
                Column("eff", "eff. util", "share", help="effective CPU utilisation of the op: CPU not spinning / "
                                                         "(wall x team)"),
                Column("switches", "ctx-sw", "count", help="context switches of the thread while the op ran"),
                Column("migrations", "migr", "count", help="moves of the thread to another CPU while the op ran")]
    # Tracepoints, where they were asked for (--events sched) and could be opened: counts only.
    traced = [(event, header, help_) for event, header, help_ in TRACEPOINT_COUNTS if event in summary.tracepoints]
    columns += [Column(event, header, "count", help=help_) for event, header, help_ in traced]
    rows = []
    for o in summary.ranked:
        for t in o.threads:
            row = {"op": o.op.name, "inputs": inputs_text(o.op), "region": region_text(o.op),
                   "thread": thread_label(t.thread), "wall": o.wall_ns,
                   "cpu": t.cpu_ns, "spin": t.spin_ns, "sleep": t.sleep_ns, "queued": t.queued_ns,
                   "imbalance": o.imbalance_ns,
                   "eff": o.effective_utilisation, "switches": t.switches, "migrations": t.migrations}
            for event, _, _ in traced:
                row[event] = _counter(o.op, event, t.thread)
            if ompt:
                kinds = sorted(t.barrier_ns.items(), key=lambda kv: kv[1], reverse=True)
                row.update({"barrier": sum(t.barrier_ns.values()), "lock": t.lock_ns, "acq": t.acquisitions,
                            "kinds": ", ".join(k.removeprefix("barrier-") for k, _ in kinds) or "-"})
            rows.append(row)
    table = Table(columns, rows, caption=f"the {len(summary.ranked)} ops with the most imbalance, one row per thread")
    notes = []
    if summary.ompt_dropped is not None:
        records, threads = summary.ompt_dropped
        notes.append(f"the OMPT tool's tables were full: {records:,} (thread, op) records and "
                     f"{threads} threads were not kept")
    return Section("contention", "Contention: where the threads waited", lines, [table], notes)


# The parts of a thread's time while ops ran, in the order a chart stacks them.
TIME_PARTS = ("working", "spin", "unsplit", "sleep", "off_other", "unknown")


@dataclass
class ThreadOpTime:
    """One team thread's time while ops ran (the ops' self wall time, summed), split into parts (ns):
    working and spin (on CPU), unsplit (on CPU, spin not measured), sleep (off CPU in the op's waits),
    off_other (off CPU outside them), unknown (its CPU time was not counted)."""

    thread: int
    label: str
    wall_ns: float = 0.0
    parts: dict[str, float] = field(default_factory=dict)


@dataclass
class OpTimeSplit:
    threads: list[ThreadOpTime]
    spin_method: str  # how spin was measured: "ompt", "samples", or "none"


def op_time_split(profile: Profile, contention: Contention | None) -> OpTimeSplit | None:
    """Per team thread, the ops' self wall time split into working, spinning and off-CPU time; None
    where the contention analysis has nothing."""
    if contention is None or not contention.ops:
        return None
    members = set(contention.members)
    out = {k: ThreadOpTime(k, thread_label(k), parts=dict.fromkeys(TIME_PARTS, 0.0))
           for k in team_order(profile) if k in members}
    # Without samples (exact mode) and without OMPT, no spin was measured at all: the analysis's 0 for
    # an op no sample landed in means nothing there, so the CPU time stays unsplit.
    spin_measured = contention.method == "ompt" or profile.sampling is not None
    for o in contention.ops:
        for t in o.threads:
            tt = out[t.thread]
            wall = float(o.wall_ns)
            tt.wall_ns += wall
            spin, sleep = t.spin_ns or 0.0, t.sleep_ns or 0.0
            if t.cpu_ns is None:
                tt.parts["spin"] += spin
                tt.parts["sleep"] += sleep
                tt.parts["unknown"] += max(0.0, wall - spin - sleep)
                continue
            if t.spin_ns is None or not spin_measured:
                tt.parts["unsplit"] += t.cpu_ns
            else:
                tt.parts["working"] += max(0.0, t.cpu_ns - spin)
                tt.parts["spin"] += spin
            tt.parts["sleep"] += sleep
            # samples: sleep is wall - CPU, nothing is left; OMPT: sleep is the waits' off-CPU part only
            tt.parts["off_other"] += max(0.0, wall - t.cpu_ns - sleep)
    return OpTimeSplit(list(out.values()), contention.method if spin_measured else "none")
