"""What a profile is collected by: the native session and the collectors beside it, one life cycle.

Every collector has the same shape (:class:`Collector`): ``start()`` (raising when it cannot run
at all), ``stop()``, ``contribute(profile)`` (adds what it measured to the profile the native
session built) and ``limitations()`` (what it could not do, one line each, warned by the session).
:class:`cpuprof.profile` keeps a list of them: it starts them in order, stops them in reverse,
and rolls back the started ones when one fails to start. A new collector is one more class here
and one more entry in :func:`collectors_for` (see ``profile._collectors``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from .. import defaults
from ..model import SAMPLED, DroppedEvent, Meta, OmptInfo, OpenMPWaits, Profile
from .build import build_profile
from .modules import ModuleRegions, attribute_names


class Collector(Protocol):
    """One source of a profile's figures, with the life cycle every source shares."""

    name: str

    def start(self) -> None:
        """Begins collecting; raises (one-line CpuprofError where the user can act) when it cannot."""

    def stop(self) -> None:
        """Ends collecting; never raises for a shortfall (``limitations`` says it)."""

    def contribute(self, profile: Profile) -> None:
        """Adds what it measured to ``profile`` (called for every snapshot and at the end)."""

    def limitations(self) -> list[str]:
        """What it could not do so far, one line each (the session warns each line once)."""


@dataclass
class NativeSettings:
    """What the native session is started with (checked by ``cpuprof.profile`` beforehand)."""

    events: list[str]
    mode: str
    record_shapes: bool
    sample_hz: int
    stack_bytes: int
    ring_pages: int
    op_capacity: int
    span_capacity: int
    max_threads: int


class NativeSession:
    """The C++ core's session: every op's time and counters, every thread, the samples. It is the
    one collector that makes the profile (:meth:`build`); the others add to it."""

    name = "native session"

    def __init__(self, nat: Any, settings: NativeSettings, meta: Meta, python: PythonStacks | None = None) -> None:
        self.nat = nat
        self.settings = settings
        self.meta = meta
        self.python = python  # py-spy's stacks are joined through the sample timeline
        self.dropped: list[DroppedEvent] = []
        self._built: Profile | None = None
        self._setup_failures = 0

    def start(self) -> None:
        s = self.settings
        # Samples one by one, the newest TIMELINE_SAMPLES (4 MB at most), in every sampled profile: the
        # threads' busy-over-time chart needs them, as do a trace and py-spy's stacks.
        keep = s.mode == SAMPLED or s.span_capacity > 0 or (self.python is not None and self.python.recording)
        dropped = self.nat.start(
            s.events, mode=self.nat.CountingMode.__members__[s.mode], record_shapes=s.record_shapes,
            sample_hz=s.sample_hz, stack_bytes=s.stack_bytes,
            timeline_samples=defaults.TIMELINE_SAMPLES if keep else 0,
            ring_pages=s.ring_pages, op_capacity=s.op_capacity, span_capacity=s.span_capacity,
            max_threads=s.max_threads, own_threads=self.python.own_threads if self.python is not None else [],
        )
        self.dropped = [DroppedEvent(name=d.name, reason=d.reason, errno=d.errno) for d in dropped]

    def stop(self) -> None:
        self.nat.stop()

    @property
    def running(self) -> bool:
        return bool(self.nat.running())

    def build(self, complete: bool) -> Profile:
        snap = self.nat.snapshot()
        self._setup_failures = snap.thread_setup_failures
        self._built = build_profile(snap, self.meta, self.dropped, complete=complete)
        return self._built

    def contribute(self, profile: Profile) -> None:
        """Nothing beyond :meth:`build`, which made the profile."""

    def limitations(self) -> list[str]:
        lines: list[str] = []
        by_reason: dict[str, list[str]] = {}
        for d in self.dropped:
            by_reason.setdefault(d.reason, []).append(d.name)
        lines += [f"dropped {', '.join(names)}: {reason}" for reason, names in by_reason.items()]
        if self._built is not None and self._built.status.complete:
            lines += sampling_warnings(self._built)
            if self._setup_failures:
                lines.append(f"a dispatching thread's op buffers could not be allocated ({self._setup_failures:,} "
                             "tries): the ops open then went unrecorded (counted as unattributed ops)")
        return lines


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
    # A shrunk ring that lost nothing fell short of nothing: the report's note still lists it.
    shrunk = [(f"T{i}", t.samples_lost) for i, t in enumerate(p.threads) if t.sample_ring_shrunk and t.samples_lost]
    if shrunk:
        more = f" and {len(shrunk) - 8} more" if len(shrunk) > 8 else ""
        named = ", ".join(label for label, _ in shrunk[:8]) + more
        one = len(shrunk) == 1
        out.append(f"{named}: sample ring{'' if one else 's'} mapped smaller than asked (over the locked-memory "
                   f"budget, kernel.perf_event_mlock_kb and RLIMIT_MEMLOCK, or out of memory); "
                   f"{'it' if one else 'they'} lost {sum(lost for _, lost in shrunk):,} samples")
    if p.sampling is not None and p.sampling.lost:
        out.append(f"{p.sampling.lost:,} samples lost (a sample ring filled before the collector drained it): "
                   "per-op CPU time is short by as many sampling periods")
    if p.sampling is not None and p.sampling.op_events_dropped:
        out.append(f"{p.sampling.op_events_dropped:,} op begins and ends dropped (a dispatching thread's op-event "
                   "ring filled before the collector drained it): CPU and stacks near them went to the wrong ops")
    return out


class OmptWaits:
    """OpenMP waits from the OMPT tool, where the OpenMP runtime loaded it (``--omp intel``).

    Its absence is the usual case (libgomp never loads a tool), so the reason is kept in the
    profile (``openmp.info``) for the report's notes rather than warned as a limitation."""

    name = "OMPT waits"

    def __init__(self, current_op_address: int) -> None:
        from .ompt import OmptReader

        self._reader = OmptReader()
        self._current_op_address = current_op_address
        self.info: OmptInfo | None = None

    def start(self) -> None:
        self.info = self._reader.open()
        if self.info.active:
            self._reader.reset()
            self._reader.attach(self._current_op_address)
            self._reader.enable(True)

    def stop(self) -> None:
        if self.info is not None and self.info.active:
            self._reader.enable(False)

    def contribute(self, profile: Profile) -> None:
        if self.info is None:
            return
        if not self.info.active:
            profile.openmp = OpenMPWaits(info=self.info)
            return
        profile.openmp = self._reader.read({t.tid: i for i, t in enumerate(profile.threads)})

    def limitations(self) -> list[str]:
        return []


class PythonStacks:
    """Python stacks joined to the dispatching threads' samples, read by ``sampler``:
    ``"in-process"`` (a thread of cpuprof's in the process, see python_sampler) or ``"py-spy"``
    (beside the process, see pyspy).

    Started before the native session, so a sampler's start-up (py-spy's attach and clock marker)
    is not the program's work. A sampler failing is a limitation (the profile says why), never a
    failed start."""

    name = "Python stacks"

    def __init__(self, hz: int, sampler: str = defaults.PYTHON_SAMPLER) -> None:
        self.hz = hz
        self.sampler = sampler
        self._recorder: Any = None
        self._trace: Any = None
        self.error: str | None = None

    def start(self) -> None:
        if self.sampler == "py-spy":
            from . import pyspy

            self._recorder, self.error = pyspy.start(self.hz)
            return
        from .python_sampler import InProcessPythonSampler

        recorder = InProcessPythonSampler(self.hz)
        try:
            recorder.start()
        except RuntimeError as exc:  # no thread could be started
            self.error = f"the in-process Python sampler could not start: {exc}"
            return
        self._recorder = recorder

    @property
    def recording(self) -> bool:
        return self._recorder is not None

    @property
    def own_threads(self) -> list[int]:
        """The OS ids of its threads in the process, which the native session must not profile
        (its cost is in the overhead line instead, like the collector's)."""
        tid = getattr(self._recorder, "native_id", None)
        return [tid] if tid is not None else []

    def stop(self) -> None:
        recorder, self._recorder = self._recorder, None
        if recorder is None:
            return
        from .pyspy import PySpyError

        try:
            self._trace = recorder.stop()
        except PySpyError as exc:
            self.error = str(exc)
        except Exception as exc:  # noqa: BLE001 - the in-process sampler's stacks could not be resolved
            self.error = f"the in-process Python sampler failed: {type(exc).__name__}: {exc}"
        self.error = self.error or getattr(recorder, "error", None)

    def contribute(self, profile: Profile) -> None:
        if self._recorder is not None:
            return  # still running: a snapshot has no Python stacks yet
        from . import python_join

        if self._trace is not None:
            python_join.join(profile, self._trace)  # a sampler that stopped early: what it read
        else:
            python_join.failed(profile, self.sampler, self.hz, self.error or f"{self.sampler} did not run")

    def limitations(self) -> list[str]:
        if not self.error:
            return []
        return [f"Python stacks incomplete: {self.error}" if self._trace is not None else
                f"no Python stacks: {self.error}"]


class ModuleRegionCollector:
    """Every nn.Module forward as a region (``modules=True``, or a model for attribute names)."""

    name = "module regions"

    def __init__(self, modules: Any) -> None:
        self.modules = modules
        self._regions: ModuleRegions | None = None

    def start(self) -> None:
        names = None if self.modules is True else attribute_names(self.modules)
        self._regions = ModuleRegions(names)

    def stop(self) -> None:
        regions, self._regions = self._regions, None
        if regions is not None:
            regions.remove()

    def contribute(self, profile: Profile) -> None:
        """Its regions are ops of the native session's profile already."""

    def limitations(self) -> list[str]:
        return []
