"""Analyses and every renderer, on hand-built profiles whose figures are known."""

from __future__ import annotations

import io
import json

import pytest
from profiles import MS, V1_DECODE, V1_UNPROFILED, decode_workload, make_profile, meta

from cpuprof.analysis.decode import decode_figures
from cpuprof.analysis.labels import inputs_text, layout_mark
from cpuprof.analysis.ops import op_table
from cpuprof.analysis.report import build_report
from cpuprof.analysis.threads import run_queue_warning
from cpuprof.errors import UsageError
from cpuprof.model import Profile
from cpuprof.reports import FORMATS, REPORT_FORMATS, get_output, get_renderer, render
from cpuprof.workload.figures import step_figures


def rendered(profile: Profile, fmt: str = "terminal", top: int = 20) -> str:
    out = io.StringIO()
    render(profile, out, format=fmt, top=top)
    return out.getvalue()


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("source", ["hand-built", "v1 decode", "v1 unprofiled"])
def test_every_format_renders_every_profile(fmt, source):
    profile = {"hand-built": make_profile, "v1 decode": lambda: Profile.load(V1_DECODE),
               "v1 unprofiled": lambda: Profile.load(V1_UNPROFILED)}[source]()
    text = rendered(profile, fmt)
    assert "tokens/s" in text
    if fmt == "json":
        data = json.loads(text)
        assert data["format"] == "cpuprof-report"
        assert [s["id"] for s in data["sections"]][:2] == ["decode", "settings"]


def test_terminal_report_derives_the_figures():
    text = rendered(make_profile())
    assert text.startswith("WARNING: threads: asked 2 but torch uses 1")
    assert "throughput 100.0 tokens/s" in text
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if line.strip().startswith("aten::mm"))
    row = lines[at]
    # The inputs column is wider than the 120 columns the report takes here: shown below the row, indented.
    assert lines[at + 1].startswith("      inputs: bf16[1,2048], bf16[2048,8192]ᵀ") and "mlp" in row
    assert "1.95" in row  # busy threads: (590 + 580) ms CPU / 600 ms self
    assert "0.50" in row  # IPC: 1.5 G instructions / 3 G cycles
    assert "92%" in row  # 600 of 650 ms of self time
    assert "multiplexed, so scaled by time_enabled/time_running: cycles" in text
    assert "3 op calls fell into '[other ops]'" in text
    assert "1 more thread did no work" in text
    # every column is explained under its table
    flat = " ".join(text.split())
    assert "% self: share of the summed self time of all ops" in flat
    assert "busy thr: CPU / self wall time" in flat


def test_markdown_tables_are_well_formed():
    text = rendered(make_profile(), "markdown")
    assert text.startswith("# cpuprof decode: llama-3.2-1b")
    assert "> **Warning:** threads: asked 2 but torch uses 1" in text
    table = [line for line in text.split("## Top ops")[1].split("## ")[0].splitlines() if line.startswith("|")]
    widths = {line.count("|") - line.count("\\|") for line in table}
    assert len(widths) == 1 and len(table) == 4  # header, alignment, two ops
    assert "`bf16[1,2048], bf16[2048,8192]ᵀ`" in table[2]


def test_json_report_keeps_numbers_and_not_measured():
    profile = make_profile("sampled")
    profile.ops[1].samples = 0  # no interval caught aten::add: its CPU is not measured, not zero
    data = json.loads(rendered(profile, "json"))
    ops = next(s for s in data["sections"] if s["id"] == "ops")["tables"][0]
    mm, add = ops["rows"]
    assert mm["self"] == 600 * MS and mm["busy"] == pytest.approx(1.95)
    assert add["cpu"] is None and add["busy"] is None
    assert {c["key"]: c["unit"] for c in ops["columns"]}["self"] == "ns"


def test_not_measured_is_not_zero_in_text():
    profile = make_profile("sampled")
    profile.ops[1].samples = 0
    row = next(line for line in rendered(profile).splitlines() if line.strip().startswith("aten::add"))
    assert "0 ns" not in row and " - " in row


def test_busy_threads_need_enough_samples():
    profile = make_profile("sampled")
    profile.ops[0].samples = 3
    table = op_table(profile)
    mm = table.rows[0]
    assert mm.cpu_ns == 1170 * MS and mm.busy_threads is None and table.withheld_few_samples == 1


def test_impossible_figures_are_withheld_never_printed():
    profile = make_profile("sampled")
    profile.ops[1].counters_self["task-clock"] = [90 * MS, 90 * MS]  # 180 ms of CPU in 50 ms on 2 threads
    table = op_table(profile)
    add = next(r for r in table.rows if r.op.name == "aten::add")
    assert add.cpu_ns is None and add.busy_threads is None and table.withheld_inconsistent == 1
    profile.ops[1].counters_self["task-clock"] = [60 * MS, 0]  # one thread busier than the wall time
    add = next(r for r in op_table(profile).rows if r.op.name == "aten::add")
    assert add.cpu_ns is None
    text = rendered(profile)
    assert "CPU not shown for 1 op key(s)" in text


@pytest.mark.parametrize("batch", [1, 4])
def test_decode_bandwidth_and_throughput_by_hand(batch):
    """bytes_read_per_token is per token and tokens/s counts every sequence: GB/s is their product."""
    latencies = [0.5, 0.2, 0.2, 0.25, 0.2]
    figures = step_figures(latencies, warmup=1, batch=batch)
    assert figures.tokens_per_s == pytest.approx(batch * 4 / 0.85)
    assert figures.p50_ms == pytest.approx(200.0)
    wl = decode_workload(batch=batch, tokens_per_s=figures.tokens_per_s, bytes_per_token=600_000_000)
    gbs = decode_figures(wl).effective_gb_per_s
    assert gbs == pytest.approx(0.6 * batch * 4 / 0.85)
    profile = make_profile()
    profile.workload = wl
    assert f"= {gbs:.1f} GB/s effective" in rendered(profile)


def test_partial_figures_use_the_same_method_as_finished_ones():
    """An interrupted run's figures come from the same function: batch and percentiles included."""
    latencies = [0.5, 0.2, 0.4, 0.3]
    partial = step_figures(latencies, warmup=1, batch=4)
    assert partial.tokens_per_s == pytest.approx(4 * 3 / 0.9)
    assert partial.p90_ms == pytest.approx(380.0)  # linear between the 2nd and 3rd of 0.2, 0.3, 0.4 s
    assert step_figures([0.5], warmup=1, batch=1) is None


def test_run_queue_warning_names_the_waiting_threads():
    profile = make_profile()
    assert run_queue_warning(profile) is None  # 5 ms of 1 s: below the threshold
    profile.threads[1].run_delay_ns = 200 * MS
    warning = run_queue_warning(profile)
    assert "T1 (tid 11) 20%" in warning and "T0" not in warning
    assert rendered(profile).count("WARNING:") == 2


def test_run_queue_delay_that_cpuprofs_collector_can_explain_is_not_warned_about():
    # one CPU for the program and the collector: the collector's 40 ms of CPU delayed the thread
    profile = make_profile()
    assert profile.overhead is not None and profile.collection is not None
    profile.overhead.discovery_cpu_ns = 40 * MS
    profile.threads[1].run_delay_ns = 60 * MS  # 6% of 1 s, 2% beyond the collector's CPU
    assert run_queue_warning(profile) is None
    profile.threads[1].run_delay_ns = 80 * MS  # 4% beyond it: something else ran there too
    assert "T1 (tid 11) 8.0%" in (run_queue_warning(profile) or "")


def test_unprofiled_run_says_why():
    profile = Profile(meta=meta(), workload=decode_workload())
    assert "not profiled (--no-profile)" in rendered(profile)
    profile.status.complete = False
    profile.status.reason = "failed: ImportError while building the model; nothing was profiled because of it"
    text = rendered(profile)
    assert "--no-profile" not in text and "nothing was profiled because of it" in text


def test_top_limits_rows_and_section_is_found():
    report = build_report(make_profile(), top=1)
    assert len(report.section("ops").tables[0].rows) == 1


def test_html_is_an_output_of_the_registry_like_the_others_and_unknown_formats_are_usage_errors():
    # html is one more registered output of a profile, not a case the commands handle apart; it is
    # a page, so it is not one of the report formats a run prints on standard output.
    assert get_output("html", "profile").suffix == ".html"
    assert REPORT_FORMATS == (*FORMATS, "html") and "html" not in FORMATS
    with pytest.raises(UsageError, match="--format html: choose one of terminal, markdown, json, csv$"):
        get_renderer("html")
    with pytest.raises(UsageError, match="--format nope: choose one of terminal, markdown, json, csv, html$"):
        get_output("nope", "profile", roles=("report", "page"))


@pytest.mark.parametrize("sizes, strides, mark", [
    ([1, 2048], [2048, 1], ""),
    ([2048, 8192], [1, 2048], "ᵀ"),
    ([2048, 8192], [8192, 1], ""),
    ([1, 4, 8, 16], [512, 16, 64, 1], "*"),
    ([1, 1, 64], [64, 64, 1], ""),  # a size-1 dim's stride does not matter
    ([4, 2, 3], [6, 1, 2], "ᵀ"),  # batched transpose
])
def test_layout_marks(sizes, strides, mark):
    assert layout_mark(sizes, strides) == mark


def test_inputs_text_cuts_at_an_input_boundary():
    op = make_profile().ops[0]
    op.inputs = op.inputs * 5
    text = inputs_text(op, max_len=40)
    assert text.endswith("more") and text.count("bf16[") == 2


def test_background_threads_are_one_row_per_kind():
    """A serving engine's worker has dozens of gloo and ZMQ threads that ran no op: each kind is one
    row with its count and their CPU together, the working threads keep a row each."""
    from cpuprof.model import ThreadStat

    profile = make_profile()
    gloo = [ThreadStat(tid=100 + i, name="gloo_tcp_loop", role="worker", counters={"task-clock": 1 * MS})
            for i in range(5)]
    zmq = ThreadStat(tid=200, name="ZMQbg/IO/0", role="worker", counters={"task-clock": 2 * MS})
    profile.threads += [*gloo, zmq]
    for op in profile.ops:
        for values in (*op.counters_self.values(), *op.counters_incl.values()):
            values += [0] * (len(profile.threads) - len(values))
    first = profile.ops[0].counters_self["task-clock"]
    first[2:7] = [MS // 10] * 5  # the gloo threads ran a little while the first op did
    report = build_report(profile)
    section = report.section("threads")
    rows = section.tables[0].rows
    assert [r["name"] for r in rows] == ["python", "python", "ZMQbg/IO/0", "gloo_tcp_loop ×5"]
    grouped = rows[-1]
    assert grouped["role"] == "background" and grouped["cpu"] == 5 * MS and grouped["tid"] is None
    assert section.lines[0].startswith("8 threads worked")
    assert any("background: 5 threads" in note for note in section.tables[0].legend_notes)
    # The op table: a CPU column per thread shown on its own, one for the grouped ones together.
    ops = report.section("ops").tables[0]
    keys = [c.key for c in ops.columns if c.key.startswith("cpu_")]
    assert keys == ["cpu_0", "cpu_1", "cpu_7", "cpu_background"]
    row = next(r for r in ops.rows if r["op"] == profile.ops[0].name and r["inputs"] == inputs_text(profile.ops[0]))
    assert row["cpu_background"] == 5 * (MS // 10)


@pytest.mark.parametrize("n", [1, 2, 7, 100, 257])
def test_step_percentiles_are_numpys_linear_ones_without_numpy(n: int):
    """Known answer: numpy's percentile (what the figures were before); computed in plain Python, as
    it runs inside a profiled decode."""
    import random

    import numpy as np

    from cpuprof.workload.figures import percentile

    rng = random.Random(n)
    values = [rng.uniform(0.001, 0.05) for _ in range(n)]
    for q in (0, 50, 90, 99, 100):
        assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)), rel=1e-12)
    figures = step_figures([1.0, *values], warmup=1, batch=2)
    assert figures is not None and figures.measured_steps == n
    assert figures.tokens_per_s == pytest.approx(2 * n / sum(values))
    assert figures.p99_ms == pytest.approx(float(np.percentile(values, 99)) * 1e3)


def test_a_tensor_parallel_ranks_bytes_are_said_to_be_its_share():
    """Cut short or not, a rank's bytes per token are its 1/N and the method says so."""
    from types import SimpleNamespace

    from cpuprof.workload.decode_loop import DecodeResult, bytes_read_method

    whole = SimpleNamespace()
    rank = SimpleNamespace(shard=SimpleNamespace(world=2))
    assert bytes_read_method(whole) == DecodeResult.bytes_read_method
    assert bytes_read_method(rank).endswith("this tensor-parallel rank's 1/2 of every layer and of the KV cache, "
                                            "with the replicated embedding, norms and lm_head whole")


def test_an_on_demand_runs_own_profile_says_it_was_profiled_in_windows_even_with_roofs_cached():
    """Its own profile.json holds the settings and, where roofs were cached, the roofs: once taken for a
    calibration's ("cpuprof calibrate") or an unprofiled run's ("--no-profile")."""
    from profiles import make_sampled_profile

    from cpuprof.analysis.report import build_report
    from cpuprof.model import Profile

    sampled = make_sampled_profile()
    own = Profile(meta=sampled.meta, settings=sampled.settings, roofs=sampled.roofs)
    own.meta.command = ["python", "-m", "cpuprof", "run", "--on-demand", "--", "python", "server.py"]
    report = build_report(own)
    assert report.title != "cpuprof calibrate"
    assert "profiled in windows, not here" in " ".join(report.section("profile").lines)  # type: ignore[union-attr]


def test_a_terminal_report_fits_its_width_and_keeps_commands_whole(monkeypatch: pytest.MonkeyPatch):
    """At COLUMNS=120 no line of a full report runs past 120 characters: paragraphs of a table (verdicts)
    go below their row, and the table's other wide columns too; a command to paste is never broken at
    a space or a hyphen, whatever the width."""
    from profiles import make_sweep
    from test_rank_groups import KIND, timeline

    from cpuprof.analysis.compare import comparison_report
    from cpuprof.analysis.rank_groups import jobs, ranks_section
    from cpuprof.analysis.report_model import Report
    from cpuprof.reports.terminal import _para

    late, on_time = [3 * MS] * 5, [0] * 5
    (job,) = jobs([timeline(1, late, all_delays=[on_time, late]), timeline(0, on_time, all_delays=[on_time, late])])
    ranks = ranks_section([job])
    assert ranks is not None and job.kinds == {KIND: 5}
    for columns in (120, 80):
        monkeypatch.setenv("COLUMNS", str(columns))
        for what, report in (("decode", None), ("sweep", comparison_report(make_sweep(), "/tmp/sweep")),
                             ("ranks", Report(title="ranks", sections=[ranks]))):
            if report is None:
                text = rendered(make_profile())
            else:
                out = io.StringIO()
                get_renderer("terminal").render(report, out)
                text = out.getvalue()
            assert max(len(line) for line in text.splitlines()) <= columns, (what, columns, text)
    monkeypatch.setenv("COLUMNS", "60")
    command = "python -m cpuprof compare --resume /tmp/cpuprof-out/compare-2026-11-29-01-02-03"
    wrapped = _para(f"PARTIAL: 3 of 12 runs finished; resume with {command}", subsequent_indent="  ")
    assert command in wrapped.replace("\n  ", " ") and command in wrapped.splitlines()[-1]
