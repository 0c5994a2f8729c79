"""Known answers for the decode ceiling and the breakdown of a step, from a hand-built profile."""

from __future__ import annotations

import pytest
from profiles import MS, make_profile

from cpuprof.analysis.ceiling import ceiling_section, decode_ceiling
from cpuprof.analysis.memory import memory_section
from cpuprof.analysis.report import build_report
from cpuprof.analysis.roofline import gemm_groups
from cpuprof.analysis.roofs import roofs_section
from cpuprof.model import (
    BandwidthRoof,
    ComputeRoof,
    KernelRoof,
    KvCachePoint,
    MachineRoofs,
    MemoryPoint,
    OpInput,
    OpStat,
    Profile,
    Repeated,
)

GEMV_BYTES = 2 * (2048 * 8192 + 2048 + 8192)  # bf16 weight + input row + output row


def roofs(bandwidth: float = 40.0, kernel: float = 20.0) -> MachineRoofs:
    return MachineRoofs(
        fingerprint={"cpu": "test CPU", "torch": "2.13.0+cpu"}, key="k", measured="2026-11-22T08:00:00+00:00",
        seconds=3.0, threads=2, cpus=[0, 1],
        bandwidth=[BandwidthRoof("triad", Repeated(bandwidth, bandwidth * 0.97, 0.05, 7), 2, 64 << 20),
                   BandwidthRoof("copy", Repeated(bandwidth * 0.9, bandwidth * 0.88, 0.05, 7), 2, 64 << 20)],
        compute=[ComputeRoof("bf16", Repeated(500.0, 480.0, 0.04, 5), 2, 2048)],
        kernel=[KernelRoof("bf16", Repeated(kernel, kernel * 0.95, 0.06, 7), 2, [8192, 2048])])


def decode_profile() -> Profile:
    """4 decode steps of 10 ms: 100 GEMV calls (25 per step) take 24 ms (6 ms per step), an add 4 ms
    (1 ms per step); the prefill's one GEMM key apart, in its region."""
    p = make_profile("sampled")
    gemv, add, region = p.ops
    gemv.calls, gemv.self_ns, gemv.incl_ns = 100, 24 * MS, 24 * MS
    add.calls, add.self_ns, add.incl_ns = 100, 4 * MS, 4 * MS
    prefill = OpStat(id=9, kind="op", name="aten::mm", region=["prefill", "mlp"], calls=4, incl_ns=8 * MS,
                     self_ns=8 * MS, max_ns=2 * MS,
                     inputs=[OpInput(kind="tensor", dtype="bf16", sizes=[8, 2048], strides=[2048, 1]),
                             OpInput(kind="tensor", dtype="bf16", sizes=[2048, 8192], strides=[1, 2048])],
                     counters_self={"task-clock": [8 * MS, 8 * MS]}, counters_incl={"task-clock": [8 * MS, 8 * MS]})
    p.ops = [gemv, add, region, prefill]
    wl = p.workload
    assert wl is not None
    wl.step_latencies_s = [0.010] * 4
    wl.bytes_read_per_token = 25 * GEMV_BYTES  # the step reads exactly what its 25 GEMVs read
    p.roofs = roofs()
    p.stacks = None
    return p


def test_ceiling_is_bytes_per_token_over_the_bandwidth() -> None:
    p = decode_profile()
    c = decode_ceiling(p)
    assert c is not None
    assert c.ceiling_tokens_per_s == pytest.approx(40e9 / (25 * GEMV_BYTES))
    assert c.share == pytest.approx(100.0 / c.ceiling_tokens_per_s)
    assert c.kernel_ceiling_tokens_per_s == pytest.approx(20e9 / (25 * GEMV_BYTES))


def test_the_parts_of_a_step_add_up_to_the_measured_step() -> None:
    c = decode_ceiling(decode_profile())
    assert c is not None
    assert c.steps == 4 and c.step_ns == pytest.approx(10 * MS)
    parts = {p.key: p.ns_per_step for p in c.parts}
    roof_ns = 25 * GEMV_BYTES / 40e9 * 1e9  # the step's bytes at 40 GB/s
    assert parts["roof"] == pytest.approx(roof_ns)
    # the decode GEMVs took 6 ms per step; at the roof they would take the same bytes' time
    assert parts["gemm"] == pytest.approx(6 * MS - roof_ns)
    assert parts["ops"] == pytest.approx(1 * MS)  # the add; the prefill's GEMM is not a decode step's
    assert parts["between"] == pytest.approx(10 * MS - 7 * MS)
    assert "rest" not in parts  # the GEMVs' bytes are the step's bytes
    assert sum(parts.values()) == pytest.approx(c.step_ns)


def test_prefill_is_judged_against_the_compute_roof() -> None:
    p = decode_profile()
    section = ceiling_section(p)
    assert section is not None
    text = "\n".join(section.lines)
    flops = 4 * 2 * 8 * 2048 * 8192
    assert f"{flops / 1e9:.2f} GFLOP in" in text
    assert f"{flops / (8 * MS):.1f} GFLOP/s" in text
    assert "of the 500 GFLOP/s compute roof" in text


def test_a_share_of_the_ceiling_above_100_percent_is_explained() -> None:
    """A memory roof measured at 8 GB/s while the decode read its 839 MB per token at 84 GB/s: 100
    tokens/s is more than the ceiling, and the section says the roof is low and how to measure it again."""
    p = decode_profile()
    p.roofs = roofs(bandwidth=8.0, kernel=4.0)
    c = decode_ceiling(p)
    assert c is not None and c.share > 1
    section = ceiling_section(p)
    assert section is not None
    (said,) = [line for line in section.lines if "above 100%" in line]
    assert said.startswith("the share of the ceiling is above 100%") and "cpuprof calibrate" in said
    p.roofs = roofs(bandwidth=200.0, kernel=100.0)  # 100 tokens/s is 42% of it: nothing to explain
    quiet = ceiling_section(p)
    assert quiet is not None and not any("above 100%" in line for line in quiet.lines)


def test_without_roofs_there_is_no_ceiling_and_the_report_still_renders() -> None:
    p = decode_profile()
    p.roofs = None
    assert decode_ceiling(p) is None and ceiling_section(p) is None and roofs_section(p) is None
    report = build_report(p)
    assert report.section("ceiling") is None and report.section("ops") is not None


def test_a_report_with_roofs_has_the_ceiling_the_roofs_and_the_gemms() -> None:
    report = build_report(decode_profile())
    ids = [s.id for s in report.sections]
    assert ids.index("ceiling") < ids.index("roofs") < ids.index("ops") < ids.index("gemms")
    rows = report.section("roofs").tables[0].rows  # type: ignore[union-attr]
    assert {r["roof"] for r in rows} == {"memory (triad)", "memory (copy)", "compute", "GEMV kernel"}
    assert len(gemm_groups(decode_profile())) == 2  # decode GEMV and prefill GEMM


def test_memory_section_reads_the_kv_cache_and_rss_timeline() -> None:
    p = decode_profile()
    wl = p.workload
    assert wl is not None
    wl.kv_cache = [KvCachePoint(8, 8 * 1024), KvCachePoint(12, 12 * 1024)]
    wl.rss_timeline = [MemoryPoint(0.0, 100 << 20, "start"), MemoryPoint(1.0, 600 << 20, "built"),
                       MemoryPoint(1.1, 610 << 20, "step 1"), MemoryPoint(1.2, 612 << 20, "step 2")]
    section = memory_section(p)
    assert section is not None
    text = "\n".join(section.lines)
    assert "1.02 kB more per position" in text  # (12 - 8) KiB over 4 positions, in decimal units
    assert f"+{2 * 1.048576:.2f} MB over 2 steps" in text


def test_a_negative_remainder_reads_as_a_duration() -> None:
    from cpuprof.units import fmt_ns

    assert fmt_ns(-11_577_360) == "-11.6 ms" and fmt_ns(11_577_360) == "11.6 ms" and fmt_ns(-5) == "-5 ns"


def test_gemm_like_ops_whose_work_is_unknown_are_a_part_of_their_own() -> None:
    # vLLM's paged attention: its KV lengths are values, so it has no roof time; its 2 ms over the 4
    # steps (0.5 ms per step) are named, not hidden among the other ops
    p = decode_profile()
    paged = OpStat(id=10, kind="op", name="_C::cpu_attention_with_kv_cache", region=[], calls=8, incl_ns=2 * MS,
                   self_ns=2 * MS, max_ns=MS, counters_self={}, counters_incl={},
                   inputs=[OpInput(kind="tensor", dtype="bf16", sizes=[1, 8, 64], strides=[512, 64, 1])])
    p.ops.append(paged)
    c = decode_ceiling(p)
    assert c is not None
    parts = {part.key: part for part in c.parts}
    assert parts["unknown_gemm"].ns_per_step == pytest.approx(0.5 * MS)
    assert "_C::cpu_attention_with_kv_cache" in parts["unknown_gemm"].help
    assert parts["ops"].ns_per_step == pytest.approx(1 * MS)  # still the add alone
    assert sum(part.ns_per_step for part in c.parts) == pytest.approx(c.step_ns)
