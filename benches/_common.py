"""Helpers shared by the benchmarks: interleaving, medians and spreads, plain-text tables."""

from __future__ import annotations

import datetime
import os
import platform
import random
import statistics
from collections.abc import Sequence


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values)) if values else float("nan")


def median_ci(values: Sequence[float], level: float = 0.95, resamples: int = 2000) -> tuple[float, float]:
    """A bootstrap confidence interval of the median (percentile method, fixed seed so a rerun on the
    same figures prints the same interval): whether a difference of a point is more than the
    machine's noise, which min-max cannot say."""
    if len(values) < 2:
        return float("nan"), float("nan")
    draw = random.Random(0)
    meds = sorted(statistics.median(draw.choices(values, k=len(values))) for _ in range(resamples))
    tail = int(resamples * (1 - level) / 2)
    return float(meds[tail]), float(meds[resamples - 1 - tail])


def span(values: Sequence[float], fmt: str = "{:.2f}") -> str:
    return f"{fmt.format(min(values))}–{fmt.format(max(values))}" if values else "-"


def rotated(items: Sequence, k: int) -> list:
    """The order of variants for round k: rotated every round, so none always runs first."""
    k = k % len(items)
    return list(items[k:]) + list(items[:k])


def render_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        pairs = enumerate(zip(cells, widths, strict=True))
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in pairs)

    return "\n".join([line(headers), "  ".join("-" * w for w in widths), *(line(r) for r in rows)])


def machine_line() -> str:
    now = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    load = "load {:.2f} {:.2f} {:.2f}".format(*os.getloadavg())
    return f"{now}  {platform.node()}  {os.cpu_count()} CPUs  {load}"
