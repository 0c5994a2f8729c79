"""The HTML report on hand-built profiles and comparisons whose figures are known: every chart draws
one mark per datum at the right place, nothing from a profile breaks the page, nothing is fetched."""

from __future__ import annotations

import html
import io
import re
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
from profiles import MS, V1_DECODE, V1_UNPROFILED, make_profile, make_sampled_profile, make_sweep

from cpuprof.analysis import flame
from cpuprof.analysis.timeline import busy_timeline
from cpuprof.cli import main
from cpuprof.exports import svg
from cpuprof.model import (
    Profile,
)
from cpuprof.reports import OutputOptions, ProfileSource, SweepSource, get_output

SVG = "{http://www.w3.org/2000/svg}"


def page_of(profile: Profile) -> str:
    out = io.StringIO()
    get_output("html", "profile").write(ProfileSource(profile), out, OutputOptions())
    return out.getvalue()


def charts(page: str) -> dict[str, ET.Element]:
    """The page's inline SVG charts by name (each is well-formed XML)."""
    found = {}
    for match in re.finditer(r'<svg\b[^>]*\bdata-chart="([^"]+)".*?</svg>', page, re.S):
        found[match.group(1)] = ET.fromstring(match.group(0))
    return found


def marks(chart: ET.Element) -> list[ET.Element]:
    return [el for el in chart.iter() if "mark" in (el.get("class") or "").split()]


def not_measured(page: str) -> list[str]:
    return [html.unescape(m) for m in re.findall(r'<p class="not-measured">(.*?)</p>', page)]


class Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.attrs: list[tuple[str, str | None]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        self.attrs.extend(attrs)


def tags(page: str) -> Tags:
    parser = Tags()
    parser.feed(page)
    return parser


def test_step_latency_chart_has_one_mark_per_step_and_the_percentile_lines():
    profile = make_profile()
    page = page_of(profile)
    chart = charts(page)["step-latency"]
    dots = marks(chart)
    wl = profile.workload
    assert wl is not None
    assert len(dots) == len(wl.step_latencies_s) == 4 and chart.get("data-marks") == "4"
    assert [float(d.get("data-ms", "nan")) for d in dots] == pytest.approx([s * 1e3 for s in wl.step_latencies_s])
    warm = [d for d in dots if "warmup" in (d.get("class") or "")]
    assert [d.get("data-step") for d in warm] == ["1"]  # warmup_steps = 1: marked apart from the measured ones
    assert warm[0].get("fill") != dots[1].get("fill")
    # 20 ms sits twice as high above the axis as 10 ms
    y = {d.get("data-step"): float(d.get("cy", "nan")) for d in dots}
    base = next(float(t.get("y", "nan")) - 4 for t in chart.iter(f"{SVG}text") if t.text == "0")
    assert (base - y["1"]) == pytest.approx(2 * (base - y["2"]), abs=0.2)
    lines = {line.get("class"): float(line.get("data-ms", "nan")) for line in chart.iter(f"{SVG}line")
             if (line.get("class") or "").startswith("ref")}
    assert lines == {"ref p50": 10.0, "ref p99": 12.0}


def test_a_profile_without_stacks_roofs_or_rss_says_so_in_one_line_each():
    page = page_of(make_profile())  # exact mode: no samples, no stacks, no roofs, no RSS timeline
    drawn = charts(page)
    assert set(drawn) == {"step-latency", "thread-waits"}
    assert 'data-chart="flame"' not in page
    notes = not_measured(page)
    assert len(notes) == 4 and all("\n" not in n for n in notes)
    assert any("sample timeline" in n for n in notes)
    assert any("no machine roofs" in n for n in notes)
    assert any("no sampled stacks" in n for n in notes)
    assert any("no RSS timeline" in n for n in notes)
    # every section of the report is there, with its tables
    for section in ("settings", "profile", "threads", "ops", "regions", "contention", "notes"):
        assert f'id="s-{section}"' in page


def test_thread_waits_split_each_threads_op_time_into_known_parts():
    chart = charts(page_of(make_profile()))["thread-waits"]
    bars = {b.get("data-thread"): b for b in marks(chart)}
    assert set(bars) == {"T0", "T1"}
    for bar in bars.values():
        # the op time of every thread is the ops' self wall time: mm 600 + add 50 + region mlp 50 ms
        assert float(bar.get("data-wall-ns", "nan")) == pytest.approx(700 * MS)
        parts = {r.get("data-part"): float(r.get("data-ns", "nan")) for r in bar}
        assert sum(parts.values()) == pytest.approx(700 * MS)
    parts0 = {r.get("data-part"): float(r.get("data-ns", "nan")) for r in bars["T0"]}
    # exact mode has no samples to split out spin: CPU 590 + 40 ms unsplit; off CPU 10 + 10 ms; the
    # region's CPU was not counted per thread
    assert parts0 == pytest.approx({"unsplit": 630 * MS, "sleep": 20 * MS, "unknown": 50 * MS})
    parts1 = {r.get("data-part"): float(r.get("data-ns", "nan")) for r in bars["T1"]}
    assert parts1 == pytest.approx({"unsplit": 580 * MS, "sleep": 70 * MS, "unknown": 50 * MS})


def test_busy_timeline_from_the_samples():
    profile = make_sampled_profile()
    timeline = busy_timeline(profile)
    assert timeline is not None
    # 1 s at 100 Hz in buckets of at least 5 sampling periods: 20 buckets of 50 ms
    assert timeline.buckets == 20 and timeline.bucket_ns == pytest.approx(50 * MS)
    rows = {row.thread: row.cpu_ns for row in timeline.threads}
    assert rows[0] == pytest.approx([50 * MS] * 20) and rows[1] == pytest.approx([0.0] * 10 + [50 * MS] * 10)
    chart = charts(page_of(profile))["thread-busy"]
    cells = marks(chart)
    assert len(cells) == 2 * 20
    shares = {t: [float(c.get("data-share", "nan")) for c in cells if c.get("data-thread") == t] for t in ("T0", "T1")}
    assert shares["T0"] == pytest.approx([1.0] * 20) and shares["T1"] == pytest.approx([0.0] * 10 + [1.0] * 10)
    assert sum(float(c.get("data-cpu-ns", "nan")) for c in cells) == pytest.approx(1500 * MS)
    # idle and busy cells differ in colour, and T1's first busy cell starts half way along T0's row
    t0 = [c for c in cells if c.get("data-thread") == "T0"]
    t1 = [c for c in cells if c.get("data-thread") == "T1"]
    assert t1[0].get("fill") != t1[-1].get("fill") == t0[0].get("fill")
    x0, x_end = float(t0[0].get("x", "nan")), float(t0[-1].get("x", "nan")) + float(t0[-1].get("width", "nan"))
    assert float(t1[10].get("x", "nan")) == pytest.approx((x0 + x_end) / 2, abs=0.5)


def test_busy_timeline_starts_at_the_first_kept_sample_when_older_ones_were_dropped():
    profile = make_sampled_profile()
    assert profile.sampling is not None and profile.stacks is not None and profile.stacks.timeline is not None
    profile.sampling.timeline_dropped = 1000
    timeline = busy_timeline(profile)
    assert timeline is not None and timeline.start_ns == profile.stacks.timeline.time_ns[0]
    assert "were not kept" in page_of(profile)


def test_sampled_profile_draws_every_chart_from_its_data():
    profile = make_sampled_profile()
    page = page_of(profile)
    drawn = charts(page)
    assert set(drawn) == {"step-latency", "thread-busy", "thread-waits", "roofline", "rss"}
    assert not_measured(page) == []
    # roofline: one circle per GEMM group with time (aten::mm's GEMV; aten::add is no GEMM)
    assert len(marks(drawn["roofline"])) == 1 == int(drawn["roofline"].get("data-marks", "0"))
    # RSS: one mark per point, in MB on the axis
    rss = marks(drawn["rss"])
    assert [int(m.get("data-bytes", "0")) for m in rss] == [200_000_000, 250_000_000, 300_000_000, 301_000_000,
                                                            302_000_000]
    # the flame graph: its own document in an iframe, drawn with the frames the flame.svg would have
    frame = re.search(r'<iframe [^>]*data-chart="flame"[^>]*>', page)
    assert frame is not None
    inner = re.search(r'srcdoc="([^"]*)"', frame.group(0))
    assert inner is not None
    srcdoc = html.unescape(inner.group(1))
    expected = svg.render(flame.merged_stacks(profile), "t", "samples").count('<g class="f"')
    assert srcdoc.count('<g class="f"') == expected > 2
    assert f'data-marks="{expected}"' in frame.group(0)
    assert "mkl_gemv&lt;float&gt;" in srcdoc  # escaped inside its own document too


def test_profile_strings_are_escaped():
    profile = make_sampled_profile()
    profile.ops[1].name = "<lambda>"
    profile.ops[0].region = ["a&b", "<script>alert(1)</script>"]
    assert profile.workload is not None
    profile.workload.model.name = 'tiny "<b>bold</b>"'
    profile.meta.argv = ["--x", "</title><img src=x onerror=alert(1)>"]
    page = page_of(profile)
    assert "<lambda>" not in page and "&lt;lambda&gt;" in page
    assert "<script>alert" not in page and "<img" not in page and "<b>" not in page
    parsed = tags(page)
    allowed = {"html", "head", "meta", "title", "style", "body", "main", "h1", "h2", "h3", "p", "div", "nav", "ol",
               "ul", "li", "a", "strong", "span", "figure", "figcaption", "table", "thead", "tbody", "tr", "th", "td",
               "iframe", "footer", "svg", "g", "rect", "circle", "line", "polyline", "text", "defs",
               "lineargradient", "stop"}
    assert set(parsed.tags) <= allowed, set(parsed.tags) - allowed
    head_title = re.search(r"<title>(.*?)</title>", page)
    assert head_title is not None and html.unescape(head_title.group(1)) == 'cpuprof decode: tiny "<b>bold</b>"'


def test_nothing_is_fetched_from_the_network():
    page = page_of(make_sampled_profile())
    assert not re.search(r"""(?:src|href)\s*=\s*["']?\s*(?:https?:)?//""", page, re.I)
    assert not re.search(r"""url\(\s*["']?\s*(?:https?:)?//""", page, re.I)
    assert "@import" not in page and "<link" not in page and "<script src" not in page
    csp = re.search(r'<meta http-equiv="Content-Security-Policy" content="([^"]*)"', page)
    assert csp is not None and "default-src 'none'" in html.unescape(csp.group(1))  # nor may the browser try


@pytest.mark.parametrize("fixture", [V1_DECODE, V1_UNPROFILED])
def test_saved_profiles_of_older_versions_render(fixture: Path):
    page = page_of(Profile.load(fixture))
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    assert "step-latency" in charts(page)


def comparison_page() -> str:
    out = io.StringIO()
    get_output("html", "sweep").write(SweepSource(make_sweep()), out, OutputOptions())
    return out.getvalue()


def test_tokens_chart_has_a_bar_per_configuration_with_its_standard_deviation():
    page = comparison_page()
    chart = charts(page)["tokens-per-s"]
    bars = {b.get("data-config"): b for b in marks(chart)}
    assert set(bars) == {"threads=1", "threads=2"}
    failed = [g for g in chart.iter(f"{SVG}g") if g.get("class") == "failed"]
    assert [g.get("data-config") for g in failed] == ["threads=3"]
    assert "failed (2 runs)" in "".join(failed[0].itertext())
    one = bars["threads=1"]
    assert float(one.get("data-mean", "nan")) == pytest.approx(12.0) and float(one.get("data-std", "nan")) == 2.0
    # the bar is as long as the mean, the error bar's half-length is one standard deviation, on the same scale
    px_per_token = float(one.get("width", "nan")) / 12.0
    bar_x0 = float(one.get("x", "nan"))
    line = next(g for g in chart.iter(f"{SVG}g")
                if g.get("class") == "errorbar" and g.get("data-config") == "threads=1")
    err = next(el for el in line if el.get("class") == "errorbar-line")
    x1, x2 = float(err.get("x1", "nan")), float(err.get("x2", "nan"))
    assert (x2 - x1) / 2 == pytest.approx(2.0 * px_per_token, rel=1e-3)
    assert (x1 + x2) / 2 - bar_x0 == pytest.approx(12.0 * px_per_token, rel=1e-3)
    two = bars["threads=2"]
    assert float(two.get("width", "nan")) / px_per_token == pytest.approx(20.0, rel=1e-3)


def _page_of(sweep) -> str:
    out = io.StringIO()
    get_output("html", "sweep").write(SweepSource(sweep), out, OutputOptions())
    return out.getvalue()


def test_an_error_bar_stops_at_zero_tokens_per_s():
    """threads=1 at 2, 4 and 30 tokens/s: a standard deviation (15.6) larger than its mean (12); its
    error bar starts at the axis' 0, not left of it."""
    sweep = make_sweep()
    for run, tps in zip([r for r in sweep.runs if r.config == 0], (2.0, 4.0, 30.0), strict=True):
        assert run.metrics is not None
        run.metrics.tokens_per_s = tps
    chart = charts(_page_of(sweep))["tokens-per-s"]
    bar = next(b for b in marks(chart) if b.get("data-config") == "threads=1")
    line = next(g for g in chart.iter(f"{SVG}g")
                if g.get("class") == "errorbar" and g.get("data-config") == "threads=1")
    err = next(el for el in line if el.get("class") == "errorbar-line")
    assert float(err.get("x1", "nan")) == pytest.approx(float(bar.get("x", "nan")))


def test_one_configurations_outliers_do_not_flatten_the_others_boxes():
    """threads=2 has a 5 s step among its 50 ms ones: the axis ends near the boxes, not at 5 s, so
    threads=1's box (71-101 ms) stays wide; the outlier is an arrow at the axis' edge."""
    sweep = make_sweep()
    outlier = next(r for r in sweep.runs if r.config == 1)
    assert outlier.metrics is not None
    outlier.metrics.step_ms = [50.0] * 60 + [5000.0]
    chart = charts(_page_of(sweep))["step-distribution"]
    box = next(b for b in marks(chart) if b.get("data-config") == "threads=1")
    rect = next(el for el in box if el.tag == f"{SVG}rect")
    assert float(rect.get("width", "nan")) > 15  # at 5 s full scale it would be under 3 px
    arrows = [el for el in chart.iter(f"{SVG}path") if el.get("class") == "beyond"]
    assert len(arrows) == 1
    assert "beyond the axis" in "".join(chart.itertext())


def test_step_distribution_pools_each_configurations_steps():
    chart = charts(comparison_page())["step-distribution"]
    boxes = {b.get("data-config"): b for b in marks(chart)}
    assert set(boxes) == {"threads=1", "threads=2"}
    steps = [100.0, 101.0, 83.0, 84.0, 71.0, 72.0]
    assert float(boxes["threads=1"].get("data-p50", "nan")) == pytest.approx(float(np.percentile(steps, 50)))
    assert float(boxes["threads=1"].get("data-p99", "nan")) == pytest.approx(float(np.percentile(steps, 99)))
    assert boxes["threads=1"].get("data-steps") == "6"


def test_comparison_page_puts_the_verdict_first_and_keeps_every_table():
    page = comparison_page()
    verdict, charts_at, table = page.index('id="verdict"'), page.index('id="charts"'), page.index("<table>")
    assert verdict < charts_at < table
    assert "threads=2 is" in page[verdict:charts_at]  # the best configuration named in the verdict
    assert "&lt;here&gt;" in page and "<here>" not in page  # the failure's message, escaped


def test_report_command_writes_html_for_a_profile_and_a_comparison(tmp_path: Path):
    from cpuprof.launch.sweep import save

    make_sampled_profile().save(tmp_path / "profile")
    target = tmp_path / "profile.html"
    assert main(["report", str(tmp_path / "profile"), "--format", "html", "-o", str(target)]) == 0
    assert set(charts(target.read_text())) >= {"step-latency", "thread-busy", "roofline"}
    save(make_sweep(), tmp_path / "sweep")
    target = tmp_path / "sweep.html"
    assert main(["report", str(tmp_path / "sweep"), "--format", "html", "-o", str(target)]) == 0
    assert set(charts(target.read_text())) == {"tokens-per-s", "step-distribution"}
