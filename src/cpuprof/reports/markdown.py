"""The Markdown report: GitHub-flavoured tables, for pasting into issues and pull requests.

Names come from the profiled program, so every piece of text is written to show as itself and
nothing more (:func:`_escape`, :func:`_code`): no HTML, link, emphasis or table cell a name opens.
"""

from __future__ import annotations

import re
from typing import TextIO

from ..analysis.report_model import Report, Table
from ..safe_text import printable
from .base import Renderer, cell_text

# The punctuation GitHub-flavoured markdown gives a meaning inline (the backslash itself, code,
# emphasis, links and images, strikethrough, table cells, headings' closing #): a backslash before
# each makes it a literal character, in table cells as anywhere else.
_PUNCTUATION = re.compile(r"([\\`*_\[\]~|#])")


def _escape(text: str) -> str:
    """``text`` as markdown that shows it: HTML's three characters as entities (raw HTML passes
    through markdown), markdown's punctuation backslash-escaped, control characters (newlines
    included) as their escapes, so that it stays on its line and in its cell."""
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return printable(_PUNCTUATION.sub(r"\\\1", text))


def _code(text: str) -> str:
    """``text`` as a code span, which shows its characters as they are (HTML included) but for a
    run of backticks as long as its fence and, in a table, a pipe: a fence longer than any run
    inside, and the pipes escaped (GFM unescapes them in a cell before reading the span)."""
    text = printable(text).replace("|", "\\|")
    fence = "`" * (max((len(run) for run in re.findall("`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""  # one space each side is dropped
    return f"{fence}{pad}{text}{pad}{fence}"


class MarkdownRenderer(Renderer):
    name = "markdown"
    suffix = ".md"
    help = "GitHub-flavoured tables, for issues and pull requests"

    def render(self, report: Report, out: TextIO) -> None:
        w = out.write
        w(f"# {_escape(report.title)}\n\n")
        for warning in report.warnings:
            w(f"> **Warning:** {_escape(warning)}\n>\n")
        if report.warnings:
            w("\n")
        for section in report.sections:
            w(f"## {_escape(section.title)}\n\n")
            for line in section.lines:
                w(f"- {_escape(line)}\n")
            if section.lines:
                w("\n")
            for table in section.tables:
                self._table(table, out)
            for note in section.notes:
                w(f"- _Note:_ {_escape(note)}\n")
            if section.notes:
                w("\n")

    def _table(self, table: Table, out: TextIO) -> None:
        w = out.write
        if table.caption:
            w(f"_{_escape(table.caption)}_\n\n")
        if not table.rows:
            w("(none)\n\n")
            return
        w("| " + " | ".join(_escape(c.header) for c in table.columns) + " |\n")
        w("|" + "|".join(":---" if c.alignment == "l" else "---:" for c in table.columns) + "|\n")
        for row in table.rows:
            cells = []
            for c in table.columns:
                text = cell_text(row.get(c.key), c)
                cells.append(_code(text) if c.key == "inputs" and text != "-" and text else _escape(text))
            w("| " + " | ".join(cells) + " |\n")
        legend = [f"**{_escape(c.header)}**: {_escape(c.help)}" for c in table.columns if c.help]
        legend += [_escape(n) for n in table.legend_notes]
        if legend:
            w("\n<sub>" + "; ".join(legend) + "</sub>\n")
        w("\n")
