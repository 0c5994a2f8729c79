"""What every renderer has in common: the interface, and how a cell's value becomes text."""

from __future__ import annotations

from typing import Any, Protocol, TextIO

from ..analysis.report_model import Column, Report
from ..units import fmt_bytes, fmt_count, fmt_ns, fmt_percent

NOT_MEASURED = "-"


class Renderer(Protocol):
    """One output format of a report. ``name`` is what ``report --format`` takes."""

    name: str
    suffix: str  # file extension when written to a file

    def render(self, report: Report, out: TextIO) -> None: ...


def cell_text(value: Any, column: Column) -> str:
    if value is None:
        return NOT_MEASURED
    unit = column.unit
    if unit == "ns":
        return fmt_ns(value)
    if unit == "count":
        return fmt_count(value)
    if unit == "int":
        return f"{value:,}" if column.key != "tid" else str(value)
    if unit == "ratio":
        return f"{value:.2f}"
    if unit == "share":
        return fmt_percent(value)
    if unit == "bytes":
        return fmt_bytes(value)
    return str(value)
