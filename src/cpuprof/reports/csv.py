"""CSV: the report's tables as rows of raw values, for spreadsheets and pandas.

Numbers stay numbers in their units (nanoseconds, shares of 1, per-token rates), an empty cell
means not measured. A report with one table is plain CSV; with several, each table is preceded
by a ``# section: caption`` line and followed by a blank line, which ``pandas.read_csv(...,
comment="#")`` on one table's lines reads as it is.
"""

from __future__ import annotations

import csv
from typing import TextIO

from ..analysis.report_model import Report


class CsvRenderer:
    name = "csv"
    suffix = ".csv"

    def render(self, report: Report, out: TextIO) -> None:
        tables = [(section, table) for section in report.sections for table in section.tables]
        writer = csv.writer(out, lineterminator="\n")
        for k, (section, table) in enumerate(tables):
            if len(tables) > 1:
                if k:
                    out.write("\n")
                out.write(f"# {section.title}: {table.caption}\n")
            writer.writerow([c.key for c in table.columns])
            for row in table.rows:
                writer.writerow(["" if row.get(c.key) is None else row.get(c.key) for c in table.columns])
