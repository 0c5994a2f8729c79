"""One report for a multi-process decode: every rank, and the group as one.

Per rank: its throughput and step latency, and (tensor-parallel) where a decode step's time goes:
computing its shard, all-reducing the partial sums, and, inside the all-reduce, waiting for the
slowest rank to arrive. The ranks time every all-reduce on CLOCK_MONOTONIC, one clock for the whole
machine, so the k-th all-reduce of every rank can be set side by side: the last rank to enter it
is the one the others waited for, and the time from that last entry to a rank's exit is the
transfer itself. Instances share nothing: their throughput adds up.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..model import Profile, format_cpulist
from ..model.ranks import MultiRun
from ..model.run_layout import rank_dirname
from ..model.workload import Collectives
from ..safe_text import cpuprof_command
from ..units import fmt_bytes, fmt_ns, fmt_percent
from .report_model import Column, Report, Section, Table
from .threads import is_backend_thread

COLLECTIVE_OP_PREFIXES = ("c10d::", "c10d_functional::", "_c10d_functional::")
# An all-reduce moving less than this per second is paying a per-call cost, not a bandwidth one.
SLOW_COLLECTIVE_BYTES_PER_S = 1e9
# A main thread runnable but waiting for a CPU this share of the time is competing for it.
CROWDED_RUN_DELAY_SHARE = 0.02
# A rank that waits this share of its step for the others is held back by one of them: name it.
SKEW_SHARE = 0.05


@dataclass
class StepSplit:
    """Mean time of a measured decode step, split (tensor-parallel ranks only)."""

    step_ns: float
    compute_ns: float  # the step outside all-reduces
    all_reduce_ns: float  # inside all-reduces: transfer plus waiting
    wait_ns: float  # inside all-reduces, before the last rank arrived
    calls_per_step: float
    payload_bytes_per_step: float

    @property
    def transfer_ns(self) -> float:
        return self.all_reduce_ns - self.wait_ns


@dataclass
class RankFigures:
    rank: int
    profile: Profile | None
    tokens_per_s: float | None = None
    p50_ms: float | None = None
    p99_ms: float | None = None
    ttft_s: float | None = None
    steps_done: int = 0
    new_tokens: int = 0
    threads_in_force: int | None = None
    openmp: str | None = None
    memory: str | None = None
    split: StepSplit | None = None
    all_reduce_calls: int | None = None  # every call the model made, prefill included
    collective_op_calls: int | None = None  # c10d ops the profiler's op hook saw
    collective_op_bytes: int | None = None  # their tensors' bytes, over every call
    collective_op_ns: int | None = None  # their time as ops (enqueueing: gloo waits after the op returns)
    wall_ns: int | None = None  # the profiled session
    cpu_ns: int | None = None  # every profiled thread's CPU time in it
    backend_cpu_ns: int | None = None  # the communication backend's own threads' CPU time (gloo, oneCCL)
    main_run_delay_ns: int | None = None  # the main thread's time runnable but waiting for a CPU
    warnings: list[str] = field(default_factory=list)


@dataclass
class GroupFigures:
    mode: str
    ranks: list[RankFigures]
    tokens_per_s: float | None  # tp: the group's (the slowest rank's); instances: their sum
    complete: bool


def arrival_waits(collectives: list[Collectives | None]) -> list[list[int]]:
    """For each rank, how long each of its all-reduces waited for the last rank to enter the
    same call (matched by order: every rank makes the same calls). Calls not every rank made
    (a rank that stopped early) get no wait: there is nothing to compare them with."""
    present = [c for c in collectives if c is not None]
    common = min((len(c.enter_ns) for c in present), default=0)
    last_enter = [max(c.enter_ns[k] for c in present) for k in range(common)]
    waits: list[list[int]] = []
    for c in collectives:
        if c is None:
            waits.append([])
            continue
        waits.append([last_enter[k] - c.enter_ns[k] if k < common else 0 for k in range(len(c.enter_ns))])
    return waits


def step_split(profile: Profile, waits: list[int]) -> StepSplit | None:
    """The measured steps' mean split into compute, all-reduce and waiting."""
    wl = profile.workload
    if wl is None or wl.collectives is None:
        return None
    measured = list(range(wl.warmup_steps, min(wl.steps_done, len(wl.step_latencies_s))))
    if not measured:
        return None
    c = wl.collectives
    in_step: dict[int, list[int]] = {}
    for k, step in enumerate(c.step):
        in_step.setdefault(step, []).append(k)
    n = len(measured)
    step_ns = sum(wl.step_latencies_s[s] for s in measured) * 1e9 / n
    calls = [k for s in measured for k in in_step.get(s, [])]
    reduce_ns = sum(c.exit_ns[k] - c.enter_ns[k] for k in calls) / n
    wait_ns = sum(min(waits[k], c.exit_ns[k] - c.enter_ns[k]) for k in calls if k < len(waits)) / n
    return StepSplit(step_ns=step_ns, compute_ns=max(step_ns - reduce_ns, 0.0), all_reduce_ns=reduce_ns,
                     wait_ns=wait_ns, calls_per_step=len(calls) / n,
                     payload_bytes_per_step=sum(c.payload_bytes[k] for k in calls) / n)


def group_figures(run: MultiRun, profiles: list[Profile | None]) -> GroupFigures:
    waits = arrival_waits([p.workload.collectives if p is not None and p.workload is not None else None
                           for p in profiles])
    ranks = []
    for r, profile, rank_waits in zip(run.ranks, profiles, waits, strict=True):
        f = RankFigures(rank=r.rank, profile=profile)
        ranks.append(f)
        if profile is None:
            continue
        _collective_ops(profile, f)
        _settings(profile, f)
        wl = profile.workload
        if wl is None:
            continue
        f.steps_done, f.new_tokens, f.ttft_s = wl.steps_done, wl.new_tokens, wl.ttft_s
        if wl.figures is not None:
            f.tokens_per_s, f.p50_ms, f.p99_ms = wl.figures.tokens_per_s, wl.figures.p50_ms, wl.figures.p99_ms
        if wl.collectives is not None:
            f.all_reduce_calls = len(wl.collectives.enter_ns)
            f.split = step_split(profile, rank_waits)
    rates = [f.tokens_per_s for f in ranks]

    known = [r for r in rates if r is not None]
    if not known or len(known) < len(rates):
        total = None
    elif run.mode == "tp":
        total = min(known)  # the ranks step together: the group is as fast as its slowest
    else:
        total = sum(known)
    complete = run.finished and all(r.returncode == 0 for r in run.ranks)
    return GroupFigures(mode=run.mode, ranks=ranks, tokens_per_s=total, complete=complete)


def _settings(profile: Profile, f: RankFigures) -> None:
    settings = profile.settings
    if settings is None:
        return
    f.warnings = list(settings.warnings)
    in_force = settings.in_force
    if in_force is not None:
        f.threads_in_force = in_force.torch.num_threads if in_force.torch is not None else None
        active = in_force.openmp.active
        f.openmp = active.runtime if active is not None else None
        policy = in_force.mempolicy
        f.memory = policy.mode + (f" {','.join(map(str, policy.nodes))}" if policy.nodes else "")


def _collective_ops(profile: Profile, f: RankFigures) -> None:
    """The c10d ops the op hook saw: calls, their tensors' bytes (from the recorded shapes), op time."""
    if not profile.profiled:
        return
    from .gemm import ELEMENT_BYTES

    ops = [o for o in profile.ops if o.kind == "op" and o.name.startswith(COLLECTIVE_OP_PREFIXES)]
    f.collective_op_calls = sum(o.calls for o in ops)
    f.collective_op_ns = sum(o.incl_ns for o in ops)
    total = 0
    for o in ops:
        first = o.inputs[0] if o.inputs else None
        tensors = (first.items or []) if first is not None and first.kind == "tensor_list" else [first]
        for t in tensors:
            if t is not None and t.kind == "tensor" and t.sizes is not None and t.dtype in ELEMENT_BYTES:
                elements = 1
                for size in t.sizes:
                    elements *= size
                total += o.calls * elements * ELEMENT_BYTES[t.dtype]
    f.collective_op_bytes = total
    c = profile.collection
    if c is not None:
        f.wall_ns = c.stopped_ns - c.started_ns
        f.cpu_ns = sum(t.cpu_ns or 0 for t in profile.threads)
        f.backend_cpu_ns = sum(t.cpu_ns or 0 for t in profile.threads if is_backend_thread(t))
        main = next((t for t in profile.threads if t.tid == profile.meta.pid), None)
        f.main_run_delay_ns = main.run_delay_ns if main is not None else None


PROCESS_COLUMNS = [
    Column("rank", "rank", "int", "RANK of the process"),
    Column("cpus", "CPUs", "text", "the CPUs it was pinned to"),
    Column("node", "mem", "text", "memory policy in force (bind N: NUMA node N; default: not bound)"),
    Column("threads", "thr", "int", "torch threads in force"),
    Column("openmp", "OpenMP", "text", "the OpenMP runtime serving it"),
    Column("wall_ns", "profiled", "ns", "wall time from its torch import to its end"),
    Column("busy", "busy thr", "ratio", "CPU time of its threads over that wall time: threads busy on average"),
    Column("op_calls", "c10d ops", "int", "c10d collective ops (all_reduce, broadcast, ...) it called"),
    Column("op_bytes", "c10d bytes", "bytes", "their tensors' bytes, every call"),
    Column("op_ns", "c10d op time", "ns", "time inside those ops: the enqueue; gloo's transfer and the wait for the "
                                          "other processes come after the op returns, in Work.wait()"),
    Column("status", "status", "text", "ok, or how it ended (the line is below the table)"),
]

RANK_COLUMNS = [
    Column("rank", "rank", "int", "the process's rank (tensor-parallel) or instance number"),
    Column("cpus", "CPUs", "text", "the CPUs it was pinned to"),
    Column("node", "mem", "text", "memory policy in force (bind N: NUMA node N; default: not bound)"),
    Column("threads", "thr", "int", "torch threads in force"),
    Column("openmp", "OpenMP", "text", "the OpenMP runtime serving it"),
    Column("tokens_per_s", "tok/s", "ratio", "decode tokens per second over its measured steps"),
    Column("p50_ns", "p50 step", "ns", "median decode step latency"),
    Column("p99_ns", "p99 step", "ns", "99th-percentile decode step latency"),
    Column("ttft_ns", "TTFT", "ns", "time to first token (prefill)"),
    Column("steps", "steps", "text", "decode steps done of those asked"),
    Column("status", "status", "text", "ok, or how it ended (the line is below the table)"),
]

SPLIT_COLUMNS = [
    Column("rank", "rank", "int", "tensor-parallel rank"),
    Column("step_ns", "step", "ns", "mean measured decode step"),
    Column("compute_ns", "compute", "ns", "the step outside all-reduces: this rank's shard of the model"),
    Column("transfer_ns", "reduce", "ns", "inside all-reduces, from the last rank's arrival to this rank's exit: the "
                                          "backend's own time (the transfer and its threads' hand-offs)"),
    Column("wait_ns", "skew wait", "ns", "inside all-reduces, waiting for the last rank to arrive"),
    Column("collective_share", "in coll.", "share", "share of the step inside all-reduces (transfer + skew wait)"),
    Column("calls", "calls/step", "ratio", "all-reduces per decode step (two per layer: after attention and MLP)"),
    Column("bytes", "bytes/step", "bytes", "all-reduce payload per decode step (the tensor reduced; a ring moves "
                                          "about 2(N-1)/N of it per rank)"),
    Column("op_calls", "c10d ops", "int", "c10d collective ops the profiler saw on this rank, prefill included"),
    Column("backend_cpu", "backend CPU", "share", "CPU time of the backend's own threads (gloo_tcp_loop, "
                                                   "pt_gloo_runloop, ...) over the profiled wall time"),
    Column("main_wait", "main runq", "share", "the main thread's run-queue delay (runnable, waiting for a CPU) over "
                                              "the profiled wall time"),
]


# Beyond this many ranks, the commands for each rank's own report are the first few and the last.
MAX_RANK_COMMANDS = 4


def ranks_report(run: MultiRun, profiles: list[Profile | None], directory: Path) -> Report:
    """The group's report; ``profiles``: each rank's, in ``run.ranks`` order (None: saved none), as
    loaded from ``directory`` (named in the report, never read here)."""
    g = group_figures(run, profiles)
    first = next((p for p in profiles if p is not None and p.workload is not None), None)
    model = ""
    if first is not None and first.workload is not None:
        w = first.workload
        model = f"{w.model.name}, {w.model.dtype}, batch {w.batch}, {w.new_tokens} new tokens"
    if run.mode == "nproc":
        program = run.argv[run.argv.index("--") + 1:] if "--" in run.argv else []
        title = f"cpuprof run: {run.world_size} processes, torchrun-style" + (
            f": {' '.join(program)}" if program else "")
    elif run.mode == "tp":
        title = f"cpuprof decode: tensor-parallel over {run.world_size} ranks ({run.backend})" + (
            f": {model}" if model else "")
    else:
        title = f"cpuprof decode: {run.world_size} independent instances" + (f": {model}" if model else "")
    report = Report(title=title)
    if not g.complete:
        report.warnings.append("PARTIAL: " + ("; ".join(run.failures) if run.failures else
                                               "not every rank finished"))
    lines = []
    if g.tokens_per_s is not None:
        if run.mode == "tp":
            lines.append(f"Group throughput {g.tokens_per_s:.2f} tokens/s: the ranks decode the same tokens in "
                         "lockstep, so the group runs at its slowest rank's rate.")
        else:
            lines.append(f"Aggregate throughput {g.tokens_per_s:.2f} tokens/s: the sum of {run.world_size} "
                         "instances decoding side by side; each one's latency is its own row.")
    if run.mode == "tp":
        lines.extend(_tp_lines(g))
    rows = []
    for r, f in zip(run.ranks, g.ranks, strict=True):
        rows.append({
            "rank": r.rank, "cpus": _cpus(r.cpus), "node": f.memory, "threads": f.threads_in_force or r.threads,
            "openmp": f.openmp, "tokens_per_s": f.tokens_per_s,
            "p50_ns": None if f.p50_ms is None else f.p50_ms * 1e6,
            "p99_ns": None if f.p99_ms is None else f.p99_ms * 1e6,
            "ttft_ns": None if f.ttft_s is None else f.ttft_s * 1e9,
            "steps": f"{f.steps_done}/{f.new_tokens}" if f.profile is not None else None,
            "status": "ok" if r.returncode == 0 else ("running" if r.returncode is None else "failed"),
        })
    table = Table(columns=RANK_COLUMNS, rows=rows, caption="one row per process")
    if run.mode == "nproc":
        table = Table(columns=PROCESS_COLUMNS, caption="one row per process", rows=[
            {"rank": row["rank"], "cpus": row["cpus"], "node": row["node"], "threads": row["threads"],
             "openmp": row["openmp"], "wall_ns": f.wall_ns,
             "busy": f.cpu_ns / f.wall_ns if f.cpu_ns is not None and f.wall_ns else None,
             "op_calls": f.collective_op_calls, "op_bytes": f.collective_op_bytes, "op_ns": f.collective_op_ns,
             "status": row["status"]} for row, f in zip(rows, g.ranks, strict=True)])
    titles = {"tp": "Ranks", "instances": "Instances", "nproc": "Processes"}
    section = Section(id="ranks", title=titles.get(run.mode, "Ranks"), lines=lines, tables=[table])
    section.notes.extend(run.failures)
    for f in g.ranks:
        section.notes.extend(f"rank {f.rank}: {w}" for w in f.warnings)
    # A command for each rank, never a template: pasted, each runs.
    commands = [cpuprof_command("report", directory / rank_dirname(str(f.rank))) for f in g.ranks]
    shown = commands if len(commands) <= MAX_RANK_COMMANDS else [*commands[:MAX_RANK_COMMANDS - 1], "...", commands[-1]]
    section.notes.append("each rank's own report: " + "; ".join(shown))
    report.sections.append(section)
    if run.mode == "tp":
        split_rows = []
        for f in g.ranks:
            s = f.split
            if s is None:
                continue
            split_rows.append({"rank": f.rank, "step_ns": s.step_ns, "compute_ns": s.compute_ns,
                               "transfer_ns": s.transfer_ns, "wait_ns": s.wait_ns,
                               "collective_share": s.all_reduce_ns / s.step_ns if s.step_ns else None,
                               "calls": s.calls_per_step, "bytes": s.payload_bytes_per_step,
                               "op_calls": f.collective_op_calls,
                               "backend_cpu": _share(f.backend_cpu_ns, f.wall_ns),
                               "main_wait": _share(f.main_run_delay_ns, f.wall_ns)})
        if split_rows:
            report.sections.append(Section(
                id="collectives", title="Where a decode step goes: compute, all-reduce, waiting for the slowest rank",
                tables=[Table(columns=SPLIT_COLUMNS, rows=split_rows,
                              caption="mean of the measured decode steps, per rank")],
                notes=["all-reduces are timed where the model calls them (enqueue to result): the dispatcher's "
                       "c10d::allreduce_ op only enqueues the work for the backend's thread"]))
    return report


def _tp_lines(g: GroupFigures) -> list[str]:
    splits = [f for f in g.ranks if f.split is not None]
    if not splits:
        return []
    worst = max(splits, key=lambda f: f.split.all_reduce_ns / f.split.step_ns if f.split and f.split.step_ns else 0)
    s = worst.split
    assert s is not None
    per_call = s.transfer_ns / s.calls_per_step if s.calls_per_step else 0.0
    payload = s.payload_bytes_per_step / s.calls_per_step if s.calls_per_step else 0.0
    lines = [f"Rank {worst.rank} spends {fmt_percent(s.all_reduce_ns / s.step_ns)} of a decode step in all-reduces "
             f"({s.calls_per_step:.0f} per step): {fmt_percent(s.wait_ns / s.step_ns)} waiting for the slowest "
             f"rank to arrive, {fmt_percent(s.transfer_ns / s.step_ns)} in the reduction itself, "
             f"{fmt_ns(per_call)} per call for {fmt_bytes(payload)}" + (
                 # Far below any memory or loopback bandwidth: the per-call overhead is the cost.
                 ": at that size the backend's fixed cost per call, not bandwidth, sets the time."
                 if per_call and payload / (per_call / 1e9) < SLOW_COLLECTIVE_BYTES_PER_S else ".")]
    crowded = [(f, waited, backend) for f in splits
               if (waited := _share(f.main_run_delay_ns, f.wall_ns)) is not None and waited >= CROWDED_RUN_DELAY_SHARE
               and (backend := _share(f.backend_cpu_ns, f.wall_ns))]
    if crowded:
        waits = ", ".join(fmt_percent(waited) for _, waited, _ in crowded)
        used = ", ".join(fmt_percent(share) for _, _, share in crowded)
        who = ", ".join(str(f.rank) for f, _, _ in crowded)
        lines.append(f"Rank(s) {who}: the main thread waited {waits} of the time for a CPU while the backend's own "
                     f"threads used {used} of one; they share the rank's CPUs with the compute threads, so they "
                     "take turns (--threads below a rank's CPU count leaves the backend a CPU of its own).")
    waiting = max(splits, key=lambda f: f.split.wait_ns if f.split else 0.0)
    held_back = _share(waiting.split.wait_ns, waiting.split.step_ns) if waiting.split is not None else None
    if held_back is not None and held_back >= SKEW_SHARE:
        slowest = min(splits, key=lambda f: f.split.wait_ns if f.split else 0.0)
        lines.append(f"Skew: rank {waiting.rank} waits most for the others; rank {slowest.rank} waits least, so it "
                     "arrives last: its own report shows what slows it (its CPUs, threads, a neighbour).")
    return lines


def _share(part: float | None, whole: float | None) -> float | None:
    return part / whole if part is not None and whole else None


def _cpus(cpus: list[int]) -> str:
    return format_cpulist(cpus)
