"""Throughput and latency from per-step latencies: one function for finished and interrupted runs."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..model import StepFigures


def step_figures(latencies_s: Sequence[float], warmup: int, batch: int) -> StepFigures | None:
    """Figures over the steps after ``warmup``; None when no step was measured.

    tokens/s counts every sequence of the batch (a step of batch 4 makes 4 tokens); the
    percentiles are numpy's linear interpolation between the closest ranks.
    """
    measured = np.asarray(latencies_s[warmup:], dtype=np.float64)
    if measured.size == 0 or measured.sum() <= 0:
        return None
    p50, p90, p99 = np.percentile(measured, [50, 90, 99]) * 1e3
    return StepFigures(measured_steps=int(measured.size), tokens_per_s=float(batch * measured.size / measured.sum()),
                       p50_ms=float(p50), p90_ms=float(p90), p99_ms=float(p99))
