"""The HTML page of a configuration sweep (``cpuprof compare``): the verdict, a chart of each
configuration's tokens/s and of its decode steps' spread, then every table of its report
(:func:`~cpuprof.analysis.compare.comparison_report`, whose figures the charts draw)."""

from __future__ import annotations

from ..analysis.compare import ConfigSummary, StepDistribution, SweepFigures
from ..exports.charts import BLUE, GREEN, SKY, VERMILION, Chart, esc, linear, tooltip
from ..model.compare import Comparison
from .html_page import Drawn, Page, command_text, figure, lines_html, section_html


def comparison_page(comparison: Comparison) -> str:
    from ..analysis.compare import comparison_report, summarize_configs

    report = comparison_report(comparison)
    summaries = summarize_configs(comparison)
    meta = (f"sweep started {comparison.created}, cpuprof {comparison.cpuprof_version}"
            + (f"; command: {command_text(comparison.argv)}" if comparison.argv else ""))
    page = Page(report.title, meta, list(report.warnings))
    ranking = report.section("ranking")
    page.heading(2, "verdict", "Verdict")
    page.add(lines_html(ranking.lines) if ranking is not None and ranking.lines else
             '<p class="not-measured">No configuration finished a run yet.</p>')
    figures = report.figures
    assert isinstance(figures, SweepFigures), "a sweep's page is drawn from comparison_report's figures"
    page.heading(2, "charts", "Charts")
    figure(page, "chart-tokens", "Tokens/s by configuration", *tokens_chart(comparison, summaries))
    figure(page, "chart-step-distribution", "Decode step latency by configuration",
           *step_distribution_chart(summaries, figures.step_distributions))
    for section in report.sections:
        section_html(page, section, lines=section.id != "ranking")
    return page.render()


def _config_rows(summaries: list[ConfigSummary]) -> tuple[int, list[str]]:
    """The label column's width (px) and each configuration's label, cut to fit."""
    labels = [s.config.label for s in summaries]
    width = int(min(420, max(90, 12 + 6.6 * max((len(t) for t in labels), default=8))))
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
    c = Chart("tokens-per-s", max(900, label_w + 700), height,
              "Decode tokens/s by configuration, mean ± standard deviation", margins=(label_w + 10, 150, 36, 46))
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
            lo, hi_ = x(max(0.0, tps.mean - tps.std)), x(tps.mean + tps.std)  # tokens/s are never below 0
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


def step_distribution_chart(summaries: list[ConfigSummary], distributions: list[StepDistribution]) -> Drawn:
    steps = {d.config: d for d in distributions}
    if not steps:
        return None, "no configuration measured a decode step."
    label_w, labels = _config_rows(summaries)
    row_h, gap = 20, 14
    height = 36 + len(summaries) * (row_h + gap) + 46
    c = Chart("step-distribution", max(900, label_w + 700), height, "Decode step latency by configuration",
              margins=(label_w + 10, 190, 36, 46))  # right: room for "p50 1,234.56, p99 1,234.56 ms"
    # The axis ends near the slowest p99, and no further than 4x the widest box's end: one configuration's
    # outliers (a p99 or a slowest step far out) would otherwise flatten every box to a line. What lies
    # beyond is drawn as an arrow at the edge; its value is in the row's label and its tooltip.
    axis_ms = min(max(d.p99_ms for d in steps.values()), 4 * max(d.p75_ms for d in steps.values())) * 1.05
    x = linear(0, axis_ms, c.x0, c.x1, ticks=8)
    beyond = False
    c.y1 = c.y0 + len(summaries) * (row_h + gap)
    c.x_axis(x, "decode step latency (ms)", grid=True)
    for r, (s, text) in enumerate(zip(summaries, labels, strict=True)):
        top = c.y0 + r * (row_h + gap) + gap / 2
        mid = top + row_h / 2
        c.add(f'<text x="{c.x0 - 8}" y="{mid + 4:.1f}" text-anchor="end">{esc(text)}{tooltip(s.config.label)}</text>')
        d = steps.get(s.index)
        if d is None:
            what = "failed" if s.failed else "not run"
            c.add(f'<g class="failed" data-config="{esc(s.config.label)}"><text x="{c.x0 + 6}" y="{mid + 4:.1f}" '
                  f'fill="{VERMILION}" font-style="italic">{esc(what)}</text></g>')
            continue
        lo, q1, p50, q3, p99, hi = d.fastest_ms, d.p25_ms, d.p50_ms, d.p75_ms, d.p99_ms, d.slowest_ms
        tip = (f"{s.config.label}: {d.steps} steps; fastest {lo:.2f} ms, p25 {q1:.2f}, p50 {p50:.2f}, "
               f"p75 {q3:.2f}, p99 {p99:.2f}, slowest {hi:.2f} ms")
        def at(ms: float) -> float:
            return x(min(ms, axis_ms))

        parts = [f'<line x1="{at(lo):.2f}" y1="{mid:.1f}" x2="{at(p99):.2f}" y2="{mid:.1f}" stroke="#333"/>',
                 f'<rect x="{at(q1):.2f}" y="{top:.1f}" width="{max(at(q3) - at(q1), 1):.2f}" height="{row_h}" '
                 f'fill="{SKY}" fill-opacity="0.6" stroke="#333"/>',
                 f'<line class="p50" x1="{at(p50):.2f}" y1="{top:.1f}" x2="{at(p50):.2f}" y2="{top + row_h:.1f}" '
                 f'stroke="#000" stroke-width="2"/>']
        if p99 <= axis_ms:
            parts.append(f'<line class="p99" x1="{x(p99):.2f}" y1="{top + 3:.1f}" x2="{x(p99):.2f}" '
                         f'y2="{top + row_h - 3:.1f}" stroke="{VERMILION}" stroke-width="2"/>')
        if hi > p99 and hi <= axis_ms:
            parts.append(f'<circle cx="{x(hi):.2f}" cy="{mid:.1f}" r="2.5" fill="#333"/>')
        if hi > axis_ms:
            beyond = True
            edge = x(axis_ms)
            parts.append(f'<path class="beyond" d="M{edge - 7:.2f},{mid - 5:.1f} L{edge:.2f},{mid:.1f} '
                         f'L{edge - 7:.2f},{mid + 5:.1f} Z" fill="{VERMILION if p99 > axis_ms else "#333"}"/>')
        c.mark(f'<g class="mark" data-config="{esc(s.config.label)}" data-steps="{d.steps}" '
               f'data-p50="{p50:.6g}" data-p99="{p99:.6g}">{tooltip(tip)}' + "".join(parts) + "</g>")
        c.add(f'<text x="{c.x1 + 8}" y="{mid + 4:.1f}" class="legend">'
              f"{esc(f'p50 {p50:.1f}, p99 {p99:.1f} ms')}</text>")
    c.legend([(f'<rect x="0" y="-6" width="12" height="12" fill="{SKY}" fill-opacity="0.6" stroke="#333"/>',
               "25th-75th percentile"),
              ('<line x1="6" y1="-7" x2="6" y2="7" stroke="#000" stroke-width="2"/>', "p50"),
              (f'<line x1="6" y1="-7" x2="6" y2="7" stroke="{VERMILION}" stroke-width="2"/>', "p99"),
              ('<circle cx="6" cy="0" r="2.5" fill="#333"/>', "slowest step"),
              *([('<path d="M0,-5 L7,0 L0,5 Z" fill="#333"/>', "beyond the axis (red: its p99)")] if beyond
                else [])], c.x0, 16)
    return c.render(), ("Every measured decode step of each configuration, pooled over its runs (warm-up steps left "
                        "out): box from the 25th to the 75th percentile, black line at p50, whisker from the fastest "
                        "step to p99 (red tick), dot at the slowest step; percentiles by linear interpolation, as "
                        "in the table.")
