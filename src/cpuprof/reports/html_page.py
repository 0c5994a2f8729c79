"""What every HTML page of cpuprof shares: the page itself (title, warnings, contents, footer), the
report's sections and tables as HTML, figures with their captions, and the figures-first boxes.

A page opens offline, in any browser, years later: nothing is fetched when it is viewed (no script
library, no font, no stylesheet, and a Content-Security-Policy that forbids the browser to try), and
every string from a profile is escaped (op names such as ``<lambda>`` are data, not markup). The
page kinds (:mod:`.html_profile`, :mod:`.html_compare`, :mod:`.html_ranks`) add their charts.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field

from .. import __version__
from ..analysis.report_model import Column, Section, Table
from ..exports.charts import esc
from .base import NOT_MEASURED, cell_text

# A chart as (inline SVG, caption), or (None, why there is none).
Drawn = tuple[str | None, str]

# Nothing may be fetched: inline styles and the flame graph's inline script only, images only as data.
CSP = "default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:"
STYLE = """
body{margin:0;font:15px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"Helvetica Neue",Arial,sans-serif;
 color:#1d1d1f;background:#fff}
main{max-width:1680px;margin:0 auto;padding:20px 28px 64px}
h1{font-size:26px;margin:0 0 4px}
h2{font-size:20px;margin:36px 0 8px;padding-bottom:4px;border-bottom:1px solid #ddd}
h3{font-size:16px;margin:22px 0 6px}
a{color:#0b5cad}
.meta{color:#555;font-size:13px;margin:0}
.warnings{background:#fff4e5;border-left:4px solid #e69f00;padding:6px 14px;margin:16px 0}
.warnings p{margin:5px 0}
nav.toc{background:#f7f7f9;border:1px solid #e4e4e8;border-radius:6px;padding:8px 16px;margin:16px 0;font-size:14px}
nav.toc ol{margin:4px 0;padding-left:20px}
nav.toc ol ol{padding-left:18px;font-size:13px}
.kpis{display:flex;flex-wrap:wrap;gap:10px;margin:12px 0}
.kpi{border:1px solid #ddd;border-radius:6px;padding:6px 14px;min-width:110px}
.kpi .v{display:block;font-size:21px;font-weight:600;font-variant-numeric:tabular-nums}
.kpi .k{display:block;font-size:12px;color:#555}
ul.lines{margin:6px 0;padding-left:20px}
ul.lines li{margin:3px 0}
ul.lines li.sub{list-style:circle;margin-left:18px}
ul.notes{margin:6px 0;padding-left:20px;color:#444;font-size:14px}
figure{margin:10px 0 26px}
figcaption{color:#444;font-size:13px;margin-top:4px;max-width:960px}
svg.chart{max-width:100%;height:auto;display:block}
svg.chart .tick{fill:#444;font-size:11px}
svg.chart .axis-label{fill:#222;font-size:12px}
svg.chart .legend{fill:#333;font-size:11px}
svg.chart .mark:hover{stroke:#000;stroke-width:1.5}
iframe.chart-frame{display:block;border:1px solid #ddd;max-width:100%}
p.not-measured{color:#555;font-style:italic;margin:4px 0 18px}
.table-wrap{overflow-x:auto;margin:6px 0 4px}
table{border-collapse:collapse;font-size:13px;font-variant-numeric:tabular-nums}
th,td{padding:3px 9px;border-bottom:1px solid #eee;white-space:nowrap;vertical-align:top;text-align:left}
th{background:#f4f4f6;border-bottom:1px solid #ccc}
th[title]{text-decoration:underline dotted #999;cursor:help}
th.r,td.r{text-align:right}
td.wrap{white-space:normal;min-width:36em;max-width:60em}
td.mono{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:12px}
td.nm{color:#999}
tbody tr:hover{background:#f8fbff}
p.caption{font-size:13px;color:#333;margin:12px 0 2px}
p.legend{font-size:12px;color:#555;margin:3px 0 14px;max-width:1100px}
footer{margin-top:40px;color:#777;font-size:12px}
"""


# -- the page -------------------------------------------------------------------------------------------


@dataclass
class Page:
    title: str
    meta: str
    warnings: list[str] = field(default_factory=list)
    body: list[str] = field(default_factory=list)
    toc: list[tuple[int, str, str]] = field(default_factory=list)  # (level, anchor, text)

    def heading(self, level: int, anchor: str, text: str) -> None:
        self.toc.append((level, anchor, text))
        self.body.append(f'<h{level} id="{esc(anchor)}">{esc(text)}</h{level}>')

    def add(self, *parts: str) -> None:
        self.body.extend(parts)

    def render(self) -> str:
        warnings = ""
        if self.warnings:
            warnings = ('<div class="warnings" role="note">'
                        + "".join(f"<p><strong>Warning:</strong> {esc(w)}</p>" for w in self.warnings) + "</div>")
        return (
            "<!DOCTYPE html>\n"
            '<html lang="en"><head><meta charset="utf-8">'
            f'<meta http-equiv="Content-Security-Policy" content="{esc(CSP)}">'
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{esc(self.title)}</title><style>{STYLE}</style></head>\n<body><main>"
            f"<h1>{esc(self.title)}</h1><p class=\"meta\">{esc(self.meta)}</p>{warnings}{self._toc()}\n"
            + "\n".join(self.body)
            + f"\n<footer>Written by cpuprof {esc(__version__)}; self-contained: it fetches nothing.</footer>"
            "</main></body></html>\n"
        )

    def _toc(self) -> str:
        """The sections (h2) in order, each with its charts or subsections (h3) under it."""
        entries: list[tuple[str, str, list[tuple[str, str]]]] = []
        for level, anchor, text in self.toc:
            if level == 3 and entries:
                entries[-1][2].append((anchor, text))
            else:
                entries.append((anchor, text, []))

        def link(anchor: str, text: str) -> str:
            return f'<a href="#{esc(anchor)}">{esc(text)}</a>'

        items = []
        for anchor, text, children in entries:
            sub = ("<ol>" + "".join(f"<li>{link(*c)}</li>" for c in children) + "</ol>") if children else ""
            items.append(f"<li>{link(anchor, text)}{sub}</li>")
        return '<nav class="toc" aria-label="contents"><strong>Contents</strong><ol>' + "".join(items) + "</ol></nav>"


def command_text(argv: list[str]) -> str:
    """A command line as the user typed it: cpuprof's launcher's argv[0] is its __main__.py's path,
    which the user reached as ``python -m cpuprof``."""
    if argv and argv[0].replace("\\", "/").endswith("cpuprof/__main__.py"):
        argv = ["python", "-m", "cpuprof", *argv[1:]]
    return shlex.join(argv)


def lines_html(lines: list[str]) -> str:
    if not lines:
        return ""
    items = []
    for line in lines:
        # comparison_report indents the explanations under the verdict with "  - "
        sub = line.startswith("  - ")
        items.append(f'<li class="sub">{esc(line[4:])}</li>' if sub else f"<li>{esc(line)}</li>")
    return '<ul class="lines">' + "".join(items) + "</ul>"


def table_html(table: Table) -> str:
    out = []
    if table.caption:
        out.append(f'<p class="caption">{esc(table.caption)}</p>')
    if not table.rows:
        out.append('<p class="not-measured">(none)</p>')
        return "".join(out)
    texts = [[cell_text(row.get(c.key), c) for c in table.columns] for row in table.rows]
    # Long prose columns (a "how it is counted", a verdict) wrap; names, shapes and numbers never do.
    wraps = [c.alignment == "l" and c.key not in ("op", "inputs") and any(len(r[i]) > 60 for r in texts)
             for i, c in enumerate(table.columns)]
    out.append('<div class="table-wrap"><table><thead><tr>')
    for c in table.columns:
        cls = ' class="r"' if c.alignment == "r" else ""
        title = f' title="{esc(c.help)}"' if c.help else ""
        out.append(f"<th{cls}{title}>{esc(c.header)}</th>")
    out.append("</tr></thead><tbody>")
    for row, cells in zip(table.rows, texts, strict=True):
        out.append("<tr>")
        for c, text, wrap in zip(table.columns, cells, wraps, strict=True):
            out.append(_cell(c, row.get(c.key), text, wrap))
        out.append("</tr>")
    out.append("</tbody></table></div>")
    legend = [f"<strong>{esc(c.header)}</strong>: {esc(c.help)}" for c in table.columns if c.help]
    legend += [esc(n) for n in table.legend_notes]
    missing = any(row.get(c.key) is None for row in table.rows for c in table.columns)
    if missing and not any(n.startswith(NOT_MEASURED + ":") for n in table.legend_notes):
        legend.append(f"{NOT_MEASURED}: not measured")
    out.append('<p class="legend">' + "; ".join(legend) + "</p>")
    return "".join(out)


def _cell(column: Column, value: object, text: str, wrap: bool) -> str:
    classes = []
    if column.alignment == "r":
        classes.append("r")
    if column.key == "inputs":
        classes.append("mono")
    if wrap:
        classes.append("wrap")
    title = ""
    if value is None:
        classes.append("nm")
        title = ' title="not measured"'
    cls = f' class="{" ".join(classes)}"' if classes else ""
    return f"<td{cls}{title}>{esc(text)}</td>"


def section_html(page: Page, section: Section, lines: bool = True) -> None:
    page.heading(2, f"s-{section.id}", section.title)
    if lines:
        page.add(lines_html(section.lines))
    for table in section.tables:
        page.add(table_html(table))
    page.add(notes_html(section.notes))


def notes_html(notes: list[str]) -> str:
    return '<ul class="notes">' + "".join(f"<li>{esc(n)}</li>" for n in notes) + "</ul>" if notes else ""


def figure(page: Page, anchor: str, title: str, chart: str | None, caption: str) -> None:
    """A chart under its heading with a one-line caption, or the one line that says why there is none."""
    page.heading(3, anchor, title)
    if chart is None:
        page.add(f'<p class="not-measured">Not measured: {esc(caption)}</p>')
    else:
        page.add(f"<figure>{chart}<figcaption>{esc(caption)}</figcaption></figure>")


def kpis_html(items: list[tuple[str, str, str]]) -> str:
    """(value, what, how it was measured) boxes: the few figures a reader looks for first."""
    return '<div class="kpis">' + "".join(
        f'<div class="kpi" title="{esc(how)}"><span class="v">{esc(value)}</span><span class="k">{esc(what)}</span>'
        "</div>" for value, what, how in items) + "</div>"
