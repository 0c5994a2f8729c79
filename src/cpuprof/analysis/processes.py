"""A run whose program started other processes (``cpuprof run`` follows every Python process that
imports torch: :mod:`cpuprof.launch.followed`): one row per process, and the full report of the
one that ran the most op time, which is where a serving engine's model runs (its engine-core or
worker process, not the front end the user started).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from .. import defaults
from ..model import CPU_EVENT, Profile
from ..model.run_layout import ProcessProfile
from ..safe_text import cpuprof_command
from .decode import changes_since_start
from .report_model import Column, Report, Section, Table

CHECKPOINT_PREFIX = "checkpoint"


@dataclass
class ProcessRow:
    role: str
    pid: int
    ppid: int | None
    wall_ns: int | None
    cpu_ns: int | None
    ops: int | None
    op_ns: int | None
    ended: str
    directory: str


def op_time_ns(profile: Profile) -> int:
    """Time inside ATen ops on the process's threads: the sum of every op's self time."""
    return sum(op.self_ns for op in profile.ops if op.kind == "op")


def ending(profile: Profile) -> str:
    status = profile.status
    if status.complete:
        return "saved at its end"
    reason = status.reason or "did not finish"
    if reason.startswith(CHECKPOINT_PREFIX):
        return "killed, or still running when the run ended: its last checkpoint"
    return reason


def row(p: ProcessProfile) -> ProcessRow:
    profile = p.profile
    meta = profile.meta
    role = meta.role or (f"the program ({os.path.basename(meta.argv[0])})" if meta.argv else "the program")
    profiled = profile.profiled
    cpu = None
    if profiled and any(t.cpu_ns is not None for t in profile.threads):
        cpu = sum(t.cpu_ns or 0 for t in profile.threads)
    wall = profile.collection.wall_ns if profile.collection is not None else None
    ops = sum(op.calls for op in profile.ops if op.kind == "op") if profiled else None
    return ProcessRow(role=role if p.followed or profiled else f"{role}, never imported torch", pid=meta.pid,
                      ppid=meta.ppid, wall_ns=wall, cpu_ns=cpu, ops=ops,
                      op_ns=op_time_ns(profile) if profiled else None,
                      ended=ending(profile), directory=str(p.directory))


def busiest(processes: list[ProcessProfile]) -> ProcessProfile | None:
    """The process that ran the most op time (the first such, in pid order, on a tie)."""
    profiled = [p for p in processes if p.profile.profiled]
    return max(profiled, key=lambda p: op_time_ns(p.profile)) if profiled else None


def processes_section(processes: list[ProcessProfile], shown: ProcessProfile | None,
                      unsaved: list[int] | None = None) -> Section:
    unsaved = unsaved or []
    rows = [row(p) for p in processes]
    table = Table(
        columns=[
            Column("role", "process", help="what the process is to its program: its multiprocessing name, the "
                                           "title it set, or what python ran"),
            Column("pid", "pid", "int"),
            Column("ppid", "parent", "int", help="the pid of the process that started it"),
            Column("wall_ns", "profiled for", "ns", help="wall time from its import of torch (or its window's "
                                                          "start) to its end (or its last checkpoint)"),
            Column("cpu_ns", "CPU", "ns", help=f"CPU time of its threads while profiled ({CPU_EVENT})"),
            Column("ops", "ops", "count", help="ATen op calls"),
            Column("op_ns", "op time", "ns", help="time inside ATen ops, summed over its threads (self times)"),
            Column("ended", "how it ended"),
            Column("directory", "profile in"),
        ],
        rows=[r.__dict__ for r in rows],
        caption="the program's process, then every process it started that imported torch, by pid",
    )
    lines = []
    if shown is not None:
        r = row(shown)
        lines.append(f"The report below is of {r.role} (pid {r.pid}), the process that ran the most op time; "
                     f"one process's own report: {cpuprof_command('report', 'DIR/profile.json')} with DIR from the "
                     "last column")
    else:
        lines.append("No process was profiled: none imported torch.")
    for p, r in zip(processes, rows, strict=True):
        settings = p.profile.settings
        if settings is None or settings.at_start is None or settings.in_force is None:
            continue
        changes = changes_since_start(settings.at_start, settings.in_force)
        if changes:
            lines.append(f"{r.role} (pid {r.pid}) changed its settings after its import of torch: {'; '.join(changes)}")
    if shown is not None:
        lines.append("tokens: not known to cpuprof for a program's processes (it counts the tokens of its own "
                     "decode only); the program's own count is the one to trust")
    if unsaved:
        lines.append(f"{len(unsaved)} more process{'es' if len(unsaved) != 1 else ''} started profiling but saved "
                     f"nothing (killed before its first checkpoint): pid {', '.join(str(p) for p in unsaved)}")
    return Section("processes", "Processes", lines=lines, tables=[table])


def processes_report(processes: list[ProcessProfile], top: int = defaults.TOP_OPS,
                     unsaved: list[int] | None = None) -> Report:
    """The busiest process's full report, with the processes table first."""
    from .report import build_report

    shown = busiest(processes)
    if shown is None:
        report = Report(title="cpuprof run")
    else:
        report = build_report(shown.profile, top=top)
    report.sections.insert(0, processes_section(processes, shown, unsaved))
    return report
