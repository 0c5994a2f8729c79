"""analysis/diff.py on hand-built profiles whose changes are known: which op changed, by how much, and
how every renderer shows it."""

from __future__ import annotations

import copy
import io
import json

import pytest
from profiles import MS, make_profile, settings, tensor

from cpuprof.analysis.diff import diff_report, gemm_changes, generated_tokens, op_changes, profile_diff, thread_figures
from cpuprof.analysis.report_model import Report
from cpuprof.model import OpStat, Profile, Status
from cpuprof.reports import FORMATS, get_renderer


def op(profile: Profile, name: str) -> OpStat:
    return next(o for o in profile.ops if o.name == name)


def bmm(op_id: int, self_ms: int) -> OpStat:
    return OpStat(id=op_id, kind="op", name="aten::bmm", region=["mlp"], calls=10, incl_ns=self_ms * MS,
                  self_ns=self_ms * MS, max_ns=1 * MS, inputs=[tensor("f32", 4, 8, 16), tensor("f32", 4, 16, 32)],
                  counters_self={}, counters_incl={})


def before_and_after(decodes: bool = False) -> tuple[Profile, Profile]:
    """A: make_profile() (aten::mm 600 ms self, aten::add 50 ms). B: aten::mm down to 200 ms, aten::add gone,
    aten::bmm new at 30 ms. Without ``decodes``, neither is a decode, so times compare as totals."""
    a = make_profile()
    b = copy.deepcopy(a)
    mm = op(b, "aten::mm")
    mm.self_ns = mm.incl_ns = 200 * MS
    b.ops = [o for o in b.ops if o.name != "aten::add"] + [bmm(8, 30)]
    if not decodes:
        a.workload = b.workload = None
    return a, b


def test_ops_are_ranked_by_the_size_of_their_change_with_added_and_removed():
    a, b = before_and_after()
    changes = op_changes(profile_diff(a, b))
    assert [(c.name, c.status, c.kind) for c in changes] == [
        ("aten::mm", "", "GEMM"), ("aten::add", "removed", ""), ("aten::bmm", "added", "GEMM")]
    mm, add, new = changes
    assert mm.compared.a == 600 * MS and mm.compared.b == 200 * MS
    assert mm.compared.delta == -400 * MS and mm.compared.relative == pytest.approx(-2 / 3)
    assert mm.a.calls == mm.b.calls == 100
    assert add.b is None and add.compared.delta == -50 * MS and add.compared.relative == -1.0
    assert new.a is None and new.compared.delta == 30 * MS and new.compared.relative is None


def test_ops_match_on_inputs_and_region_not_only_the_name():
    a, b = before_and_after()
    mm = op(b, "aten::mm")
    mm.region = ["attention"]  # the same op in another region is another key
    changes = {(c.name, c.status) for c in op_changes(profile_diff(a, b))}
    assert ("aten::mm", "added") in changes and ("aten::mm", "removed") in changes


def test_decodes_compare_per_generated_token():
    a, b = before_and_after(decodes=True)
    mm = op(b, "aten::mm")
    mm.self_ns = mm.incl_ns = 600 * MS  # the same total time...
    b.workload.steps_done = 9  # ...over twice the tokens: 10 (the prefill's and 9 steps') against 5
    cmp = profile_diff(a, b)
    assert (cmp.tokens_a, cmp.tokens_b) == (5, 10)
    first = op_changes(cmp)[0]
    assert first.name == "aten::mm"
    assert first.compared.a == 120 * MS and first.compared.b == 60 * MS and first.compared.delta == -60 * MS
    b.workload.output_ids = [[1, 2, 3], [4, 5, 6]]  # the tokens themselves, where the run kept them
    assert generated_tokens(b) == 6


def test_gemm_shapes_compare_their_time_and_bandwidth():
    a, b = before_and_after()
    changes = gemm_changes(profile_diff(a, b))
    assert [c.shape for c in changes] == ["[1,2048]x[2048,8192]ᵀ", "4×[8,16]x[16,32]"]
    gemv = changes[0]
    assert gemv.time.delta == -400 * MS and gemv.calls_a == gemv.calls_b == 100
    bytes_per_call = (2048 + 2048 * 8192 + 8192) * 2  # bf16: input, weight, output
    assert gemv.gb_per_s.a == pytest.approx(100 * bytes_per_call / (600 * MS))
    assert gemv.gb_per_s.b == pytest.approx(3 * gemv.gb_per_s.a)


def test_a_gemm_whose_weight_was_laid_out_anew_is_the_same_gemm():
    """torch.compile prepacks what eager mode transposes: one GEMM, faster, not one removed and one added."""
    a, b = before_and_after()
    op(b, "aten::mm").inputs = [tensor("bf16", 1, 2048), tensor("bf16", 2048, 8192)]  # contiguous, unmarked
    gemv = gemm_changes(profile_diff(a, b))[0]
    assert gemv.shape == "[1,2048]x[2048,8192]ᵀ → [1,2048]x[2048,8192]"
    assert gemv.calls_a == gemv.calls_b == 100 and gemv.time.delta == -400 * MS


def test_threads_counters_settings_and_throughput():
    a, b = before_and_after(decodes=True)
    b.settings = settings(threads=1)
    b.threads[1].counters["context-switches"] = 19  # 5 + 19 = 24 against 5 + 7 = 12
    b.threads[1].run_delay_ns = 11 * MS
    b.workload.figures.tokens_per_s = 125.0
    fa = thread_figures(a)
    assert (fa.threads, fa.dispatch, fa.workers, fa.cpu_ns, fa.run_delay_ns) == (2, 1, 1, 1700 * MS, 6 * MS)
    assert fa.busy == pytest.approx(1.7)
    report = diff_report(a, b)
    threads = table(report, "threads")
    assert [r["run"] for r in threads] == ["A", "B", "B − A"]
    assert threads[2]["delay"] == 10 * MS and threads[2]["cpu"] == 0
    counters = {r["event"]: r for r in table(report, "counters")}
    # both decodes: per generated token (5 each)
    assert counters["context-switches"]["a"] == 12 / 5 and counters["context-switches"]["b"] == 24 / 5
    assert counters["context-switches"]["relative"] == pytest.approx(1.0)
    differ = {r["setting"]: (r["a"], r["b"]) for r in table(report, "settings")}
    assert differ["threads (asked)"] == ("2", "1") and differ["OMP_NUM_THREADS"] == ("2", "1")
    assert "torch threads (in force)" not in differ  # 1 in both
    throughput = {r["metric"]: r for r in table(report, "throughput")}
    assert throughput["tokens/s"]["delta"] == 25.0 and throughput["tokens/s"]["relative"] == 0.25
    assert throughput["step latency p50 (ms)"]["delta"] == 0.0


def table(report: Report, section_id: str, index: int = 0) -> list[dict]:
    section = report.section(section_id)
    assert section is not None, [s.id for s in report.sections]
    return section.tables[index].rows


def test_report_names_what_changed_most_first():
    a, b = before_and_after()
    report = diff_report(a, b, a_name="before", b_name="after", top=2)
    assert report.title == "cpuprof diff: before → after"
    rows = table(report, "ops")
    assert len(rows) == 2  # --top
    assert (rows[0]["op"], rows[0]["kind"], rows[0]["delta"]) == ("aten::mm", "GEMM", -400 * MS)
    assert (rows[1]["op"], rows[1]["change"], rows[1]["self_b"]) == ("aten::add", "removed", None)
    summary = " ".join(report.section("summary").lines)
    assert "aten::mm bf16[1,2048], bf16[2048,8192]ᵀ (GEMM): -400.0 ms" in summary
    ops_lines = " ".join(report.section("ops").lines)
    assert "1 op key in both, 1 added (only in B), 1 removed (only in A)" in ops_lines
    # self time 650 ms -> 230 ms; GEMMs 600 -> 230 (mm 200 + bmm 30); other ops 50 -> 0
    assert "650.0 ms → 230.0 ms (-420.0 ms, -65%)" in ops_lines
    assert "GEMM and attention ops 600.0 ms → 230.0 ms (-370.0 ms, -62%)" in ops_lines
    assert "other ops 50.0 ms → 0 ns (-50.0 ms, -100%)" in ops_lines
    assert report.warnings == []


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_renders_the_diff(fmt):
    a, b = before_and_after(decodes=True)
    out = io.StringIO()
    get_renderer(fmt).render(diff_report(a, b), out)
    text = out.getvalue()
    assert "aten::mm" in text
    if fmt == "json":
        data = json.loads(text)
        assert [s["id"] for s in data["sections"]][:3] == ["summary", "throughput", "ops"]
        assert data["sections"][2]["tables"][0]["rows"][0]["kind"] == "GEMM"


def test_what_qualifies_a_diff_is_a_warning():
    a, b = before_and_after(decodes=True)
    b.status = Status(complete=False, reason="interrupted by SIGINT")
    b.workload.model.dtype = "fp32"
    b.collection.mode = "sampled"
    warnings = diff_report(a, b).warnings
    assert "B is PARTIAL: interrupted by SIGINT" in warnings
    assert any("different workloads (dtype bf16 vs fp32)" in w for w in warnings)
    assert any("A was profiled in exact mode and B in sampled mode" in w for w in warnings)


def test_a_side_that_waited_for_cpus_is_said_to_be_disturbed():
    """B's dispatching thread waited 650 ms of its 1 s for a CPU (schedstat): its slowdown is partly
    the machine's. A, with 5 ms, is quiet: no line for it."""
    a, b = before_and_after(decodes=True)
    b.threads[0].run_delay_ns = 650 * MS
    warnings = diff_report(a, b).warnings
    disturbed = [w for w in warnings if "was disturbed" in w]
    assert len(disturbed) == 1 and disturbed[0].startswith("B was disturbed: threads waited for a CPU"), warnings
    assert "65%" in disturbed[0] and "diff two runs made on a quiet machine" in disturbed[0]


def test_an_unprofiled_side_compares_throughput_and_settings_only():
    a, b = before_and_after(decodes=True)
    b.collection = None
    report = diff_report(a, b)
    assert "B was not profiled: it has no ops, threads or counters to compare" in report.warnings
    assert [s.id for s in report.sections] == ["summary", "throughput", "settings"]
