"""What a report is, before any format: sections of prose lines and tables of typed values.

Analyses produce these from a Profile; renderers (terminal, markdown, json) only lay them out.
A cell holds the value itself (nanoseconds, a count, a ratio), never its text, so the JSON
report carries numbers and each text format writes them its own way; ``None`` means "not
measured", which every renderer shows differently from zero.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# Units a column's values are in; renderers format by unit.
UNITS = ("text", "ns", "count", "int", "ratio", "share", "bytes")


@dataclass
class Column:
    key: str
    header: str
    unit: str = "text"
    help: str = ""  # what the column means, printed in the table's legend
    align: str = ""  # "l" or "r"; by default text is left-aligned and numbers right-aligned

    @property
    def alignment(self) -> str:
        return self.align or ("l" if self.unit == "text" else "r")


@dataclass
class Table:
    columns: list[Column]
    rows: list[dict[str, Any]]
    caption: str = ""  # one line above the table: what it shows and how it is sorted
    legend_notes: list[str] = field(default_factory=list)  # extra legend lines (symbols, methods)


@dataclass
class Section:
    id: str
    title: str
    lines: list[str] = field(default_factory=list)  # prose before the tables
    tables: list[Table] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # after the tables


@dataclass
class Report:
    title: str
    warnings: list[str] = field(default_factory=list)  # what qualifies every number below
    sections: list[Section] = field(default_factory=list)
    # The analyses' typed results the charts draw (a dataclass: analysis.report.ProfileFigures,
    # analysis.compare.SweepFigures), carried as data by the JSON report; None where there are none.
    figures: Any = None

    def section(self, section_id: str) -> Section | None:
        return next((s for s in self.sections if s.id == section_id), None)
