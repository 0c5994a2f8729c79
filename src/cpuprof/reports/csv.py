"""CSV: the report's tables as rows of raw values, for spreadsheets and pandas.

Numbers stay numbers in their units (nanoseconds, shares of 1, per-token rates), an empty cell
means not measured. The report's prose (warnings, each section's figures and notes) comes as
``# `` comment lines, and each table is preceded by a ``# section: caption`` line and followed
by a blank line: ``pandas.read_csv(..., comment="#")`` on one table's lines reads it as it is.

Names come from the profiled program, so text is written to be read as text (:func:`_cell`): a
text cell that begins with ``=``, ``+``, ``-``, ``@``, a tab or a carriage return gets a leading
``'`` (OWASP's advice against formula injection: a spreadsheet shows it as text and runs nothing),
and control characters in text are written as escapes (``\x1b``, ``\n``). Numeric columns are
written as numbers, negative ones included: which cells are text is the column's unit.
"""

from __future__ import annotations

import csv
from typing import Any, TextIO

from ..analysis.report_model import Column, Report
from ..safe_text import printable
from .base import Renderer

# What makes a spreadsheet read a cell as a formula (OWASP, "CSV Injection").
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def _text(value: Any) -> str:
    text = printable(str(value))
    return "'" + text if text.startswith(FORMULA_START) else text


def _cell(value: Any, column: Column) -> Any:
    """A cell as written: empty if not measured, a number as itself in a numeric column, any other
    value as text no spreadsheet reads as a formula."""
    if value is None:
        return ""
    if column.unit != "text" and isinstance(value, (int, float)) and not isinstance(value, bool):
        return value
    return _text(value)


def _comment(out: TextIO, text: str) -> None:
    for line in text.splitlines() or [""]:
        out.write(f"# {printable(line)}".rstrip() + "\n")


class CsvRenderer(Renderer):
    name = "csv"
    suffix = ".csv"
    help = ("the tables as rows for spreadsheets and pandas (comment lines: '#'; text that would start a "
            "formula gets a leading ')")

    def render(self, report: Report, out: TextIO) -> None:
        writer = csv.writer(out, lineterminator="\n")
        _comment(out, report.title)
        for warning in report.warnings:
            _comment(out, f"WARNING: {warning}")
        for section in report.sections:
            out.write("\n")
            _comment(out, f"{section.title}")
            for line in section.lines:
                _comment(out, line)
            for table in section.tables:
                _comment(out, f"{section.title}: {table.caption}")
                writer.writerow([c.key for c in table.columns])
                for row in table.rows:
                    writer.writerow([_cell(row.get(c.key), c) for c in table.columns])
                out.write("\n")
            for note in section.notes:
                _comment(out, f"note: {note}")
