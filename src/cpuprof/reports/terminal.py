"""The terminal report: aligned columns, a legend under every table, warnings first.

Every piece of text goes through :func:`_line` or :func:`_para` (tables through their cells), which
show a control character in a name as its escape: nothing the profiled program named reaches the
terminal as a control sequence, and a name's newline never breaks a row."""

from __future__ import annotations

import textwrap
from typing import TextIO

from ..analysis.report_model import Report, Table
from ..safe_text import printable
from .base import Renderer, cell_text

WIDTH = 110  # where prose and legends wrap; tables are as wide as their content


def _line(text: str) -> str:
    """One line of output: ``text`` made printable, then its end."""
    return printable(text) + "\n"


def _para(text: str, initial_indent: str = "", subsequent_indent: str = "", end: str = "\n") -> str:
    """``text`` made printable, then wrapped at WIDTH (the wrapping's newlines are the only ones),
    then ``end``."""
    return textwrap.fill(printable(text), WIDTH, initial_indent=initial_indent,
                         subsequent_indent=subsequent_indent) + end


class TerminalRenderer(Renderer):
    name = "terminal"
    suffix = ".txt"
    help = "aligned columns for a terminal (the default)"
    for_a_person = True

    def render(self, report: Report, out: TextIO) -> None:
        w = out.write
        for warning in report.warnings:
            w(_para(f"WARNING: {warning}", subsequent_indent="  "))
        if report.warnings:
            w("\n")
        w(_line(report.title))
        for section in report.sections:
            w("\n" + _line(section.title))
            for line in section.lines:
                w(_para(line, initial_indent="  ", subsequent_indent="    "))
            for table in section.tables:
                self._table(table, out)
            for note in section.notes:
                w(_para(f"note: {note}", initial_indent="  ", subsequent_indent="    "))

    def _table(self, table: Table, out: TextIO) -> None:
        if table.caption:
            out.write(_line(f"  {table.caption}"))
        if not table.rows:
            out.write("  (none)\n")
            return
        cells = [[printable(c.header) for c in table.columns]]
        cells += [[printable(cell_text(row.get(c.key), c)) for c in table.columns] for row in table.rows]
        widths = [max(len(r[i]) for r in cells) for i in range(len(table.columns))]
        for r in cells:
            parts = [cell.ljust(wd) if c.alignment == "l" else cell.rjust(wd)
                     for cell, wd, c in zip(r, widths, table.columns, strict=True)]
            out.write("  " + "  ".join(parts).rstrip() + "\n")
        legend = [f"{c.header}: {c.help}" for c in table.columns if c.help] + table.legend_notes
        if legend:
            out.write(_para("; ".join(legend), initial_indent="  (", subsequent_indent="   ", end=")\n"))
