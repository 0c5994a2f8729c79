"""The Python API: ``cpuprof.profile()`` and ``cpuprof.region()``.

    with cpuprof.profile() as prof:
        model.generate(...)
    prof.report(); prof.export("out/")

The session lives in the C++ core; this module checks options and runs the profile's collectors
(:mod:`cpuprof.collect.collectors`: the native session, py-spy, the OMPT tool, module regions)
through one life cycle: started in order, stopped in reverse, rolled back together.
"""

from __future__ import annotations

import datetime
import os
import socket
import sys
from pathlib import Path
from typing import Any, TextIO

from .. import __version__, defaults, native
from .. import events as event_presets
from ..errors import CpuprofError, UsageError
from ..model import DroppedEvent, Meta, Profile
from ..safe_text import printable
from .collectors import (
    Collector,
    ModuleRegionCollector,
    NativeSession,
    NativeSettings,
    OmptWaits,
    PythonStacks,
    sampling_warnings,
)

__all__ = ["CollectorError", "check_op_counters", "check_options", "profile", "region", "sampling_warnings"]


def _warn(message: str) -> None:
    print(f"cpuprof: warning: {printable(message)}", file=sys.stderr)


def _running_native() -> Any:
    nat = sys.modules.get("cpuprof._native")
    return nat if nat is not None and nat.running() else None


class region:
    """Marks a user region; ops inside it are keyed by it, and it gets its own time and counters.

        with cpuprof.region("generate"):
            model.generate(...)

    It goes straight into cpuprof's session (about 0.5 µs; a Python
    ``torch.profiler.record_function`` costs about 8 µs) and costs nothing when no profile runs.
    Regions that torch.profiler makes with ``record_function`` are regions for cpuprof too.
    """

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __enter__(self) -> region:
        nat = _running_native()
        if nat is not None:
            nat.region_begin(self.name, id(self))
        return self

    def __exit__(self, *exc: object) -> None:
        nat = _running_native()
        if nat is not None:
            nat.region_end(id(self))


def check_options(mode: str, sample_hz: int, stack_bytes: int, op_capacity: int, timeline: int,
                  max_threads: int) -> None:
    """Raises UsageError for an option outside what the core accepts (the core's own limits)."""
    if mode not in defaults.MODES:
        raise UsageError(f"mode {mode!r} is not one of: {', '.join(defaults.MODES)}")
    if not defaults.MIN_SAMPLE_HZ <= sample_hz <= defaults.MAX_SAMPLE_HZ:
        raise UsageError(f"sample rate {sample_hz} Hz: expected {defaults.MIN_SAMPLE_HZ} to {defaults.MAX_SAMPLE_HZ}")
    if not 0 <= stack_bytes <= defaults.MAX_STACK_BYTES or stack_bytes % 8:
        raise UsageError(f"stack bytes {stack_bytes}: expected a multiple of 8 from 0 to {defaults.MAX_STACK_BYTES}")
    if not defaults.MIN_OP_CAPACITY <= op_capacity <= defaults.MAX_OP_CAPACITY:
        raise UsageError(f"op capacity {op_capacity}: expected {defaults.MIN_OP_CAPACITY} to "
                         f"{defaults.MAX_OP_CAPACITY}")
    if not 0 <= timeline <= defaults.MAX_TIMELINE:
        raise UsageError(f"timeline {timeline}: expected 0 to {defaults.MAX_TIMELINE} spans per thread")
    if not 1 <= max_threads <= defaults.MAX_THREADS_LIMIT:
        raise UsageError(f"max threads {max_threads}: expected 1 to {defaults.MAX_THREADS_LIMIT}")


class CollectorError(CpuprofError):
    """A collector could not start (the ones started before it were stopped again)."""


def check_op_counters(op_capacity: int, n_events: int) -> None:
    """Raises UsageError when the op table's per-thread counters (its keys, a power of two, times
    the events) exceed what the core reserves per thread (csrc/common/limits.h)."""
    keys = 16
    while keys < op_capacity:
        keys *= 2
    limit = defaults.CORE_LIMITS["kMaxOpCountersPerThread"]
    if keys * max(n_events, 1) > limit:
        raise UsageError(f"op capacity {op_capacity} ({keys} keys) with {n_events} events needs "
                         f"{keys * max(n_events, 1):,} counters per thread; at most {limit:,} (op capacity x events), "
                         f"so a thread's counters stay within 16 MiB: lower the op capacity or the events")


def launch_command() -> list[str]:
    """The command the user typed, where cpuprof's launcher started this process (an environment
    variable it set, so read as untrusted: a list of strings, or nothing)."""
    import json

    try:
        command = json.loads(os.environ.get(defaults.COMMAND_ENV, "[]"))
    except (ValueError, RecursionError):
        return []
    return command if isinstance(command, list) and all(isinstance(c, str) for c in command) else []


class profile:
    """Profiles every ATen op, with counters of every thread of the process.

    ``mode="sampled"`` (default): the kernel samples every thread of the process each 1/``sample_hz``
    of its CPU time, with its counters, call chain and ``stack_bytes`` of user stack; the op path
    only records op begins and ends, and a collector thread joins the samples to the op each
    thread was working for, and unwinds their native stacks. ``mode="exact"`` reads every working
    thread's counters at both ends of every op (exact per op, costly per op).
    ``modules=True`` makes each nn.Module forward a region named by its class, so ops are keyed by
    the module that ran them (a few µs per module call); ``modules=model`` names the regions of
    that model's modules by their attribute names ("layers.*/self_attn/q_proj"). ``timeline`` is how many of the newest
    op spans each dispatching thread keeps (0: aggregates only). ``max_threads`` sizes the thread
    slots: threads beyond it are counted, not profiled. ``python_stacks=True`` reads every Python
    thread's stack ``python_hz`` times a second and joins them to the samples of the dispatching
    threads: ``python_sampler="in-process"`` (default) from a thread of cpuprof's that takes the
    GIL for each read, ``"py-spy"`` from py-spy beside the process (no GIL, but a second process
    whose CPU time competes with the program's where no CPU is spare).
    """

    def __init__(
        self,
        events: str | list[str] | None = None,
        *,
        mode: str = defaults.DEFAULT_MODE,
        record_shapes: bool = True,
        sample_hz: int = defaults.SAMPLE_HZ,
        stack_bytes: int = defaults.STACK_BYTES,
        op_capacity: int = defaults.OP_CAPACITY,
        timeline: int = 0,
        max_threads: int = defaults.MAX_THREADS,
        modules: bool | Any = False,
        python_stacks: bool = False,
        python_hz: int = defaults.PYTHON_HZ,
        python_sampler: str = defaults.PYTHON_SAMPLER,
        warn: bool = True,
    ) -> None:
        check_options(mode, sample_hz, stack_bytes, op_capacity, timeline, max_threads)
        if python_stacks and mode != "sampled":
            raise UsageError("Python stacks are joined to samples: they need mode='sampled'")
        if not 1 <= python_hz <= defaults.MAX_PYTHON_HZ:
            raise UsageError(f"Python sample rate {python_hz} Hz: expected 1 to {defaults.MAX_PYTHON_HZ}")
        if python_sampler not in defaults.PYTHON_SAMPLERS:
            raise UsageError(f"unknown Python sampler {python_sampler!r}: expected one of "
                             f"{', '.join(defaults.PYTHON_SAMPLERS)}")
        self.python_stacks = python_stacks
        self.python_hz = python_hz
        self.python_sampler = python_sampler
        self.event_names = event_presets.resolve(events)
        check_op_counters(op_capacity, len(self.event_names))
        self.mode = mode
        self.record_shapes = record_shapes
        self.sample_hz = sample_hz
        self.stack_bytes = stack_bytes
        self.op_capacity = op_capacity
        self.timeline = timeline
        self.max_threads = max_threads
        self.modules = modules
        self.warn = warn
        self.profile: Profile | None = None
        self.meta: Meta | None = None
        self._core: NativeSession | None = None
        self._collectors: list[Collector] = []
        self._warned: set[str] = set()

    def _ring_pages(self, collect_interval_us: int) -> int:
        """Ring pages per thread for 2.5 collector periods of samples: a sample is its copied stack
        plus about 1 KiB of call chain and counters."""
        needed = self.sample_hz * 2.5e-6 * collect_interval_us * (self.stack_bytes + 1024) / 4096
        pages = defaults.CORE_LIMITS["kMinRingPages"]
        while pages < needed and pages < 4096:  # 16 MiB: 2.5 default periods at 18 kHz
            pages *= 2
        return pages

    # -- life cycle ---------------------------------------------------------------------------
    def _make_collectors(self, nat: Any, meta: Meta) -> tuple[NativeSession, list[Collector]]:
        """The collectors of this profile, in start order (stopped in reverse). Contributions go
        in the same order, after the native session built the profile. A new collector is one
        more entry here."""
        python = PythonStacks(self.python_hz, self.python_sampler) if self.python_stacks else None
        core = NativeSession(nat, NativeSettings(
            events=self.event_names, mode=self.mode, record_shapes=self.record_shapes, sample_hz=self.sample_hz,
            stack_bytes=self.stack_bytes, op_capacity=self.op_capacity, span_capacity=self.timeline,
            max_threads=self.max_threads, ring_pages=self._ring_pages(nat.collect_interval_us()),
        ), meta, python)
        collectors: list[Collector] = []
        if python is not None:
            collectors.append(python)  # first: its start-up is not the program's work
        collectors += [core, OmptWaits(nat.current_op_entry_address())]
        if self.modules is not False and self.modules is not None:
            collectors.append(ModuleRegionCollector(self.modules))
        return core, collectors

    def start(self) -> profile:
        nat = native.load()
        event_presets.validate_names(self.event_names, nat)
        if nat.running():
            raise UsageError("a cpuprof profile is already running in this process")
        import torch

        meta = Meta(
            created=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            cpuprof_version=__version__, torch_version=torch.__version__, python=sys.version.split()[0],
            hostname=socket.gethostname(), pid=os.getpid(), argv=list(sys.argv), ppid=os.getppid(),
            command=launch_command(),
        )
        core, collectors = self._make_collectors(nat, meta)
        start_all(collectors)
        # From here on this object owns the running session: stop() may stop it.
        self._core, self._collectors, self.meta = core, collectors, meta
        self._warn_limitations()
        return self

    def stop(self) -> Profile:
        if self._core is None:
            raise UsageError("profile.stop() called before start()")
        stop_all(self._collectors)
        self.profile = self._build(complete=True)
        self._warn_limitations()
        return self.profile

    def _warn_limitations(self) -> None:
        """Each collector's shortfalls, each line once (at start, and what stopping added)."""
        for collector in self._collectors:
            for line in collector.limitations():
                if self.warn and line not in self._warned:
                    _warn(line)
                self._warned.add(line)

    @property
    def dropped(self) -> list[DroppedEvent]:
        """The events the native session could not open, with the reasons."""
        return self._core.dropped if self._core is not None else []

    @property
    def started(self) -> bool:
        return self._core is not None

    @property
    def running(self) -> bool:
        return self._core is not None and self._core.running

    def snapshot(self) -> Profile:
        """The profile so far, without stopping: what a checkpoint writes."""
        if self._core is None:
            raise UsageError("profile.snapshot() called before start()")
        return self._build(complete=not self._core.running)

    def __enter__(self) -> profile:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        if self._core is not None and self._core.running:
            self.stop()

    # -- output -------------------------------------------------------------------------------
    def report(self, file: TextIO | None = None, top: int = defaults.TOP_OPS, format: str = "terminal") -> None:
        from ..reports import render

        render(self._require(), file or sys.stdout, format=format, top=top)

    def export(self, directory: str | os.PathLike[str]) -> Path:
        return self._require().save(directory)

    def _require(self) -> Profile:
        if self.profile is None:
            raise UsageError("no profile yet: use the profile as a context manager or call stop()")
        return self.profile

    def _build(self, complete: bool) -> Profile:
        assert self._core is not None
        profile = self._core.build(complete)
        for collector in self._collectors:
            collector.contribute(profile)
        return profile


def start_all(collectors: list[Collector]) -> None:
    """Starts the collectors in order. When one fails, the ones started before it are stopped in
    reverse order (their own errors then are dropped: the first failure is the one to tell) and
    the failure is raised as one line; an interrupt is re-raised as it came."""
    for k, collector in enumerate(collectors):
        try:
            collector.start()
        except BaseException as exc:
            for started in reversed(collectors[:k]):
                try:
                    started.stop()
                except Exception:  # rolling back: the start failure is the one to report
                    pass
            if isinstance(exc, CpuprofError) or not isinstance(exc, Exception):
                raise
            raise CollectorError(f"{collector.name} could not start: {exc}") from exc


def stop_all(collectors: list[Collector]) -> None:
    """Stops the collectors in reverse start order; every one is stopped even if one raises."""
    failure: BaseException | None = None
    for collector in reversed(collectors):
        try:
            collector.stop()
        except BaseException as exc:
            failure = failure or exc
    if failure is not None:
        raise failure
