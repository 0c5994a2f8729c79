"""The terminal report: aligned columns, a legend under every table, warnings first."""

from __future__ import annotations

import textwrap
from typing import TextIO

from ..analysis.report_model import Report, Table
from .base import Renderer, cell_text

WIDTH = 110  # where prose and legends wrap; tables are as wide as their content


class TerminalRenderer(Renderer):
    name = "terminal"
    suffix = ".txt"
    help = "aligned columns for a terminal (the default)"

    def render(self, report: Report, out: TextIO) -> None:
        w = out.write
        for warning in report.warnings:
            w(textwrap.fill(f"WARNING: {warning}", WIDTH, subsequent_indent="  ") + "\n")
        if report.warnings:
            w("\n")
        w(f"{report.title}\n")
        for section in report.sections:
            w(f"\n{section.title}\n")
            for line in section.lines:
                w(textwrap.fill(line, WIDTH, initial_indent="  ", subsequent_indent="    ") + "\n")
            for table in section.tables:
                self._table(table, out)
            for note in section.notes:
                w(textwrap.fill(f"note: {note}", WIDTH, initial_indent="  ", subsequent_indent="    ") + "\n")

    def _table(self, table: Table, out: TextIO) -> None:
        if table.caption:
            out.write(f"  {table.caption}\n")
        if not table.rows:
            out.write("  (none)\n")
            return
        cells = [[c.header for c in table.columns]]
        cells += [[cell_text(row.get(c.key), c) for c in table.columns] for row in table.rows]
        widths = [max(len(r[i]) for r in cells) for i in range(len(table.columns))]
        for r in cells:
            parts = [cell.ljust(wd) if c.alignment == "l" else cell.rjust(wd)
                     for cell, wd, c in zip(r, widths, table.columns, strict=True)]
            out.write("  " + "  ".join(parts).rstrip() + "\n")
        legend = [f"{c.header}: {c.help}" for c in table.columns if c.help] + table.legend_notes
        if legend:
            out.write(textwrap.fill("; ".join(legend), WIDTH, initial_indent="  (", subsequent_indent="   ")
                      + ")\n")
