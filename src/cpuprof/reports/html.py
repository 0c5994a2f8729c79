"""The self-contained HTML report: one file that opens offline, in any browser, years later.

    write_profile_html(profile, out)        # a saved profile (decode or any profiled run)
    write_comparison_html(comparison, out)  # a configuration sweep (cpuprof compare)

The page reads top down: the verdicts and warnings, then charts where a picture says more than a
table, then every table of the report behind them. The text and tables are the same sections the
other formats lay out (:func:`~cpuprof.analysis.report.build_report`,
:func:`~cpuprof.analysis.compare.comparison_report`); the charts are drawn here, by Python, as
inline SVG from the profile's own data. Nothing is fetched when the page is viewed: no script
library, no font, no stylesheet, and a Content-Security-Policy that forbids the browser to try.
Every string from a profile is escaped (op names such as ``<lambda>`` are data, not markup).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TextIO

import numpy as np

from .. import __version__, defaults
from ..analysis.labels import team_order, thread_label
from ..analysis.report_model import Column, Report, Section, Table
from ..exports.charts import (
    BLUE,
    GREEN,
    GREY,
    ORANGE,
    SKY,
    VERMILION,
    Chart,
    esc,
    linear,
    tooltip,
)
from ..model import DecodeWorkload, Profile
from ..model.compare import Comparison
from ..units import fmt_bytes, fmt_ns, fmt_percent, fmt_rate
from .base import NOT_MEASURED, cell_text

if TYPE_CHECKING:
    from ..analysis.compare import ConfigSummary

# Nothing may be fetched: inline styles and the flame graph's inline script only, images only as data.
CSP = "default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:"
STYLE = """
body{margin:0;font:15px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"Helvetica Neue",Arial,sans-serif;
 color:#1d1d1f;background:#fff}
main{max-width:1240px;margin:0 auto;padding:20px 28px 64px}
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
td.wrap{white-space:normal;min-width:16em;max-width:40em}
td.mono{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:12px}
td.nm{color:#999}
tbody tr:hover{background:#f8fbff}
p.caption{font-size:13px;color:#333;margin:12px 0 2px}
p.legend{font-size:12px;color:#555;margin:3px 0 14px;max-width:1100px}
footer{margin-top:40px;color:#777;font-size:12px}
"""


# -- the page -------------------------------------------------------------------------------------------


@dataclass
class _Page:
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


def _lines(lines: list[str]) -> str:
    if not lines:
        return ""
    items = []
    for line in lines:
        # comparison_report indents the explanations under the verdict with "  - "
        sub = line.startswith("  - ")
        items.append(f'<li class="sub">{esc(line[4:])}</li>' if sub else f"<li>{esc(line)}</li>")
    return '<ul class="lines">' + "".join(items) + "</ul>"


def _table(table: Table) -> str:
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


def _section(page: _Page, section: Section, lines: bool = True) -> None:
    page.heading(2, f"s-{section.id}", section.title)
    if lines:
        page.add(_lines(section.lines))
    for table in section.tables:
        page.add(_table(table))
    page.add(_notes(section.notes))


def _notes(notes: list[str]) -> str:
    return '<ul class="notes">' + "".join(f"<li>{esc(n)}</li>" for n in notes) + "</ul>" if notes else ""


def _figure(page: _Page, anchor: str, title: str, chart: str | None, caption: str) -> None:
    """A chart under its heading with a one-line caption, or the one line that says why there is none."""
    page.heading(3, anchor, title)
    if chart is None:
        page.add(f'<p class="not-measured">Not measured: {esc(caption)}</p>')
    else:
        page.add(f"<figure>{chart}<figcaption>{esc(caption)}</figcaption></figure>")


def _kpis(items: list[tuple[str, str, str]]) -> str:
    """(value, what, how it was measured) boxes: the few figures a reader looks for first."""
    return '<div class="kpis">' + "".join(
        f'<div class="kpi" title="{esc(how)}"><span class="v">{esc(value)}</span><span class="k">{esc(what)}</span>'
        "</div>" for value, what, how in items) + "</div>"


# -- a profile's page ---------------------------------------------------------------------------------


def write_profile_html(profile: Profile, out: TextIO, top: int = defaults.TOP_OPS) -> None:
    from ..analysis.report import build_report

    report = build_report(profile, top=top)
    out.write(profile_page(profile, report))


def profile_page(profile: Profile, report: Report) -> str:
    m = profile.meta
    meta = (f"recorded {m.created} on {m.hostname} (pid {m.pid}), cpuprof {m.cpuprof_version}, "
            f"torch {m.torch_version or 'not loaded'}" + (f"; command: {' '.join(m.argv)}" if m.argv else ""))
    page = _Page(report.title, meta, list(report.warnings))
    summary_ids = ("decode", "ceiling")
    page.heading(2, "summary", "Summary")
    page.add(_kpis(_profile_kpis(profile)))
    for section in report.sections:
        if section.id in summary_ids:
            page.heading(3, f"s-{section.id}", section.title)
            page.add(_lines(section.lines), *(_table(t) for t in section.tables), _notes(section.notes))
    if not any(s.id in summary_ids for s in report.sections):
        page.add('<p class="not-measured">No decode figures: this profile was not a decode run.</p>')

    page.heading(2, "charts", "Charts")
    _figure(page, "chart-step-latency", "Decode step latency", *step_latency_chart(profile.workload))
    _figure(page, "chart-thread-busy", "Threads busy over time", *thread_busy_chart(profile))
    _figure(page, "chart-thread-waits", "Where each thread's op time went", *thread_waits_chart(profile))
    _figure(page, "chart-roofline", "GEMMs against the roofs (roofline)", *roofline_chart(profile))
    _figure(page, "chart-flame", "Flame graph (every thread's sampled stacks)", *flame_chart(profile))
    _figure(page, "chart-rss", "Resident memory over the run", *rss_chart(profile.workload))

    for section in report.sections:
        if section.id not in summary_ids:
            _section(page, section)
    return page.render()


def _profile_kpis(profile: Profile) -> list[tuple[str, str, str]]:
    wl = profile.workload
    items: list[tuple[str, str, str]] = []
    if wl is not None and wl.figures is not None:
        f = wl.figures
        how = f"over {f.measured_steps} measured decode steps (warm-up left out)"
        items += [(fmt_rate(f.tokens_per_s), "tokens/s", f"decode throughput, every sequence of the batch, {how}"),
                  (f"{f.p50_ms:.2f} ms", "step p50", f"median step latency {how}"),
                  (f"{f.p99_ms:.2f} ms", "step p99", f"99th-percentile step latency {how}")]
    if wl is not None and wl.ttft_s is not None:
        items.append((f"{wl.ttft_s * 1e3:.1f} ms", "time to first token", "prefill, timed by the decode loop"))
    if profile.profiled:
        from ..analysis.ceiling import decode_ceiling

        ceiling = decode_ceiling(profile)
        if ceiling is not None:
            items.append((fmt_percent(ceiling.share), "of the bandwidth ceiling",
                          f"tokens/s against the measured memory roof ({ceiling.bandwidth_gb_per_s:.1f} GB/s) / "
                          f"bytes read per token ({fmt_bytes(ceiling.bytes_per_token)}): "
                          f"{fmt_rate(ceiling.ceiling_tokens_per_s)} tokens/s"))
    if profile.collection is not None and profile.collection.wall_ns and profile.threads:
        cpu = sum(t.cpu_ns or 0 for t in profile.threads)
        items.append((f"{cpu / profile.collection.wall_ns:.2f}", "CPUs busy on average",
                      "CPU time of every working thread (task-clock) / profiled wall time"))
    if wl is not None and wl.peak_rss_bytes:
        items.append((fmt_bytes(wl.peak_rss_bytes), "peak RSS", "the process's high-water mark (getrusage)"))
    return items


# -- a profile's charts: each returns (svg, caption), or (None, why there is none) ----------------------

Drawn = tuple[str | None, str]


def step_latency_chart(wl: DecodeWorkload | None) -> Drawn:
    if wl is None:
        return None, "this profile has no decode workload, so no step latencies."
    ms = [s * 1e3 for s in wl.step_latencies_s]
    if not ms:
        return None, "no decode step finished."
    n = len(ms)
    warm = min(wl.warmup_steps, n)
    f = wl.figures
    c = Chart("step-latency", 900, 320, "Decode step latency, one dot per step", margins=(64, 120, 34, 46))
    x = linear(0, n, c.x0 + 4, c.x1 - 4, ticks=10, integer=True)
    y = linear(0, max(ms + ([f.p99_ms] if f else [])), c.y1, c.y0)
    c.y_axis(y, "step latency (ms)")
    c.x_axis(x, "decode step")
    radius = 3.5 if n <= 200 else 2.0 if n <= 2000 else 1.2
    for k, value in enumerate(ms):
        step = k + 1
        if k < warm:
            c.mark(f'<circle class="mark warmup" data-step="{step}" data-ms="{value:.6g}" cx="{x(step):.1f}" '
                   f'cy="{y(value):.1f}" r="{radius}" fill="white" stroke="{GREY}" stroke-width="1.5">'
                   f"{tooltip(f'step {step}: {value:.2f} ms (warm-up: left out of tokens/s and percentiles)')}"
                   "</circle>")
        else:
            c.mark(f'<circle class="mark" data-step="{step}" data-ms="{value:.6g}" cx="{x(step):.1f}" '
                   f'cy="{y(value):.1f}" r="{radius}" fill="{BLUE}" fill-opacity="0.85">'
                   f"{tooltip(f'step {step}: {value:.2f} ms')}</circle>")
    if f is not None:
        for name, value, colour in (("p50", f.p50_ms, GREEN), ("p99", f.p99_ms, VERMILION)):
            py = y(value)
            c.add(f'<line class="ref {name}" data-ms="{value:.6g}" x1="{c.x0}" y1="{py:.1f}" x2="{c.x1}" '
                  f'y2="{py:.1f}" stroke="{colour}" stroke-width="1.5" stroke-dasharray="6 4"/>',
                  f'<text x="{c.x1 + 6}" y="{py + 4:.1f}" fill="{colour}" font-size="12">'
                  f"{esc(f'{name} {value:.2f} ms')}</text>")
    c.legend([(f'<circle cx="6" cy="0" r="4" fill="{BLUE}"/>', "measured step"),
              (f'<circle cx="6" cy="0" r="4" fill="white" stroke="{GREY}" stroke-width="1.5"/>',
               "warm-up step (not in tokens/s)")], c.x0, 14)
    first = "none is warm-up" if not warm else (
        "the first is warm-up (hollow) and is" if warm == 1 else f"the first {warm} are warm-up (hollow) and are")
    caption = (f"Wall time of each of the {n} decode steps (batch {wl.batch}), timed around the step by the decode "
               f"loop (perf_counter); {first}" + (" left out of tokens/s and of the percentiles" if warm else ""))
    if f is not None:
        caption += f"; p50 and p99 lines over the {f.measured_steps} measured steps (numpy's linear interpolation)."
    else:
        caption += "; no step was measured, so no percentile lines."
    if wl.steps_done < wl.new_tokens:
        caption += f" The run stopped after {wl.steps_done} of {wl.new_tokens} steps."
    return c.render(), caption


@dataclass
class BusyTimeline:
    """Each thread's CPU time per wall-time bucket, from the sample timeline."""

    start_ns: int
    bucket_ns: float
    buckets: int
    rows: list[tuple[int, list[float]]]  # (index into Profile.threads, CPU ns in each bucket)
    samples: int
    dropped: int  # samples older than the timeline kept
    hz: int


# A bucket holds at least this many sampling periods of one thread's CPU: a busy share is then
# measured to a fifth or better, not read off one or two samples.
MIN_PERIODS_PER_BUCKET = 5
MAX_BUCKETS = 120


def busy_timeline(profile: Profile) -> BusyTimeline | None:
    tl = profile.stacks.timeline if profile.stacks is not None else None
    c = profile.collection
    if tl is None or not len(tl) or c is None:
        return None
    hz = profile.sampling.hz if profile.sampling else defaults.SAMPLE_HZ
    dropped = profile.sampling.timeline_dropped if profile.sampling else 0
    # With samples dropped the timeline holds only the newest: the chart starts at the first kept one.
    start = min(tl.time_ns) if dropped else c.started_ns
    end = max(c.stopped_ns, max(tl.time_ns))
    span = max(end - start, 1)
    buckets = int(max(1, min(MAX_BUCKETS, span * hz // (MIN_PERIODS_PER_BUCKET * 1_000_000_000))))
    width = span / buckets
    cpu = {i: [0.0] * buckets for i in team_order(profile)}
    for t, thread, cpu_us in zip(tl.time_ns, tl.thread, tl.cpu_us, strict=True):
        if thread not in cpu:
            continue
        # A sample closes the CPU time since the thread's previous one: spread it over the wall time
        # just before the sample (as the trace's CPU counter does), clipped to the chart.
        lo, hi = max(start, t - cpu_us * 1000), min(end, t)
        row = cpu[thread]
        while lo < hi:
            # integer bucket edges, start + ceil(k * span / buckets): the next edge is always past lo
            k = min((lo - start) * buckets // span, buckets - 1)
            edge = min(hi, start - (-(k + 1) * span // buckets))
            row[k] += edge - lo
            lo = edge
    return BusyTimeline(start_ns=start, bucket_ns=width, buckets=buckets, rows=list(cpu.items()),
                        samples=len(tl), dropped=dropped, hz=hz)


def _time_unit(span_ns: float) -> tuple[float, str]:
    return (1e9, "s") if span_ns >= 2e9 else (1e6, "ms")


def _busy_colour(share: float) -> str:
    """White (idle) to dark blue (a whole CPU busy), linear in the share."""
    share = min(1.0, max(0.0, share))
    lo, hi = (247, 251, 255), (8, 69, 148)
    return "rgb(" + ",".join(str(round(a + (b - a) * share)) for a, b in zip(lo, hi, strict=True)) + ")"


def thread_busy_chart(profile: Profile) -> Drawn:
    timeline = busy_timeline(profile)
    if timeline is None:
        why = ("the run was not profiled" if not profile.profiled else
               "this profile has no sample timeline (exact mode, or no thread was sampled)")
        return None, f"{why}; per-thread CPU busy over time needs the sampled mode."
    rows = timeline.rows
    row_h, gap = 22, 5
    height = 34 + len(rows) * (row_h + gap) + 50
    c = Chart("thread-busy", 900, height, "Threads busy over time", margins=(120, 24, 34, 46))
    scale, unit = _time_unit(timeline.buckets * timeline.bucket_ns)
    x = linear(0, timeline.buckets * timeline.bucket_ns / scale, c.x0, c.x1, ticks=10)
    # the cells fill the plot exactly; the axis may reach a little past the last bucket
    px_per_ns = (x(timeline.buckets * timeline.bucket_ns / scale) - c.x0) / (timeline.buckets * timeline.bucket_ns)
    cell_w = timeline.bucket_ns * px_per_ns
    for r, (thread, cpu) in enumerate(rows):
        top = c.y0 + r * (row_h + gap)
        t = profile.threads[thread]
        c.add(f'<text x="{c.x0 - 8}" y="{top + row_h / 2 + 4:.1f}" text-anchor="end">'
              f"{esc(f'{thread_label(thread)} {t.role}')}{tooltip(f'{thread_label(thread)}: tid {t.tid}, {t.name}')}"
              "</text>")
        for b, ns in enumerate(cpu):
            share = ns / timeline.bucket_ns
            t0 = b * timeline.bucket_ns / scale
            tip = (f"{thread_label(thread)}, {t0:.3g}-{t0 + timeline.bucket_ns / scale:.3g} {unit}: "
                   f"{fmt_percent(min(share, 1.0))} busy ({fmt_ns(ns)} of CPU)")
            c.mark(f'<rect class="mark" data-thread="{thread_label(thread)}" data-cpu-ns="{ns:.0f}" '
                   f'data-share="{share:.4f}" x="{c.x0 + b * cell_w:.2f}" y="{top}" width="{cell_w + 0.3:.2f}" '
                   f'height="{row_h}" fill="{_busy_colour(share)}">{tooltip(tip)}</rect>')
    c.add(f'<rect x="{c.x0}" y="{c.y0}" width="{cell_w * timeline.buckets:.1f}" '
          f'height="{len(rows) * (row_h + gap) - gap}" fill="none" stroke="#ccc"/>')
    c.y1 = c.y0 + len(rows) * (row_h + gap)
    c.x_axis(x, f"time since profiling started ({unit})" if not timeline.dropped else f"time ({unit})")
    gradient = ('<defs><linearGradient id="cpuprof-busy-gradient"><stop offset="0" stop-color="'
                f'{_busy_colour(0)}"/><stop offset="1" stop-color="{_busy_colour(1)}"/></linearGradient></defs>')
    c.add(gradient, f'<text x="{c.x0}" y="20" class="legend">idle</text>',
          f'<rect x="{c.x0 + 26}" y="11" width="120" height="11" fill="url(#cpuprof-busy-gradient)" stroke="#ccc"/>',
          f'<text x="{c.x0 + 152}" y="20" class="legend">one CPU busy</text>')
    caption = (f"Share of each {fmt_ns(timeline.bucket_ns)} of wall time each thread was on a CPU, from "
               f"{timeline.samples:,} samples of the threads' CPU clocks at {timeline.hz} Hz of CPU time (each "
               "sample closes 1/{hz} s of its thread's CPU time, spread over the wall time just before it)"
               .replace("{hz}", str(timeline.hz)))
    if timeline.dropped:
        caption += (f"; the oldest {timeline.dropped:,} samples were not kept, so the chart starts at the first "
                    "kept sample")
    return c.render(), caption + "."


@dataclass
class ThreadTime:
    """One thread's time while ops ran, split as the contention analysis measured it (ns)."""

    thread: int
    wall: float = 0.0
    parts: dict[str, float] = field(default_factory=dict)


# (key, legend, colour): the parts of a thread's op time, in the order they are stacked.
WAIT_PARTS = (
    ("working", "on CPU, working", BLUE),
    ("spin", "on CPU, spinning in the OpenMP runtime", ORANGE),
    ("unsplit", "on CPU (too few samples to split out spin)", SKY),
    ("sleep", "off CPU while the op ran", "#b8b8b8"),
    ("off_other", "off CPU outside OpenMP waits", "#dddddd"),
    ("unknown", "not measured", "#ffffff"),
)


def thread_times(profile: Profile) -> tuple[list[ThreadTime], str] | None:
    """Per thread, the ops' self wall time split into working, spinning and off-CPU time; and how
    spin was measured ("ompt", "samples", or "none"). None where the contention analysis has nothing."""
    from ..analysis.contention import analyse
    from ..analysis.threads import compute_team

    contention = analyse(profile)
    if contention is None or not contention.ops:
        return None
    members = set(compute_team(profile))
    out = {k: ThreadTime(k, parts=dict.fromkeys((p for p, _, _ in WAIT_PARTS), 0.0))
           for k in team_order(profile) if k in members}
    # Without samples (exact mode) and without OMPT, no spin was measured at all: the analysis's 0 for
    # an op no sample landed in means nothing there, so the CPU time stays unsplit.
    spin_measured = contention.method == "ompt" or profile.sampling is not None
    for o in contention.ops:
        for t in o.threads:
            tt = out[t.thread]
            wall = float(o.wall_ns)
            tt.wall += wall
            spin, sleep = t.spin_ns or 0.0, t.sleep_ns or 0.0
            if t.cpu_ns is None:
                tt.parts["spin"] += spin
                tt.parts["sleep"] += sleep
                tt.parts["unknown"] += max(0.0, wall - spin - sleep)
                continue
            if t.spin_ns is None or not spin_measured:
                tt.parts["unsplit"] += t.cpu_ns
            else:
                tt.parts["working"] += max(0.0, t.cpu_ns - spin)
                tt.parts["spin"] += spin
            tt.parts["sleep"] += sleep
            # samples: sleep is wall - CPU, nothing is left; OMPT: sleep is the waits' off-CPU part only
            tt.parts["off_other"] += max(0.0, wall - t.cpu_ns - sleep)
    return list(out.values()), contention.method if spin_measured else "none"


def thread_waits_chart(profile: Profile) -> Drawn:
    result = thread_times(profile)
    if result is None:
        why = "the run was not profiled" if not profile.profiled else "no op ran with its threads' CPU time counted"
        return None, f"{why}, so there is no per-thread split of op time into working, spinning and off CPU."
    times, method = result
    labels = dict((k, (t, c)) for k, t, c in WAIT_PARTS)
    if method == "ompt":
        labels["sleep"] = ("off CPU in OpenMP waits", labels["sleep"][1])
    elif method == "none":
        labels["unsplit"] = ("on CPU (spin not measured: no samples)", labels["unsplit"][1])
    shown = [k for k, _, _ in WAIT_PARTS if any(t.parts[k] > 0 for t in times)]
    row_h, gap = 24, 10
    height = 58 + len(times) * (row_h + gap) + 46
    c = Chart("thread-waits", 900, height, "Where each thread's op time went", margins=(120, 40, 58, 46))
    total = max((t.wall for t in times), default=0.0)
    scale, unit = _time_unit(total)
    x = linear(0, total / scale, c.x0, c.x1, ticks=8)
    c.y1 = c.y0 + len(times) * (row_h + gap)
    c.x_axis(x, f"time while ops ran ({unit}, the ops' self wall time)", grid=True)
    for r, tt in enumerate(times):
        top = c.y0 + r * (row_h + gap) + gap / 2
        th = profile.threads[tt.thread]
        c.add(f'<text x="{c.x0 - 8}" y="{top + row_h / 2 + 4:.1f}" text-anchor="end">'
              f"{esc(f'{thread_label(tt.thread)} {th.role}')}</text>")
        segs, left = [], 0.0
        for key in shown:
            ns = tt.parts[key]
            if ns <= 0:
                continue
            text, colour = labels[key]
            px0, px1 = x(left / scale), x((left + ns) / scale)
            tip = f"{thread_label(tt.thread)}: {text}: {fmt_ns(ns)} ({fmt_percent(ns / tt.wall if tt.wall else 0)})"
            segs.append(f'<rect class="seg {key}" data-part="{key}" data-ns="{ns:.0f}" x="{px0:.2f}" y="{top:.1f}" '
                        f'width="{max(px1 - px0, 0.5):.2f}" height="{row_h}" fill="{colour}" stroke="#999" '
                        f'stroke-width="0.5">{tooltip(tip)}</rect>')
            left += ns
        c.mark(f'<g class="mark" data-thread="{thread_label(tt.thread)}" data-wall-ns="{tt.wall:.0f}">'
               + "".join(segs) + "</g>")
    entries = [(f'<rect x="0" y="-6" width="12" height="12" fill="{labels[k][1]}" stroke="#999"/>', labels[k][0])
               for k in shown]
    c.legend(entries[:3], c.x0, 14)
    c.legend(entries[3:], c.x0, 34)
    how = {"ompt": "OMPT: the OpenMP runtime reported every barrier and lock wait, its CPU clock read at both ends",
           "samples": "samples: spin is the thread's sampled CPU time with its leaf in the OpenMP runtime; off CPU "
                      "is the op's wall time minus the thread's CPU time",
           "none": "the threads' CPU counters read at every op boundary: on CPU is the thread's CPU time while the "
                   "op ran, off CPU the op's wall time minus it; spin needs samples (the sampled mode) or OMPT"
           }[method]
    return c.render(), (f"Each thread's time while ops ran (the ops' self wall time, summed over every op), split "
                        f"by {how}; the same figures as the contention table below.")


def roofline_chart(profile: Profile) -> Drawn:
    if not profile.profiled:
        return None, "the run was not profiled, so there are no GEMM times to place against the roofs."
    if profile.roofs is None or profile.roofs.memory_gb_per_s() is None:
        return None, ("no machine roofs in this profile (decode --roofs off, or they could not be measured); "
                      "python -m cpuprof calibrate measures them.")
    from ..analysis.roofline import gemm_groups
    from ..exports import roofline_svg

    groups = gemm_groups(profile)
    if not groups:
        return None, "no GEMM with recorded input shapes (shapes are needed for FLOPs and bytes; not --no-shapes)."
    name = profile.workload.model.name if profile.workload else "GEMMs"
    svg = roofline_svg.element(groups, profile.roofs, f"{name}: GEMMs against the roofs",
                               attributes='class="chart" data-chart="roofline"')
    marks = svg.count('<circle class="mark"')
    svg = svg.replace("<svg ", f'<svg data-marks="{marks}" ', 1)
    roofs = profile.roofs
    origin = "cached" if roofs.from_cache else "measured for this run"
    return svg, (f"Each GEMM shape (same kind, dtype and shape) as a circle whose area is its time: GFLOP/s against "
                 "arithmetic intensity, FLOPs and least bytes analytic from the recorded shapes, time measured; the "
                 f"roofs {origin} ({roofs.measured[:10]}, {roofs.threads} threads). Hover a circle for its figures.")


def flame_chart(profile: Profile) -> Drawn:
    if profile.stacks is None or not profile.stacks.counts:
        return None, ("this profile has no sampled stacks (exact mode, not profiled, or nothing was sampled); the "
                      "flame graph needs the sampled mode.")
    from ..analysis import flame
    from ..exports import svg

    stacks = flame.merged_stacks(profile)
    what = profile.workload.model.name if profile.workload else "profile"
    subtitle = ""
    if profile.sampling is not None:
        subtitle = f"{profile.sampling.samples:,} samples at {profile.sampling.hz} Hz per thread"
        py = profile.sampling.python
        if py is not None:
            subtitle += f"; Python frames: {py.source} at {py.hz} Hz" if not py.error else "; no Python frames"
    doc = svg.render(stacks, f"cpuprof: {what}, all threads, weighted by samples", "samples", subtitle)
    doc = re.sub(r"^<\?xml[^>]*\?>\s*", "", doc)
    frames = doc.count('<g class="f"')
    size = re.search(r'<svg [^>]*width="(\d+)" height="(\d+)"', doc)
    width, height = (int(size.group(1)), int(size.group(2))) if size else (1200, 600)
    # Its own document: the flame graph's script (zoom, search) and style sheet stay inside it,
    # where they cannot restyle the page or take its Ctrl-F.
    inner = ('<!DOCTYPE html><html><head><meta charset="utf-8"><style>html,body{margin:0;background:#fff}'
             f"</style></head><body>{doc}</body></html>")
    frame = (f'<iframe class="chart-frame" data-chart="flame" data-marks="{frames}" title="flame graph" '
             f'width="{width + 2}" height="{height + 2}" srcdoc="{esc(inner)}"></iframe>')
    return frame, ("Merged stacks of every sampled thread, root at the bottom: the thread, its Python frames "
                   "(py-spy), the regions and ATen ops it worked for, and the native frames its CPU was in; each "
                   "box as wide as its share of the samples. Click a box to zoom, Search (or Ctrl-F inside it) to "
                   "highlight frames.")


def rss_chart(wl: DecodeWorkload | None) -> Drawn:
    if wl is None or not wl.rss_timeline:
        return None, "no RSS timeline in this profile (it is recorded by decode runs)."
    points = wl.rss_timeline
    c = Chart("rss", 900, 300, "Resident memory over the run", margins=(72, 24, 20, 46))
    t_lo, t_hi = min(p.time_s for p in points), max(p.time_s for p in points)
    x = linear(t_lo if t_hi > t_lo else t_lo - 1, t_hi, c.x0 + 4, c.x1 - 4, ticks=10)
    mb = [p.rss_bytes / 1e6 for p in points]
    y = linear(0, max(mb), c.y1, c.y0)
    c.y_axis(y, "RSS (MB)")
    c.x_axis(x, "time since the decode process started (s)")
    path = " ".join(f"{x(p.time_s):.1f},{y(v):.1f}" for p, v in zip(points, mb, strict=True))
    c.add(f'<polyline points="{path}" fill="none" stroke="{BLUE}" stroke-width="1.5"/>')
    radius = 3.0 if len(points) <= 200 else 1.5
    last_label, below = -1e9, False
    for p, v in zip(points, mb, strict=True):
        px, py = x(p.time_s), y(v)
        c.mark(f'<circle class="mark" data-phase="{esc(p.phase)}" data-bytes="{p.rss_bytes}" cx="{px:.1f}" '
               f'cy="{py:.1f}" r="{radius}" fill="{BLUE}">'
               f"{tooltip(f'{p.phase}: {fmt_bytes(p.rss_bytes)} at {p.time_s:.3f} s')}</circle>")
        # The phases before decoding (start, built) are named on the chart, steps only in tooltips; a
        # name too close to the previous one goes below its point.
        if not p.phase.startswith("step "):
            below = px - last_label < 60 and not below
            ly = py + 18 if below else py - 8
            c.add(f'<text x="{px:.1f}" y="{ly:.1f}" text-anchor="middle" class="legend">{esc(p.phase)}</text>')
            last_label = px
    named = list(dict.fromkeys(p.phase for p in points if not p.phase.startswith("step ")))
    steps = sum(1 for p in points if p.phase.startswith("step "))
    moments = ", ".join(named + ([f"after each of {steps} decode steps"] if steps else []))
    caption = (f"The decode process's resident memory (/proc/self/statm) at {len(points)} moments ({moments}), "
               "against the time since the process started")
    if wl.peak_rss_bytes:
        caption += (f"; its high-water mark over the whole process (getrusage) was {fmt_bytes(wl.peak_rss_bytes)}, "
                    "which can include work between the points, such as measuring the roofs")
    return c.render(), caption + "."


# -- a comparison's page --------------------------------------------------------------------------------


def write_comparison_html(comparison: Comparison, out: TextIO) -> None:
    out.write(comparison_page(comparison))


def comparison_page(comparison: Comparison) -> str:
    from ..analysis.compare import comparison_report, summarize_configs

    report = comparison_report(comparison)
    summaries = summarize_configs(comparison)
    meta = (f"sweep started {comparison.created}, cpuprof {comparison.cpuprof_version}"
            + (f"; command: {' '.join(comparison.argv)}" if comparison.argv else ""))
    page = _Page(report.title, meta, list(report.warnings))
    ranking = report.section("ranking")
    page.heading(2, "verdict", "Verdict")
    page.add(_lines(ranking.lines) if ranking is not None and ranking.lines else
             '<p class="not-measured">No configuration finished a run yet.</p>')
    page.heading(2, "charts", "Charts")
    _figure(page, "chart-tokens", "Tokens/s by configuration", *tokens_chart(comparison, summaries))
    _figure(page, "chart-step-distribution", "Decode step latency by configuration",
            *step_distribution_chart(comparison, summaries))
    for section in report.sections:
        _section(page, section, lines=section.id != "ranking")
    return page.render()


def _config_rows(summaries: list[ConfigSummary]) -> tuple[int, list[str]]:
    """The label column's width (px) and each configuration's label, cut to fit."""
    labels = [s.config.label for s in summaries]
    width = int(min(300, max(90, 12 + 6.6 * max((len(t) for t in labels), default=8))))
    fit = int((width - 12) / 6.6)
    return width, [t if len(t) <= fit else t[:fit - 1] + "…" for t in labels]


def tokens_chart(comparison: Comparison, summaries: list[ConfigSummary]) -> Drawn:
    if not summaries:
        return None, "the sweep has no configuration."
    if not any(s.ok for s in summaries):
        return None, "no configuration finished a run, so there is no tokens/s to draw."
    label_w, labels = _config_rows(summaries)
    row_h, gap = 24, 10
    height = 36 + len(summaries) * (row_h + gap) + 46
    c = Chart("tokens-per-s", 900, height, "Decode tokens/s by configuration, mean ± standard deviation",
              margins=(label_w + 10, 150, 36, 46))
    hi = max(s.tokens_per_s.mean + (s.tokens_per_s.std if s.tokens_per_s.n > 1 else 0.0) for s in summaries if s.ok)
    x = linear(0, hi, c.x0, c.x1, ticks=8)
    c.y1 = c.y0 + len(summaries) * (row_h + gap)
    c.x_axis(x, "decode tokens/s (every sequence of the batch)", grid=True)
    best = max((s for s in summaries if s.ok), key=lambda s: s.tokens_per_s.mean)
    for r, (s, text) in enumerate(zip(summaries, labels, strict=True)):
        top = c.y0 + r * (row_h + gap) + gap / 2
        mid = top + row_h / 2
        tag = " (baseline)" if s.index == comparison.baseline else ""
        c.add(f'<text x="{c.x0 - 8}" y="{mid + 4:.1f}" text-anchor="end">{esc(text)}'
              f"{tooltip(s.config.label + tag)}</text>")
        if not s.ok:
            what = f"failed ({s.failed} run{'s' if s.failed != 1 else ''})" if s.failed else "not run"
            why = "; ".join(s.errors) if s.errors else "no run of it finished"
            c.add(f'<g class="failed" data-config="{esc(s.config.label)}"><text x="{c.x0 + 6}" y="{mid + 4:.1f}" '
                  f'fill="{VERMILION}" font-style="italic">{esc(what)}{tooltip(why)}</text></g>')
            continue
        tps = s.tokens_per_s
        colour = GREEN if s is best else BLUE
        tip = (f"{s.config.label}{tag}: {tps.mean:.2f} tokens/s over {tps.n} run(s)"
               + (f", standard deviation {tps.std:.2f}" if tps.n > 1 else ""))
        c.mark(f'<rect class="mark" data-config="{esc(s.config.label)}" data-mean="{tps.mean:.6g}" '
               f'data-std="{tps.std:.6g}" data-n="{tps.n}" x="{c.x0}" y="{top:.1f}" '
               f'width="{max(x(tps.mean) - c.x0, 0.5):.2f}" height="{row_h}" fill="{colour}" fill-opacity="0.8">'
               f"{tooltip(tip)}</rect>")
        text_x = x(tps.mean)
        if tps.n > 1:
            lo, hi_ = x(tps.mean - tps.std), x(tps.mean + tps.std)
            c.add(f'<g class="errorbar" data-config="{esc(s.config.label)}" stroke="#222" stroke-width="1.3">'
                  f'<line class="errorbar-line" x1="{lo:.2f}" y1="{mid:.1f}" x2="{hi_:.2f}" y2="{mid:.1f}"/>'
                  f'<line x1="{lo:.2f}" y1="{mid - 6:.1f}" x2="{lo:.2f}" y2="{mid + 6:.1f}"/>'
                  f'<line x1="{hi_:.2f}" y1="{mid - 6:.1f}" x2="{hi_:.2f}" y2="{mid + 6:.1f}"/></g>')
            text_x = hi_
        value = f"{tps.mean:.2f}" + (f" ± {tps.std:.2f}" if tps.n > 1 else " (1 run)") + tag
        c.add(f'<text x="{text_x + 6:.1f}" y="{mid + 4:.1f}" class="legend">{esc(value)}</text>')
    c.legend([(f'<rect x="0" y="-6" width="12" height="12" fill="{BLUE}" fill-opacity="0.8"/>', "mean over the runs"),
              (f'<rect x="0" y="-6" width="12" height="12" fill="{GREEN}" fill-opacity="0.8"/>', "fastest"),
              ('<g stroke="#222" stroke-width="1.3"><line x1="0" y1="0" x2="12" y2="0"/><line x1="0" y1="-5" x2="0" '
               'y2="5"/><line x1="12" y1="-5" x2="12" y2="5"/></g>', "± one standard deviation")], c.x0, 16)
    return c.render(), (f"Bar: mean decode tokens/s over the finished runs of each configuration (up to "
                        f"{comparison.repetitions}, each a fresh process, run in rotated rounds); error bar: ± one "
                        "sample standard deviation (n - 1) where a configuration has two or more runs; the fastest "
                        "in green. Failed configurations are named as failed, never drawn as zero.")


def step_distribution_chart(comparison: Comparison, summaries: list[ConfigSummary]) -> Drawn:
    steps = {s.index: [v for r in comparison.done_runs(s.index) if r.metrics is not None for v in r.metrics.step_ms]
             for s in summaries}
    if not any(steps.values()):
        return None, "no configuration measured a decode step."
    label_w, labels = _config_rows(summaries)
    row_h, gap = 20, 14
    height = 36 + len(summaries) * (row_h + gap) + 46
    c = Chart("step-distribution", 900, height, "Decode step latency by configuration",
              margins=(label_w + 10, 190, 36, 46))  # right: room for "p50 1,234.56, p99 1,234.56 ms"
    x = linear(0, max(max(v) for v in steps.values() if v), c.x0, c.x1, ticks=8)
    c.y1 = c.y0 + len(summaries) * (row_h + gap)
    c.x_axis(x, "decode step latency (ms)", grid=True)
    for r, (s, text) in enumerate(zip(summaries, labels, strict=True)):
        top = c.y0 + r * (row_h + gap) + gap / 2
        mid = top + row_h / 2
        c.add(f'<text x="{c.x0 - 8}" y="{mid + 4:.1f}" text-anchor="end">{esc(text)}{tooltip(s.config.label)}</text>')
        values = steps[s.index]
        if not values:
            what = "failed" if s.failed else "not run"
            c.add(f'<g class="failed" data-config="{esc(s.config.label)}"><text x="{c.x0 + 6}" y="{mid + 4:.1f}" '
                  f'fill="{VERMILION}" font-style="italic">{esc(what)}</text></g>')
            continue
        lo, q1, p50, q3, p99, hi = (float(v) for v in np.percentile(np.asarray(values), [0, 25, 50, 75, 99, 100]))
        tip = (f"{s.config.label}: {len(values)} steps; fastest {lo:.2f} ms, p25 {q1:.2f}, p50 {p50:.2f}, "
               f"p75 {q3:.2f}, p99 {p99:.2f}, slowest {hi:.2f} ms")
        parts = [f'<line x1="{x(lo):.2f}" y1="{mid:.1f}" x2="{x(p99):.2f}" y2="{mid:.1f}" stroke="#333"/>',
                 f'<line class="p99" x1="{x(p99):.2f}" y1="{top + 3:.1f}" x2="{x(p99):.2f}" y2="{top + row_h - 3:.1f}" '
                 f'stroke="{VERMILION}" stroke-width="2"/>',
                 f'<rect x="{x(q1):.2f}" y="{top:.1f}" width="{max(x(q3) - x(q1), 1):.2f}" height="{row_h}" '
                 f'fill="{SKY}" fill-opacity="0.6" stroke="#333"/>',
                 f'<line class="p50" x1="{x(p50):.2f}" y1="{top:.1f}" x2="{x(p50):.2f}" y2="{top + row_h:.1f}" '
                 f'stroke="#000" stroke-width="2"/>']
        if hi > p99:
            parts.append(f'<circle cx="{x(hi):.2f}" cy="{mid:.1f}" r="2.5" fill="#333"/>')
        c.mark(f'<g class="mark" data-config="{esc(s.config.label)}" data-steps="{len(values)}" '
               f'data-p50="{p50:.6g}" data-p99="{p99:.6g}">{tooltip(tip)}' + "".join(parts) + "</g>")
        c.add(f'<text x="{c.x1 + 8}" y="{mid + 4:.1f}" class="legend">'
              f"{esc(f'p50 {p50:.1f}, p99 {p99:.1f} ms')}</text>")
    c.legend([(f'<rect x="0" y="-6" width="12" height="12" fill="{SKY}" fill-opacity="0.6" stroke="#333"/>',
               "25th-75th percentile"),
              ('<line x1="6" y1="-7" x2="6" y2="7" stroke="#000" stroke-width="2"/>', "p50"),
              (f'<line x1="6" y1="-7" x2="6" y2="7" stroke="{VERMILION}" stroke-width="2"/>', "p99"),
              ('<circle cx="6" cy="0" r="2.5" fill="#333"/>', "slowest step")], c.x0, 16)
    return c.render(), ("Every measured decode step of each configuration, pooled over its runs (warm-up steps left "
                        "out): box from the 25th to the 75th percentile, black line at p50, whisker from the fastest "
                        "step to p99 (red tick), dot at the slowest step; percentiles by linear interpolation, as "
                        "in the table.")


__all__ = ["write_comparison_html", "write_profile_html"]
