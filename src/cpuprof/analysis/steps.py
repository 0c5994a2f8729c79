"""Decode steps of any program, inferred from its op stream: what the built-in decoder reports of
itself (steps, tokens/s, step latency, prefill, the ceiling), for transformers' ``generate()`` or a
serving engine's worker, which cpuprof does not own.

A forward pass of a language model is a fixed sequence of GEMMs over the same weights, ending with
the LM head: the projection onto the vocabulary, made once per forward and wider than any other.
So, on the thread that ran the most GEMMs, in the op spans of the profile's timeline:

1. the outermost GEMM-like calls, in time order (a ``linear`` is counted, not the ``mm`` inside it),
   each known by its weight (its name, the weight's [n, k] and dtype: the same weight in the prefill
   and in a decode step, whatever the rows);
2. the LM head: of the weights used fewest times (once a forward, where each layer's are used once a
   layer), the largest; its calls end the forwards, and the GEMMs between two of them are one
   forward (a window's first, cut in half, is left out when it has fewer GEMMs than the others);
3. a step runs from the end of the previous LM head to the end of its own (its wall time includes
   sampling the next token and the framework's work between forwards); the first one, which has no
   previous forward, from its first GEMM;
4. its tokens are the rows of its first projection; [batch, positions, k] activations (transformers)
   give sequences and positions, a step with one position per sequence being a decode step;
   flattened [tokens, k] ones (serving engines) give sequences from the LM head's rows (it projects
   only the positions that sample), a step with as many tokens as sequences being a decode step, one
   sequence of many tokens a prefill, anything else mixed (chunked prefill beside decodes);
5. the KV length from the attention op's key length, where the attention's shapes show it.

What would make these wrong is said with them: a model whose LM head is not its widest projection,
GEMMs outside the table cpuprof knows (a custom kernel), a forward split over threads.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field
from typing import Any

from ..model import OpStat, Profile
from ..units import fmt_bytes, fmt_ns, fmt_percent, fmt_rate
from .ceiling import above_the_roof
from .gemm import GEMM_TABLE, GemmWork, gemm_kind, gemm_work
from .report_model import Column, Section, Table

# An LM head projects onto a vocabulary; without attention in the steps, one this much wider than
# every other projection still says "language model" (a classifier or an MLP has no such layer).
LM_HEAD_WIDTH_RATIO = 4
# Time between two forwards longer than this many times the forward itself (and than the floor) is a
# pause of the program's (another generate() call, a server waiting for requests), not the step's.
IDLE_FACTOR = 2
IDLE_FLOOR_NS = 50_000_000
# Fewer decode steps than this and tokens/s is not worth a figure.
MIN_DECODE_STEPS = 2

PREFILL, DECODE, MIXED = "prefill", "decode", "mixed"


@dataclass
class Step:
    start_ns: int
    wall_ns: int
    tokens: int  # rows its projections processed: every position of every sequence
    sequences: int  # sequences it produced a token for (the LM head's rows)
    kind: str  # PREFILL, DECODE or MIXED
    kv_len: int | None = None  # the longest key length its attention read, where its shapes show it
    gemm_ns: int = 0  # its outermost GEMM-like calls (attention apart)
    attention_ns: int = 0
    other_ops_ns: int = 0  # its other top-level ops
    weight_bytes: int = 0  # the weights its GEMMs read (one per call), at their stored size
    kv_bytes: int = 0  # the keys and values its attention read

    @property
    def outside_ops_ns(self) -> int:
        """Wall time no top-level op covers: Python, the framework, the scheduler, waits."""
        return max(0, self.wall_ns - self.gemm_ns - self.attention_ns - self.other_ops_ns)


@dataclass
class Steps:
    steps: list[Step]
    thread: int  # the thread (index into Profile.threads) whose ops the steps are
    lm_head: str  # the op and weight that ends each forward
    gemms_per_forward: int
    partial_first: bool = False  # a first forward cut in half (the window opened mid-step): left out
    notes: list[str] = field(default_factory=list)

    def of_kind(self, kind: str) -> list[Step]:
        return [s for s in self.steps if s.kind == kind]


@dataclass(frozen=True)
class _Call:
    start_ns: int
    end_ns: int
    op: OpStat
    work: GemmWork | None
    kind: str  # "gemm" or "attention"

    @property
    def weight(self) -> tuple[str, int, int, str] | None:
        """What the call multiplies by, whatever its rows: the same in the prefill and each step."""
        # A batched product (eager attention's q·kᵀ and p·v, whose shapes grow each step) multiplies
        # two activations, not a weight.
        if self.work is None or self.kind != "gemm" or self.work.batch > 1:
            return None
        return (self.op.name, self.work.n, self.work.k, self.work.weight_dtype or self.work.dtype)


def _activation_sizes(op: OpStat) -> list[int] | None:
    spec = GEMM_TABLE.get(op.name)
    if spec is None or op.inputs is None or spec.a >= len(op.inputs):
        return None
    return op.inputs[spec.a].sizes


def find_steps(profile: Profile) -> Steps | str:
    """The decode steps in ``profile``'s op timeline, or why there are none (one line)."""
    spans = profile.spans
    if spans is None or not len(spans):
        return "the op timeline was not kept (it is kept with --timeline N)"
    ops = profile.op_by_id()
    kinds = {op_id: gemm_kind(op.name) for op_id, op in ops.items() if op.kind == "op"}
    by_thread: dict[int, list[int]] = {}
    for i, op_id in enumerate(spans.op):
        if kinds.get(op_id):
            by_thread.setdefault(spans.thread[i], []).append(i)
    if not by_thread:
        return "no GEMM-like op ran (no linear, matmul, mm or attention the GEMM table knows)"
    thread = max(by_thread, key=lambda t: len(by_thread[t]))
    calls = _outermost_calls(spans, thread, ops, kinds)
    weights = [c.weight for c in calls]
    counts: dict[tuple[str, int, int, str], int] = {}
    for w in weights:
        if w is not None:
            counts[w] = counts.get(w, 0) + 1
    repeated = {w: n for w, n in counts.items() if n >= 2}
    if not repeated:
        return "no GEMM repeats over the same weights: no forward pass runs more than once"
    fewest = min(repeated.values())
    head = max((w for w, n in repeated.items() if n == fewest), key=lambda w: (w[1], w[1] * w[2]))
    ends = [i for i, w in enumerate(weights) if w == head]
    gaps = [b - a for a, b in zip(ends, ends[1:], strict=False)]
    per_forward = max(set(gaps), key=gaps.count) if gaps else ends[0] + 1
    if per_forward < 2:
        return "GEMMs repeat, but not as the forward passes of a model (one GEMM between two of the widest)"
    has_attention = any(c.kind == "attention" for c in calls)
    widest_other = max((w[1] for w in counts if w != head), default=0)
    if not has_attention and head[1] < LM_HEAD_WIDTH_RATIO * widest_other:
        return ("GEMMs repeat, but no step has attention or an LM head (a projection several times wider than the "
                "others): not the forward passes of a language model")
    steps: list[Step] = []
    partial_first = ends[0] + 1 < per_forward
    covered = _op_cover(spans, thread, ops)
    for n, end in enumerate(ends):
        if n == 0 and partial_first:
            continue
        # The first forward: its last GEMMs up to its LM head (GEMMs before it, a warm-up, a setup,
        # are no part of it); the others: every GEMM since the LM head before.
        lo = ends[n - 1] + 1 if n else end + 1 - per_forward
        forward = calls[lo:end + 1]
        start = forward[0].start_ns
        if n:
            # From the LM head before, sampling and the framework's work included; but a pause longer
            # than the forward itself (the program did something else, or waited for a request) is
            # no part of the step: it starts at its first GEMM then.
            idle = forward[0].start_ns - calls[ends[n - 1]].end_ns
            if idle <= max(IDLE_FACTOR * (calls[end].end_ns - forward[0].start_ns), IDLE_FLOOR_NS):
                start = calls[ends[n - 1]].end_ns
        steps.append(_step(forward, start, calls[end].end_ns, covered, first_seen=not steps and not partial_first))
    found = Steps(steps=steps, thread=thread, lm_head=_weight_text(head), gemms_per_forward=per_forward,
                  partial_first=partial_first)
    dropped = profile.limits.spans_dropped if profile.limits is not None else 0
    if dropped:
        found.notes.append(f"the timeline kept the newest spans of each thread ({dropped:,} older ones dropped): "
                           "these steps are the last part of the run (--timeline N keeps more)")
    irregular = sum(1 for g in gaps if g != per_forward)
    if irregular:
        found.notes.append(f"{irregular} of {len(gaps)} forwards had another count of GEMMs than {per_forward}: "
                           "something else ran GEMMs between them, or the model changed its path")
    return found


def _outermost_calls(spans: object, thread: int, ops: dict[int, OpStat],
                     kinds: dict[int, str | None]) -> list[_Call]:
    """The GEMM-like calls not inside another one (a linear, not the mm it calls), by start. Nesting
    is read from the spans' depths in start order, not from their ends: a span's duration leaves out
    the profiler's own time in the ops under it, so a parent can seem to end before its children."""
    s: Any = spans
    order = sorted((i for i in range(len(s.op)) if s.thread[i] == thread), key=lambda i: (s.start_ns[i], s.depth[i]))
    calls: list[_Call] = []
    open_spans: list[tuple[int, bool]] = []  # (depth, is a GEMM-like call) of the spans enclosing this one
    works: dict[int, GemmWork | None] = {}
    for i in order:
        depth, op_id = s.depth[i], s.op[i]
        while open_spans and open_spans[-1][0] >= depth:
            open_spans.pop()
        kind = kinds.get(op_id)
        inside_gemm = any(is_gemm for _, is_gemm in open_spans)
        open_spans.append((depth, bool(kind)))
        if not kind or inside_gemm:
            continue
        if op_id not in works:
            works[op_id] = gemm_work(ops[op_id])
        calls.append(_Call(s.start_ns[i], s.start_ns[i] + s.dur_ns[i], ops[op_id], works[op_id], kind))
    return calls


def _step(forward: list[_Call], start: int, end: int, covered: list[tuple[int, int]], first_seen: bool) -> Step:
    """One forward's step; ``first_seen``: no forward came before it (a flattened batch of prompts
    then is a prefill, nothing being decoded yet; later, its prompts may sit beside decodes: mixed)."""
    first = next((c for c in forward if c.kind == "gemm"), forward[0])
    head = forward[-1]
    sizes = _activation_sizes(first.op) or []
    head_sizes = _activation_sizes(head.op) or []
    if len(sizes) >= 3:  # [batch, positions, k]
        sequences, positions = sizes[0], math.prod(sizes[1:-1])
        tokens = sequences * positions
        kind = DECODE if positions == 1 else PREFILL
    else:  # [tokens, k], flattened over the sequences (a vector: one token)
        tokens = sizes[0] if len(sizes) == 2 else 1
        if len(head_sizes) >= 3:  # an LM head over [batch, positions, k]: its batch is the sequences
            sequences = head_sizes[0]
        else:  # it projects only the positions that sample: one row a sequence
            sequences = head_sizes[0] if len(head_sizes) == 2 else 1
        kind = DECODE if tokens == sequences else PREFILL if sequences == 1 or first_seen else MIXED
    kv = [c.work.n for c in forward if c.kind == "attention" and c.work is not None]
    # Each GEMM of a forward multiplies by a weight of its own (q and o of one layer have one shape, and
    # every layer the same shapes, but not the same matrix): a step reads the weights of all its calls.
    weight_bytes = sum(c.work.weight_bytes for c in forward if c.weight is not None and c.work is not None)
    step = Step(start_ns=start, wall_ns=max(0, end - start), tokens=tokens, sequences=sequences, kind=kind,
                kv_len=max(kv) if kv else None, weight_bytes=weight_bytes,
                kv_bytes=sum(c.work.weight_bytes for c in forward if c.kind == "attention" and c.work is not None))
    step.gemm_ns = sum(c.end_ns - c.start_ns for c in forward if c.kind == "gemm")
    step.attention_ns = sum(c.end_ns - c.start_ns for c in forward if c.kind == "attention")
    step.other_ops_ns = max(0, _covered_ns(covered, start, end) - step.gemm_ns - step.attention_ns)
    return step


def _op_cover(spans: object, thread: int, ops: dict[int, OpStat]) -> list[tuple[int, int]]:
    """The instants ``thread`` was inside an op, as sorted disjoint intervals (ops nested in ops,
    and the regions around them, counted once)."""
    s = spans
    intervals = sorted((s.start_ns[i], s.start_ns[i] + s.dur_ns[i])  # type: ignore[attr-defined]
                       for i in range(len(s.op))  # type: ignore[attr-defined]
                       if s.thread[i] == thread  # type: ignore[attr-defined]
                       and getattr(ops.get(s.op[i]), "kind", None) == "op")  # type: ignore[attr-defined]
    merged: list[tuple[int, int]] = []
    for lo, hi in intervals:
        if merged and lo <= merged[-1][1]:
            if hi > merged[-1][1]:
                merged[-1] = (merged[-1][0], hi)
        else:
            merged.append((lo, hi))
    return merged


def _covered_ns(covered: list[tuple[int, int]], start: int, end: int) -> int:
    """How much of [start, end) the disjoint intervals ``covered`` cover."""
    first = bisect.bisect_right(covered, (start, math.inf)) - 1
    total = 0
    for lo, hi in covered[max(first, 0):]:
        if lo >= end:
            break
        total += max(0, min(hi, end) - max(lo, start))
    return total


def _weight_text(weight: tuple[str, int, int, str]) -> str:
    name, n, k, dtype = weight
    return f"{name} onto {n:,} outputs from {k:,} ({dtype})"


# -- the report's sections, as the built-in decoder's (ids "decode" and "ceiling") -----------------
HOW = ("inferred from the op stream: each forward pass ends with the LM head ({head}), {per} GEMM-like calls "
       "apart; a step runs from one LM head's end to the next (sampling the token and the framework's work "
       "between forwards included), its tokens are the rows of its projections; this is wrong if the model's LM "
       "head is not its widest projection, if its GEMMs are ops the GEMM table does not know, or if a forward "
       "runs on several threads")


def _percentiles(values: list[float]) -> tuple[float, float, float]:
    import numpy as np

    p50, p90, p99 = np.percentile(values, [50, 90, 99])
    return float(p50), float(p90), float(p99)


def _batch_text(steps: list[Step]) -> str:
    sizes = sorted({s.sequences for s in steps})
    return str(sizes[0]) if len(sizes) == 1 else f"{sizes[0]} to {sizes[-1]} (continuous batching)"


def decode_tokens_per_s(steps: list[Step]) -> float | None:
    """Tokens produced per second of the decode steps' wall time: every sequence's token counted."""
    wall = sum(s.wall_ns for s in steps)
    return sum(s.sequences for s in steps) * 1e9 / wall if steps and wall else None


def decode_section(found: Steps) -> Section:
    decode, prefill, mixed = found.of_kind(DECODE), found.of_kind(PREFILL), found.of_kind(MIXED)
    mixed_text = (f", {len(mixed)} mixed (prompts' prefill, with or without decodes beside them: a flattened batch "
                  "does not say which)" if mixed else "")
    lines = [f"{len(found.steps)} forward passes on thread T{found.thread + 1}: {len(prefill)} prefill, "
             f"{len(decode)} decode{mixed_text}"]
    tps = decode_tokens_per_s(decode)
    if len(decode) >= MIN_DECODE_STEPS and tps is not None:
        p50, p90, p99 = _percentiles([s.wall_ns / 1e6 for s in decode])
        tokens = sum(s.sequences for s in decode)
        lines.append(f"throughput {fmt_rate(tps)} tokens/s over {len(decode)} decode steps ({tokens:,} tokens, batch "
                     f"{_batch_text(decode)}); step latency p50 {p50:.1f} ms, p90 {p90:.1f} ms, p99 {p99:.1f} ms")
    else:
        lines.append(f"throughput: {len(decode)} decode step{'s' if len(decode) != 1 else ''} found, too few for a "
                     "figure")
    if prefill:
        first = prefill[0]
        ttft = (f"time to first token {fmt_ns(first.wall_ns)}" if len(prefill) == 1 else
                f"the first, {first.tokens:,} tokens, took {fmt_ns(first.wall_ns)} (time to first token)")
        lines.append(f"prefill: {len(prefill)} forward{'s' if len(prefill) != 1 else ''}, "
                     f"{sum(s.tokens for s in prefill):,} tokens in {fmt_ns(sum(s.wall_ns for s in prefill))}; "
                     f"{ttft}, from its first GEMM to its LM head (the tokenizer and what ran before are not in it)")
    kv = [s.kv_len for s in decode if s.kv_len is not None]
    if kv:
        lines.append(f"KV length {min(kv):,} to {max(kv):,} positions over the decode steps (the attention's keys)")
    lines.append("how: " + HOW.format(head=found.lm_head, per=found.gemms_per_forward))
    notes = list(found.notes)
    if found.partial_first:
        notes.append("the first forward was cut (the timeline starts mid-step: a window opened then, or older "
                     "spans were dropped): left out")
    rows = [{"kind": kind, "steps": len(group), "tokens": sum(s.tokens for s in group),
             "mean_ns": sum(s.wall_ns for s in group) / len(group),
             "gemm": sum(s.gemm_ns for s in group) / max(1, sum(s.wall_ns for s in group)),
             "attention": sum(s.attention_ns for s in group) / max(1, sum(s.wall_ns for s in group)),
             "outside": sum(s.outside_ops_ns for s in group) / max(1, sum(s.wall_ns for s in group))}
            for kind, group in ((PREFILL, prefill), (DECODE, decode), (MIXED, mixed)) if group]
    table = Table([Column("kind", "forward"), Column("steps", "steps", "int"),
                   Column("tokens", "tokens", "count", help="rows its projections processed"),
                   Column("mean_ns", "mean wall", "ns", help="from one LM head's end to the next"),
                   Column("gemm", "GEMMs", "share", help="outermost GEMM-like calls (a linear, not its mm)"),
                   Column("attention", "attention", "share"),
                   Column("outside", "outside ops", "share",
                          help="time no op covers: Python, the framework, the scheduler, waits")],
                  rows, caption="the forward passes by kind")
    return Section("decode", "Decode (inferred from the op stream)", lines, [table], notes)


def ceiling_section(profile: Profile, found: Steps) -> Section | None:
    """The decode steps against the memory roof: the bytes a step must read (the weights of its
    GEMMs at their stored size, and the keys and values its attention read) over the roof's bandwidth."""
    decode = found.of_kind(DECODE)
    tps = decode_tokens_per_s(decode)
    if len(decode) < MIN_DECODE_STEPS or tps is None:
        return None
    title = "Decode against the memory roof"
    bandwidth = profile.roofs.memory_gb_per_s() if profile.roofs is not None else None
    if not bandwidth:
        return Section("ceiling", title, ["no ceiling: no memory roof measured for this launch (`run` measures "
                                          "them before the program unless --roofs off; or: python -m cpuprof "
                                          "calibrate with the same launch options)"])
    n = len(decode)
    mean = {key: sum(getattr(s, key) for s in decode) / n
            for key in ("wall_ns", "weight_bytes", "kv_bytes", "gemm_ns", "attention_ns", "other_ops_ns",
                        "outside_ops_ns", "sequences")}
    step_bytes = mean["weight_bytes"] + mean["kv_bytes"]
    if not step_bytes:
        return Section("ceiling", title, ["no ceiling: the decode steps' GEMMs have no weight bytes in their shapes"])
    per_token = step_bytes / mean["sequences"]
    ceiling = bandwidth * 1e9 / per_token
    at_roof = 1e9 / (bandwidth * 1e9)  # ns per byte
    # A paged attention kernel's shapes give no key length: its cache's bytes are then unknown, not nothing.
    kv = fmt_bytes(mean["kv_bytes"]) if mean["kv_bytes"] else "not known"
    lines = [f"ceiling {fmt_rate(ceiling)} tokens/s: {fmt_bytes(per_token)} read per token (the decode steps' "
             f"weights, {fmt_bytes(mean['weight_bytes'])}, and KV cache, {kv}, per "
             f"step of {mean['sequences']:.3g} sequence{'' if mean['sequences'] == 1 else 's'}) at the measured "
             f"{bandwidth:.1f} GB/s; measured "
             f"{fmt_rate(tps)} tokens/s = {fmt_percent(tps / ceiling)} of it"]
    if not mean["kv_bytes"]:
        lines.append("the KV cache's bytes are not known (the attention's shapes do not give its key length, as a "
                     "paged attention kernel's do not): the ceiling, from the weights alone, is an upper bound")
    if tps > ceiling:  # a small model's weights stay in the caches: a negative part below says so
        lines.append(above_the_roof("the share of the ceiling is"))
    parts = [
        ("reading the weights and KV cache at the memory roof", step_bytes * at_roof,
         f"{fmt_bytes(step_bytes)} per step at {bandwidth:.1f} GB/s"),
        ("GEMMs below the memory roof", mean["gemm_ns"] - mean["weight_bytes"] * at_roof,
         "their time minus their weights' bytes at the roof"),
        ("attention below the memory roof", mean["attention_ns"] - mean["kv_bytes"] * at_roof,
         "its time minus its keys' and values' bytes at the roof"),
        ("other ops (norms, RoPE, activations, copies, sampling)", mean["other_ops_ns"],
         "the time inside the step's other top-level ops"),
        ("outside ops (Python, the framework, the scheduler, waits)", mean["outside_ops_ns"],
         "the step's wall time that no op covers"),
    ]
    rows = [{"part": label, "ns": ns, "share": ns / mean["wall_ns"], "how": how} for label, ns, how in parts]
    rows.append({"part": "measured step", "ns": mean["wall_ns"], "share": 1.0,
                 "how": f"mean of {n} decode steps' wall time"})
    table = Table([Column("part", "where a decode step's time goes"), Column("ns", "per step", "ns"),
                   Column("share", "% step", "share"), Column("how", "how it is counted")], rows,
                  caption="the measured step = its bytes at the roof + what keeps it from the roof")
    worst = max(parts[1:], key=lambda p: p[1])
    if worst[1] > 0:
        lines.append(f"largest gap: {worst[0]}, {fmt_ns(worst[1])} per step; without it decode would run at "
                     f"{fmt_rate(mean['sequences'] * 1e9 / max(1.0, mean['wall_ns'] - worst[1]))} tokens/s")
    return Section("ceiling", title, lines, [table])
