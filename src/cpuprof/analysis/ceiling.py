"""Decode as a whole against the memory roof: the tokens/s ceiling, the share reached, and where
the rest of each step goes.

A decode step must stream every weight matrix and the KV cache from memory once, so the
measured bandwidth over the bytes a token costs is a ceiling no implementation can pass. The
gap between it and the measured step is split, from the profile's own op times, into: the bytes
at the roof (the ceiling's own time), GEMMs and attention running below their roof, the other
ops, and the time between ops (Python, dispatch, sampling the next token). The parts add up to
the measured step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..model import MachineRoofs, OpStat, Profile
from ..model.workload import PREFILL_REGION, QUANT_WEIGHT_CODES, ROOF_DTYPES
from ..units import fmt_bytes, fmt_ns, fmt_percent, fmt_rate
from .gemm_kernels import unknown_gemm_ops
from .report_model import Column, Section, Table
from .roofline import GemmGroup, counted_gemm_ops, gemm_groups, roof_ns


def fmt_flops(flops: float) -> str:
    for scale, unit in ((1e12, "TFLOP"), (1e9, "GFLOP"), (1e6, "MFLOP"), (1e3, "kFLOP")):
        if flops >= scale:
            return f"{flops / scale:.2f} {unit}"
    return f"{flops:.0f} FLOP"


def in_prefill(op: OpStat) -> bool:
    return PREFILL_REGION in op.region


@dataclass
class GapPart:
    key: str
    label: str
    ns_per_step: float
    help: str


@dataclass
class DecodeCeiling:
    bytes_per_token: int
    bandwidth_gb_per_s: float
    ceiling_tokens_per_s: float
    tokens_per_s: float
    kernel_ceiling_tokens_per_s: float | None  # at the best GEMV bandwidth torch reaches in this dtype
    steps: int  # decode steps the profile covers (warm-up ones included)
    step_ns: float  # their mean wall time
    parts: list[GapPart] = field(default_factory=list)
    openmp_ns_per_step: float | None = None  # the dispatching thread in the OpenMP runtime, within ops

    @property
    def share(self) -> float:
        return self.tokens_per_s / self.ceiling_tokens_per_s


@dataclass
class PrefillFigures:
    prompt_tokens: int
    ttft_s: float
    gemm_flops: int
    gemm_ns: int  # time in the prefill's GEMMs and attention
    at_roof_ns: float  # their time at the roofs
    compute_gflop_per_s: float | None  # the compute roof of the model's dtype

    @property
    def achieved_gflop_per_s(self) -> float | None:
        return self.gemm_flops / self.gemm_ns if self.gemm_ns else None


def decode_ceiling(profile: Profile, groups: list[GemmGroup] | None = None) -> DecodeCeiling | None:
    wl, roofs = profile.workload, profile.roofs
    if wl is None or roofs is None or not wl.bytes_read_per_token or wl.figures is None:
        return None
    bandwidth = roofs.memory_gb_per_s()
    if not bandwidth:
        return None
    ceiling = bandwidth * 1e9 / wl.bytes_read_per_token
    quant = wl.model.quant
    kernel_bw = roofs.kernel_gb_per_s(ROOF_DTYPES.get(wl.model.dtype, wl.model.dtype),
                                      QUANT_WEIGHT_CODES.get(quant.mode, ""),
                                      quant.groups)
    result = DecodeCeiling(
        bytes_per_token=wl.bytes_read_per_token, bandwidth_gb_per_s=bandwidth, ceiling_tokens_per_s=ceiling,
        tokens_per_s=wl.figures.tokens_per_s,
        kernel_ceiling_tokens_per_s=kernel_bw * 1e9 / wl.bytes_read_per_token if kernel_bw else None,
        steps=len(wl.step_latencies_s), step_ns=0.0)
    if not profile.profiled or not wl.step_latencies_s:
        return result
    steps = len(wl.step_latencies_s)
    result.step_ns = step_ns = sum(wl.step_latencies_s) * 1e9 / steps
    groups = gemm_groups(profile) if groups is None else groups
    gemm_ns, gemm_roof_ns = (total / steps for total in _phase_times(groups, roofs, prefill=False))
    ops_ns = sum(op.self_ns for op in profile.ops if op.kind == "op" and not in_prefill(op)) / steps
    # The bytes a step must read, at the roof: the ceiling's own time per step.
    ideal_ns = wl.bytes_read_per_token * wl.batch / (bandwidth * 1e9) * 1e9
    # GEMM-like ops whose work is not known (an engine's own GEMM op, a paged attention): their time is
    # a part of its own, never hidden among the other ops, but has no roof time to subtract.
    unknown = [u for u in unknown_gemm_ops(profile, counted_gemm_ops(profile)[1]) if not in_prefill(u.op)]
    unknown_ns = sum(u.op.incl_ns for u in unknown) / steps
    other_ops_ns = max(0.0, ops_ns - gemm_ns - unknown_ns)
    result.parts = [
        GapPart("roof", "reading the weights and KV cache at the memory roof", ideal_ns,
                f"{fmt_bytes(wl.bytes_read_per_token * wl.batch)} per step at {bandwidth:.1f} GB/s"),
        GapPart("gemm", "GEMMs and attention below their roofs", gemm_ns - gemm_roof_ns,
                "their time minus their time at the roofs (the table of GEMMs says which)"),
        *([GapPart("unknown_gemm", "GEMM-like ops whose work is not known", unknown_ns,
                   "their time: " + ", ".join(sorted({u.op.name for u in unknown}))
                   + " (the GEMM table lists them with why)")] if unknown else []),
        GapPart("ops", "other ops (norms, RoPE, activations, copies, sampling)", other_ops_ns,
                "the self time of every other op in the decode steps"),
        GapPart("between", "between ops (Python, dispatch, the profiler's callbacks)", step_ns - ops_ns,
                "the step's wall time that no op covers"),
    ]
    # What is left once the GEMMs' roof time and the step's bytes disagree (activations, outputs
    # and the KV cache's exact layout): shown so the parts add up to the step.
    rest = step_ns - sum(p.ns_per_step for p in result.parts)
    if abs(rest) > 0.005 * step_ns:
        result.parts.append(GapPart("rest", "analytic bytes the GEMMs count beyond the step's (or fewer)", rest,
                                    "the GEMMs' bytes at the roof minus the step's bytes at the roof"))
    result.openmp_ns_per_step = _dispatch_openmp_ns(profile, steps)
    return result


def _phase_share(group: GemmGroup, prefill: bool) -> float:
    """The share of a group's calls made in the prefill (or in the decode steps). A group is one
    shape across regions: the prefill's last-position lm_head is the decode steps' GEMV."""
    calls = sum(op.calls for op in group.ops if in_prefill(op) == prefill)
    return calls / group.calls if group.calls else 0.0


def _phase_times(groups: list[GemmGroup], roofs: MachineRoofs, prefill: bool) -> tuple[float, float]:
    """The GEMMs' time in one phase and their time at the roofs, in ns (every call of a group does
    the same work, but for attention, whose phases are separate groups)."""
    time_ns = sum(op.incl_ns for g in groups for op in g.ops if in_prefill(op) == prefill)
    at_roof = sum(roof_ns(g, roofs) * _phase_share(g, prefill) for g in groups)
    return time_ns, at_roof


def _dispatch_openmp_ns(profile: Profile, steps: int) -> float | None:
    """The dispatching thread's sampled CPU in the OpenMP runtime inside decode ops: waiting for the
    team at barriers is on the critical path of every step."""
    stacks = profile.stacks
    if stacks is None:
        return None
    by_id = profile.op_by_id()
    dispatch = {i for i, t in enumerate(profile.threads) if t.role == "dispatch"}
    total = 0
    for c in stacks.counts:
        op = by_id.get(c.op)
        if c.thread not in dispatch or op is None or op.kind != "op" or in_prefill(op):
            continue
        frames = stacks.stacks[c.stack]
        if frames and stacks.frames[frames[0]].category == "openmp":
            total += c.cpu_ns
    return total / steps


def prefill_figures(profile: Profile, groups: list[GemmGroup]) -> PrefillFigures | None:
    wl, roofs = profile.workload, profile.roofs
    if wl is None or wl.ttft_s is None or not profile.profiled:
        return None
    flops = sum(g.flops * _phase_share(g, prefill=True) for g in groups)
    if not flops:
        return None
    gemm_ns, at_roof_ns = _phase_times(groups, roofs, prefill=True) if roofs else (
        sum(op.incl_ns for g in groups for op in g.ops if in_prefill(op)), 0.0)
    peak = roofs.compute_gflop_per_s(ROOF_DTYPES.get(wl.model.dtype, wl.model.dtype)) if roofs else None
    return PrefillFigures(
        prompt_tokens=wl.prompt_len * wl.batch, ttft_s=wl.ttft_s, gemm_flops=int(flops), gemm_ns=int(gemm_ns),
        at_roof_ns=at_roof_ns, compute_gflop_per_s=peak)


def above_the_roof(what: str) -> str:
    """Why a share of a measured roof can pass 100%, and what to do: a roof is a measurement too."""
    return (f"{what} above 100%: the run went faster than the roof measured for its launch, so that roof is low "
            "(measured at a busy moment, or below what this kernel and size reach: a small model's weights partly "
            "stay in the caches); re-measure it with `python -m cpuprof calibrate` and the same launch options")


def ceiling_section(profile: Profile) -> Section | None:
    wl = profile.workload
    if wl is None or profile.roofs is None:
        return None
    groups = gemm_groups(profile) if profile.profiled else []
    ceiling = decode_ceiling(profile, groups)
    if ceiling is None:
        if profile.roofs.memory_gb_per_s() is None:
            why = "the roofs have no memory bandwidth"
        elif wl.figures is None:
            why = "no decode step was measured"
        else:  # an HF model's decode cut short: its KV cache, which its bytes are counted from, never came back
            why = "the bytes a token reads are not known (the decode was cut short before they were counted)"
        return Section("ceiling", "Decode against the memory roof", [f"no ceiling: {why}"])
    lines = [f"ceiling {fmt_rate(ceiling.ceiling_tokens_per_s)} tokens/s: {fmt_bytes(ceiling.bytes_per_token)} read "
             f"per token at the measured {ceiling.bandwidth_gb_per_s:.1f} GB/s; measured "
             f"{fmt_rate(ceiling.tokens_per_s)} tokens/s = {fmt_percent(ceiling.share)} of it"]
    if ceiling.share > 1:
        lines.append(above_the_roof("the share of the ceiling is"))
    if ceiling.kernel_ceiling_tokens_per_s:
        kernel_share = ceiling.tokens_per_s / ceiling.kernel_ceiling_tokens_per_s
        storage = f" with {wl.model.quant.mode} weights" if wl.model.quant.quantized else ""
        lines.append(f"at the best GEMV bandwidth torch itself reaches in {wl.model.dtype}{storage} (the kernel roof) "
                     f"the ceiling is {fmt_rate(ceiling.kernel_ceiling_tokens_per_s)} tokens/s: "
                     f"{fmt_percent(kernel_share)} of it reached")
        if kernel_share > 1 >= ceiling.share:
            lines.append(above_the_roof("the share of the kernel roof's ceiling is"))
    tables = []
    if ceiling.parts:
        columns = [Column("part", "where a decode step's time goes"),
                   Column("ns", "per step", "ns", help="mean over the profiled decode steps (warm-up included)"),
                   Column("share", "% step", "share", help="share of the mean step"),
                   Column("how", "how it is counted")]
        rows = [{"part": p.label, "ns": p.ns_per_step, "share": p.ns_per_step / ceiling.step_ns, "how": p.help}
                for p in ceiling.parts]
        rows.append({"part": "measured step", "ns": ceiling.step_ns, "share": 1.0,
                     "how": f"mean of {ceiling.steps} decode steps' wall time"})
        tables.append(Table(columns, rows, caption="the measured step = its bytes at the roof + what keeps it "
                                                   "from the roof"))
        gaps = sorted((p for p in ceiling.parts if p.key not in ("roof", "rest") and p.ns_per_step > 0),
                      key=lambda p: p.ns_per_step, reverse=True)
        if gaps:
            worst = gaps[0]
            without = ceiling.step_ns - worst.ns_per_step
            lines.append(f"largest gap: {worst.label}, {fmt_ns(worst.ns_per_step)} per step; without it decode "
                         f"would run at {fmt_rate(wl.batch * 1e9 / without)} tokens/s")
        worst_gemm = max((g for g in groups if g.lost_ns), key=lambda g: g.lost_ns or 0.0, default=None)
        if worst_gemm is not None and worst_gemm.lost_ns:
            per_step = worst_gemm.lost_ns * _phase_share(worst_gemm, prefill=False) / ceiling.steps
            if per_step > 0:
                lines.append(f"the GEMM furthest below its roof: {worst_gemm.shape_text} ({worst_gemm.work.dtype}), "
                             f"{fmt_ns(per_step)} per step lost: {worst_gemm.verdict}")
        if ceiling.openmp_ns_per_step:
            lines.append(f"the dispatching thread spent {fmt_ns(ceiling.openmp_ns_per_step)} per step in the OpenMP "
                         "runtime inside ops (waiting for the team at barriers, or waking it): from its samples")
    prefill = prefill_figures(profile, groups)
    if prefill is not None and prefill.achieved_gflop_per_s is not None:
        peak = prefill.compute_gflop_per_s
        share = f", {fmt_percent(prefill.achieved_gflop_per_s / peak)} of the {peak:.0f} GFLOP/s compute roof" \
            if peak else ""
        lines.append(f"prefill ({prefill.prompt_tokens} tokens, {prefill.ttft_s * 1e3:.1f} ms to the first token): "
                     f"its GEMMs and attention ran {fmt_flops(prefill.gemm_flops)} in {fmt_ns(prefill.gemm_ns)} "
                     f"= {prefill.achieved_gflop_per_s:.1f} GFLOP/s{share}; at the roofs they would take "
                     f"{fmt_ns(prefill.at_roof_ns)}")
    return Section("ceiling", "Decode against the memory roof", lines, tables)
