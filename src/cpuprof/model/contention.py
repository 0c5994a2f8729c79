"""Where threads waited instead of computing: OpenMP barriers and locks (from an OMPT tool, where
the runtime supports one), and what the samples and the scheduler say where it does not."""

from __future__ import annotations

from dataclasses import dataclass, field

# Barrier kinds as OMPT names them (ompt_sync_region_t), plus the waits that are not barriers.
# "idle": a worker in the runtime's thread pool between two parallel regions (from the moment its
# team's closing barrier completed until it is forked again), charged to op 1; OMPT reports it as
# part of the worker's barrier wait, and the tool cuts it off.
WAIT_KINDS = ("barrier-implicit", "barrier-explicit", "barrier-reduction", "barrier-other", "taskwait",
              "taskgroup", "lock", "critical", "ordered", "atomic", "nest-lock", "other-mutex", "idle")


@dataclass
class OmpWait:
    """One kind of wait of one thread while it worked for one op: how often, how long, and how much
    of that time the thread spent on a CPU (spinning) rather than asleep."""

    thread: int  # index into Profile.threads
    op: int  # Profile.ops id (the op the parallel region ran for; 1: outside ATen ops)
    kind: str  # one of WAIT_KINDS
    count: int  # waits (for locks: acquisitions that waited or not)
    wall_ns: int
    cpu_ns: int  # on-CPU part of wall_ns (spin); wall_ns - cpu_ns is asleep or waiting for a CPU


@dataclass
class OmpWork:
    """One thread's OpenMP work for one op: its implicit tasks, and on the primary thread the
    parallel regions it forked and the time it spent in them."""

    thread: int
    op: int
    parallel_regions: int = 0  # forked by this thread (the primary)
    team_threads: int = 0  # sum of the team sizes of those regions (mean = team_threads / regions)
    parallel_ns: int = 0  # primary thread: wall time inside the regions it forked
    implicit_tasks: int = 0
    implicit_task_ns: int = 0  # wall time in implicit tasks (work and the barrier at their end)
    lock_acquisitions: int = 0  # locks, critical sections and ordered regions entered


@dataclass
class OmptInfo:
    """How the OMPT tool ran, or why it did not."""

    active: bool
    runtime: str | None = None  # the runtime's own version string, e.g. "Intel(R) OMP version: 5.0..."
    library: str | None = None  # the tool library the runtime loaded
    error: str | None = None  # why there are no OMPT figures (libgomp, the runtime refused it, ...)
    callbacks: dict[str, str] = field(default_factory=dict)  # callback -> how the runtime registered it
    records_dropped: int = 0  # (thread, op) slots that did not fit the tool's bounded tables
    threads_beyond_limit: int = 0
    records_unmapped: int = 0  # records of threads the session's thread table lacks (left out)
    waits_uncut: int = 0  # worker barrier waits the tool could not cut from the idle time after them


@dataclass
class OpenMPWaits:
    """The OMPT tool's figures for the session: exact waits and work per thread and op."""

    info: OmptInfo
    waits: list[OmpWait] = field(default_factory=list)
    work: list[OmpWork] = field(default_factory=list)
