"""Every registered output, over one shared hand-built profile (and the sweep, group and diff made of
it): each writes what its format's own reader parses. A new format adds its reader to PARSERS."""

from __future__ import annotations

import csv
import io
import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest
from profiles import make_profile, make_sampled_profile, make_sweep

from cpuprof.analysis.flame import flame_graph
from cpuprof.exports.speedscope import check_indices
from cpuprof.model.ranks import MultiRun, RankOutcome
from cpuprof.reports import (
    OUTPUTS,
    DiffSource,
    OutputOptions,
    ProcessesSource,
    ProfileSource,
    RanksSource,
    Source,
    StacksSource,
    SweepSource,
    get_output,
)


def source_of(kind: str, tmp_path: Path) -> Source:
    profile = make_sampled_profile()
    if kind == "profile":
        return ProfileSource(profile)
    if kind == "stacks":
        return StacksSource(flame_graph(profile))
    if kind == "sweep":
        return SweepSource(make_sweep())
    if kind == "diff":
        return DiffSource(make_profile(), profile, "before", "after")
    if kind == "processes":  # the program's own profile and two followed processes'
        profile.save(tmp_path)
        for pid in (101, 102):
            profile.meta.pid, profile.meta.role = pid, f"SpawnPoolWorker-{pid - 100}"
            profile.save(tmp_path / "processes" / str(pid))
        return ProcessesSource.load(tmp_path)
    assert kind == "ranks"
    run = MultiRun(mode="instances", world_size=2, backend="gloo", argv=["cpuprof", "decode", "--instances", "2"],
                   timeout_s=60, finished=True,
                   ranks=[RankOutcome(rank=r, dir=f"rank-{r}", cpus=[r], node=None, threads=2, returncode=0)
                          for r in range(2)])
    for r in range(2):
        profile.save(tmp_path / f"rank-{r}")
    run.save(tmp_path)
    return RanksSource(run, tmp_path)


def parse_report_json(text: str, kind: str) -> None:
    data = json.loads(text)
    assert data["format"] == "cpuprof-report" and data["sections"]
    assert all(s["id"] and s["title"] for s in data["sections"])


def parse_csv(text: str, kind: str) -> None:
    tables = [block for block in re.split(r"\n\s*\n", text) if any(not line.startswith("#") for line in
                                                                   block.splitlines() if line)]
    assert tables
    for block in tables:
        rows = list(csv.reader(line for line in block.splitlines() if line and not line.startswith("#")))
        assert len({len(r) for r in rows}) == 1, block  # every row as wide as the header


def parse_terminal(text: str, kind: str) -> None:
    assert text.strip() and "Traceback" not in text


def parse_markdown(text: str, kind: str) -> None:
    assert text.startswith("# ") and re.search(r"^\|.*\|$", text, re.M)


def parse_html(text: str, kind: str) -> None:
    assert text.startswith("<!DOCTYPE html>") and text.rstrip().endswith("</html>")
    charts = re.findall(r'<svg\b[^>]*\bdata-chart="[^"]+".*?</svg>', text, re.S)
    assert charts  # every page kind draws at least one chart from the figures
    for chart in charts:
        ET.fromstring(chart)  # well-formed XML


def parse_svg(text: str, kind: str) -> None:
    root = ET.fromstring(text.encode())
    assert root.tag == "{http://www.w3.org/2000/svg}svg"


def parse_folded(text: str, kind: str) -> None:
    lines = text.splitlines()
    assert lines and all(re.fullmatch(r"[^ ].* \d+", line) for line in lines)


def parse_speedscope(text: str, kind: str) -> None:
    doc = json.loads(text)
    assert doc["$schema"].startswith("https://www.speedscope.app") and check_indices(doc) == []


def parse_trace(text: str, kind: str) -> None:
    events = json.loads(text)["traceEvents"]
    assert events and all("ph" in e for e in events)
    if kind == "ranks":
        assert {e["pid"] for e in events} == {1, 2}  # one process per rank


PARSERS = {"terminal": parse_terminal, "markdown": parse_markdown, "json": parse_report_json, "csv": parse_csv,
           "html": parse_html, "svg": parse_svg, "folded": parse_folded, "speedscope": parse_speedscope,
           "trace": parse_trace, "roofline-svg": parse_svg}


def test_every_registered_output_has_a_reader_here_and_a_unique_name():
    assert sorted(PARSERS) == sorted(o.name for o in OUTPUTS)
    assert all(o.suffix.startswith(".") and o.help and "\n" not in o.help for o in OUTPUTS)


@pytest.mark.parametrize("name, kind", [(o.name, kind) for o in OUTPUTS for kind in o.reads])
def test_every_output_writes_what_its_reader_parses(name: str, kind: str, tmp_path: Path):
    output = get_output(name, kind)
    out = io.StringIO()
    output.write(source_of(kind, tmp_path), out, OutputOptions(top=5))
    PARSERS[name](out.getvalue(), kind)


def test_the_json_report_carries_the_figures_the_charts_draw():
    out = io.StringIO()
    get_output("json").write(ProfileSource(make_sampled_profile()), out, OutputOptions())
    data = json.loads(out.getvalue())
    assert data["version"] == 1  # the figures are an addition: every key a reader knew is still there
    busy = data["figures"]["busy_timeline"]
    # 1 s at 100 Hz in buckets of at least 5 sampling periods: 20 buckets of 50 ms; T0 busy throughout,
    # T1 in the second half only
    assert busy["buckets"] == 20 and busy["bucket_ns"] == pytest.approx(50e6)
    rows = {t["label"]: t["cpu_ns"] for t in busy["threads"]}
    assert rows["T0"] == pytest.approx([50e6] * 20) and rows["T1"] == pytest.approx([0.0] * 10 + [50e6] * 10)
    op_time = data["figures"]["op_time"]
    assert op_time["spin_method"] == "samples"
    for thread in op_time["threads"]:
        assert sum(thread["parts"].values()) == pytest.approx(thread["wall_ns"])


def test_the_json_report_of_an_exact_profile_has_no_busy_timeline_and_a_sweep_has_its_step_percentiles():
    out = io.StringIO()
    get_output("json").write(ProfileSource(make_profile()), out, OutputOptions())
    assert json.loads(out.getvalue())["figures"]["busy_timeline"] is None  # exact mode: no samples
    out = io.StringIO()
    get_output("json").write(SweepSource(make_sweep()), out, OutputOptions())
    spread = {d["label"]: d for d in json.loads(out.getvalue())["figures"]["step_distributions"]}
    assert set(spread) == {"threads=1", "threads=2"}  # threads=3 failed: no step
    steps = [100.0, 101.0, 83.0, 84.0, 71.0, 72.0]
    assert spread["threads=1"]["steps"] == 6
    assert spread["threads=1"]["p50_ms"] == pytest.approx(float(np.percentile(steps, 50)))
    assert spread["threads=1"]["p99_ms"] == pytest.approx(float(np.percentile(steps, 99)))


def test_a_source_an_output_cannot_read_is_a_usage_error():
    from cpuprof.errors import UsageError

    with pytest.raises(UsageError, match="--format html: choose one of .*folded"):
        get_output("html", "stacks")
