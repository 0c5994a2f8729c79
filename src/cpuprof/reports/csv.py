"""CSV: the report's tables as rows of raw values, for spreadsheets and pandas.

Numbers stay numbers in their units (nanoseconds, shares of 1, per-token rates), an empty cell
means not measured. The report's prose (warnings, each section's figures and notes) comes as
``# `` comment lines, and each table is preceded by a ``# section: caption`` line and followed
by a blank line: ``pandas.read_csv(..., comment="#")`` on one table's lines reads it as it is.
"""

from __future__ import annotations

import csv
from typing import TextIO

from ..analysis.report_model import Report
from .base import Renderer


def _comment(out: TextIO, text: str) -> None:
    for line in text.splitlines() or [""]:
        out.write(f"# {line}".rstrip() + "\n")


class CsvRenderer(Renderer):
    name = "csv"
    suffix = ".csv"
    help = "the tables as rows for spreadsheets and pandas (comment lines: '#')"

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
                    writer.writerow(["" if row.get(c.key) is None else row.get(c.key) for c in table.columns])
                out.write("\n")
            for note in section.notes:
                _comment(out, f"note: {note}")
