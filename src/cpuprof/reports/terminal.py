"""The terminal report: aligned columns, a legend under every table, warnings first.

Every piece of text goes through :func:`_line` or :func:`_para` (tables through their cells), which
show a control character in a name as its escape: nothing the profiled program named reaches the
terminal as a control sequence, and a name's newline never breaks a row."""

from __future__ import annotations

import os
import re
import shutil
import textwrap
from typing import TextIO

from ..analysis.report_model import Report, Table
from ..safe_text import printable
from .base import NOT_MEASURED, Renderer, cell_text

# Where prose and legends wrap, and what a table may take before its long text cells move below it:
# the terminal's width ($COLUMNS, else the terminal's own, else this), never below MIN_WIDTH.
DEFAULT_WIDTH = 120
MIN_WIDTH = 60
# A text cell longer than this is a paragraph (a verdict, a method): in a table it becomes a mark
# ("[3]") and the text follows the table, numbered, wrapped at the width.
MAX_CELL = 48
# A text column wider than this goes below its rows before any number does when a table is too wide.
WIDE_TEXT = 24

# A command cpuprof prints for a person to paste (safe_text.cpuprof_command): its words are kept on one
# line, never broken at a space or a hyphen, so that pasted it runs.
_COMMAND = re.compile(r"python -m cpuprof(?: (?:'[^']*'|[^\s']+))+")
_KEEP = "\u00a0"  # joins a command's words while the text is wrapped


def width() -> int:
    """The report's width: $COLUMNS where set (as a pipe into a file has no terminal), else the
    terminal's, else DEFAULT_WIDTH."""
    text = os.environ.get("COLUMNS", "")
    if text.isdigit() and int(text) > 0:
        return max(int(text), MIN_WIDTH)
    return max(shutil.get_terminal_size((DEFAULT_WIDTH, 24)).columns, MIN_WIDTH)


def _line(text: str) -> str:
    """One line of output: ``text`` made printable, then its end."""
    return printable(text) + "\n"


def _para(text: str, initial_indent: str = "", subsequent_indent: str = "", end: str = "\n") -> str:
    """``text`` made printable, then wrapped at the width (the wrapping's newlines are the only ones),
    then ``end``. A command to paste is never broken: it moves whole to the next line, and a longer one
    than the width runs past it."""
    kept = _COMMAND.sub(lambda m: m.group(0).replace(" ", _KEEP), printable(text))
    fit = width()
    lines = []
    for line in textwrap.wrap(kept, fit, initial_indent=initial_indent, subsequent_indent=subsequent_indent,
                              break_long_words=False, break_on_hyphens=False) or [initial_indent]:
        if len(line) > fit and _KEEP not in line:  # a name longer than the width (a C++ symbol): cut, not a command
            lines += textwrap.wrap(line, fit, subsequent_indent=subsequent_indent, break_on_hyphens=False)
        else:
            lines.append(line)
    return "\n".join(lines).replace(_KEEP, " ") + end


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
                # A list item ("  - ...") hangs under its text.
                item = line.startswith("  - ")
                hang = "  " + " " * (len(line) - len(line.lstrip(" -"))) if item else "    "
                w(_para(line, initial_indent="  ", subsequent_indent=hang))
            for table in section.tables:
                self._table(table, out)
            for note in section.notes:
                w(_para(f"note: {note}", initial_indent="  ", subsequent_indent="    "))

    def _table(self, table: Table, out: TextIO) -> None:
        if table.caption:
            out.write(_para(f"  {table.caption}", subsequent_indent="  "))
        if not table.rows:
            out.write("  (none)\n")
            return
        cells = [[printable(c.header) for c in table.columns]]
        cells += [[printable(cell_text(row.get(c.key), c)) for c in table.columns] for row in table.rows]
        moved = _columns_below(cells, [c.alignment for c in table.columns], width() - 2)
        kept = [i for i in range(len(table.columns)) if i not in moved]
        widths = {i: max(len(r[i]) for r in cells) for i in kept}
        for n, r in enumerate(cells):
            parts = [r[i].ljust(widths[i]) if table.columns[i].alignment == "l" else r[i].rjust(widths[i])
                     for i in kept]
            out.write("  " + "  ".join(parts).rstrip() + "\n")
            below = [f"{cells[0][i]}: {r[i]}" for i in moved if n and r[i] not in ("", NOT_MEASURED)]
            if below:
                out.write(_para("; ".join(below), initial_indent="      ", subsequent_indent="      "))
        legend = [f"{c.header}: {c.help}" for c in table.columns if c.help] + table.legend_notes
        if legend:
            out.write(_para("; ".join(legend), initial_indent="  (", subsequent_indent="   ", end=")\n"))


def _columns_below(cells: list[list[str]], alignments: list[str], fit: int) -> list[int]:
    """The columns a table shows below each row instead of in it, so that it fits ``fit`` characters:
    first every text column holding a paragraph (a cell over MAX_CELL: a verdict, a method), then, while
    the rest is still too wide, the widest text columns and then the numbers from the right. The first
    column, which names the row, always stays. Markdown and HTML keep every column in place."""
    widths = [max(len(r[i]) for r in cells) for i in range(len(cells[0]))]
    text = [i for i in range(1, len(widths)) if alignments[i] == "l"]
    moved = [i for i in text if widths[i] > MAX_CELL]
    # Wide text (lists of ops, kernels) before any number; a short label that names the row last.
    others = sorted((i for i in text if i not in moved and widths[i] > WIDE_TEXT), key=lambda i: -widths[i])
    others += [i for i in reversed(range(1, len(widths))) if alignments[i] != "l"]
    others += sorted((i for i in text if i not in moved and widths[i] <= WIDE_TEXT), key=lambda i: -widths[i])

    def total() -> int:
        kept = [w for i, w in enumerate(widths) if i not in moved]
        return sum(kept) + 2 * (len(kept) - 1)

    for i in others:
        if total() <= fit:
            break
        moved.append(i)
    return sorted(moved)
