"""The HTML page of a multi-process decode (``decode --tp/--instances``, ``run --nproc``): the merged
report's tables, and a chart of where each rank's decode step goes, drawn from the ranks' profiles
with the same primitives and page as a single profile's (:mod:`cpuprof.reports.html_page`)."""

from __future__ import annotations

from pathlib import Path

from ..analysis.ranks import GroupFigures, group_figures, ranks_report
from ..exports.charts import BLUE, GREY, ORANGE, VERMILION, Chart, esc, linear, tooltip
from ..model.ranks import MultiRun
from ..units import fmt_ns
from .html_page import Drawn, Page, command_text, figure, section_html


def ranks_page(run: MultiRun, directory: Path) -> str:
    profiles = run.profiles(directory)
    report = ranks_report(run, profiles, directory)
    group = group_figures(run, profiles)
    page = Page(report.title, f"command: {command_text(run.argv)}" if run.argv else "", list(report.warnings))
    for section in report.sections:
        section_html(page, section)
        if section.id == "ranks" and run.mode != "nproc":
            page.heading(2, "charts", "Charts")
            figure(page, "chart-rank-steps", "Each rank's decode step", *rank_step_chart(group))
    return page.render()


# What a tensor-parallel step is made of, in the order the bars stack, and an instance's whole step.
PARTS = (("compute_ns", "compute", BLUE), ("transfer_ns", "reduce, after the last rank arrived", ORANGE),
         ("wait_ns", "waiting for the slowest rank", VERMILION))


def rank_step_chart(group: GroupFigures) -> Drawn:
    """One bar per rank: its mean measured decode step, split into compute, all-reduce and skew wait
    for tensor-parallel ranks; the whole step (p50) for independent instances."""
    rows = []
    for f in group.ranks:
        if f.split is not None:
            s = f.split
            rows.append((f.rank, [(s.compute_ns, *PARTS[0][1:]), (s.transfer_ns, *PARTS[1][1:]),
                                  (s.wait_ns, *PARTS[2][1:])]))
        elif f.p50_ms is not None:
            rows.append((f.rank, [(f.p50_ms * 1e6, "median step", GREY)]))
    if not rows:
        return None, "no rank measured a decode step."
    row_h, gap = 24, 10
    height = 36 + len(rows) * (row_h + gap) + 46
    c = Chart("rank-steps", 900, height, "Decode step per rank", margins=(80, 150, 36, 46))
    hi = max(sum(v for v, _, _ in parts) for _, parts in rows) or 1.0
    x = linear(0, hi / 1e6, c.x0, c.x1, ticks=8)
    c.y1 = c.y0 + len(rows) * (row_h + gap)
    c.x_axis(x, "milliseconds per decode step (mean of the measured steps; instances: median)", grid=True)
    for r, (rank, parts) in enumerate(rows):
        top = c.y0 + r * (row_h + gap) + gap / 2
        c.add(f'<text x="{c.x0 - 8}" y="{top + row_h / 2 + 4:.1f}" text-anchor="end">rank {rank}</text>')
        left = 0.0
        for value, name, colour in parts:
            x0, x1 = x(left / 1e6), x((left + value) / 1e6)
            c.mark(f'<rect class="mark" data-rank="{rank}" data-part="{esc(name)}" data-ns="{value:.0f}" '
                   f'x="{x0:.2f}" y="{top:.1f}" width="{max(x1 - x0, 0.0):.2f}" height="{row_h}" fill="{colour}" '
                   f'fill-opacity="0.85">{tooltip(f"rank {rank}: {name} {fmt_ns(value)}")}</rect>')
            left += value
        c.add(f'<text x="{x(left / 1e6) + 6:.1f}" y="{top + row_h / 2 + 4:.1f}" class="legend">'
              f"{esc(fmt_ns(left))}</text>")
    shown = {name for _, parts in rows for _, name, _ in parts}
    c.legend([(f'<rect x="0" y="-6" width="12" height="12" fill="{colour}" fill-opacity="0.85"/>', name)
              for name, colour in [(p[1], p[2]) for p in PARTS] + [("median step", GREY)] if name in shown],
             c.x0, 16)
    caption = ("Each tensor-parallel rank's mean measured decode step: computing its shard (outside all-reduces), "
               "the all-reduces after the last rank arrived, and the time it waited inside them for the last rank. "
               "The ranks time every all-reduce on the machine's one monotonic clock, so their calls line up."
               if group.mode == "tp" else "Each instance's median decode step.")
    return c.render(), caption
