"""The HTML page of one profile: its figures first, charts drawn from its data, then every section
of its report (:func:`~cpuprof.analysis.report.build_report`). The charts only draw: what they show
is computed in :mod:`cpuprof.analysis` (the report's figures), so the JSON report carries it too.
"""

from __future__ import annotations

import re

from ..analysis.contention import OpTimeSplit
from ..analysis.labels import thread_label
from ..analysis.report import ProfileFigures
from ..analysis.report_model import Report
from ..analysis.timeline import BusyTimeline
from ..exports.charts import BLUE, GREEN, GREY, ORANGE, SKY, VERMILION, Chart, esc, linear, tooltip
from ..model import SAMPLED, DecodeWorkload, Profile
from ..units import fmt_bytes, fmt_ns, fmt_percent, fmt_rate
from .html_page import Drawn, Page, command_text, figure, kpis_html, lines_html, notes_html, section_html, table_html


def profile_page(profile: Profile, report: Report) -> str:
    m = profile.meta
    command = command_text(m.command or m.argv)
    meta = (f"recorded {m.created} on {m.hostname} (pid {m.pid}), cpuprof {m.cpuprof_version}, "
            f"torch {m.torch_version or 'not loaded'}" + (f"; command: {command}" if command else ""))
    figures = report.figures
    assert isinstance(figures, ProfileFigures), "a profile's page is drawn from build_report's figures"
    page = Page(report.title, meta, list(report.warnings))
    summary_ids = ("decode", "ceiling")
    page.heading(2, "summary", "Summary")
    page.add(kpis_html(_profile_kpis(profile)))
    for section in report.sections:
        if section.id in summary_ids:
            page.heading(3, f"s-{section.id}", section.title)
            page.add(lines_html(section.lines), *(table_html(t) for t in section.tables), notes_html(section.notes))
    if not any(s.id in summary_ids for s in report.sections):
        page.add('<p class="not-measured">No decode figures: this profile was not a decode run.</p>')

    page.heading(2, "charts", "Charts")
    figure(page, "chart-step-latency", "Decode step latency", *step_latency_chart(profile.workload))
    figure(page, "chart-thread-busy", "Threads busy over time",
           *thread_busy_chart(profile, figures.busy_timeline))
    figure(page, "chart-thread-waits", "Where each thread's op time went",
           *thread_waits_chart(profile, figures.op_time))
    figure(page, "chart-roofline", "GEMMs against the roofs (roofline)", *roofline_chart(profile))
    figure(page, "chart-flame", "Flame graph (every thread's sampled stacks)", *flame_chart(profile))
    figure(page, "chart-rss", "Resident memory over the run", *rss_chart(profile.workload))

    for section in report.sections:
        if section.id not in summary_ids:
            section_html(page, section)
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


# -- the charts: each returns (svg, caption), or (None, why there is none) -----------------------------


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


def _time_unit(span_ns: float) -> tuple[float, str]:
    return (1e9, "s") if span_ns >= 2e9 else (1e6, "ms")


def _busy_colour(share: float) -> str:
    """White (idle) to dark blue (a whole CPU busy), linear in the share."""
    share = min(1.0, max(0.0, share))
    lo, hi = (247, 251, 255), (8, 69, 148)
    return "rgb(" + ",".join(str(round(a + (b - a) * share)) for a, b in zip(lo, hi, strict=True)) + ")"


def thread_busy_chart(profile: Profile, timeline: BusyTimeline | None) -> Drawn:
    if timeline is None:
        if not profile.profiled:
            return None, "the run was not profiled; per-thread CPU busy over time needs the sampled mode."
        if profile.collection is not None and profile.collection.mode == SAMPLED and profile.stacks is not None:
            return None, ("this profile kept no sample timeline: sampled mode keeps one with --timeline N or "
                          "--flamegraph (or --python-hz), for this chart and for traces.")
        return None, ("this profile has no sample timeline (exact mode, or no thread was sampled); per-thread "
                      "CPU busy over time needs the sampled mode.")
    rows = timeline.threads
    row_h, gap = 22, 5
    height = 34 + len(rows) * (row_h + gap) + 50
    c = Chart("thread-busy", 900, height, "Threads busy over time", margins=(120, 24, 34, 46))
    scale, unit = _time_unit(timeline.buckets * timeline.bucket_ns)
    x = linear(0, timeline.buckets * timeline.bucket_ns / scale, c.x0, c.x1, ticks=10)
    # the cells fill the plot exactly; the axis may reach a little past the last bucket
    px_per_ns = (x(timeline.buckets * timeline.bucket_ns / scale) - c.x0) / (timeline.buckets * timeline.bucket_ns)
    cell_w = timeline.bucket_ns * px_per_ns
    for r, row in enumerate(rows):
        thread, cpu = row.thread, row.cpu_ns
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


# (key, legend, colour): the parts of a thread's op time (analysis.contention.TIME_PARTS), as they are drawn.
WAIT_PARTS = (
    ("working", "on CPU, working", BLUE),
    ("spin", "on CPU, spinning in the OpenMP runtime", ORANGE),
    ("unsplit", "on CPU (too few samples to split out spin)", SKY),
    ("sleep", "off CPU while the op ran", "#b8b8b8"),
    ("off_other", "off CPU outside OpenMP waits", "#dddddd"),
    ("unknown", "not measured", "#ffffff"),
)


def thread_waits_chart(profile: Profile, split: OpTimeSplit | None) -> Drawn:
    if split is None:
        why = "the run was not profiled" if not profile.profiled else "no op ran with its threads' CPU time counted"
        return None, f"{why}, so there is no per-thread split of op time into working, spinning and off CPU."
    times, method = split.threads, split.spin_method
    labels = dict((k, (t, c)) for k, t, c in WAIT_PARTS)
    if method == "ompt":
        labels["sleep"] = ("off CPU in OpenMP waits", labels["sleep"][1])
    elif method == "none":
        labels["unsplit"] = ("on CPU (spin not measured: no samples)", labels["unsplit"][1])
    shown = [k for k, _, _ in WAIT_PARTS if any(t.parts[k] > 0 for t in times)]
    row_h, gap = 24, 10
    height = 58 + len(times) * (row_h + gap) + 46
    c = Chart("thread-waits", 900, height, "Where each thread's op time went", margins=(120, 40, 58, 46))
    total = max((t.wall_ns for t in times), default=0.0)
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
            share = ns / tt.wall_ns if tt.wall_ns else 0
            tip = f"{thread_label(tt.thread)}: {text}: {fmt_ns(ns)} ({fmt_percent(share)})"
            segs.append(f'<rect class="seg {key}" data-part="{key}" data-ns="{ns:.0f}" x="{px0:.2f}" y="{top:.1f}" '
                        f'width="{max(px1 - px0, 0.5):.2f}" height="{row_h}" fill="{colour}" stroke="#999" '
                        f'stroke-width="0.5">{tooltip(tip)}</rect>')
            left += ns
        c.mark(f'<g class="mark" data-thread="{thread_label(tt.thread)}" data-wall-ns="{tt.wall_ns:.0f}">'
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
    from ..analysis.flame import flame_graph
    from ..exports import svg

    graph = flame_graph(profile)
    doc = svg.render(graph.stacks, graph.title, graph.unit, graph.subtitle)
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
                   "(each op's recorded caller, or a Python sampler's reads), the regions and ATen ops it worked "
                   "for, and the native frames its CPU was in; each box as wide as its share of the samples. "
                   "Click a box to zoom, Search (or Ctrl-F inside it) to highlight frames.")


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
