"""Native stacks of the sampled threads, joined to ops: what flame graphs and traces read."""

from __future__ import annotations

from dataclasses import dataclass, field

# What a frame's code is, for the per-op split of CPU time (reports name these in full).
CATEGORIES = ("compute", "openmp", "allocator", "interpreter", "framework", "kernel", "other")


@dataclass
class NativeFrame:
    name: str  # the demangled function, or "library+0x1a2b" where no symbol covers the address
    module: str  # the library's file name, "[kernel]", or "[jit]" for code generated at run time
    category: str  # one of CATEGORIES


@dataclass
class StackCount:
    """Samples of one thread, on one native stack, while it worked for one op path."""

    stack: int  # index into Stacks.stacks
    path: int  # index into Stacks.paths: the ops open on the thread it worked for
    thread: int  # index into Profile.threads
    # the op's id (Profile.ops): the path's innermost op, "[outside ATen ops]" (1) or "[cpuprof callbacks]" (2)
    op: int
    samples: int
    cpu_ns: int  # the CPU time (task-clock) these samples stand for
    values: list[int] = field(default_factory=list)  # every counted event's deltas, in Collection.events order


@dataclass
class SampleTimeline:
    """The newest samples one by one, oldest first (columnar): for traces."""

    time_ns: list[int]
    thread: list[int]
    op: list[int]
    stack: list[int]
    cpu_us: list[int]
    path: list[int] = field(default_factory=list)  # index into Stacks.paths, as in StackCount

    def __len__(self) -> int:
        return len(self.time_ns)


@dataclass
class PythonFrame:
    function: str
    file: str  # the code's file name (py-spy's: the path below site-packages, or the script's path)
    line: int

    @property
    def name(self) -> str:
        return f"{self.function} ({self.file}:{self.line})"


@dataclass
class PythonSplit:
    """How many of one stack count's samples were joined to one Python stack (a Python sampler's
    read, or the caller the op hook recorded for their op)."""

    count: int  # index into Stacks.counts
    stack: int  # index into Stacks.python_stacks
    samples: int


@dataclass
class Stacks:
    frames: list[NativeFrame]
    stacks: list[list[int]]  # frame indices, leaf first; stack 0 is the empty stack
    counts: list[StackCount]
    paths: list[list[int]] = field(default_factory=lambda: [[]])  # op ids, outermost first; path 0: no op
    timeline: SampleTimeline | None = None
    # Python stacks of the dispatching threads' samples, from a Python sampler (see PythonSampling)
    python_frames: list[PythonFrame] = field(default_factory=list)
    python_stacks: list[list[int]] = field(default_factory=lambda: [[]])  # leaf first; 0: none seen
    python_splits: list[PythonSplit] = field(default_factory=list)


@dataclass
class PythonSampling:
    """How the Python stacks were taken and joined, or why there are none."""

    source: str  # "in-process (Python 3.11.7)" or "py-spy 0.4.3"
    hz: int
    error: str | None = None  # why there are no Python stacks
    samples: int = 0  # stacks the sampler read
    errors: int = 0  # stacks it failed to read
    clock_error_ns: int = 0  # its times are placed on the op timeline within this (py-spy's; 0 in-process)
    joined: int = 0  # dispatching-thread samples given a Python stack
    unmatched: int = 0  # dispatching-thread samples py-spy had no stack for at their time
    extrapolated: int = 0  # samples older than the sample timeline (workers' too), split like the newer ones
    # The in-process sampler's own CPU time (its thread's CPU clock), reading stacks with the GIL
    # held; None for py-spy, whose process cpuprof does not measure.
    cpu_ns: int | None = None
    stopped: str | None = None  # why the sampler stopped before the profile did; its stacks are kept
    # Samples inside ops given the Python caller the op hook recorded at their op's begin (exact),
    # of `joined`; the other joined samples took the sampler's last read.
    op_callers: int = 0
    op_caller_changes: int = 0  # changes of op caller the op hook recorded
    op_callers_lost: int = 0  # changes it could not record (a full ring): the reads cover them
    # Samples between ops given the caller of their thread's last op, where no read of the sampler
    # was within a period (its pacer skipped them: the op callers covered the thread), of `joined`
    op_callers_between: int = 0
    ticks_covered: int = 0  # periods the in-process sampler did not read: the op callers said every stack
    # Worker samples inside ops given the caller of the op their dispatching thread ran (where the
    # profile has one dispatching thread that runs Python and its op callers were recorded)
    workers_joined: int = 0


@dataclass
class Sampling:
    """How the samples behind per-op CPU and the stacks were taken, and what they missed."""

    hz: int  # samples per second of each thread's CPU time
    stack_bytes: int  # user stack copied with each sample for unwinding
    samples: int  # joined to the op timeline
    lost: int  # dropped by the kernel because a ring was full
    unwind: dict[str, int] = field(default_factory=dict)  # how each sample's user stack walk ended
    frames_by_frame_pointer: int = 0  # frames stepped by frame pointer (no CFI)
    frames_by_scanning: int = 0  # frames whose return address was found by scanning the stack
    ambiguous_workers: int = 0  # worker samples while several op-running threads were in ops
    late_op_events: int = 0
    # How per-op CPU was charged: by the on-CPU intervals the threads' switch records give (exact
    # per op), or, where those did not cover it (a thread's first sample, a kernel without switch
    # records), to the op a sample landed in (statistical).
    switch_records: int = 0
    cpu_by_interval_ns: int = 0
    cpu_by_sample_ns: int = 0

    @property
    def cpu_by_interval(self) -> bool:
        """Per-op CPU came from the intervals, but for at most 1% placed by samples: it is then
        no sampling estimate, and needs no minimum of samples per op to be shown."""
        charged = self.cpu_by_interval_ns + self.cpu_by_sample_ns
        return self.cpu_by_interval_ns > 0 and self.cpu_by_sample_ns <= 0.01 * charged
    op_events_dropped: int = 0
    stacks_truncated: int = 0  # stacks kept as their leaf alone (the stack table was full)
    counts_dropped: int = 0
    timeline_dropped: int = 0
    jit_symbols: str | None = None  # where names of JIT code came from (a perf map), or None
    unresolved_frames: int = 0  # frames no symbol table or map names ("library+offset")
    python: PythonSampling | None = None  # None: Python stacks were not asked for
