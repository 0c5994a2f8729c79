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
from .rank_groups import RankTimeline, jobs, rank_timeline, ranks_section
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
    cost: ObservingCost | None = None  # what cpuprof measured itself costing the process
    rank: RankTimeline | None = None  # its collectives, where it is a rank of a torch.distributed job
    host: str | None = None  # in a merged run: its host's label


@dataclass(frozen=True)
class ObservingCost:
    """What observing one process cost it, as the process measured it (model.Overhead): the parts
    cpuprof can time from inside. torch's own dispatch to a callback it cannot (a bench measures it)."""

    callbacks_ns: int  # inside cpuprof's op callbacks, on the dispatching threads
    per_op_ns: float
    collector_cpu_ns: int  # the collector thread's CPU: thread discovery, draining and joining samples
    opening_cpu_ns: int  # of that, opening counters on the threads found (once per thread)
    sampler_cpu_ns: int | None  # the Python stack sampler thread, where Python stacks were read
    checkpoints: int
    checkpoint_ns: int  # the checkpoints' saves, wall time (the final save is after the profile's end)
    boot_ns: int | None  # cpuprof's start-up in the process (None: not a followed process)

    def program_threads_ns(self) -> int:
        """What cpuprof took of the program's own time: its start-up, the callbacks on the threads
        that ran ops, and the checkpoints (whose thread holds the GIL). The collector and the Python
        sampler run on threads of their own, beside the program: their CPU is not in it (summed with
        it, a short process's share could pass 100%)."""
        return self.callbacks_ns + self.checkpoint_ns + (self.boot_ns or 0)


def observing_cost(profile: Profile) -> ObservingCost | None:
    o = profile.overhead
    if o is None or not profile.profiled:
        return None
    py = profile.sampling.python if profile.sampling is not None else None
    return ObservingCost(callbacks_ns=o.hook_ns, per_op_ns=o.per_op_ns, collector_cpu_ns=o.discovery_cpu_ns,
                         opening_cpu_ns=o.scan_setup_cpu_ns, sampler_cpu_ns=py.cpu_ns if py is not None else None,
                         checkpoints=o.checkpoints, checkpoint_ns=o.checkpoint_ns, boot_ns=o.boot_ns)


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


def _short(words: list[str]) -> str:
    """A command as a table names it: its program's file name ("torchrun", "generate.py"), or a
    Python's module or script ("python -m torch.distributed.run" reads "torch.distributed.run")."""
    name = os.path.basename(words[0])
    if not name.startswith("python"):
        return name
    rest = iter(words[1:])
    for word in rest:  # Python's own flags (-u, -X dev, -O) before the script or module
        if word == "-m":
            return next(rest, name)
        if word in ("-X", "-W"):
            next(rest, None)
        elif not word.startswith("-"):
            return os.path.basename(word)
    return name


def row(p: ProcessProfile) -> ProcessRow:
    profile = p.profile
    meta = profile.meta
    role = meta.role or (f"the program ({_short(meta.program())})" if meta.program() else "the program")
    if p.host is not None:
        role = f"{p.host}: {role}"
    profiled = profile.profiled
    cpu = None
    if profiled and any(t.cpu_ns is not None for t in profile.threads):
        cpu = sum(t.cpu_ns or 0 for t in profile.threads)
    wall = profile.collection.wall_ns if profile.collection is not None else None
    ops = sum(op.calls for op in profile.ops if op.kind == "op") if profiled else None
    settings = profile.settings
    changes: tuple[str, ...] = ()
    if settings is not None and settings.at_start is not None and settings.in_force is not None:
        changes = tuple(changes_since_start(settings.at_start, settings.in_force, settings.front_end))
    return ProcessRow(role=role if p.followed or profiled else f"{role}, never imported torch", pid=meta.pid,
                      ppid=meta.ppid, wall_ns=wall, cpu_ns=cpu, ops=ops,
                      op_ns=op_time_ns(profile) if profiled else None,
                      ended=ending(profile), directory=str(p.directory), followed=p.followed, changes=changes,
                      cost=observing_cost(profile),
                      rank=rank_timeline(profile, role, p.host, p.clock_offset_ns, p.clock_residual_ns),
                      host=p.host)


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

_COST_COLUMNS = [
    Column("role", "process"),
    Column("pid", "pid", "int"),
    Column("boot_ns", "start-up", "ns", help="wall time cpuprof took in the process to start: its import as Python "
                                             "started (none in a forked process: its parent's), then starting the "
                                             "profile inside the import of torch"),
    Column("callbacks_ns", "callbacks", "ns", help="time inside cpuprof's op callbacks on the threads that ran ops"),
    Column("per_op_ns", "per op", "ns", help="callbacks per ATen op call"),
    Column("collector_cpu_ns", "collector CPU", "ns", help="CPU time of cpuprof's collector thread: finding "
                                                           "threads, draining the sample rings, joining samples "
                                                           "to ops"),
    Column("opening_cpu_ns", "of it opening", "ns", help="of the collector's CPU, opening counters and sample "
                                                         "rings on the threads it found (once per thread)"),
    Column("sampler_cpu_ns", "Python sampler", "ns", help="CPU time of the Python stack sampler thread (- : "
                                                           "Python stacks not read)"),
    Column("checkpoints", "checkpoints", "int", help="profiles saved while the process ran (so a kill keeps them)"),
    Column("checkpoint_ns", "saving them", "ns", help="wall time the checkpoints took, holding the GIL part of it"),
    Column("share", "of its time", "share", help="start-up, callbacks and checkpoints (what cpuprof took on the "
                                                 "program's own threads) over the time the process was "
                                                 "profiled (start-up included); the collector's and the "
                                                 "sampler's CPU ran beside it and are not in it"),
]


def cost_table(rows: list[ProcessRow]) -> Table | None:
    """What observing each profiled process cost it, measured in it: the next lever is in the
    largest column."""
    costed = [r for r in rows if r.cost is not None]
    if not costed:
        return None
    table_rows = []
    for r in costed:
        assert r.cost is not None
        cells = {"role": r.role, "pid": r.pid, **vars(r.cost)}
        cells["sampler_cpu_ns"] = r.cost.sampler_cpu_ns
        wall = (r.wall_ns or 0) + (r.cost.boot_ns or 0)
        cells["share"] = r.cost.program_threads_ns() / wall if wall else None
        table_rows.append(cells)
    return Table(columns=_COST_COLUMNS, rows=table_rows,
                 caption="what observing each process cost it, as the process measured it",
                 legend_notes=["not measurable from inside a process, so not in these figures: torch's own dispatch "
                               "to a RecordFunction callback (any callback profiler pays it; "
                               "benches/bench_decode_profilers.py --breakdown measures it against a bare run) and the "
                               "kernel's work for each sample on the sampled thread"])


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
        alone = cpuprof_command("report", os.path.join(shown.directory, "profile.json"))
        lines.append(f"The report below is of {shown.role} (pid {shown.pid}), the process that ran the most op time; "
                     f"its own report alone: {alone} (another process's: the same with the directory in its row's "
                     "last column)")
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
    costs = cost_table(listed)
    return Section("processes", "Processes", lines=lines, tables=[table] + ([costs] if costs is not None else []))


def processes_report(rows: list[ProcessRow], shown: ProcessProfile | None, top: int = defaults.TOP_OPS,
                     unsaved: list[int] | None = None, whole_run: bool = False,
                     merged: list[str] | None = None) -> Report:
    """The full report of ``shown`` (the busiest process, :func:`busiest_row`), with the table of
    every process's row first; ``merged``: a merged run's lines on its hosts and their clocks."""
    from .report import build_report

    report = Report(title="cpuprof run") if shown is None else build_report(shown.profile, top=top, whole_run=whole_run)
    report.sections.insert(0, processes_section(rows, row(shown) if shown is not None else None, unsaved))
    ranks = ranks_section(jobs([r.rank for r in rows if r.rank is not None]))
    if merged:
        if ranks is None:
            ranks = Section("ranks", "Hosts", lines=[])
        ranks.lines[:0] = merged
    if ranks is not None:
        report.sections.insert(1, ranks)
    return report
