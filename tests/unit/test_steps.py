"""Decode steps inferred from an op stream (analysis.steps), on hand-built timelines whose steps are
known: a transformers-shaped model ([batch, positions, k] activations, sdpa attention) and a serving
engine's ([tokens, k], continuous batching), a window that cut a forward, and programs that are not
language models."""

from __future__ import annotations

import pytest
from profiles import MS, make_profile, make_sampled_profile, tensor

from cpuprof.analysis.labels import inputs_text
from cpuprof.analysis.report import build_report
from cpuprof.analysis.steady_state import SteadyState, _span_self_times, steady_state
from cpuprof.analysis.steps import DECODE, MIXED, PREFILL, Steps, find_steps
from cpuprof.model import OpInput, OpStat, Spans
from cpuprof.units import fmt_rate

NONE = OpInput(kind="none")
HIDDEN, FFN, VOCAB, KV = 64, 128, 512, 32  # one layer: q, k, v, o, gate, up, down; then the LM head


class Timeline:
    """Spans of one thread, written as a program runs: ops nest by depth, time advances by hand."""

    def __init__(self) -> None:
        self.ops: dict[tuple, OpStat] = {}
        self.spans = Spans(op=[], thread=[], depth=[], start_ns=[], dur_ns=[], counters=[])
        self.now = 0

    def op(self, name: str, inputs: list[OpInput]) -> int:
        key = (name, tuple((i.kind, i.dtype, tuple(i.sizes or ())) for i in inputs))
        if key not in self.ops:
            self.ops[key] = OpStat(id=100 + len(self.ops), kind="op", name=name, region=[], calls=0, incl_ns=0,
                                   self_ns=0, max_ns=0, counters_self={}, counters_incl={}, inputs=inputs)
        return self.ops[key].id

    def span(self, op_id: int, dur_ns: int, depth: int = 0, children: list[tuple[int, int]] = ()) -> None:
        start = self.now
        for child, child_dur in children:  # nested in this span (an mm in its linear)
            self._add(child, start + 1, child_dur, depth + 1, child_dur)
        self._add(op_id, start, dur_ns, depth, dur_ns - sum(d for _, d in children))
        self.now = start + dur_ns

    def _add(self, op_id: int, start: int, dur: int, depth: int, self_ns: int) -> None:
        """A span, and its op key's aggregates as the native core keeps them: its CPU on T0 is its
        self time, T1's half of it (a worker that joined it)."""
        s = self.spans
        s.op.append(op_id), s.thread.append(0), s.depth.append(depth), s.start_ns.append(start)
        s.dur_ns.append(dur), s.counters.append([])
        op = next(o for o in self.ops.values() if o.id == op_id)
        op.calls += 1
        op.incl_ns += dur
        op.self_ns += self_ns
        op.max_ns = max(op.max_ns, dur)
        cpu = op.counters_self.setdefault("task-clock", [0, 0])
        cpu[0] += self_ns
        cpu[1] += self_ns // 2

    def gap(self, ns: int) -> None:
        self.now += ns

    def linear(self, rows: list[int], n: int, k: int, dur_ns: int) -> None:
        linear = self.op("aten::linear", [tensor("bf16", *rows, k), tensor("bf16", n, k), NONE])
        mm = self.op("aten::mm", [tensor("bf16", rows[0] * (rows[1] if len(rows) > 1 else 1), k),
                                  tensor("bf16", k, n, strides=[1, k])])
        self.span(linear, dur_ns, children=[(mm, dur_ns - 2)])

    def forward(self, batch: int, positions: int, kv_len: int, flat: bool = False, sequences: int | None = None,
                op_ns: int = 100_000) -> None:
        """One forward pass of a one-layer model: 7 projections, attention, the LM head."""
        rows = [batch * positions] if flat else [batch, positions]
        for n, k in ((HIDDEN, HIDDEN), (KV, HIDDEN), (KV, HIDDEN)):
            self.linear(rows, n, k, op_ns)
        if not flat:
            sdpa = self.op("aten::scaled_dot_product_attention", [
                tensor("bf16", batch, 4, positions, 16), tensor("bf16", batch, 2, kv_len, 16),
                tensor("bf16", batch, 2, kv_len, 16)])
            self.span(sdpa, 2 * op_ns)
        self.span(self.op("aten::add", [tensor("bf16", *rows, HIDDEN)]), op_ns // 10)
        for n, k in ((HIDDEN, HIDDEN), (FFN, HIDDEN), (FFN, HIDDEN), (HIDDEN, FFN)):
            self.linear(rows, n, k, op_ns)
        head_rows = [sequences if sequences is not None else batch] if flat else [batch, 1]
        self.linear(head_rows, VOCAB, HIDDEN, 3 * op_ns)

    def profile(self):  # noqa: ANN201
        p = make_profile("sampled")
        p.workload = None
        p.roofs = make_sampled_profile().roofs  # a 40 GB/s triad
        p.ops = list(self.ops.values())
        p.spans = self.spans
        assert p.collection is not None and p.limits is not None
        p.collection.started_ns, p.collection.stopped_ns = 0, self.now
        p.limits.span_capacity, p.limits.spans_dropped = 1 << 20, 0
        return p


def test_a_generate_loop_gives_one_prefill_and_its_decode_steps_with_their_wall_times():
    t = Timeline()
    t.gap(5 * MS)  # the tokenizer, before any op
    t.forward(batch=2, positions=8, kv_len=8)  # prefill
    walls = []
    for step in range(5):
        before = t.now
        t.gap(300_000)  # sampling and the framework between forwards: part of the step
        t.forward(batch=2, positions=1, kv_len=9 + step)
        walls.append(t.now - before)
    found = find_steps(t.profile())
    assert isinstance(found, Steps)
    assert [s.kind for s in found.steps] == [PREFILL] + [DECODE] * 5
    assert found.gemms_per_forward == 9  # 8 linears and the attention; the mm inside each linear not counted
    prefill, *decode = found.steps
    assert (prefill.tokens, prefill.sequences) == (16, 2)
    assert [s.wall_ns for s in decode] == walls
    assert [(s.tokens, s.sequences, s.kv_len) for s in decode] == [(2, 2, 9 + k) for k in range(5)]
    assert "LM head (aten::linear onto 512 outputs from 64 (bf16))" not in found.lm_head  # named, not phrased
    assert found.lm_head == "aten::linear onto 512 outputs from 64 (bf16)"
    step = decode[0]
    assert step.gemm_ns == 8 * 100_000 + 2 * 100_000  # 7 projections and the 3x LM head
    assert step.attention_ns == 200_000 and step.other_ops_ns == 10_000 and step.outside_ops_ns == 300_000
    # The weights a decode step reads (each projection its own, q and o alike in shape), at 2 bytes
    # each, and the keys and values it read.
    assert step.weight_bytes == 2 * (HIDDEN * HIDDEN * 2 + KV * HIDDEN * 2 + FFN * HIDDEN * 2 + HIDDEN * FFN
                                     + VOCAB * HIDDEN)
    assert step.kv_bytes == 2 * (2 * 2 * 9 * 16 * 2)


def test_the_report_gets_decode_and_ceiling_sections_whose_figures_are_the_steps():
    t = Timeline()
    t.forward(batch=1, positions=4, kv_len=4)
    for step in range(4):
        t.gap(1 * MS)
        t.forward(batch=1, positions=1, kv_len=5 + step, op_ns=200_000)
    report = build_report(t.profile())
    decode = report.section("decode")
    ceiling = report.section("ceiling")
    assert decode is not None and ceiling is not None
    step_ns = 1 * MS + 7 * 200_000 + 2 * 200_000 + 20_000 + 3 * 200_000  # the gap, 7 linears, sdpa, add, LM head
    text = " ".join(decode.lines)
    assert "5 forward passes on thread T1: 1 prefill, 4 decode" in text and "mixed" not in text
    assert f"throughput {fmt_rate(1e9 / step_ns)} tokens/s over 4 decode steps" in text
    # The roofs of make_profile: a 40 GB/s triad; the ceiling is the step's bytes at it.
    assert "at the measured 40.0 GB/s" in " ".join(ceiling.lines)
    parts = ceiling.tables[0].rows
    assert parts[-1]["ns"] == pytest.approx(step_ns)
    assert sum(r["ns"] for r in parts[:-1]) == pytest.approx(step_ns)  # the parts add up to the step


def test_a_serving_engines_flattened_batches_are_decode_prefill_or_mixed_by_their_rows():
    t = Timeline()
    t.forward(batch=1, positions=6, kv_len=0, flat=True, sequences=1)  # one request's prefill
    t.forward(batch=1, positions=1, kv_len=0, flat=True, sequences=1)  # its decode
    t.forward(batch=1, positions=5, kv_len=0, flat=True, sequences=2)  # a new prompt of 4 beside a decode
    t.forward(batch=2, positions=1, kv_len=0, flat=True, sequences=2)  # two decodes
    found = find_steps(t.profile())
    assert isinstance(found, Steps)
    assert [(s.kind, s.tokens, s.sequences) for s in found.steps] == [
        (PREFILL, 6, 1), (DECODE, 1, 1), (MIXED, 5, 2), (DECODE, 2, 2)]
    assert all(s.kv_len is None for s in found.steps)  # no attention shapes: no KV length claimed


def test_a_forward_cut_by_the_profiles_start_is_left_out():
    t = Timeline()
    t.forward(batch=1, positions=1, kv_len=5)
    t.forward(batch=1, positions=1, kv_len=6)
    t.forward(batch=1, positions=1, kv_len=7)
    p = t.profile()
    cut = 4  # the window opened during the first forward: its first linears' spans are not there
    p.spans = Spans(*(column[cut * 2:] for column in (p.spans.op, p.spans.thread, p.spans.depth, p.spans.start_ns,
                                                       p.spans.dur_ns, p.spans.counters)))
    found = find_steps(p)
    assert isinstance(found, Steps) and found.partial_first
    assert [s.kv_len for s in found.steps] == [6, 7]


def test_a_program_that_is_not_a_language_model_has_no_steps_and_says_why_in_one_line():
    t = Timeline()
    for _ in range(5):  # an MLP's training loop: the same GEMMs again and again, nothing attends, no vocabulary
        for n, k in ((64, 32), (64, 64), (10, 64)):
            t.linear([32], n, k, 50_000)
    why = find_steps(t.profile())
    assert why == ("GEMMs repeat, but no step has attention or an LM head (a projection several times wider than "
                   "the others): not the forward passes of a language model")
    report = build_report(t.profile())
    assert report.section("decode") is None and report.section("ceiling") is None
    assert f"decode steps: none found in the op stream ({why})" in report.section("profile").notes  # type: ignore


@pytest.mark.parametrize("spans, why", [
    (None, "the op timeline was not kept (it is kept with --timeline N)"),
    (Spans(op=[7], thread=[0], depth=[0], start_ns=[0], dur_ns=[5], counters=[[]]),
     "no GEMM-like op ran (no linear, matmul, mm or attention the GEMM table knows)"),
])
def test_without_a_timeline_or_gemms_there_are_no_steps(spans: Spans | None, why: str):
    p = make_profile("sampled")
    p.workload, p.spans = None, spans
    assert find_steps(p) == why


def test_calls_nest_by_depth_even_where_a_parent_seems_to_end_before_its_children():
    """A span's duration leaves out the profiler's own time in the ops under it: a linear recorded as
    ending before its mm does (seen in real timelines). The mm is still inside it, by depth."""
    t = Timeline()
    for _ in range(3):
        t.forward(batch=1, positions=1, kv_len=4)
    p = t.profile()
    mm_ids = {op.id for op in p.ops if op.name == "aten::mm"}
    p.spans.dur_ns = [d + 50_000 if op in mm_ids else d for op, d in zip(p.spans.op, p.spans.dur_ns, strict=True)]
    found = find_steps(p)
    assert isinstance(found, Steps) and found.gemms_per_forward == 9 and len(found.steps) == 3


def test_a_flattened_batch_of_prompts_before_any_decode_is_a_prefill():
    t = Timeline()
    t.forward(batch=2, positions=8, kv_len=0, flat=True, sequences=2)  # two prompts of 8, together
    t.forward(batch=2, positions=1, kv_len=0, flat=True, sequences=2)
    t.forward(batch=2, positions=1, kv_len=0, flat=True, sequences=2)
    found = find_steps(t.profile())
    assert isinstance(found, Steps)
    assert [(s.kind, s.tokens, s.sequences) for s in found.steps] == [(PREFILL, 16, 2), (DECODE, 2, 2), (DECODE, 2, 2)]


def test_eager_attentions_batched_matmuls_are_not_taken_for_weights():
    """attn_implementation="eager": q·kᵀ and p·v are batched matmuls of activations whose shapes grow
    every step, each once a layer. Taken for weights, one became "the LM head" past a few steps."""
    t = Timeline()
    for step in range(10):
        positions, kv = (8, 8) if step == 0 else (1, 8 + step)
        for _layer in range(2):
            for n, k in ((HIDDEN, HIDDEN), (KV, HIDDEN), (KV, HIDDEN)):
                t.linear([1, positions], n, k, 100_000)
            qk = t.op("aten::matmul", [tensor("bf16", 1, 4, positions, 16), tensor("bf16", 1, 4, 16, kv)])
            pv = t.op("aten::matmul", [tensor("bf16", 1, 4, positions, kv), tensor("bf16", 1, 4, kv, 16)])
            t.span(qk, 50_000)
            t.span(pv, 50_000)
            t.linear([1, positions], HIDDEN, HIDDEN, 100_000)
        t.linear([1, 1], VOCAB, HIDDEN, 300_000)
    found = find_steps(t.profile())
    assert isinstance(found, Steps), found
    assert found.lm_head == "aten::linear onto 512 outputs from 64 (bf16)"
    assert [s.kind for s in found.steps] == [PREFILL] + [DECODE] * 9


def test_a_pause_between_two_generate_calls_is_not_a_step():
    t = Timeline()
    for call in range(2):
        t.forward(batch=1, positions=4, kv_len=4)
        for step in range(3):
            t.gap(100_000)
            t.forward(batch=1, positions=1, kv_len=5 + step)
        if call == 0:
            t.gap(2_000 * MS)  # the program does something else for 2 s
    found = find_steps(t.profile())
    assert isinstance(found, Steps)
    assert [s.kind for s in found.steps] == ([PREFILL] + [DECODE] * 3) * 2
    second_prefill = found.steps[4]
    assert second_prefill.wall_ns < 10 * MS  # its forward, not the 2 s before it


def test_a_step_faster_than_its_bytes_at_the_roof_says_the_roof_is_low():
    """Weights that stay in the caches read faster than the memory roof: the share passes 100% and
    the GEMMs' part goes negative; the section says why instead of leaving an impossible share."""
    t = Timeline()
    t.forward(batch=1, positions=4, kv_len=4)
    for step in range(3):
        t.forward(batch=1, positions=1, kv_len=5 + step, op_ns=100)  # ~100 kB in ~1 µs: far past 40 GB/s
    ceiling = build_report(t.profile()).section("ceiling")
    assert ceiling is not None
    assert any("above 100%" in line for line in ceiling.lines)


def _startup_and_steps(t: Timeline, decode_steps: int = 4) -> tuple[int, int]:
    """A program's start: weights initialised, a KV cache filled (the largest op of the run), a
    warm-up add; then a prefill and its decode steps. Returns the first and last steps' bounds."""
    t.span(t.op("aten::normal_", [tensor("bf16", VOCAB, HIDDEN)]), 30 * MS)
    t.span(t.op("aten::fill_", [tensor("bf16", 4096, HIDDEN)]), 90 * MS)
    t.span(t.op("aten::add", [tensor("bf16", 1, 1, HIDDEN)]), 6 * MS)  # the key of each step's add, too
    t.gap(20 * MS)  # Python between the start-up's ops
    start = t.now
    t.forward(batch=1, positions=4, kv_len=4)
    for step in range(decode_steps):
        t.gap(MS)
        t.forward(batch=1, positions=1, kv_len=5 + step, op_ns=200_000)
    end = t.now
    t.gap(3 * MS)  # after the last step: the program's end
    return start, end


def test_a_programs_tables_are_over_its_steps_its_start_up_apart():
    """Known answer: the spans say which calls ran before the first step; the tables over the steps
    have the steps' calls and times exactly, the start-up's ops (a KV-cache fill 90 ms, the largest
    of the run) are in its own section, and --whole-run gives the whole run's table back."""
    t = Timeline()
    start, end = _startup_and_steps(t)
    profile = t.profile()
    steps = find_steps(profile)
    assert isinstance(steps, Steps)
    state = steady_state(profile, steps)
    assert isinstance(state, SteadyState)
    assert (state.start_ns, state.end_ns) == (start, end)
    assert state.startup_ns == start and state.after_ns == 3 * MS
    view = {op.name + inputs_text(op): op for op in state.profile.ops}
    assert not any(name.startswith(("aten::normal_", "aten::fill_")) for name in view)
    head = next(op for op in state.profile.ops if op.name == "aten::linear" and op.inputs[1].sizes == [VOCAB, HIDDEN])
    assert head.calls == 5
    mm = next(op for op in state.profile.ops if op.name == "aten::mm" and op.inputs[1].sizes == [HIDDEN, VOCAB])
    assert mm.calls == 5 and mm.self_ns == (3 * 100_000 - 2) + 4 * (3 * 200_000 - 2)
    assert head.self_ns == 5 * 2  # the linear's own time: its span less the mm's
    # The add of the steps shares its key with the warm-up's: calls and times exact, CPU scaled.
    add = next(op for op in profile.ops if op.name == "aten::add" and op.inputs[0].sizes == [1, 1, HIDDEN])
    steady_add = next(op for op in state.profile.ops if op.id == add.id)
    assert steady_add.calls == add.calls - 1 and steady_add.self_ns == add.self_ns - 6 * MS
    assert steady_add.counters_self["task-clock"][0] == steady_add.self_ns
    # T1's CPU in it was half of each call's self time: scaled by the same share, it stays half.
    assert steady_add.counters_self["task-clock"][1] == pytest.approx(add.counters_self["task-clock"][1]
                                                                      * steady_add.self_ns / add.self_ns, abs=1)
    assert state.scaled_keys == 1
    assert state.profile.collection.wall_ns == end - start
    startup = [(op.name, time.calls, time.self_ns) for op, time in state.startup_ops]
    assert startup[:3] == [("aten::fill_", 1, 90 * MS), ("aten::normal_", 1, 30 * MS), ("aten::add", 1, 6 * MS)]

    report = build_report(profile)
    ids = [s.id for s in report.sections]
    assert ids.index("startup") < ids.index("ops")
    top = report.section("ops").tables[0].rows[0]
    assert top["op"] == "aten::mm" and top["calls"] == 5  # the LM head's product: the steps' largest
    assert report.section("startup").tables[0].rows[0]["op"] == "aten::fill_"
    assert "over the 5 steps: from the first one's start to the last one's end" in " ".join(
        report.section("startup").lines)
    assert "whatever the program did first" in report.section("startup").lines[0]
    whole = build_report(profile, whole_run=True)
    assert whole.section("ops").tables[0].rows[0]["op"] == "aten::fill_"
    assert "startup" not in [s.id for s in whole.sections]


def _on_thread_1(spans: Spans, op_id: int, timed: list[tuple[int, int]]) -> None:
    """Outermost spans of ``op_id`` on a second dispatching thread: (start, duration) each."""
    for start, dur in timed:
        spans.op.append(op_id), spans.thread.append(1), spans.depth.append(0), spans.start_ns.append(start)
        spans.dur_ns.append(dur), spans.counters.append([])


def test_the_tables_stay_over_the_whole_run_where_the_timeline_lost_part_of_the_steps():
    """Another thread's ring of spans was full and kept nothing from before the first step: some of
    its spans in the steps may be gone, so nothing is split, and the report says why."""
    t = Timeline()
    _startup_and_steps(t)
    profile = t.profile()
    steps = find_steps(profile)
    assert isinstance(steps, Steps)
    first = steps.steps[0].start_ns
    add = next(op.id for op in profile.ops if op.name == "aten::add")
    # a second thread's newest three spans, all after the first step began
    _on_thread_1(profile.spans, add, [(first + (k + 1) * MS, 10_000) for k in range(3)])
    profile.limits.span_capacity, profile.limits.spans_dropped = 3, 40
    why = steady_state(profile, steps)
    assert why == "the timeline dropped spans of 1 thread(s) after the first step began (--timeline N keeps more)"
    report = build_report(profile)
    assert "startup" not in [x.id for x in report.sections]
    assert any(w.startswith("the tables are over the whole run, not the decode steps: the timeline dropped")
               for w in report.warnings)


@pytest.mark.parametrize("between_ms, advised", [(6, True), (0, False)])
def test_a_program_is_advised_what_it_can_apply_with_the_share_measured(between_ms: int, advised: bool):
    """Known answer: decode steps of 2.42 ms of ops with 6 ms of Python between them are 71% outside
    ops: torch.compile is advised with that share; without the gap, nothing is; never decode --compile."""
    t = Timeline()
    t.forward(batch=1, positions=4, kv_len=4)
    for step in range(4):
        t.gap(between_ms * MS)
        t.forward(batch=1, positions=1, kv_len=5 + step, op_ns=200_000)
    report = build_report(t.profile())
    steps = find_steps(t.profile())
    assert isinstance(steps, Steps)
    decode = steps.of_kind(DECODE)
    share = sum(s.outside_ops_ns for s in decode) / sum(s.wall_ns for s in decode)
    advice = report.section("advice")
    assert advice is not None  # its bf16 GEMVs are memory-bound, whatever the gap
    assert "decode --compile" not in " ".join(advice.lines)
    if not advised:
        assert share < 0.01 and not any("outside ATen ops" in line for line in advice.lines)
        return
    assert share == pytest.approx(6 / (6 + 2.42), rel=0.01)  # 7 linears, the LM head, sdpa, an add: 2.42 ms
    assert advice is not None and ids_before(report, "advice", "ops")
    text = " ".join(advice.lines)
    assert f"{round(share * 100)}% of the decode steps' time is outside ATen ops" in text
    assert "torch.compile" in text and "decode --compile" not in text


def ids_before(report, first: str, second: str) -> bool:  # noqa: ANN001
    ids = [s.id for s in report.sections]
    return ids.index(first) < ids.index(second)


def test_a_span_whose_parent_never_ended_is_no_child_of_an_earlier_span():
    """Self times from the spans' end order: A ended, then two spans at depth 1 whose parent was still
    open when the profile stopped (never recorded): A keeps its own time."""
    spans = Spans(op=[1, 2, 2], thread=[0, 0, 0], depth=[0, 1, 1], start_ns=[0, 20, 30], dur_ns=[10, 5, 5],
                  counters=[[], [], []])
    assert _span_self_times(spans) == [10, 5, 5]
    nested = Spans(op=[2, 2, 1], thread=[0, 0, 0], depth=[1, 1, 0], start_ns=[2, 6, 0], dur_ns=[3, 2, 10],
                   counters=[[], [], []])
    assert _span_self_times(nested) == [3, 2, 5]


def test_a_timeline_cut_on_the_steps_thread_is_not_called_the_programs_start():
    """The ring of the steps' thread kept only the last steps: what came before them holds earlier
    steps, and the section says the profile began mid-run, not what a program does first."""
    t = Timeline()
    _startup_and_steps(t, decode_steps=8)
    profile = t.profile()
    s = profile.spans
    keep = len(s) - 60  # the newest 60 spans: the last few steps
    profile.spans = Spans(op=s.op[keep:], thread=s.thread[keep:], depth=s.depth[keep:], start_ns=s.start_ns[keep:],
                          dur_ns=s.dur_ns[keep:], counters=s.counters[keep:])
    profile.limits.span_capacity, profile.limits.spans_dropped = 60, keep
    report = build_report(profile)
    startup = report.section("startup")
    assert startup is not None and "the profile began mid-run" in startup.lines[0]
    assert "whatever the program did first" not in startup.lines[0]


def test_a_long_span_kept_from_before_the_steps_does_not_hide_spans_dropped_within_them():
    """Rings keep the newest spans by their end: another thread's full ring whose oldest kept span began
    before the first step but ended within the steps may have dropped spans that ended within them."""
    t = Timeline()
    _startup_and_steps(t)
    profile = t.profile()
    steps = find_steps(profile)
    assert isinstance(steps, Steps)
    first = steps.steps[0].start_ns
    add = next(op.id for op in profile.ops if op.name == "aten::add")
    _on_thread_1(profile.spans, add, [(first + 2 * MS, 10_000), (first - MS, 5 * MS)])  # one short, one long
    profile.limits.span_capacity, profile.limits.spans_dropped = 2, 40
    assert steady_state(profile, steps) == ("the timeline dropped spans of 1 thread(s) after the first step began "
                                            "(--timeline N keeps more)")


def test_op_times_of_several_threads_before_the_first_step_are_summed_not_a_share_of_its_time():
    t = Timeline()
    _startup_and_steps(t)
    profile = t.profile()
    fill = next(op for op in profile.ops if op.name == "aten::fill_")
    # A second thread filled another cache for 140 ms beside the first one's start-up of 146 ms.
    _on_thread_1(profile.spans, fill.id, [(0, 140 * MS)])
    fill.calls += 1
    fill.self_ns += 140 * MS
    fill.incl_ns += 140 * MS
    startup = build_report(profile).section("startup")
    assert startup is not None
    assert "ATen ops ran 266.0 ms in it, summed over 2 threads" in startup.lines[0]
    assert [c.key for c in startup.tables[0].columns] == ["op", "inputs", "calls", "self"]  # no share of the time


def test_no_start_up_section_when_nothing_came_before_the_first_step():
    t = Timeline()
    t.forward(batch=1, positions=4, kv_len=4)
    for step in range(3):
        t.gap(MS)
        t.forward(batch=1, positions=1, kv_len=5 + step)
    report = build_report(t.profile())
    assert report.section("decode") is not None and report.section("startup") is None
