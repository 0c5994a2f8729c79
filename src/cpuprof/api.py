"""The Python API: ``cpuprof.profile()`` and ``cpuprof.region()``.

    with cpuprof.profile() as prof:
        model.generate(...)
    prof.report(); prof.export("out/")

The session lives in the C++ core; this module only resolves options, starts and stops it, and
turns the core's snapshot into a :class:`~cpuprof.model.Profile`.
"""

from __future__ import annotations

import datetime
import os
import socket
import sys
from pathlib import Path
from typing import Any, TextIO

from . import __version__, native
from . import events as event_presets
from .errors import UsageError
from .model import (
    Collection,
    DroppedEvent,
    EventInfo,
    Limits,
    OpStat,
    Overhead,
    Profile,
    Spans,
    ThreadStat,
)

MODES = ("sampled", "exact")


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


class _ModuleRegions:
    """Makes every nn.Module forward a region named by its class, through global module hooks.

    Class names, not instance paths: the keys stay bounded ("LlamaDecoderLayer/LlamaMLP/Linear"
    whatever the depth of the model), which is what an aggregate over many layers wants.
    """

    def __init__(self) -> None:
        import threading

        import torch
        from torch.nn.modules import module as nn_module

        self._local = threading.local()
        record_function = torch.autograd.profiler.record_function

        def enter(module: Any, _args: Any) -> None:
            scope = record_function(type(module).__name__)
            scope.__enter__()
            self._stack().append(scope)

        def leave(module: Any, _args: Any, _output: Any) -> None:
            stack = self._stack()
            if stack:
                stack.pop().__exit__(None, None, None)

        self._handles = [nn_module.register_module_forward_pre_hook(enter),
                         nn_module.register_module_forward_hook(leave, always_call=True)]

    def _stack(self) -> list[Any]:
        if not hasattr(self._local, "stack"):
            self._local.stack = []
        return self._local.stack

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()


class profile:
    """Profiles every ATen op, with counters of every thread of the process.

    ``mode="sampled"`` (default) keeps the op path to two timestamps; at the first op boundary
    after every ``sample_interval_us`` the dispatching thread reads the team's counters once and
    charges the deltas to the op running then. ``mode="exact"`` reads the team at every op
    boundary (exact per op, about two ``read()``s per team thread per op).
    ``modules=True`` makes each nn.Module forward a region named by its class, so ops are keyed by
    the module that ran them (a few µs per module call; the built-in decode model marks its own
    regions instead). ``timeline`` is how many of the newest op spans each dispatching thread
    keeps (0: aggregates only).
    """

    def __init__(
        self,
        events: str | list[str] | None = None,
        *,
        mode: str = "sampled",
        record_shapes: bool = True,
        sample_interval_us: int = 4000,
        op_capacity: int = 2048,
        timeline: int = 0,
        max_threads: int = 64,
        modules: bool = False,
        warn: bool = True,
    ) -> None:
        if mode not in MODES:
            raise UsageError(f"mode {mode!r} is not one of: {', '.join(MODES)}")
        if sample_interval_us < 50:
            raise UsageError(f"sample interval {sample_interval_us} µs is too short; use at least 50")
        if not 16 <= op_capacity <= 1 << 20 or not 0 <= timeline <= 1 << 24 or not 1 <= max_threads <= 64:
            raise UsageError("op_capacity must be in 16..1048576, timeline in 0..16777216 and max_threads in 1..64")
        self.event_names = event_presets.resolve(events)
        self.mode = mode
        self.record_shapes = record_shapes
        self.sample_interval_us = sample_interval_us
        self.op_capacity = op_capacity
        self.timeline = timeline
        self.max_threads = max_threads
        self.modules = modules
        self._module_regions: _ModuleRegions | None = None
        self.warn = warn
        self.dropped: list[DroppedEvent] = []
        self.profile: Profile | None = None
        self._native: Any = None
        self.meta: dict[str, Any] = {}

    # -- life cycle ---------------------------------------------------------------------------
    def start(self) -> profile:
        nat = native.load()
        event_presets.validate_names(self.event_names, nat)
        if nat.running():
            raise UsageError("a cpuprof profile is already running in this process")
        dropped = nat.start(
            self.event_names,
            mode=self.mode,
            record_shapes=self.record_shapes,
            sample_interval_us=self.sample_interval_us,
            op_capacity=self.op_capacity,
            span_capacity=self.timeline,
            max_threads=self.max_threads,
        )
        # From here on this object owns the running session: stop() may stop it.
        self._native = nat
        self.dropped = [DroppedEvent(name=d["name"], reason=d["reason"], errno=d["errno"]) for d in dropped]
        try:
            if self.modules:
                self._module_regions = _ModuleRegions()
        except BaseException:
            nat.stop()
            raise
        if self.warn:
            by_reason: dict[str, list[str]] = {}
            for d in self.dropped:
                by_reason.setdefault(d.reason, []).append(d.name)
            for reason, names in by_reason.items():
                _warn(f"dropped {', '.join(names)}: {reason}")
        import torch

        self.meta = {
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "cpuprof_version": __version__,
            "torch_version": torch.__version__,
            "python": sys.version.split()[0],
            "hostname": socket.gethostname(),
            "pid": os.getpid(),
            "argv": list(sys.argv),
        }
        return self

    def stop(self) -> Profile:
        if self._native is None:
            raise UsageError("profile.stop() called before start()")
        if self._module_regions is not None:
            self._module_regions.remove()
            self._module_regions = None
        self._native.stop()
        self.profile = self._build(complete=True)
        return self.profile

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
    def report(self, file: TextIO | None = None, top: int = 20) -> None:
        from .reports import terminal

        terminal.render(self._require(), file or sys.stdout, top=top)

    def export(self, directory: str | os.PathLike[str]) -> Path:
        return self._require().save(directory)

    def _require(self) -> Profile:
        if self.profile is None:
            raise UsageError("no profile yet: use the profile as a context manager or call stop()")
        return self.profile

    def _build(self, complete: bool) -> Profile:
        return build_profile(self._native.snapshot(), self.meta, self.dropped, complete=complete)


def build_profile(snap: dict[str, Any], meta: dict[str, Any], dropped: list[DroppedEvent],
                  complete: bool = True) -> Profile:
    """Turns the core's snapshot into the profile model."""
    from . import capabilities

    names = [e["name"] for e in snap["events"]]
    stopped_ns = snap["stopped_ns"] if not snap["running"] and snap["stopped_ns"] else snap["now_ns"]
    dispatch = set(snap["dispatch_tids"])
    threads = []
    for t in snap["threads"]:
        counters = dict(zip(names, t["totals"]))
        counted = t["counted"]
        if t["tid"] in dispatch:
            role = "dispatch"
        elif any(counted) and counters.get("task-clock", 0) > 0:
            role = "worker"
        else:
            role = "idle"
        threads.append(ThreadStat(
            tid=t["tid"], name=t["name"], role=role, counters=counters,
            scaled=[n for n, s in zip(names, t["scaled"]) if s],
            uncounted=[n for n, c in zip(names, counted) if not c],
            opened_ns=t["opened_ns"],
        ))
    n_threads = len(threads)
    by_index = {e["index"]: e for e in snap["entries"]}

    def region_path(index: int) -> str | None:
        parts = []
        seen = set()
        while index and index in by_index and index not in seen:
            seen.add(index)
            parts.append(by_index[index]["name"])
            index = by_index[index]["region"]
        return "/".join(reversed(parts)) or None

    def per_event(rows: list[list[int]]) -> dict[str, list[int]]:
        padded = [row for row in rows] + [[0] * len(names)] * (n_threads - len(rows))
        return {name: [padded[slot][e] for slot in range(n_threads)] for e, name in enumerate(names)}

    ops = [
        OpStat(
            id=e["index"], kind=e["kind"], name=e["name"], shapes=e["shapes"],
            region=region_path(e["region"]), calls=e["calls"], incl_ns=e["incl_ns"],
            self_ns=min(e["self_ns"], e["incl_ns"]), max_ns=e["max_ns"],
            counters_self=per_event(e["counters_self"]), counters_incl=per_event(e["counters_incl"]),
            samples=e["samples"],
        )
        for e in snap["entries"]
    ]
    spans_data = snap["spans"]
    spans = None
    if spans_data["capacity"]:
        import numpy as np

        # One ring per dispatching thread; merged here in the order the spans ended.
        order = np.argsort(spans_data["start_ns"] + spans_data["dur_ns"], kind="stable")
        spans = Spans(
            op=spans_data["entry"][order].tolist(), thread=spans_data["thread_slot"][order].tolist(),
            depth=spans_data["depth"][order].tolist(), start_ns=spans_data["start_ns"][order].tolist(),
            dur_ns=spans_data["dur_ns"][order].tolist(),
            # Per-span counter deltas exist only where every op boundary was read (exact mode).
            counters=(spans_data["counters"][order, : len(names)].tolist() if snap["mode"] == "exact"
                      else [[] for _ in range(len(order))]),
        )
    profile = Profile(
        meta=meta,
        capabilities=capabilities.collection_capabilities(),
        collection=Collection(
            mode=snap["mode"], events=[EventInfo(**e) for e in snap["events"]],
            record_shapes=snap["record_shapes"], sample_interval_us=snap["sample_interval_us"],
            started_ns=snap["started_ns"], stopped_ns=stopped_ns, scaled_events=snap["scaled_events"],
        ),
        threads=threads,
        ops=ops,
        overhead=Overhead(
            hook_ns=snap["hook_ns"], ops=snap["ops_seen"], sampler_cpu_ns=snap["sampler_cpu_ns"],
            sampler_ticks=snap["sampler_ticks"], samples=snap["samples"],
        ),
        limits=Limits(
            op_capacity=snap["op_capacity"], ops_overflowed=snap["ops_overflowed"],
            span_capacity=spans_data["capacity"], spans_dropped=spans_data["dropped"],
            too_deep=snap["too_deep"], unattributed_ops=snap["unattributed_ops"],
            threads_beyond_limit=snap["threads_beyond_limit"], memory_bytes=snap["memory_bytes"],
            unmatched_ends=snap["unmatched_ends"], truncated_ops=snap["truncated_ops"],
        ),
        dropped_events=list(dropped),
        spans=spans,
        status={"complete": complete},
    )
    profile.validate()
    return profile
