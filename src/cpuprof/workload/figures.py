"""Throughput and latency from per-step latencies: one function for finished and interrupted runs.

Plain Python, no numpy: this runs while a decode is still profiled, and numpy's percentile imports
numpy.ma and inspect on first use, work the profile would charge to the program (it was the tallest
tower of a decode's flame graph).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from ..model import StepFigures


def percentile(values: Sequence[float], q: float) -> float:
    """numpy's default percentile: linear interpolation between the closest ranks of the sorted values."""
    ordered = sorted(values)
    rank = q / 100 * (len(ordered) - 1)
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def step_figures(latencies_s: Sequence[float], warmup: int, batch: int) -> StepFigures | None:
    """Figures over the steps after ``warmup``; None when no step was measured.

    tokens/s counts every sequence of the batch (a step of batch 4 makes 4 tokens); the
    percentiles are numpy's linear interpolation between the closest ranks.
    """
    measured = [float(x) for x in latencies_s[warmup:]]
    total = math.fsum(measured)
    if not measured or total <= 0:
        return None
    p50, p90, p99 = (percentile(measured, q) * 1e3 for q in (50, 90, 99))
    return StepFigures(measured_steps=len(measured), tokens_per_s=batch * len(measured) / total,
                       p50_ms=p50, p90_ms=p90, p99_ms=p99)
