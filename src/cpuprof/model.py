"""The one profile model that every report and exporter reads.

A profile is data first: recording writes it, ``save`` turns it into versioned JSON, ``load``
turns that back into the same objects, and reports never look at anything else. Every number
carries how it was obtained (``Collection.mode``, ``Capabilities``) and what could not be
measured (``Limits``, ``Capabilities.dropped_events``), so a re-rendered profile says the same
things as the live one.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .errors import ProfileFormatError

FORMAT = "cpuprof-profile"
VERSION = 1
PROFILE_FILENAME = "profile.json"


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

    mode: str  # "exact": read at every op boundary; "sampled": charged by a sampler thread
    events: list[EventInfo]
    record_shapes: bool
    sample_interval_us: int
    started_ns: int
    stopped_ns: int
    scaled_events: list[str] = field(default_factory=list)  # per-op deltas scaled (multiplexing)

    @property
    def wall_ns(self) -> int:
        return max(0, self.stopped_ns - self.started_ns)

    @property
    def event_names(self) -> list[str]:
        return [e.name for e in self.events]


@dataclass
class ThreadStat:
    """One OS thread of the profiled process; ``counters`` are its totals over the session."""

    tid: int
    name: str
    role: str  # "dispatch" (runs ATen ops), "worker" (did work for them), or "idle"
    counters: dict[str, int]
    scaled: list[str] = field(default_factory=list)  # events whose counts were multiplexed
    uncounted: list[str] = field(default_factory=list)  # events that never ran on it
    opened_ns: int = 0

    @property
    def cpu_ns(self) -> int | None:
        return self.counters.get("task-clock")


@dataclass
class OpStat:
    """Aggregates for one op key: (name, input shapes and dtypes, enclosing region).

    ``counters_self``/``counters_incl`` map an event to one value per thread, in the order of
    ``Profile.threads``: the work of every thread of the team while this op ran.
    """

    id: int
    kind: str  # "op", "region" or "special"
    name: str
    shapes: str
    region: str | None
    calls: int
    incl_ns: int
    self_ns: int
    max_ns: int
    counters_self: dict[str, list[int]]
    counters_incl: dict[str, list[int]]
    samples: int = 0  # sampled mode: sampler ticks that caught this op innermost

    def self_total(self, event: str) -> int | None:
        values = self.counters_self.get(event)
        return None if values is None else sum(values)

    def incl_total(self, event: str) -> int | None:
        values = self.counters_incl.get(event)
        return None if values is None else sum(values)


@dataclass
class Overhead:
    """What the profiler itself cost, measured during the run."""

    hook_ns: int  # time inside cpuprof's op callbacks, on the dispatching threads
    ops: int
    sampler_cpu_ns: int  # CPU time of the sampler thread (thread discovery, final totals)
    sampler_ticks: int
    samples: int = 0  # sampled mode: team reads taken at op boundaries
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
    threads_beyond_limit: int
    memory_bytes: int
    unmatched_ends: int = 0  # op ends with no begin in this session on that thread
    truncated_ops: int = 0  # ops still open when the session stopped


@dataclass
class Spans:
    """The optional timeline: columnar, in the order the spans ended. ``counters`` are each span's
    inclusive deltas summed over the team, in event order (exact mode; empty lists in sampled mode)."""

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
    meta: dict[str, Any]
    capabilities: dict[str, Any]
    collection: Collection
    threads: list[ThreadStat]
    ops: list[OpStat]
    overhead: Overhead
    limits: Limits
    dropped_events: list[DroppedEvent] = field(default_factory=list)
    spans: Spans | None = None
    settings: dict[str, Any] = field(default_factory=dict)
    workload: dict[str, Any] = field(default_factory=dict)
    status: dict[str, Any] = field(default_factory=lambda: {"complete": True})

    @classmethod
    def unprofiled(cls) -> Profile:
        """A profile with no counters: a run made without profiling (a baseline), whose
        workload and settings still need one home."""
        return cls(
            meta={}, capabilities={},
            collection=Collection(mode="off", events=[], record_shapes=False, sample_interval_us=0,
                                  started_ns=0, stopped_ns=0),
            threads=[], ops=[], overhead=Overhead(hook_ns=0, ops=0, sampler_cpu_ns=0, sampler_ticks=0),
            limits=Limits(op_capacity=0, ops_overflowed=0, span_capacity=0, spans_dropped=0, too_deep=0,
                          unattributed_ops=0, threads_beyond_limit=0, memory_bytes=0),
        )

    # ----------------------------------------------------------------------------------------
    def op_by_id(self) -> dict[int, OpStat]:
        return {op.id: op for op in self.ops}

    def has_event(self, name: str) -> bool:
        return name in self.collection.event_names

    def validate(self) -> None:
        """Checks the invariants every report relies on; raises ProfileFormatError if broken."""
        n_threads = len(self.threads)
        events = set(self.collection.event_names)
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
            columns = asdict(self.spans)
            lengths = {len(v) for v in columns.values()}
            if len(lengths) > 1:
                raise ProfileFormatError("span columns have different lengths")

    # ----------------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        return {"format": FORMAT, "version": VERSION, **data}

    @classmethod
    def from_dict(cls, data: Any, source: str = "profile") -> Profile:
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ProfileFormatError(f"{source} is not a cpuprof profile (no '{FORMAT}' header)")
        version = data.get("version")
        if version != VERSION:
            raise ProfileFormatError(
                f"{source} is a cpuprof profile of format version {version}; this cpuprof reads version {VERSION}"
            )
        try:
            collection = dict(data["collection"])
            collection["events"] = [EventInfo(**e) for e in collection["events"]]
            spans = data.get("spans")
            profile = cls(
                meta=data["meta"],
                capabilities=data["capabilities"],
                collection=Collection(**collection),
                threads=[ThreadStat(**t) for t in data["threads"]],
                ops=[OpStat(**o) for o in data["ops"]],
                overhead=Overhead(**data["overhead"]),
                limits=Limits(**data["limits"]),
                dropped_events=[DroppedEvent(**d) for d in data.get("dropped_events", [])],
                spans=Spans(**spans) if spans else None,
                settings=data.get("settings", {}),
                workload=data.get("workload", {}),
                status=data.get("status", {"complete": True}),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ProfileFormatError(f"{source} is a damaged cpuprof profile ({type(exc).__name__}: {exc})") from exc
        profile.validate()
        return profile

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Writes JSON atomically (temp file + rename): a crash mid-write never leaves half a file.

        ``path`` may be a directory (the file is ``profile.json`` in it) or a file name.
        """
        target = Path(path)
        if target.suffix != ".json":
            target.mkdir(parents=True, exist_ok=True)
            target = target / PROFILE_FILENAME
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".profile-", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as out:
                json.dump(self.to_dict(), out, separators=(",", ":"))
            os.replace(tmp, target)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
        return target

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Profile:
        """Reads a profile file, or ``profile.json`` inside a directory; one-line errors only."""
        source = Path(path)
        if source.is_dir():
            source = source / PROFILE_FILENAME
        try:
            text = source.read_text()
        except FileNotFoundError as exc:
            raise ProfileFormatError(f"{source}: no such profile (expected a directory written by cpuprof "
                                     f"or a {PROFILE_FILENAME})") from exc
        except (OSError, UnicodeDecodeError) as exc:
            raise ProfileFormatError(f"{source}: cannot read ({exc})") from exc
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ProfileFormatError(
                f"{source}: not valid JSON at line {exc.lineno} column {exc.colno} (truncated or not a profile)"
            ) from exc
        return cls.from_dict(data, source=str(source))
