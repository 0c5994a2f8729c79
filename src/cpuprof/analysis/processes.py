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


# The processes table lists at most this many (the busiest first past it): a run of thousands of
# short-lived processes still reports in bounded memory and a readable table.
MAX_PROCESS_ROWS = 200


@dataclass
class ProcessRow:
    """One process of a run, as its table row says it: all that is kept of a process's profile
    once it has been read (a run of 10,000 processes keeps 10,000 of these, not their profiles)."""

    role: str
    pid: int
    ppid: int | None
    wall_ns: int | None
    cpu_ns: int | None
    ops: int | None
    op_ns: int | None
    ended: str
    directory: str
    followed: bool = True
    changes: tuple[str, ...] = ()  # settings the process changed after its import of torch


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
    settings = profile.settings
    changes: tuple[str, ...] = ()
    if settings is not None and settings.at_start is not None and settings.in_force is not None:
        changes = tuple(changes_since_start(settings.at_start, settings.in_force))
    return ProcessRow(role=role if p.followed or profiled else f"{role}, never imported torch", pid=meta.pid,
                      ppid=meta.ppid, wall_ns=wall, cpu_ns=cpu, ops=ops,
                      op_ns=op_time_ns(profile) if profiled else None,
                      ended=ending(profile), directory=str(p.directory), followed=p.followed, changes=changes)


def busiest(processes: list[ProcessProfile]) -> ProcessProfile | None:
    """The process that ran the most op time (the first such, in pid order, on a tie)."""
    profiled = [p for p in processes if p.profile.profiled]
    return max(profiled, key=lambda p: op_time_ns(p.profile)) if profiled else None


def busiest_row(rows: list[ProcessRow]) -> ProcessRow | None:
    """:func:`busiest`, from the rows alone."""
    profiled = [r for r in rows if r.op_ns is not None]
    return max(profiled, key=lambda r: r.op_ns or 0) if profiled else None


_COLUMNS = [
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
]
_TABLE_KEYS = [c.key for c in _COLUMNS]


def processes_section(rows: list[ProcessRow], shown: ProcessRow | None, unsaved: list[int] | None = None) -> Section:
    unsaved = unsaved or []
    listed = rows
    if len(rows) > MAX_PROCESS_ROWS:  # the busiest, kept in pid order
        kept = sorted(rows, key=lambda r: r.op_ns or 0, reverse=True)[:MAX_PROCESS_ROWS]
        listed = sorted(kept, key=lambda r: (r.followed, r.pid))
    table = Table(
        columns=_COLUMNS,
        rows=[{key: getattr(r, key) for key in _TABLE_KEYS} for r in listed],
        caption="the program's process, then every process it started that imported torch, by pid",
    )
    lines = []
    if shown is not None:
        lines.append(f"The report below is of {shown.role} (pid {shown.pid}), the process that ran the most op time; "
                     f"one process's own report: {cpuprof_command('report', 'DIR/profile.json')} with DIR from the "
                     "last column")
    else:
        lines.append("No process was profiled: none imported torch.")
    if len(listed) < len(rows):
        lines.append(f"{len(rows):,} processes: the table lists the {len(listed)} that ran the most op time; every "
                     "process's profile is in processes/PID")
    changed = [r for r in rows if r.changes]
    for r in changed[:MAX_PROCESS_ROWS]:
        lines.append(f"{r.role} (pid {r.pid}) changed its settings after its import of torch: {'; '.join(r.changes)}")
    if len(changed) > MAX_PROCESS_ROWS:
        lines.append(f"... and {len(changed) - MAX_PROCESS_ROWS:,} more processes changed their settings")
    if shown is not None:
        lines.append("tokens: a program's are counted from the decode steps found in its op stream (the Decode "
                     "section below, where there are steps); the program's own count is the one to trust")
    if unsaved:
        shown_pids = ", ".join(str(p) for p in unsaved[:20]) + (", ..." if len(unsaved) > 20 else "")
        lines.append(f"{len(unsaved)} more process{'es' if len(unsaved) != 1 else ''} started profiling but saved "
                     f"nothing (killed before its first checkpoint): pid {shown_pids}")
    return Section("processes", "Processes", lines=lines, tables=[table])


def processes_report(rows: list[ProcessRow], shown: ProcessProfile | None, top: int = defaults.TOP_OPS,
                     unsaved: list[int] | None = None, whole_run: bool = False) -> Report:
    """The full report of ``shown`` (the busiest process, :func:`busiest_row`), with the table of
    every process's row first."""
    from .report import build_report

    report = Report(title="cpuprof run") if shown is None else build_report(shown.profile, top=top, whole_run=whole_run)
    report.sections.insert(0, processes_section(rows, row(shown) if shown is not None else None, unsaved))
    return report
