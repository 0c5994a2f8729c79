"""The Markdown report: GitHub-flavoured tables, for pasting into issues and pull requests."""

from __future__ import annotations

from typing import TextIO

from ..analysis.report_model import Report, Table
from .base import Renderer, cell_text


def _escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


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
                text = _escape(cell_text(row.get(c.key), c))
                cells.append(f"`{text}`" if c.key == "inputs" and text != "-" and text else text)
            w("| " + " | ".join(cells) + " |\n")
        legend = [f"**{_escape(c.header)}**: {_escape(c.help)}" for c in table.columns if c.help]
        legend += [_escape(n) for n in table.legend_notes]
        if legend:
            w("\n<sub>" + "; ".join(legend) + "</sub>\n")
        w("\n")
