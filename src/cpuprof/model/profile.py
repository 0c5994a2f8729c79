"""The one profile model that every report and exporter reads.

A profile is data first: recording writes it, ``save`` turns it into versioned JSON (see
``io.py`` and ``profile.schema.json``), ``load`` turns that back into the same objects, and
reports never look at anything else. Every number carries how it was obtained
(``Collection.mode``, ``Capabilities``) and what could not be measured (``Limits``,
``dropped_events``), so a re-rendered profile says the same things as the live one.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from ..defaults import CollectionMode  # how the counters were collected: declared at the base
from ..errors import ProfileFormatError
from . import codec, io
from .contention import OpenMPWaits
from .machine import OpenMPInfo
from .roofs import MachineRoofs
from .settings import Settings
from .stacks import Sampling, Stacks
from .workload import DecodeWorkload

CPU_EVENT = "task-clock"  # the per-thread CPU time every report is built on


@dataclass
class Meta:
    created: str  # ISO 8601, UTC
    cpuprof_version: str
    torch_version: str | None
    python: str
    hostname: str
    pid: int
    argv: list[str] = field(default_factory=list)
    ppid: int | None = None  # the parent process; None in profiles written before it was kept
    # What the process is to its program, for a process cpuprof run followed: its multiprocessing
    # name, the title it set itself (setproctitle), or its main module; None for the one cpuprof started.
    role: str | None = None
    # The command the user typed to start the run (``python -m cpuprof decode ...``), where cpuprof's
    # launcher started the process; argv is then its internal child's.
    command: list[str] = field(default_factory=list)

    def program(self) -> list[str]:
        """What the process ran, as its user would name it: for the program ``cpuprof run`` started
        itself, the command after ``--`` (its argv is cpuprof's own child's); else its argv."""
        if self.role is None and "--" in self.command:
            words = self.command[self.command.index("--") + 1:]
            if words:
                return words
        return self.argv


@dataclass
class DistributedRank:
    """The process's place in a torch.distributed job, as torch.distributed told it (the program
    started the group itself: torchrun's children, vLLM's tensor-parallel workers, mp.spawn)."""

    rank: int
    world_size: int
    backend: str | None = None  # gloo, ccl, ...
    # Where the ranks of one job meet: its store's address ("tcp 127.0.0.1:29500", "file /tmp/x"),
    # so two jobs of one run are never taken for one. None: a store cpuprof cannot name.
    store: str | None = None
    local_rank: int | None = None  # LOCAL_RANK, where the launcher set it (torchrun)


@dataclass
class Status:
    complete: bool = True
    reason: str | None = None  # why the run did not finish (interrupted, failed, checkpoint)


@dataclass
class Capabilities:
    """The facts about the machine that qualify this profile's numbers."""

    hardware_pmu: str | None  # the core PMU's sysfs name; None: no hardware events here
    hardware_pmu_reason: str | None
    perf_event_paranoid: int | None
    openmp: OpenMPInfo
    cpus_online: int | None


@dataclass
class EventInfo:
    name: str
    kind: str  # software, hardware, hardware-cache, raw, pmu, tracepoint
    user_only: bool = False  # kernel-mode counting was refused (perf_event_paranoid)


@dataclass
class DroppedEvent:
    name: str
    reason: str
    errno: int = 0




@dataclass
class Collection:
    """How the counters were collected, so every number can say where it came from."""

    mode: CollectionMode
    events: list[EventInfo]
    record_shapes: bool
    started_ns: int
    stopped_ns: int
    scaled_events: list[str] = field(default_factory=list)  # per-op deltas scaled for multiplexing
    memory_reported: bool = False  # torch's allocator reported allocations and frees per op

    @property
    def wall_ns(self) -> int:
        return max(0, self.stopped_ns - self.started_ns)

    @property
    def event_names(self) -> list[str]:
        return [e.name for e in self.events]


@dataclass
class ThreadStat:
    """One OS thread that worked during the session; ``counters`` are its totals over it."""

    tid: int
    name: str
    role: str  # "dispatch" (runs ATen ops) or "worker" (did work for them: OpenMP, intra-op pools)
    counters: dict[str, int]
    scaled: list[str] = field(default_factory=list)  # events whose counts were multiplexed
    uncounted: list[str] = field(default_factory=list)  # events that never ran on it
    opened_ns: int = 0
    # From the kernel's schedstat over the session: time runnable but waiting for a CPU, and time
    # on a CPU. None where the thread exited before it could be read.
    run_delay_ns: int | None = None
    sched_cpu_ns: int | None = None
    samples: int = 0  # sampled mode: samples of this thread joined to ops
    samples_lost: int = 0  # dropped by the kernel (its ring was full)
    sampling_error: str | None = None  # why this thread could not be sampled
    # Its sample ring's data pages as mapped, and as asked for (after the 32-page cap on threads past
    # the 64th): fewer where the locked-memory budget (perf_event_mlock_kb, RLIMIT_MEMLOCK) or memory
    # refused the asked size (0: not sampled, or not known)
    sample_ring_pages: int = 0
    sample_ring_pages_asked: int = 0
    counting_error: str | None = None  # why the events in ``uncounted`` could not be opened on it

    @property
    def cpu_ns(self) -> int | None:
        return self.counters.get(CPU_EVENT)

    @property
    def sample_ring_shrunk(self) -> bool:
        """Its sample ring was mapped smaller than asked (over the locked-memory budget)."""
        return 0 < self.sample_ring_pages < self.sample_ring_pages_asked


@dataclass
class IdleThread:
    """A thread of the process that did no work during the session, or that no counter could be
    opened on (``uncounted`` says why): its work, if any, is in no figure."""

    tid: int
    name: str
    uncounted: str | None = None


@dataclass
class OpInput:
    """One input of an op, as the dispatcher saw it."""

    kind: str  # tensor, tensor_list, none, int, float, bool, int_list, other, unknown_shape, undefined
    dtype: str | None = None  # tensors: bf16, f32, i64, ...
    sizes: list[int] | None = None
    strides: list[int] | None = None
    items: list[OpInput] | None = None  # tensor_list: its tensors


@dataclass
class OpStat:
    """Aggregates for one op key: (name, inputs, enclosing region).

    ``counters_self``/``counters_incl`` map an event to one value per thread, in the order of
    ``Profile.threads``: the work of every thread of the team while this op ran.
    """

    id: int
    kind: str  # "op", "region" or "special"
    name: str
    region: list[str]  # the enclosing regions, outermost first; empty: none
    calls: int
    incl_ns: int
    self_ns: int
    max_ns: int
    counters_self: dict[str, list[int]]
    counters_incl: dict[str, list[int]]
    inputs: list[OpInput] | None = None  # None: not recorded (--no-shapes) or unreadable
    inputs_truncated: bool = False  # more inputs or dims than the key keeps
    samples: int = 0  # sampled mode: samples taken while this op ran innermost (any thread)
    # torch's allocator reports while this op was innermost on the thread that allocated
    # (Collection.memory_reported says whether they were measured at all)
    alloc_bytes: int = 0
    allocs: int = 0
    freed_bytes: int = 0
    frees: int = 0

    def self_total(self, event: str) -> int | None:
        values = self.counters_self.get(event)
        return None if values is None else sum(values)


@dataclass
class Overhead:
    """What the profiler itself cost, measured during the run."""

    hook_ns: int  # time inside cpuprof's op callbacks on the dispatching threads (team reads included)
    ops: int
    discovery_cpu_ns: int  # CPU time of the thread-discovery thread
    discovery_ticks: int
    samples: int = 0  # sampled mode: samples joined to ops
    # Threads' counter reads the collector left out: idle at their last read, no record written since.
    idle_reads_skipped: int = 0
    thread_scans: int = 0  # walks of /proc/self/task for new threads
    # Of discovery_cpu_ns: opening counters on the threads the scans found, once per thread.
    scan_setup_cpu_ns: int = 0
    # A followed process (run): the wall time cpuprof took in it to start (importing cpuprof as
    # Python started, none in a forked child, then starting the profile; None where not followed),
    # and its checkpoints so far and their wall time.
    boot_ns: int | None = None
    checkpoints: int = 0
    checkpoint_ns: int = 0
    method: str = "self-timed callbacks; torch's own RecordFunction dispatch is not included"

    @property
    def per_op_ns(self) -> float:
        return self.hook_ns / self.ops if self.ops else 0.0


@dataclass
class Limits:
    """What the bounded buffers could not keep."""

    op_capacity: int
    ops_overflowed: int
    span_capacity: int
    spans_dropped: int
    too_deep: int
    unattributed_ops: int
    max_threads: int
    threads_beyond_limit: int
    memory_bytes: int
    unmatched_ends: int = 0  # op ends with no begin in this session on that thread
    truncated_ops: int = 0  # ops still open when the session stopped


@dataclass
class Spans:
    """The optional timeline: columnar, in the order the spans ended. ``thread`` indexes
    ``Profile.threads``. ``counters`` are each span's inclusive deltas summed over the team, in
    event order (exact mode; empty lists in sampled mode)."""

    op: list[int]
    thread: list[int]
    depth: list[int]
    start_ns: list[int]
    dur_ns: list[int]
    counters: list[list[int]]

    def __len__(self) -> int:
        return len(self.op)


@dataclass
class Profile:
    meta: Meta
    status: Status = field(default_factory=Status)
    collection: Collection | None = None  # None: the run was not profiled (a baseline)
    capabilities: Capabilities | None = None
    threads: list[ThreadStat] = field(default_factory=list)
    idle_threads: list[IdleThread] = field(default_factory=list)
    ops: list[OpStat] = field(default_factory=list)
    overhead: Overhead | None = None
    limits: Limits | None = None
    dropped_events: list[DroppedEvent] = field(default_factory=list)
    spans: Spans | None = None
    settings: Settings | None = None  # launched runs: what was asked and what was in force
    workload: DecodeWorkload | None = None
    sampling: Sampling | None = None  # sampled mode: how the samples were taken
    stacks: Stacks | None = None  # sampled mode: native stacks per thread and op
    roofs: MachineRoofs | None = None  # the machine's measured limits the GEMMs and decode are judged against
    openmp: OpenMPWaits | None = None  # the OMPT tool's waits and work, or why there are none
    distributed: DistributedRank | None = None  # a followed process that joined a torch.distributed job

    @property
    def profiled(self) -> bool:
        return self.collection is not None

    def op_by_id(self) -> dict[int, OpStat]:
        return {op.id: op for op in self.ops}

    def has_event(self, name: str) -> bool:
        return self.collection is not None and name in self.collection.event_names

    def validate(self) -> None:
        """Checks the invariants every report relies on; raises ProfileFormatError if broken."""
        n_threads = len(self.threads)
        events = set(self.collection.event_names) if self.collection else set()
        ids = set()
        for op in self.ops:
            if op.id in ids:
                raise ProfileFormatError(f"profile has two ops with id {op.id}")
            ids.add(op.id)
            if op.self_ns > op.incl_ns:
                raise ProfileFormatError(f"op {op.name!r}: self time exceeds total time")
            for table in (op.counters_self, op.counters_incl):
                for event, values in table.items():
                    if event not in events:
                        raise ProfileFormatError(f"op {op.name!r} has counts of unknown event {event!r}")
                    if len(values) != n_threads:
                        raise ProfileFormatError(
                            f"op {op.name!r}: {len(values)} per-thread values for {n_threads} threads"
                        )
        if self.spans is not None:
            columns = (self.spans.op, self.spans.thread, self.spans.depth, self.spans.start_ns,
                       self.spans.dur_ns, self.spans.counters)
            if len({len(c) for c in columns}) > 1:
                raise ProfileFormatError("span columns have different lengths")
            if any(t < -1 or t >= n_threads for t in self.spans.thread):
                raise ProfileFormatError("a span refers to a thread the profile does not have")
        if self.openmp is not None:
            refs = [(r.thread, r.op) for r in self.openmp.waits] + [(r.thread, r.op) for r in self.openmp.work]
            if any(not 0 <= thread < n_threads or (op not in ids and op > 2) for thread, op in refs):
                raise ProfileFormatError("an OpenMP wait refers to a thread or op the profile does not have")
        if self.stacks is not None:
            n_frames, n_stacks = len(self.stacks.frames), len(self.stacks.stacks)
            if any(f < 0 or f >= n_frames for stack in self.stacks.stacks for f in stack):
                raise ProfileFormatError("a stack refers to a frame the profile does not have")
            n_paths = len(self.stacks.paths)
            if any(op not in ids for path in self.stacks.paths for op in path):
                raise ProfileFormatError("an op path refers to an op the profile does not have")
            for c in self.stacks.counts:
                if (not 0 <= c.stack < n_stacks or not 0 <= c.path < n_paths or not 0 <= c.thread < n_threads
                        or c.op not in ids):
                    raise ProfileFormatError("a stack count refers to a stack, path, thread or op the profile "
                                             "does not have")

    # A profile's file: io.py reads and writes versioned files of any kind; these say which kind.
    def to_dict(self) -> dict:
        return {"format": io.FORMAT, "version": io.VERSION, **codec.to_json(self)}

    @classmethod
    def from_dict(cls, data: object, source: str = "profile") -> Profile:
        return io.decode(io.upgrade(data, io.PROFILE, source), io.PROFILE, Profile, source)  # validated by decode

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Writes the profile (atomically, where it is a regular file). ``path`` may be a directory
        (the file is ``profile.json`` in it) or a file name."""
        target = Path(path)
        if target.suffix != ".json":
            target = target / io.PROFILE_FILENAME
        return io.write_versioned(target, io.PROFILE, self)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Profile:
        """Reads a profile file, or ``profile.json`` inside a directory; one-line errors only."""
        source = io.file_in(path, io.PROFILE)
        return cls.from_dict(io.read_json_file(source, io.PROFILE), source=str(source))
