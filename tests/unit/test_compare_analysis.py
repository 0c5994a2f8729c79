"""compare's arithmetic with known answers: Welch's test against table values, the sweep plan,
the ranking and verdict of hand-built sweeps, one run's figures from a hand-built profile, and
what a profile's figures propose."""

from __future__ import annotations

import csv
import dataclasses
import io
import math

import pytest
from tests.profiles import MS, make_profile

from cpuprof.analysis.compare import comparison_report, group_metrics, run_metrics, summarize_configs, verdict
from cpuprof.analysis.proposals import proposals
from cpuprof.analysis.stats import summarize, t_two_sided_p, welch_test
from cpuprof.errors import FileFormatError, UsageError
from cpuprof.launch import sweep
from cpuprof.launch.options import DecodeOptions
from cpuprof.model import Profile
from cpuprof.model.compare import Comparison, RunMetrics, SweepConfig, SweepRun
from cpuprof.model.ranks import MultiRun, RankOutcome
from cpuprof.model.workload import Collectives
from cpuprof.reports.csv import CsvRenderer


# Student's t two-sided critical values at p = 0.05 and 0.01 (any statistics table).
@pytest.mark.parametrize(("t", "df", "p"), [(12.706, 1, 0.05), (4.303, 2, 0.05), (2.776, 4, 0.05), (2.228, 10, 0.05),
                                            (63.657, 1, 0.01), (4.604, 4, 0.01), (2.845, 20, 0.01),
                                            (1.960, 1e7, 0.05), (0.0, 5, 1.0)])
def test_student_t_p_values_match_the_tables(t: float, df: float, p: float):
    assert t_two_sided_p(t, df) == pytest.approx(p, abs=2e-4)


def test_welch_test_of_separated_and_overlapping_samples():
    apart = welch_test([10.0, 11.0, 12.0], [20.0, 21.0, 22.0])
    assert apart is not None
    # t = -10 / sqrt(1/3 + 1/3), df = 4 exactly (equal variances and sizes).
    assert apart.t == pytest.approx(-10 / math.sqrt(2 / 3)) and apart.df == pytest.approx(4.0)
    assert apart.p == pytest.approx(t_two_sided_p(10 / math.sqrt(2 / 3), 4.0)) and apart.significant
    overlapping = welch_test([10.0, 12.0, 14.0], [11.0, 13.0, 15.0])
    assert overlapping is not None and not overlapping.significant and overlapping.p > 0.5
    assert welch_test([1.0], [2.0, 3.0]) is None  # one run: no spread to test against
    s = summarize([2.0, 4.0, 6.0])
    assert (s.n, s.mean, s.std) == (3, 4.0, 2.0)


def test_sweep_values_lists_and_ranges():
    assert sweep.parse_values("threads", "1-4") == ["1", "2", "3", "4"]
    assert sweep.parse_values("threads", "1-16*2") == ["1", "2", "4", "8", "16"]
    assert sweep.parse_values("threads", "2-8+3") == ["2", "5", "8"]
    assert sweep.parse_values("omp", "gnu,intel") == ["gnu", "intel"]
    assert sweep.parse_values("blocktime", "0,200,infinite") == ["0", "200", "infinite"]
    assert sweep.parse_values("compile", "off,on") == ["off", "on"]
    assert sweep.apply(DecodeOptions(), {"compile": "on"}).workload.compile
    for axis, text, words in [("threads", "4-1", "first <= last"), ("threads", "0,2", "positive"),
                              ("omp", "gnu,llvm", "choose from"), ("threads", "1,1", "twice"),
                              ("batch", "1,", "empty"), ("dtype", "fp8", "choose from")]:
        with pytest.raises(UsageError, match=words):
            sweep.parse_values(axis, text)


def test_rotated_rounds_run_every_configuration_once_per_round_in_every_position():
    order = sweep.rotated_order(3, 3)
    rounds = [order[i:i + 3] for i in range(0, 9, 3)]
    assert [[c for c, _ in r] for r in rounds] == [[0, 1, 2], [1, 2, 0], [2, 0, 1]]
    assert all({rep for _, rep in r} == {k + 1} for k, r in enumerate(rounds))


def test_plan_is_the_cross_product_and_the_baseline_is_decodes_default():
    plan = sweep.plan(DecodeOptions(), {"threads": ["1", "2"], "omp": ["intel", "gnu"]}, 2, ["compare"])
    assert [c.label for c in plan.configs] == ["threads=1 omp=intel", "threads=1 omp=gnu",
                                               "threads=2 omp=intel", "threads=2 omp=gnu"]
    assert plan.configs[plan.baseline].values == {"threads": "1", "omp": "gnu"}
    applied = sweep.apply(DecodeOptions(), plan.configs[2].values)
    assert applied.launch.threads == 2 and applied.launch.omp == "intel"
    assert sweep.apply(DecodeOptions(), {"batch": "4", "dtype": "fp32"}).workload.batch == 4


def _metrics(tokens_per_s: float, **kw: float) -> RunMetrics:
    return RunMetrics(tokens_per_s=tokens_per_s, step_ms=[1000 / tokens_per_s] * 4, ttft_s=0.05,
                      p50_ms=1000 / tokens_per_s, p99_ms=1000 / tokens_per_s, **kw)  # type: ignore[arg-type]


def _comparison(a: list[float], b: list[float], a_spin: float = 0.40, b_spin: float = 0.05) -> Comparison:
    c = sweep.plan(DecodeOptions(), {"omp": ["gnu", "intel"]}, len(a), ["compare"])
    for rep, (ta, tb) in enumerate(zip(a, b, strict=True), 1):
        c.runs.append(SweepRun(0, rep, "done", "a", metrics=_metrics(ta, spin_share=a_spin, sleep_share=0.1)))
        c.runs.append(SweepRun(1, rep, "done", "b", metrics=_metrics(tb, spin_share=b_spin, sleep_share=0.1)))
    return c


def test_the_best_beyond_the_noise_is_named_with_its_test_and_cause():
    c = _comparison([10.0, 11.0, 12.0], [20.0, 21.0, 22.0])
    v = verdict(c)
    assert v is not None and v.best.config.label == "omp=intel" and v.baseline.config.label == "omp=gnu"
    assert v.change == pytest.approx(21 / 11 - 1)  # mean 21 against mean 11 tokens/s
    assert "beyond the noise" in v.line and "Welch's t-test over 3 and 3 runs" in v.line
    assert any(e.startswith("spin") and "40%" in e and "5.0%" in e for e in v.explanations)
    assert not any(e.startswith("sleep") for e in v.explanations)  # the same in both: explains nothing
    rows = comparison_report(c).section("ranking").tables[0].rows  # type: ignore[union-attr]
    assert [r["config"] for r in rows] == ["omp=intel", "omp=gnu"]
    assert rows[0]["tokens_per_s"] == pytest.approx(21.0) and rows[0]["tokens_per_s_std"] == pytest.approx(1.0)
    assert rows[0]["vs_baseline"] == "+90.9%" and rows[1]["vs_baseline"] == "base"


def test_a_fastest_baseline_is_tested_against_the_runner_up():
    c = _comparison([20.0, 21.0, 22.0], [10.0, 11.0, 12.0])
    v = verdict(c)
    assert v is not None and v.best.config.label == v.baseline.config.label == "omp=gnu"
    assert v.other.config.label == "omp=intel" and v.change == pytest.approx(21 / 11 - 1)
    assert "ahead of the runner-up (omp=intel)" in v.line and "beyond the noise" in v.line


def test_a_difference_within_the_noise_is_called_so():
    v = verdict(_comparison([10.0, 12.0, 14.0], [11.0, 13.0, 15.0]))
    assert v is not None and "within the noise" in v.line


def test_failed_runs_rank_last_and_keep_their_reason():
    c = _comparison([10.0, 11.0], [20.0, 21.0])
    c.configs.append(SweepConfig(label="numa=9", values={"numa": "9"}))
    c.runs.append(SweepRun(2, 1, "failed", "x", error="--numa 9: no such NUMA node"))
    summaries = summarize_configs(c)
    assert summaries[2].failed == 1 and not summaries[2].ok
    report = comparison_report(c)
    rows = report.section("ranking").tables[0].rows  # type: ignore[union-attr]
    assert rows[-1]["config"] == "numa=9" and rows[-1]["tokens_per_s"] is None and rows[-1]["status"] == "1 of 1 failed"
    assert any("no such NUMA node" in n for n in report.section("ranking").notes)  # type: ignore[union-attr]


def test_csv_has_raw_numbers_for_every_column():
    out = io.StringIO()
    CsvRenderer().render(comparison_report(_comparison([10.0, 11.0, 12.0], [20.0, 21.0, 22.0])), out)
    text = out.getvalue()
    assert "# omp=intel is" in text  # the verdict, as a comment line
    rows = list(csv.DictReader(line for line in text.splitlines() if line and not line.startswith("#")))
    assert [r["config"] for r in rows] == ["omp=intel", "omp=gnu"]
    assert float(rows[0]["tokens_per_s"]) == pytest.approx(21.0) and float(rows[1]["spin_share"]) == pytest.approx(0.4)
    assert rows[0]["bandwidth_share"] == ""  # not measured: empty, never 0


def test_run_metrics_of_a_known_profile():
    p = make_profile()
    m = run_metrics(p)
    assert m is not None
    assert m.tokens_per_s == 100.0 and m.step_ms == pytest.approx([10.0, 10.0, 10.0])  # warm-up step left out
    assert m.switches_per_token == pytest.approx((5 + 7) / 4)  # 4 steps of batch 1
    assert m.run_delay_share == pytest.approx((5 + 1) * MS / (1000 * MS * 2))
    assert m.threads == 1  # what torch said it uses, not what was asked


def test_sleep_share_is_the_difference_of_the_totals_not_a_sum_of_clamped_ops():
    """Per-op sampled CPU is noisy both ways; clamping each op at its wall time before summing would
    count only the low side. Known answer: ops wall 650 ms x 2 threads, CPU 1170 + 110 ms."""
    p = make_profile()
    op = next(o for o in p.ops if o.name == "aten::add")
    op.counters_self["task-clock"] = [60 * MS, 50 * MS]  # 110 ms of CPU in 50 ms x 2 threads: noise
    m = run_metrics(p)
    assert m is not None and m.sleep_share == pytest.approx((1300 - 1280) / 1300)


def test_proposals_follow_the_figures():
    p = make_profile()
    # 2 threads on 2 CPUs, bound, no delay, no spin: nothing to try but int8 weights, since its bf16
    # GEMVs take most of the op time (a change of numerics, said so)
    (quant,) = proposals(p)
    assert quant.values == {"quant": "int8"} and "changes the model's numerics" in quant.reason
    p.threads[0].run_delay_ns = 300 * MS  # 15% of threads × wall
    assert [x.values for x in proposals(p)] == [{"threads": "1"}, {"quant": "int8"}]
    p = make_profile()
    assert p.settings is not None
    p.settings.requested = dataclasses.replace(p.settings.requested, threads=1, bind="none")
    found = {tuple(x.values.items()): x.reason for x in proposals(p)}
    assert (("bind", "close"),) in found and "not bound" in found[(("bind", "close"),)]
    assert (("threads", "2"),) in found and "use them all" in found[(("threads", "2"),)]


@pytest.mark.parametrize("returncode, interrupted, status", [
    (1, True, "interrupted"),  # Ctrl-C while the child's Python was still starting: it exits 1
    (-2, True, "interrupted"),
    (130, False, "interrupted"),
    (1, False, "failed"),  # a child that failed by itself is a failed run
])
def test_a_run_the_launcher_passed_a_signal_to_is_interrupted_whatever_its_status(
        tmp_path, monkeypatch, returncode, interrupted, status):
    from cpuprof.launch import parent, sweep
    from cpuprof.launch.options import DecodeOptions

    comparison = sweep.plan(DecodeOptions(), {"threads": ["1"]}, 1, argv=[])
    monkeypatch.setattr(parent, "launch", lambda options, out_dir, log=None: parent.DecodeOutcome(
        out_dir=out_dir, profile=None, returncode=returncode, interrupted=interrupted))
    assert sweep.run_one(comparison, 0, 1, tmp_path).status == status


def _rank_profiles(slow_tokens_per_s: float) -> list[Profile | None]:
    """Two ranks: make_profile's (100 tokens/s, 10 ms steps) and one at ``slow_tokens_per_s`` whose
    steps last 1000 / that ms, with three times the run-queue delay."""
    fast, slow = make_profile(), make_profile()
    assert slow.workload is not None and slow.workload.figures is not None
    step_s = 1 / slow_tokens_per_s
    slow.workload.step_latencies_s = [0.02, step_s, step_s, step_s]
    slow.workload.figures.tokens_per_s = slow_tokens_per_s
    for t in slow.threads:
        t.run_delay_ns = (t.run_delay_ns or 0) * 3
    return [fast, slow]


def _group(mode: str) -> MultiRun:
    return MultiRun(mode=mode, world_size=2, backend="gloo" if mode == "tp" else None, argv=[], timeout_s=60,
                    ranks=[RankOutcome(rank=r, dir=f"rank-{r}", cpus=[r], node=None, threads=1) for r in (0, 1)])


def test_instances_add_their_tokens_per_second_and_pool_their_steps():
    m = group_metrics(_group("instances"), _rank_profiles(50.0))
    assert m is not None
    assert m.tokens_per_s == pytest.approx(150.0)  # 100 + 50: the machine's throughput
    assert sorted(m.step_ms) == pytest.approx([10.0] * 3 + [20.0] * 3)  # warm-up steps left out
    assert m.p50_ms == pytest.approx(15.0) and m.p99_ms == pytest.approx(20.0, abs=0.01)
    one = run_metrics(make_profile())
    assert one is not None and one.switches_per_token is not None and one.run_delay_share is not None
    assert m.switches_per_token == pytest.approx(one.switches_per_token)  # each instance's own tokens
    assert m.run_delay_share == pytest.approx(one.run_delay_share * 2)  # mean of 1x and 3x
    assert m.bandwidth_share is None  # no roof measured for the group
    assert m.all_reduce_share == 0.0


def _all_reduces(profile: Profile, ms_each: float) -> None:
    """Two all-reduces of ``ms_each`` in every decode step (prefill's and warm-up's included)."""
    wl = profile.workload
    assert wl is not None
    c = Collectives(kind="all_reduce")
    for step in range(wl.steps_done):
        for k in range(2):
            start = (step * 100 + k * 10) * MS
            c.enter_ns.append(start)
            c.exit_ns.append(start + int(ms_each * MS))
            c.payload_bytes.append(4096)
            c.step.append(step)
    wl.collectives = c


def test_tensor_parallel_ranks_are_one_decoder_as_fast_as_the_slowest_rank():
    profiles = _rank_profiles(50.0)
    for p in profiles:
        assert p is not None
        _all_reduces(p, ms_each=2.0)
    m = group_metrics(_group("tp"), profiles)
    one = run_metrics(make_profile())
    assert m is not None and one is not None and one.switches_per_token is not None
    assert m.tokens_per_s == pytest.approx(50.0) and m.step_ms == pytest.approx([20.0] * 3)  # the slower rank's
    assert m.switches_per_token == pytest.approx(one.switches_per_token * 2)  # both ranks' for the same tokens
    # 2 x 2 ms of every measured step: 4 of 10 ms on one rank, 4 of 20 ms on the other.
    assert m.all_reduce_share == pytest.approx((0.4 + 0.2) / 2)
    assert one.all_reduce_share == 0.0  # one process reduces nothing


def test_the_all_reduce_column_is_shown_only_where_a_configuration_has_ranks():
    c = _comparison([10.0, 11.0], [20.0, 21.0])
    keys = [col.key for col in comparison_report(c).section("ranking").tables[0].columns]  # type: ignore[union-attr]
    assert "all_reduce_share" not in keys
    c.configs.append(SweepConfig(label="tp=2", values={"tp": "2"}))
    keys = [col.key for col in comparison_report(c).section("ranking").tables[0].columns]  # type: ignore[union-attr]
    assert "all_reduce_share" in keys


def test_a_group_with_a_rank_that_saved_nothing_has_no_figures():
    assert group_metrics(_group("instances"), [make_profile(), None]) is None


def test_sweeping_processes_leaves_out_tp_and_instances_together_and_prefers_one_process():
    plan = sweep.plan(DecodeOptions(), {"tp": ["1", "2"], "instances": ["1", "2"]}, 1, ["compare"])
    assert [c.label for c in plan.configs] == ["tp=1 instances=1", "tp=1 instances=2", "tp=2 instances=1"]
    assert plan.configs[plan.baseline].label == "tp=1 instances=1"
    assert [sweep.process_layout(c.values) for c in plan.configs] == [None, ("instances", 2), ("tp", 2)]
    assert sweep.apply(DecodeOptions(), {"tp": "2", "threads": "1"}).launch.threads == 1
    with pytest.raises(UsageError, match="not both"):
        sweep.plan(DecodeOptions(), {"tp": ["2"], "instances": ["2"]}, 1, ["compare"])
    with pytest.raises(UsageError, match="--tp 0: expected a positive whole number"):
        sweep.parse_values("tp", "0,2")


def test_a_version_1_comparison_still_loads_and_reports(tmp_path):
    """Saved before processes could be swept: no all-reduce figure, no tp axis."""
    import json

    from cpuprof.model.codec import to_json

    c = _comparison([10.0, 11.0], [20.0, 21.0])
    data = to_json(c)
    data["version"] = 1
    for run in data["runs"]:
        del run["metrics"]["all_reduce_share"]
    (tmp_path / "compare.json").write_text(json.dumps(data))
    loaded = sweep.load(tmp_path)
    assert all(r.metrics is not None and r.metrics.all_reduce_share is None for r in loaded.runs)
    assert comparison_report(loaded).section("ranking") is not None
    data["version"] = 9
    (tmp_path / "compare.json").write_text(json.dumps(data))
    with pytest.raises(FileFormatError, match=r"newer cpuprof \(comparison format version 9\); this cpuprof reads "
                                              "versions 1 to 2"):
        sweep.load(tmp_path)


def test_a_partial_sweep_says_the_command_that_resumes_it_with_its_directory():
    from profiles import make_sweep

    from cpuprof.analysis.compare import comparison_report

    sweep = make_sweep()
    sweep.runs[0].status = "interrupted"  # runs again on resume: not finished
    warnings = comparison_report(sweep, "/tmp/my sweeps/a").warnings
    assert any("resume with python -m cpuprof compare --resume '/tmp/my sweeps/a'" in w for w in warnings), warnings
    assert not any("DIR" in w for w in comparison_report(sweep).warnings)


def test_a_share_above_the_roof_is_explained():
    """omp=intel reached 118% of its ceiling: its roof was measured low, and the report says so and
    how to re-measure it; omp=gnu's 60% needs no word."""
    c = _comparison([10.0, 11.0, 12.0], [20.0, 21.0, 22.0])
    for run in c.runs:
        assert run.metrics is not None
        run.metrics.bandwidth_share = 1.18 if run.config == 1 else 0.60
    lines = comparison_report(c).section("ranking").lines  # type: ignore[union-attr]
    (said,) = [line for line in lines if "above 100%" in line]
    assert "against its own launch's roof" in said and said.index("omp=intel") < said.index("above 100%")
    assert "omp=gnu" not in said and "cpuprof calibrate" in said


def _two(axis: str, values: tuple[str, str], a: RunMetrics, b: RunMetrics) -> Comparison:
    c = sweep.plan(DecodeOptions(), {axis: list(values)}, 2, ["compare"])
    for rep in (1, 2):
        for config, metrics in ((0, a), (1, b)):
            tokens = metrics.tokens_per_s + rep / 10
            c.runs.append(SweepRun(config, rep, "done", "ab"[config],
                                   metrics=dataclasses.replace(metrics, tokens_per_s=tokens)))
    return c


def test_the_explanation_starts_from_the_swept_axis_and_its_mechanism():
    """Known answer: int8 weights halve the bytes a token reads (2.47 GB to 1.30 GB), which predicts
    1.90x the tokens/s where memory binds; the runs measured 9.15 against 5.15 tokens/s (1.78x). The context switches,
    which differ by more than half but by less than 2 a token, are no cause."""
    none = _metrics(5.0, bytes_per_token=2.47e9, gb_per_s=12.35, switches_per_token=1.6)
    int8 = _metrics(9.0, bytes_per_token=1.30e9, gb_per_s=11.7, switches_per_token=3.3)
    v = verdict(_two("quant", ("none", "int8"), none, int8))
    assert v is not None and v.best.config.label == "quant=int8"
    (cause,) = v.causes
    assert cause.startswith("quant none → int8: the bytes of each weight, which every token reads once")
    assert "bytes read per token 2.47 GB → 1.30 GB" in cause and "memory traffic 12.3 GB/s → 11.7 GB/s" in cause
    assert "reading 1.90x fewer bytes per token predicts 1.90x the tokens/s where memory binds; measured 1.78x" in cause
    assert v.explanations == []
    assert v.small == ["context switches per token 1.6 against 3.3 (a difference below 2.0)"]
    report = comparison_report(_two("quant", ("none", "int8"), none, int8))
    lines = report.section("ranking").lines  # type: ignore[union-attr]
    assert lines[1] == "What the configurations differ in, and what it changes:"
    assert lines[2] == "  - " + cause
    assert lines[3].startswith("No other measured figure differs enough to explain it: context switches per token")
    assert "within 25%" not in " ".join(lines)


def test_a_threads_sweep_names_threads_with_the_traffic_and_the_waits():
    one = _metrics(4.0, gb_per_s=10.0, spin_share=0.0, run_delay_share=0.01)
    two = _metrics(6.0, gb_per_s=15.0, spin_share=0.12, run_delay_share=0.02)
    v = verdict(_two("threads", ("1", "2"), one, two))
    assert v is not None and v.causes[0].startswith("threads 1 → 2: each GEMV's rows are split over that many cores")
    assert "memory traffic 10.0 GB/s → 15.0 GB/s" in v.causes[0] and "spin 0.0% → 12%" in v.causes[0]


def test_a_sweep_of_a_profiles_proposals_names_what_each_changed_from_the_profile():
    """compare --from: "as profiled" holds the profile's own value of each axis a proposal changes, so
    the explanation says "threads 2 → 1" (known: the proposal changed only the threads), and two
    proposals are told apart by both settings. A figure that differs by half is never "within 25%"."""
    base = sweep.apply(DecodeOptions(), {"threads": "2", "bind": "none"})
    profiled = sweep.values_of(base, ["threads", "bind", "blocktime"])
    assert profiled == {"threads": "2", "bind": "none"}  # blocktime: the runtime's own default, no text
    configs = [SweepConfig("as profiled", profiled),
               SweepConfig("threads=1", {"threads": "1"}, proposal="waited"),
               SweepConfig("bind=close", {"bind": "close"}, proposal="migrated")]
    c = sweep.plan(base, {"threads": ["1"], "bind": ["close"]}, 2, ["compare"], extra=configs, source="p")
    for rep in (1, 2):
        c.runs.append(SweepRun(0, rep, "done", "a", metrics=_metrics(5.0 + rep / 10, gb_per_s=10.0)))
        c.runs.append(SweepRun(1, rep, "done", "b", metrics=_metrics(8.0 + rep / 10, gb_per_s=20.0)))
        c.runs.append(SweepRun(2, rep, "done", "c", metrics=_metrics(4.0 + rep / 10, gb_per_s=10.0)))
    v = verdict(c)
    assert v is not None and v.best.config.label == "threads=1" and v.other.config.label == "as profiled"
    (cause,) = v.causes
    assert not any("memory traffic" in e for e in v.explanations)  # the threads line quotes it already
    assert cause.startswith("threads 2 → 1: each GEMV's rows") and "memory traffic 10.0 GB/s → 20.0 GB/s" in cause
    runner_up = [s for s in summarize_configs(c) if s.config.label == "bind=close"][0]
    from cpuprof.analysis.compare import causes, explain
    both = causes(v.best, runner_up, c.configs[0].values)
    assert [line.split(":")[0] for line in both] == ["threads 2 → 1", "bind close → none"]
    # The traffic doubled and no axis line quotes it (bind's line does: gb_per_s): said, not "within 25%".
    assert explain(v.best, v.other) == ["memory traffic: 10.0 GB/s in as profiled, 20.0 GB/s in threads=1"]


def test_the_report_says_what_roofs_the_runs_used_and_where_the_memory_moved():
    """Known answers: two runs took cached roofs a probe confirmed, one remeasured after its probe read
    another state, one measured its own; one run's end probe read 20.0 against its 40.0 GB/s roof; the
    omp=gnu runs' roofs 30 and 40 GB/s apart by a third (moved), omp=intel's alike."""
    c = _comparison([10.0, 11.0], [20.0, 21.0])
    roofs = {(0, 1): (30.0, True, 29.0, "agrees", None, None),
             (0, 2): (40.0, False, 41.0, "remeasured", 20.0, "changed"),
             (1, 1): (35.0, True, 36.0, "agrees", 35.5, "agrees"), (1, 2): (36.0, False, None, None, None, None)}
    for run in c.runs:
        assert run.metrics is not None
        (run.metrics.memory_roof_gb_per_s, run.metrics.roofs_from_cache, run.metrics.probe_gb_per_s,
         run.metrics.probe_outcome, run.metrics.end_probe_gb_per_s,
         run.metrics.end_probe_outcome) = roofs[(run.config, run.repetition)]
    lines = comparison_report(c).section("ranking").lines  # type: ignore[union-attr]
    text = "\n".join(lines)
    assert ("Memory roofs of the 4 runs: 30.0 to 40.0 GB/s (by configuration: omp=gnu 30.0 to 40.0 GB/s; omp=intel "
            "35.0 to 36.0 GB/s); 2 from the cache after a probe of the memory agreed, 1 measured again because the "
            "probe disagreed") in text
    assert "1 measured for the run" in text
    assert "The memory changed state during omp=gnu run 2 (20.0 against 40.0 GB/s)" in text
    assert "omp=gnu (30.0 to 40.0 GB/s)" in text and "omp=intel (" not in text
    # Runs all at one roof: no per-configuration list; a cached roof whose probe could not run is counted too.
    for run in c.runs:
        assert run.metrics is not None
        run.metrics.memory_roof_gb_per_s, run.metrics.roofs_from_cache, run.metrics.probe_outcome = 30.0, True, None
        run.metrics.end_probe_outcome = None
    lines = comparison_report(c).section("ranking").lines  # type: ignore[union-attr]
    assert "Memory roofs of the 4 runs: 30.0 GB/s; 4 from the cache unprobed (the probe could not run)." in lines
