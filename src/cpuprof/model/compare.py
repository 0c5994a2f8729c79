"""A configuration sweep (``cpuprof compare``): what was asked, in what order it ran, what each run measured.

Saved as ``compare.json`` after every run, so an interrupted sweep keeps what finished and can
be resumed, and any report (terminal, Markdown, CSV, JSON, HTML) is re-rendered from it later.
Each run is a whole ``decode`` in a fresh process with its own profile directory; the figures
kept here are the few that rank and explain configurations, taken from that profile.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import FileFormatError
from .io import FileKind, read_versioned, write_versioned


def _v1_to_v2(data: dict[str, Any]) -> dict[str, Any]:
    """Version 1 is version 2 without what it added (the tp and instances axes, and
    RunMetrics.all_reduce_share): one process per run, the new figure absent."""
    return data


COMPARE_FILE = FileKind(name="comparison", format="cpuprof-compare", version=2, filename="compare.json",
                        written_by="python -m cpuprof compare", migrations={1: _v1_to_v2})
COMPARE_FORMAT = COMPARE_FILE.format
COMPARE_VERSION = COMPARE_FILE.version
COMPARE_FILENAME = COMPARE_FILE.filename


@dataclass
class RunMetrics:
    """What one run measured. ``None``: not measured in that run (not profiled, no roofs, ...)."""

    tokens_per_s: float
    step_ms: list[float]  # every measured decode step's latency (warm-up steps left out)
    ttft_s: float | None  # prefill, to the first token
    p50_ms: float
    p99_ms: float
    threads: int | None = None  # the OpenMP team size in force
    # Shares of the team's time during ops (threads × op wall time), from the profile's contention analysis.
    spin_share: float | None = None  # on CPU, waiting in the OpenMP runtime
    sleep_share: float | None = None  # off CPU while an op ran (barrier sleep or waiting for a CPU)
    run_delay_share: float | None = None  # runnable but waiting for a CPU (schedstat), of threads × wall
    switches_per_token: float | None = None  # context switches of every thread, per generated token
    migrations_per_token: float | None = None  # CPU migrations of every thread, per generated token
    bandwidth_share: float | None = None  # tokens/s against the memory-bandwidth ceiling (roofline)
    # Of each measured decode step, the time inside all-reduces (tensor-parallel ranks summing their
    # partial results, waiting for the slowest rank included); 0 for a process that makes none.
    all_reduce_share: float | None = None
    profiled: bool = True
    # The bytes a token reads (weights and KV cache, counted by the decode), and the traffic that makes at
    # the measured tokens/s: what a decode bound by memory follows.
    bytes_per_token: float | None = None
    gb_per_s: float | None = None
    # The memory roof this run's ceiling and shares divide by, and whether it came from the cache (after a
    # probe of the memory agreed with it, or kept with --roofs cached) or was measured for the run.
    memory_roof_gb_per_s: float | None = None
    roofs_from_cache: bool | None = None
    # The probe of the memory before the run used cached roofs ("agrees", "remeasured", "kept") and the one
    # at the end of a long run ("agrees", "changed"): what it read, and the outcome.
    probe_gb_per_s: float | None = None
    probe_outcome: str | None = None
    end_probe_gb_per_s: float | None = None
    end_probe_outcome: str | None = None


@dataclass
class SweepConfig:
    """One configuration: a value for every swept axis, the rest as in the base options."""

    label: str  # "threads=2 omp=intel"
    values: dict[str, str]  # axis -> value, in axis order
    proposal: str | None = None  # compare --from: the verdict that proposed this configuration


RUN_STATUSES = ("done", "failed", "interrupted")


@dataclass
class SweepRun:
    config: int  # index into Comparison.configs
    repetition: int  # 1-based
    status: str  # "done", "failed", "interrupted"
    out_dir: str
    wall_s: float = 0.0  # the whole run: launch, build, decode
    error: str | None = None  # why it failed, in one line
    metrics: RunMetrics | None = None


@dataclass
class Comparison:
    format: str
    version: int
    created: str  # ISO 8601, UTC
    cpuprof_version: str
    argv: list[str]
    base: dict[str, Any]  # the DecodeOptions every configuration starts from (launch.json's form)
    axes: dict[str, list[str]]  # swept axis -> its values, in the order given
    configs: list[SweepConfig]
    repetitions: int
    order: list[list[int]]  # [config, repetition] pairs in the order they run
    baseline: int  # the configuration the others are judged against
    runs: list[SweepRun] = field(default_factory=list)
    source: str | None = None  # compare --from: the profile whose verdicts were swept

    def validate(self) -> None:
        """Every index points at a configuration and every count is positive (checked on load: a
        report or a resume indexes with them); raises FileFormatError naming the first that does not."""
        n = len(self.configs)
        if n == 0:
            raise FileFormatError("no configurations")
        if self.repetitions < 1:
            raise FileFormatError(f"repetitions is {self.repetitions}, not a positive count")
        if not 0 <= self.baseline < n:
            raise FileFormatError(f"baseline {self.baseline} is not one of the {n} configurations")
        for pair in self.order:
            if len(pair) != 2 or not 0 <= pair[0] < n or not 1 <= pair[1] <= self.repetitions:
                raise FileFormatError(f"order holds {pair}, not a [configuration, repetition] of the {n} "
                                      f"configurations and {self.repetitions} repetition(s)")
        for i, run in enumerate(self.runs):
            if not 0 <= run.config < n or not 1 <= run.repetition <= self.repetitions:
                raise FileFormatError(f"runs[{i}] is configuration {run.config} repetition {run.repetition}, "
                                      f"not one of the {n} configurations and {self.repetitions} repetition(s)")
            if run.status not in RUN_STATUSES:
                raise FileFormatError(f"runs[{i}] has status {run.status!r}, not one of {', '.join(RUN_STATUSES)}")
            m = run.metrics
            if m is not None and (m.tokens_per_s < 0 or m.p50_ms < 0 or m.p99_ms < 0 or any(v < 0 for v in m.step_ms)
                                  or (m.threads is not None and m.threads < 1)):
                raise FileFormatError(f"runs[{i}] has a negative rate, latency or thread count")

    def done_runs(self, config: int) -> list[SweepRun]:
        return [r for r in self.runs if r.config == config and r.status == "done" and r.metrics is not None]

    def finished(self, config: int, repetition: int) -> bool:
        """Whether that run has a result to keep (done or failed); interrupted runs run again on resume."""
        return any(r.config == config and r.repetition == repetition and r.status in ("done", "failed")
                   for r in self.runs)

    def save(self, out_dir: str | os.PathLike[str]) -> Path:
        """``out_dir/compare.json``, atomically: a sweep killed while saving keeps the previous state."""
        return write_versioned(Path(out_dir) / COMPARE_FILENAME, COMPARE_FILE, self)

    @staticmethod
    def load(path: str | os.PathLike[str]) -> Comparison:
        """A comparison file, or compare.json in a directory; FileFormatError (one line) otherwise."""
        return read_versioned(path, COMPARE_FILE, Comparison)
