"""Per-op figures: self and total time, CPU across the team's threads, busy threads.

A figure that cannot be right is never returned as a number: an op whose CPU time exceeds what
its threads could spend in its wall time (more busy threads than the team has) gets ``None``
and is counted, so the report can say how many such estimates it withheld and why.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .. import defaults
from ..model import CPU_EVENT, OpStat, Profile

# Relative slack before a CPU figure counts as impossible: clocks of different threads are read
# at slightly different instants, so exact figures can exceed the wall by a hair.
IMPOSSIBLE_SLACK = 1.05
# Below this self time a per-thread CPU > wall check is noise-dominated and not applied.
MIN_CHECKED_SELF_NS = 100_000


@dataclass
class OpRow:
    op: OpStat
    share: float  # of the summed self time of all ops
    self_per_call_ns: float
    cpu_ns: int | None  # CPU time of all threads while this op ran innermost; None: not measured
    cpu_per_thread: list[int | None]  # in profile.threads order
    busy_threads: float | None  # cpu_ns / self wall time; None: not measured or not reliable
    withheld: str | None = None  # why busy_threads is None although cpu_ns is known


@dataclass
class OpTable:
    rows: list[OpRow]
    n_keys: int
    total_self_ns: int
    outside_cpu_ns: int | None  # CPU while no op ran (Python, framework, idle-spinning workers)
    withheld_impossible: int = 0  # ops whose CPU estimate exceeded threads x wall
    withheld_few_samples: int = 0
    notes: list[str] = field(default_factory=list)


def op_table(profile: Profile, top: int = defaults.TOP_OPS) -> OpTable:
    """The ops with the most self time, with their CPU figures."""
    collection = profile.collection
    ops = [op for op in profile.ops if op.kind == "op" and op.calls]
    total_self = sum(op.self_ns for op in ops)
    sampled = collection is not None and collection.mode == "sampled"
    has_cpu = profile.has_event(CPU_EVENT)
    team = max(1, len(profile.threads))
    table = OpTable(rows=[], n_keys=len(ops), total_self_ns=total_self, outside_cpu_ns=None)
    for op in sorted(ops, key=lambda o: o.self_ns, reverse=True):
        per_thread_raw = op.counters_self.get(CPU_EVENT, [])
        measured = has_cpu and (not sampled or op.samples > 0)
        cpu = sum(per_thread_raw) if measured else None
        per_thread: list[int | None] = list(per_thread_raw) if measured else [None] * len(profile.threads)
        busy = None
        withheld = None
        if cpu is not None and op.self_ns:
            ratio = cpu / op.self_ns
            too_many = ratio > team * IMPOSSIBLE_SLACK
            one_thread_over = op.self_ns >= MIN_CHECKED_SELF_NS and any(
                v is not None and v > op.self_ns * IMPOSSIBLE_SLACK for v in per_thread)
            if too_many or one_thread_over:
                withheld = "impossible"
            elif sampled and op.samples < defaults.MIN_SAMPLES:
                withheld = "few samples"
            else:
                busy = ratio
        row = OpRow(op=op, share=op.self_ns / total_self if total_self else 0.0,
                    self_per_call_ns=op.self_ns / op.calls, cpu_ns=cpu, cpu_per_thread=per_thread,
                    busy_threads=busy, withheld=withheld)
        if withheld == "impossible":
            # The estimate is not printed at all: not the total, not the per-thread split.
            row.cpu_ns = None
            row.cpu_per_thread = [None] * len(profile.threads)
            table.withheld_impossible += 1
        elif withheld == "few samples":
            table.withheld_few_samples += 1
        table.rows.append(row)
    table.rows = table.rows[:top]
    outside = next((op for op in profile.ops if op.kind == "special" and op.name.startswith("[outside")), None)
    if outside is not None and has_cpu:
        table.outside_cpu_ns = outside.self_total(CPU_EVENT)
    return table


@dataclass
class RegionRow:
    region: OpStat
    cpu_ns: int | None  # CPU time of all threads inside it; None: not measured, or withheld
    withheld: bool = False  # the estimate exceeded what the team could spend in the region's time


def region_rows(profile: Profile) -> list[RegionRow]:
    """Regions by total time, with the CPU time of all threads inside them."""
    regions = [op for op in profile.ops if op.kind == "region" and op.calls]
    has_cpu = profile.has_event(CPU_EVENT)
    team = max(1, len(profile.threads))
    rows = []
    for r in sorted(regions, key=lambda r: r.incl_ns, reverse=True):
        cpu = r.incl_total(CPU_EVENT) if has_cpu else None
        withheld = cpu is not None and cpu > team * r.incl_ns * IMPOSSIBLE_SLACK
        rows.append(RegionRow(region=r, cpu_ns=None if withheld else cpu, withheld=withheld))
    return rows
