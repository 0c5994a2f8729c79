"""The HTML reports of real runs, opened in a real headless browser: no console error, no page
error, no request beyond the file itself, and every chart drawn with as many marks as the data has.

Needs the ``playwright`` package and Debian's Chromium at /usr/bin/chromium (``playwright install``
is not needed: the system browser is driven directly).
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cli_runs import cpuprof_ok as cpuprof

from cpuprof.analysis.timeline import busy_timeline
from cpuprof.model import Profile

CHROMIUM = Path("/usr/bin/chromium")
# No network, no background services: the page must draw from the file alone.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", "--disable-quic"]
TINY = ["--preset", "tiny", "--prompt-len", "8"]

pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("playwright") is None,
                       reason="the playwright package is not installed (pip install playwright)"),
    pytest.mark.skipif(not CHROMIUM.exists(), reason=f"no Chromium at {CHROMIUM} (apt-get install chromium)"),
]


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


class Opened:
    """A report opened in a fresh page, with everything the browser said and asked for."""

    def __init__(self, browser: Any, path: Path) -> None:
        self.page = browser.new_page(viewport={"width": 1300, "height": 1000})
        self.messages: list[tuple[str, str]] = []
        self.errors: list[str] = []
        self.requests: list[str] = []
        self.page.on("console", lambda m: self.messages.append((m.type, m.text)))
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.on("request", lambda r: self.requests.append(r.url))
        self.url = path.resolve().as_uri()
        self.page.goto(self.url)
        self.page.wait_for_load_state("load")

    def check_clean(self) -> None:
        assert self.errors == []
        assert [m for m in self.messages if m[0] == "error"] == []
        assert self.requests == [self.url]  # the file itself and nothing else

    def chart(self, name: str, expected_marks: int) -> Any:
        """The named inline chart: drawn (a box of non-zero size) with ``expected_marks`` marks."""
        el = self.page.query_selector(f'svg.chart[data-chart="{name}"]')
        assert el is not None, f"no {name} chart"
        box = el.bounding_box()
        assert box is not None and box["width"] > 100 and box["height"] > 50, box
        found = el.query_selector_all(".mark")
        assert len(found) == expected_marks == int(el.get_attribute("data-marks")), name
        if found:
            mark_box = found[len(found) // 2].bounding_box()
            assert mark_box is not None and mark_box["width"] > 0 and mark_box["height"] > 0
        return el

    def check_layout(self, widths: tuple[int, ...] = (1400, 2400), tallest_px: float = 130) -> None:
        """At each window width, as a person would look at it: no table cell taller than ``tallest_px``
        (a long verdict squeezed into a narrow column makes rows that look blank) and no chart wider
        than the page."""
        for width in widths:
            self.page.set_viewport_size({"width": width, "height": 1000})
            cells = self.page.evaluate(
                "() => [...document.querySelectorAll('td')].map(td => [td.getBoundingClientRect().height,"
                " td.getBoundingClientRect().width, td.innerText.slice(0, 60)])")
            tall = [c for c in cells if c[0] > tallest_px]
            assert not tall, f"at {width} px: cells taller than {tallest_px} px: {tall[:3]}"
            overflowing = self.page.evaluate(
                "() => [...document.querySelectorAll('svg.chart')].filter(s => s.getBoundingClientRect().right >"
                " document.documentElement.clientWidth + 1).length")
            assert overflowing == 0, f"at {width} px: {overflowing} chart(s) wider than the window"

    def close(self) -> None:
        self.page.close()


def test_decode_profile_report_in_a_browser(browser: Any, tmp_path: Path):
    out = tmp_path / "decode"
    result = cpuprof("decode", *TINY, "--new-tokens", "24", "--flamegraph", "--html", "--out", str(out))
    report = out / "report.html"
    assert f"HTML report: {report}" in result.stdout
    profile = Profile.load(out)
    wl = profile.workload
    assert wl is not None and profile.stacks is not None and profile.stacks.timeline is not None

    opened = Opened(browser, report)
    try:
        opened.check_clean()
        page = opened.page
        opened.chart("step-latency", len(wl.step_latencies_s))
        assert len(wl.step_latencies_s) == 24
        assert len(page.query_selector_all('svg[data-chart="step-latency"] .mark.warmup')) == wl.warmup_steps

        timeline = busy_timeline(profile)
        assert timeline is not None
        busy = opened.chart("thread-busy", len(profile.threads) * timeline.buckets)
        cpu_drawn = sum(float(m.get_attribute("data-cpu-ns")) for m in busy.query_selector_all(".mark"))
        cpu_sampled = 1000.0 * sum(profile.stacks.timeline.cpu_us)
        # every sample's CPU time is drawn, but for what the first samples held from before the session
        assert 0.9 * cpu_sampled <= cpu_drawn <= cpu_sampled + 1

        opened.chart("thread-waits", len(profile.threads))
        opened.chart("rss", len(wl.rss_timeline))
        if profile.roofs is not None and profile.roofs.memory_gb_per_s() is not None:
            # the same circles as the roofline.svg the run wrote beside the profile
            opened.chart("roofline", (out / "roofline.svg").read_text().count("<circle "))
        else:
            assert "no machine roofs" in page.inner_text("#chart-roofline + p")

        flame_frames = (out / "flame.svg").read_text().count('<g class="f"')
        frame_el = page.query_selector('iframe[data-chart="flame"]')
        assert frame_el is not None and int(frame_el.get_attribute("data-marks")) == flame_frames > 0
        flame = frame_el.content_frame()
        graph = flame.query_selector("svg")
        assert graph is not None and graph.bounding_box()["height"] > 100
        assert len(flame.query_selector_all("g.f")) == flame_frames
        # its own script runs inside the report: a click zooms and shows "Reset Zoom"
        assert "h" in flame.get_attribute("#unzoom", "class").split()
        flame.query_selector_all("g.f")[-1].click()
        assert "h" not in flame.get_attribute("#unzoom", "class").split()

        # every section of the report is there, tables under them
        for section in ("decode", "threads", "ops", "native"):
            assert page.query_selector(f"#s-{section}") is not None
        assert len(page.query_selector_all("table")) >= 5
        opened.check_layout()
        opened.page.screenshot(path=str(tmp_path / "decode.png"), full_page=True)
        opened.check_clean()  # zooming the flame graph logged nothing either
    finally:
        opened.close()


def test_comparison_report_in_a_browser(browser: Any, tmp_path: Path):
    from cpuprof.analysis.compare import summarize_configs

    out = tmp_path / "sweep"
    comparison = _comparison(out)
    report = out / "report.html"
    summaries = summarize_configs(comparison)
    ok = [s for s in summaries if s.ok]
    assert len(ok) == 2

    opened = Opened(browser, report)
    try:
        opened.check_clean()
        page = opened.page
        bars = opened.chart("tokens-per-s", len(ok))
        by_config = {b.get_attribute("data-config"): b for b in bars.query_selector_all(".mark")}
        for s in ok:
            bar = by_config[s.config.label]
            assert float(bar.get_attribute("data-mean")) == pytest.approx(s.tokens_per_s.mean, rel=1e-5)
            assert int(bar.get_attribute("data-n")) == s.tokens_per_s.n == 2
            # the error bar, as drawn: one standard deviation either side, on the bar's own scale
            px_per_token = bar.bounding_box()["width"] / s.tokens_per_s.mean
            err = page.query_selector(f'svg[data-chart="tokens-per-s"] g.errorbar[data-config="{s.config.label}"] '
                                      ".errorbar-line").bounding_box()
            assert err["width"] / 2 == pytest.approx(s.tokens_per_s.std * px_per_token, rel=0.02, abs=1.5)
        opened.chart("step-distribution", len(ok))
        verdict = page.inner_text("#verdict + ul")
        assert "baseline" in verdict or "fastest" in verdict
        assert page.query_selector("#s-ranking + p + .table-wrap table") is not None
        opened.check_layout()
        opened.page.screenshot(path=str(tmp_path / "compare.png"), full_page=True)
    finally:
        opened.close()


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="two ranks need two usable CPUs")
def test_tensor_parallel_group_report_in_a_browser(browser: Any, tmp_path: Path):
    from cpuprof.analysis.ranks import group_figures
    from cpuprof.model.ranks import MultiRun

    out = tmp_path / "tp"
    result = cpuprof("decode", *TINY, "--new-tokens", "12", "--tp", "2", "--threads", "1", "--html", "--out", str(out))
    assert f"HTML report of the group: {out / 'report.html'}" in result.stdout
    run = MultiRun.load(out)
    group = group_figures(run, run.profiles(out))
    opened = Opened(browser, out / "report.html")
    try:
        opened.check_clean()
        bars = opened.chart("rank-steps", 3 * 2)  # compute, all-reduce and waiting, for each rank
        for mark in bars.query_selector_all(".mark"):
            split = group.ranks[int(mark.get_attribute("data-rank"))].split
            assert split is not None
            expected = {"compute": split.compute_ns, "reduce, after the last rank arrived": split.transfer_ns,
                        "waiting for the slowest rank": split.wait_ns}[mark.get_attribute("data-part")]
            assert float(mark.get_attribute("data-ns")) == pytest.approx(expected, abs=1)
        for section in ("ranks", "collectives"):
            assert opened.page.query_selector(f"#s-{section}") is not None
        opened.page.screenshot(path=str(tmp_path / "ranks.png"), full_page=True)
    finally:
        opened.close()
    for rank in range(2):  # each rank's own page beside its profile
        assert (out / f"rank-{rank}" / "report.html").is_file()


def _comparison(out: Path) -> Any:
    """A real sweep of threads 1 and 2, two runs each: by ``cpuprof compare --html`` where this cpuprof
    has it, else by running the decodes here and assembling their figures the way a sweep does."""
    from cpuprof.launch.sweep import load

    commands = cpuprof("--help").stdout
    if " compare " in commands and "--html" in cpuprof("compare", "--help").stdout:
        cpuprof("compare", *TINY, "--new-tokens", "16", "--threads", "1,2", "-r", "2", "--out", str(out), "--html")
        assert (out / "report.html").is_file()
        return load(out)
    return _comparison_from_decodes(out)


def _comparison_from_decodes(out: Path) -> Any:
    from cpuprof.analysis.compare import run_metrics
    from cpuprof.launch.sweep import label, rotated_order, save
    from cpuprof.model.compare import COMPARE_FORMAT, COMPARE_VERSION, Comparison, SweepConfig, SweepRun
    from cpuprof.reports import OutputOptions, SweepSource, get_output

    threads = ["1", "2"]
    configs = [SweepConfig(label=label({"threads": t}), values={"threads": t}) for t in threads]
    order = rotated_order(len(configs), 2)
    runs = []
    for config, rep in order:
        run_dir = out / f"config-{config + 1:02d}" / f"run-{rep}"
        cpuprof("decode", *TINY, "--new-tokens", "16", "--threads", threads[config], "--out", str(run_dir), "--json")
        metrics = run_metrics(Profile.load(run_dir))
        assert metrics is not None
        runs.append(SweepRun(config=config, repetition=rep, status="done", out_dir=str(run_dir), metrics=metrics))
    comparison = Comparison(format=COMPARE_FORMAT, version=COMPARE_VERSION, created="", cpuprof_version="test",
                            argv=[], base={}, axes={"threads": threads}, configs=configs, repetitions=2,
                            order=order, baseline=0, runs=runs)
    save(comparison, out)
    with open(out / "report.html", "w") as f:
        get_output("html", "sweep").write(SweepSource(comparison), f, OutputOptions())
    return comparison
