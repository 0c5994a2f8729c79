"""The Python API: ``cpuprof.profile()`` and ``cpuprof.region()``.

    with cpuprof.profile() as prof:
        model.generate(...)
    prof.report(); prof.export("out/")

The session lives in the C++ core; this module only checks options, starts and stops it, and
hands the core's snapshot to :mod:`cpuprof.collect.build`.
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
from ..errors import UsageError
from ..model import DroppedEvent, Meta, OmptInfo, OpenMPWaits, Profile
from .build import build_profile
from .modules import ModuleRegions, attribute_names


def _warn(message: str) -> None:
    print(f"cpuprof: warning: {message}", file=sys.stderr)


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


def sampling_warnings(p: Profile) -> list[str]:
    """One line for each way the samples fell short: what the report's notes then detail."""
    out: list[str] = []
    if p.collection is None or not p.collection.events:
        return out  # nothing could be opened: the dropped-events warning said why
    by_reason: dict[str, list[str]] = {}
    for i, t in enumerate(p.threads):
        if t.sampling_error and "task-clock" not in t.uncounted:  # else its counting error says why
            by_reason.setdefault(t.sampling_error, []).append(f"T{i}")
    for reason, labels in by_reason.items():
        out.append(f"{', '.join(labels)} {reason}: their per-op CPU time and stacks are missing; their totals are "
                   "still counted")
    if p.sampling is not None and p.sampling.lost:
        out.append(f"{p.sampling.lost:,} samples lost (a sample ring filled before the collector drained it): "
                   "per-op CPU time is short by as many sampling periods")
    return out


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
    slots: threads beyond it are counted, not profiled. ``python_stacks=True`` runs py-spy beside
    the process at ``python_hz`` and joins its Python stacks to the samples of the dispatching
    threads; off by default, since py-spy's own CPU time competes with the program's where no
    CPU is spare.
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
        warn: bool = True,
    ) -> None:
        check_options(mode, sample_hz, stack_bytes, op_capacity, timeline, max_threads)
        if python_stacks and mode != "sampled":
            raise UsageError("Python stacks are joined to samples: they need mode='sampled'")
        if not 1 <= python_hz <= defaults.MAX_PYTHON_HZ:
            raise UsageError(f"Python sample rate {python_hz} Hz: expected 1 to {defaults.MAX_PYTHON_HZ}")
        self.python_stacks = python_stacks
        self.python_hz = python_hz
        self._pyspy: Any = None
        self._pyspy_error: str | None = None
        self.event_names = event_presets.resolve(events)
        self.mode = mode
        self.record_shapes = record_shapes
        self.sample_hz = sample_hz
        self.stack_bytes = stack_bytes
        self.op_capacity = op_capacity
        self.timeline = timeline
        self.max_threads = max_threads
        self.modules = modules
        self._module_regions: ModuleRegions | None = None
        self.warn = warn
        self.dropped: list[DroppedEvent] = []
        self.profile: Profile | None = None
        self._native: Any = None
        self.meta: Meta | None = None
        self._ompt: Any = None
        self._ompt_info: OmptInfo | None = None

    def _ring_pages(self) -> int:
        """Ring pages per thread for 25 ms of samples (2.5 collector periods): a sample is its
        copied stack plus about 1 KiB of call chain and counters."""
        needed = self.sample_hz * 0.025 * (self.stack_bytes + 1024) / 4096
        pages = 8
        while pages < needed and pages < 1024:
            pages *= 2
        return pages

    # -- life cycle ---------------------------------------------------------------------------
    def start(self) -> profile:
        nat = native.load()
        event_presets.validate_names(self.event_names, nat)
        if nat.running():
            raise UsageError("a cpuprof profile is already running in this process")
        if self.python_stacks:
            # Before the session: py-spy's start and clock marker are not the program's work.
            from . import pyspy

            self._pyspy, self._pyspy_error = pyspy.start(self.python_hz)
            if self._pyspy_error and self.warn:
                _warn(f"no Python stacks: {self._pyspy_error}")
        try:
            dropped = nat.start(
                self.event_names, mode=self.mode, record_shapes=self.record_shapes,
                sample_hz=self.sample_hz, stack_bytes=self.stack_bytes,
                timeline_samples=defaults.TIMELINE_SAMPLES if self.timeline or self._pyspy else 0,
                ring_pages=self._ring_pages(), op_capacity=self.op_capacity, span_capacity=self.timeline,
                max_threads=self.max_threads,
            )
        except BaseException:
            self._stop_pyspy()
            raise
        # From here on this object owns the running session: stop() may stop it.
        self._native = nat
        self._start_ompt(nat)
        self.dropped = [DroppedEvent(name=d.name, reason=d.reason, errno=d.errno) for d in dropped]
        try:
            if self.modules is True:
                self._module_regions = ModuleRegions()
            elif self.modules is not False and self.modules is not None:
                self._module_regions = ModuleRegions(attribute_names(self.modules))
        except BaseException:
            nat.stop()
            self._stop_pyspy()
            raise
        if self.warn:
            by_reason: dict[str, list[str]] = {}
            for d in self.dropped:
                by_reason.setdefault(d.reason, []).append(d.name)
            for reason, names in by_reason.items():
                _warn(f"dropped {', '.join(names)}: {reason}")
        import torch

        self.meta = Meta(
            created=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            cpuprof_version=__version__, torch_version=torch.__version__, python=sys.version.split()[0],
            hostname=socket.gethostname(), pid=os.getpid(), argv=list(sys.argv),
        )
        return self

    def _start_ompt(self, nat: Any) -> None:
        """The OMPT tool's waits, where the OpenMP runtime loaded it: reset, told how to find the
        running op, and recording for the session's length. Elsewhere the reason is kept."""
        from .ompt import OmptReader

        self._ompt = OmptReader()
        self._ompt_info = self._ompt.open()
        if self._ompt_info.active:
            self._ompt.reset()
            self._ompt.attach(nat.current_op_entry_address())
            self._ompt.enable(True)

    def _read_ompt(self, profile: Profile) -> None:
        if self._ompt is None or self._ompt_info is None:
            return
        if not self._ompt_info.active:
            profile.openmp = OpenMPWaits(info=self._ompt_info)
            return
        tids = {t.tid: i for i, t in enumerate(profile.threads)}
        profile.openmp = self._ompt.read(tids)

    def stop(self) -> Profile:
        if self._native is None:
            raise UsageError("profile.stop() called before start()")
        if self._ompt is not None and self._ompt_info is not None and self._ompt_info.active:
            self._ompt.enable(False)
        if self._module_regions is not None:
            self._module_regions.remove()
            self._module_regions = None
        self._native.stop()
        trace = self._stop_pyspy()
        self.profile = self._build(complete=True)
        self._join_python(self.profile, trace)
        if self.warn:
            for line in sampling_warnings(self.profile):
                _warn(line)
        return self.profile

    def _stop_pyspy(self) -> Any:
        """py-spy's trace, or None (with the reason kept for the profile)."""
        recorder, self._pyspy = self._pyspy, None
        if recorder is None:
            return None
        from .pyspy import PySpyError

        try:
            return recorder.stop()
        except PySpyError as exc:
            self._pyspy_error = str(exc)
            if self.warn:
                _warn(f"no Python stacks: {exc}")
            return None

    def _join_python(self, profile: Profile, trace: Any) -> None:
        if not self.python_stacks:
            return
        from . import python_join

        if trace is not None:
            python_join.join(profile, trace)
        else:
            python_join.failed(profile, "py-spy", self.python_hz, self._pyspy_error or "py-spy did not run")

    @property
    def started(self) -> bool:
        return self._native is not None

    @property
    def running(self) -> bool:
        return self._native is not None and bool(self._native.running())

    def snapshot(self) -> Profile:
        """The profile so far, without stopping: what a checkpoint writes."""
        if self._native is None:
            raise UsageError("profile.snapshot() called before start()")
        return self._build(complete=not self._native.running())

    def __enter__(self) -> profile:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        if self._native is not None and self._native.running():
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
        assert self.meta is not None
        profile = build_profile(self._native.snapshot(), self.meta, self.dropped, complete=complete)
        self._read_ompt(profile)
        return profile
