"""Per-op figures: self and total time, CPU across the team's threads, busy threads.

A figure that cannot be right is never returned as a number. A thread cannot spend more CPU in
an op than the op's wall time: in exact mode a clock read a hair off is held to that bound; in
sampled mode CPU is charged by the threads' on-CPU intervals, which cannot exceed it, except the
part a sample placed (a thread's first sample, a kernel without switch records), where each sample
stands for 1/Hz of CPU, so an estimate can overshoot by sampling noise and is held to the bound
when within three standard deviations of it. Beyond that, the figure is inconsistent: it is
withheld and counted, so the report can say how many and why.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .. import defaults
from ..model import CPU_EVENT, SAMPLED, OpStat, Profile

# Derived metrics, where both events were counted: (name, numerator, denominator, scale, what it is).
RATIOS = (
    ("IPC", "instructions", "cycles", 1.0, "instructions per cycle"),
    ("cache miss%", "cache-misses", "cache-references", 100.0, "cache misses per 100 cache references"),
    ("LLC miss%", "LLC-load-misses", "LLC-loads", 100.0, "last-level cache load misses per 100 loads"),
    ("dTLB miss%", "dTLB-load-misses", "dTLB-loads", 100.0, "data TLB load misses per 100 loads"),
    ("branch miss%", "branch-misses", "branch-instructions", 100.0, "mispredicted branches per 100"),
)

# Relative slack before an exact CPU figure counts as inconsistent: clocks of different threads
# are read at slightly different instants.
EXACT_SLACK = 1.05


@dataclass
class OpRow:
    op: OpStat
    share: float  # of the summed self time of all ops
    self_per_call_ns: float
    cpu_ns: int | None  # CPU time of all threads while this op ran innermost; None: not measured
    cpu_per_thread: list[int | None]  # in profile.threads order
    busy_threads: float | None  # cpu_ns / self wall time; None: not measured or not reliable
    withheld: str | None = None  # why busy_threads is None although the op has samples
    capped: bool = False  # a thread's estimate was held to the op's wall time (sampling noise)


@dataclass
class OpTable:
    rows: list[OpRow]
    n_keys: int
    total_self_ns: int
    outside_cpu_ns: int | None  # CPU while no op ran (Python, framework, idle-spinning workers)
    profiler_cpu_ns: int | None = None  # CPU in cpuprof's own callbacks (sampled mode)
    withheld_inconsistent: int = 0  # ops whose CPU figure could not be right
    withheld_few_samples: int = 0
    capped: int = 0
    notes: list[str] = field(default_factory=list)


def cpu_is_statistical(profile: Profile) -> bool:
    """Whether per-op CPU is a sampling estimate: sampled mode, where the threads' switch records
    did not give it (a kernel without them, or most of it placed by samples)."""
    collection = profile.collection
    if collection is None or collection.mode != SAMPLED:
        return False
    return profile.sampling is None or not profile.sampling.cpu_by_interval


def counted_ratios(profile: Profile) -> list[tuple[str, str, str, float, str]]:
    """The RATIOS whose two events this profile counted."""
    return [r for r in RATIOS if profile.has_event(r[1]) and profile.has_event(r[2])]


def op_ratios(op: OpStat, ratios: list[tuple[str, str, str, float, str]]) -> dict[str, float | None]:
    """Each ratio of the op's own counts (its self totals); None where the denominator is zero."""
    out: dict[str, float | None] = {}
    for name, num, den, scale, _ in ratios:
        n, d = op.self_total(num) or 0, op.self_total(den) or 0
        out[name] = scale * n / d if d else None
    return out


def bounded_cpu(profile: Profile, cpu: int, wall: int) -> tuple[int | None, bool]:
    """One thread's CPU in an op, held to the op's wall time; (None, False) when inconsistent."""
    if cpu <= wall:
        return cpu, False
    if profile.collection is not None and profile.collection.mode == SAMPLED and profile.sampling:
        period = 1e9 / profile.sampling.hz
        sigma = math.sqrt(max(cpu / period, 1.0)) * period
        return (wall, True) if cpu - wall <= 3 * sigma else (None, False)
    return (wall, True) if cpu <= wall * EXACT_SLACK else (None, False)


def _special(profile: Profile, prefix: str) -> int | None:
    op = next((op for op in profile.ops if op.kind == "special" and op.name.startswith(prefix)), None)
    return op.self_total(CPU_EVENT) if op is not None and profile.has_event(CPU_EVENT) else None


def op_table(profile: Profile, top: int = defaults.TOP_OPS) -> OpTable:
    """The ops with the most self time, with their CPU figures."""
    collection = profile.collection
    ops = [op for op in profile.ops if op.kind == "op" and op.calls]
    total_self = sum(op.self_ns for op in ops)
    sampled = collection is not None and collection.mode == SAMPLED
    statistical = cpu_is_statistical(profile)
    has_cpu = profile.has_event(CPU_EVENT)
    # Exact mode reads the team at op boundaries only: CPU outside ops is not measured there (None),
    # which is not zero.
    table = OpTable(rows=[], n_keys=len(ops), total_self_ns=total_self,
                    outside_cpu_ns=_special(profile, "[outside") if sampled else None,
                    profiler_cpu_ns=_special(profile, "[cpuprof") if sampled else None)
    for op in sorted(ops, key=lambda o: o.self_ns, reverse=True):
        raw = op.counters_self.get(CPU_EVENT, [])
        measured = has_cpu and (not statistical or op.samples > 0)
        row = OpRow(op=op, share=op.self_ns / total_self if total_self else 0.0, self_per_call_ns=op.self_ns / op.calls,
                    cpu_ns=None, cpu_per_thread=[None] * len(profile.threads), busy_threads=None)
        if measured:
            per_thread: list[int | None] = []
            consistent = True
            for value in raw:
                bounded, capped = bounded_cpu(profile, value, op.self_ns)
                consistent = consistent and bounded is not None
                row.capped = row.capped or capped
                per_thread.append(bounded)
            if not consistent:
                row.withheld = "inconsistent"
                table.withheld_inconsistent += 1
            else:
                row.cpu_per_thread = per_thread
                row.cpu_ns = sum(v or 0 for v in per_thread)
                table.capped += row.capped
                if statistical and op.samples < defaults.MIN_SAMPLES:
                    row.withheld = "few samples"
                    table.withheld_few_samples += 1
                elif op.self_ns:
                    row.busy_threads = row.cpu_ns / op.self_ns
        table.rows.append(row)
    table.rows = table.rows[:top]
    return table


@dataclass
class RegionRow:
    region: OpStat
    cpu_ns: int | None  # CPU time of all threads inside it; None: not measured, or withheld
    withheld: bool = False  # the figure exceeded what the team could spend in the region's time


def region_rows(profile: Profile) -> list[RegionRow]:
    """Regions by total time, with the CPU time of all threads inside them."""
    regions = [op for op in profile.ops if op.kind == "region" and op.calls]
    has_cpu = profile.has_event(CPU_EVENT)
    rows = []
    for r in sorted(regions, key=lambda r: r.incl_ns, reverse=True):
        cpu = None
        withheld = False
        if has_cpu:
            bounded = [bounded_cpu(profile, v, r.incl_ns)[0] for v in r.counters_incl.get(CPU_EVENT, [])]
            withheld = any(b is None for b in bounded)
            cpu = None if withheld else sum(b or 0 for b in bounded)
        rows.append(RegionRow(region=r, cpu_ns=cpu, withheld=withheld))
    return rows
