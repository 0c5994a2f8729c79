"""How numbers are written, everywhere cpuprof writes them (reports, progress, errors)."""

from __future__ import annotations


def fmt_ns(ns: float) -> str:
    if ns < 0:  # a difference of times (a remainder of a breakdown) can be negative
        return "-" + fmt_ns(-ns)
    if ns >= 1e9:
        return f"{ns / 1e9:.2f} s"
    if ns >= 1e6:
        return f"{ns / 1e6:.1f} ms"
    if ns >= 1e3:
        return f"{ns / 1e3:.1f} µs"
    return f"{ns:.0f} ns"


def fmt_count(value: float) -> str:
    """1234 -> 1.2k, 5_600_000 -> 5.6M: event counts, where three digits are enough."""
    for limit, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= limit:
            return f"{value / limit:.1f}{suffix}"
    return f"{value:.0f}"


def fmt_bytes(n: float) -> str:
    for limit, suffix in ((1e9, "GB"), (1e6, "MB"), (1e3, "kB")):
        if n >= limit:
            return f"{n / limit:.2f} {suffix}"
    return f"{n:.0f} B"


def fmt_params(n: float) -> str:
    """Parameter counts as model cards write them: 1.24 B, 90.4 M, 512 k."""
    for limit, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if n >= limit:
            return f"{n / limit:.2f} {suffix}" if n < 10 * limit else f"{n / limit:.1f} {suffix}"
    return f"{n:.0f}"


def fmt_percent(share: float) -> str:
    """A share (0..1) as a percentage with the precision it deserves."""
    pct = 100.0 * share
    return f"{pct:.1f}%" if pct < 10 else f"{pct:.0f}%"


def fmt_rate(value: float) -> str:
    return f"{value:.2f}" if value < 100 else f"{value:.1f}" if value < 1000 else f"{value:,.0f}"
