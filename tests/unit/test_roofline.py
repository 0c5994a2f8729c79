"""GEMMs against the roofs, on hand-built profiles whose figures are known: the binding roof, the
share of it reached and the time lost follow from the op's time alone; nesting counts each GEMM
once; the native split and the measured traffic come from synthetic samples and counters; the
SVG chart parses and draws one circle per GEMM."""

from __future__ import annotations

import dataclasses
import math
import xml.etree.ElementTree as ET

import pytest
from profiles import decode_workload, meta, tensor

from cpuprof.analysis.gemm import gemm_work
from cpuprof.analysis.report_model import UNITS
from cpuprof.analysis.roofline import (
    AT_ROOF_SHARE,
    GemmGroup,
    enclosing_gemm_ops,
    gemm_groups,
    gemm_summary,
    repacking_name,
    roof_ns,
    roofline_section,
)
from cpuprof.exports import roofline_svg
from cpuprof.model import (
    BandwidthRoof,
    Capabilities,
    Collection,
    ComputeRoof,
    EventInfo,
    KernelRoof,
    MachineRoofs,
    NativeFrame,
    OpenMPInfo,
    OpInput,
    OpStat,
    Profile,
    Repeated,
    Spans,
    StackCount,
    Stacks,
    ThreadStat,
)

MS = 1_000_000
SVG = "{http://www.w3.org/2000/svg}"
BW, PEAK, KERNEL = 40.0, 500.0, 25.0  # GB/s, bf16 GFLOP/s, GB/s: ridge at 12.5 flop/B

# The decode GEMV [1,2048] x [8192,2048]ᵀ in bf16, and a square [2048,2048]^2 GEMM, by hand:
GEMV_FLOPS = 2 * 1 * 8192 * 2048
GEMV_BYTES = (1 * 2048 + 8192 * 2048 + 1 * 8192) * 2
SQUARE_FLOPS = 2 * 2048 * 2048 * 2048
SQUARE_BYTES = 3 * 2048 * 2048 * 2


t = tensor  # short: the tests write many inputs


def gemv_inputs(dtype: str = "bf16") -> list[OpInput]:
    return [t(dtype, 1, 2048), t(dtype, 2048, 8192, strides=[1, 2048])]


def square_inputs() -> list[OpInput]:
    return [t("bf16", 2048, 2048), t("bf16", 2048, 2048)]


def op(op_id: int, name: str, inputs: list[OpInput] | None, time_ns: int, calls: int = 1, self_ns: int | None = None,
       region: list[str] | None = None, counters: dict[str, list[int]] | None = None) -> OpStat:
    return OpStat(id=op_id, kind="op", name=name, region=region or [], calls=calls, incl_ns=time_ns,
                  self_ns=time_ns if self_ns is None else self_ns, max_ns=time_ns, counters_self={},
                  counters_incl=counters or {}, inputs=inputs)


def roofs(kernel: float | None = KERNEL, compute: dict[str, float] | None = None) -> MachineRoofs:
    compute = {"bf16": PEAK} if compute is None else compute
    return MachineRoofs(
        fingerprint={"cpu": "test CPU"}, key="k", measured="2026-11-21T10:00:00+00:00", seconds=4.0, threads=2,
        cpus=[0, 1], bandwidth=[BandwidthRoof("triad", Repeated(BW, 38.0, 0.06, 5), 2, 1 << 28),
                                BandwidthRoof("copy", Repeated(35.0, 34.0, 0.04, 5), 2, 1 << 28)],
        compute=[ComputeRoof(d, Repeated(p, p * 0.95, 0.02, 3), 2, 2048) for d, p in compute.items()],
        kernel=[KernelRoof("bf16", Repeated(kernel, kernel * 0.9, 0.05, 5), 2, [8192, 2048])] if kernel else [],
        from_cache=True)


def profile(ops: list[OpStat], mode: str = "exact", events: tuple[str, ...] = ("task-clock",),
            with_roofs: bool = True, stacks: Stacks | None = None, spans: Spans | None = None) -> Profile:
    return Profile(
        meta=meta(),
        capabilities=Capabilities(hardware_pmu=None, hardware_pmu_reason="no PMU", perf_event_paranoid=2,
                                  openmp=OpenMPInfo(), cpus_online=2),
        collection=Collection(mode=mode, events=[EventInfo(e, "software") for e in events], record_shapes=True,
                              started_ns=0, stopped_ns=10_000 * MS),
        threads=[ThreadStat(tid=10, name="python", role="dispatch", counters={}),
                 ThreadStat(tid=11, name="omp", role="worker", counters={})],
        ops=ops, stacks=stacks, spans=spans, roofs=roofs() if with_roofs else None)


def ns_at_gb_per_s(bytes_: int, calls: int, gb_per_s: float) -> int:
    return round(bytes_ * calls / gb_per_s)  # bytes / (GB/s) = ns


def only_group(p: Profile) -> GemmGroup:
    groups = gemm_groups(p)
    assert len(groups) == 1
    return groups[0]


def test_gemv_is_memory_bound_and_the_square_gemm_compute_bound() -> None:
    p = profile([op(1, "aten::mm", gemv_inputs(), 10 * MS), op(2, "aten::mm", square_inputs(), 100 * MS)])
    by_shape = {g.work.shape_text: g for g in gemm_groups(p)}
    gemv, square = by_shape["[1,2048]x[2048,8192]ᵀ"], by_shape["[2048,2048]x[2048,2048]"]
    assert gemv.work.flops == GEMV_FLOPS and gemv.work.bytes_min == GEMV_BYTES
    assert square.work.flops == SQUARE_FLOPS and square.work.bytes_min == SQUARE_BYTES
    assert gemv.ridge == pytest.approx(PEAK / BW)  # 12.5 flop/B
    assert gemv.intensity == pytest.approx(GEMV_FLOPS / GEMV_BYTES)  # about 1 flop/B: below the ridge
    assert gemv.bound == "memory"
    assert square.intensity == pytest.approx(SQUARE_FLOPS / SQUARE_BYTES)  # about 683 flop/B: above it
    assert square.bound == "compute"
    assert gemv.attainable_gflop_per_s == pytest.approx(gemv.intensity * BW)
    assert square.attainable_gflop_per_s == PEAK


def test_share_of_roof_and_time_lost_memory_bound() -> None:
    calls = 10
    time = ns_at_gb_per_s(GEMV_BYTES, calls, 20.0)  # half the 40 GB/s roof
    g = only_group(profile([op(1, "aten::mm", gemv_inputs(), time, calls=calls)]))
    assert g.calls == calls and g.time_ns == time
    assert g.gb_per_s == pytest.approx(20.0, rel=1e-6)
    assert g.gflop_per_s == pytest.approx(GEMV_FLOPS * calls / time)
    assert g.roof_share == pytest.approx(0.5, rel=1e-6)
    assert g.kernel_roof_share == pytest.approx(20.0 / KERNEL, rel=1e-6)
    ideal = calls * GEMV_BYTES / BW  # ns: the bytes at 40 GB/s
    assert g.lost_ns == pytest.approx(time - ideal)
    assert g.lost_ns == pytest.approx(time / 2, rel=1e-6)
    assert roof_ns(g, roofs()) == pytest.approx(calls * GEMV_BYTES / BW)


def test_share_of_roof_and_time_lost_compute_bound() -> None:
    calls = 4
    time = round(SQUARE_FLOPS * calls / 250.0)  # 250 GFLOP/s: half the peak
    g = only_group(profile([op(1, "aten::mm", square_inputs(), time, calls=calls)]))
    assert g.gflop_per_s == pytest.approx(250.0, rel=1e-6)
    assert g.roof_share == pytest.approx(0.5, rel=1e-6)
    assert g.kernel_roof_share is None  # the GEMV kernel roof judges memory-bound GEMMs only
    assert g.lost_ns == pytest.approx(time - calls * SQUARE_FLOPS / PEAK)
    assert roof_ns(g, roofs()) == pytest.approx(calls * SQUARE_FLOPS / PEAK)


def test_the_verdict_follows_the_measured_time_not_the_name() -> None:
    def verdict_at(gb_per_s: float, inputs: list[OpInput], bytes_: int, kernel: float | None = KERNEL) -> str:
        p = profile([op(1, "aten::mm", inputs, ns_at_gb_per_s(bytes_, 1, gb_per_s))])
        p.roofs = roofs(kernel=kernel)
        return only_group(p).verdict

    at_roof = verdict_at(0.92 * BW, gemv_inputs(), GEMV_BYTES)
    assert at_roof == "at the memory roof (92% of 40.0 GB/s)"
    slow = verdict_at(0.31 * BW, gemv_inputs(), GEMV_BYTES, kernel=50.0)
    assert slow.startswith("memory-bound by intensity (1 flop/B < ridge 12.5) but running at 31% of the "
                           "bandwidth (12.4 of 40.0 GB/s)")
    assert "native split not known" in slow  # exact mode: no stacks
    # at the roof of torch's own GEMV: the kernel binds it
    kernel_bound = verdict_at(0.6 * BW, gemv_inputs(), GEMV_BYTES)
    assert "the kernel binds it" in kernel_bound and "96% of that" in kernel_bound
    assert "noise" not in kernel_bound
    # above torch's GEMV by less than the roofs' noise (105%): binds, and the figure above 100% explained
    just_above = verdict_at(0.6 * BW, gemv_inputs(), GEMV_BYTES, kernel=0.6 * BW / 1.05)
    assert "the kernel binds it" in just_above and "105% of that (above 100% by less than the 10% allowed for the " \
                                                    "roofs' run-to-run noise)" in just_above
    # faster than torch's best GEMV measured (a roof measured low): the verdict says so, and never that
    # the kernel binds a GEMM that beat it
    beat = verdict_at(0.6 * BW, gemv_inputs(), GEMV_BYTES, kernel=20.0)
    assert "faster than torch's best bf16 GEMV measured here (20.0 GB/s, this one 120% of it)" in beat
    assert "binds" not in beat
    # above the memory roof: the bytes came from the caches
    cached = verdict_at(3 * BW, gemv_inputs(), GEMV_BYTES)
    assert cached.startswith("above the memory roof")
    assert at_roof != slow != kernel_bound != cached
    # the same op, compute-bound, at and below the peak
    compute_time = round(SQUARE_FLOPS / (0.85 * PEAK))
    fast = only_group(profile([op(1, "aten::mm", square_inputs(), compute_time)])).verdict
    assert fast == "compute-bound at 85% of the bf16 peak (500 GFLOP/s)"
    slow_compute = only_group(profile([op(1, "aten::mm", square_inputs(), compute_time * 4)])).verdict
    assert slow_compute.startswith("compute-bound by intensity (683 flop/B ≥ ridge 12.5) at 21% of the bf16 peak")
    assert AT_ROOF_SHARE == 0.8  # the threshold the figures above straddle


def test_groups_merge_the_same_gemm_across_regions_and_ops() -> None:
    layer0 = op(1, "aten::mm", gemv_inputs(), 3 * MS, calls=2, region=["layers.0"])
    layer1 = op(2, "aten::mm", gemv_inputs(), 5 * MS, calls=3, region=["layers.1"])
    # the same product through oneDNN's linear: [1,2048] x [8192,2048] is the same GEMM
    dnnl = op(3, "mkldnn::_linear_pointwise", [t("bf16", 1, 2048), t("bf16", 8192, 2048),
                                               OpInput(kind="none"), OpInput(kind="other")], 7 * MS)
    with_bias = op(4, "aten::addmm", [t("bf16", 8192), *gemv_inputs()], 11 * MS)
    groups = {g.work.shape_text: g for g in gemm_groups(profile([layer0, layer1, dnnl, with_bias]))}
    assert set(groups) == {"[1,2048]x[2048,8192]ᵀ", "[1,2048]x[2048,8192]ᵀ +bias"}
    merged = groups["[1,2048]x[2048,8192]ᵀ"]
    assert (merged.calls, merged.time_ns) == (2 + 3 + 1, (3 + 5 + 7) * MS)
    assert merged.op_ids == [1, 2, 3] and merged.op_names == ["aten::mm", "mkldnn::_linear_pointwise"]


def test_composites_are_not_counted_and_their_inner_gemm_is() -> None:
    # F.linear(x, w) over 7 calls: linear -> matmul -> mm, each with its own row
    linear = op(1, "aten::linear", [t("bf16", 1, 2048), t("bf16", 8192, 2048), OpInput(kind="none")], 70 * MS,
                calls=7, self_ns=1 * MS)
    matmul = op(2, "aten::matmul", gemv_inputs(), 69 * MS, calls=7, self_ns=1 * MS)
    mm = op(3, "aten::mm", gemv_inputs(), 68 * MS, calls=7)
    g = only_group(profile([linear, matmul, mm]))
    assert g.op_ids == [3] and g.calls == 7 and g.time_ns == 68 * MS


def test_nesting_seen_in_sample_paths_and_spans() -> None:
    addbmm = op(10, "aten::addbmm", [t("f32", 4, 8), t("f32", 2, 4, 16), t("f32", 2, 16, 8)], 10 * MS)
    addmm_ = op(11, "aten::addmm_", [t("f32", 4, 8), t("f32", 4, 16), t("f32", 16, 8)], 8 * MS, calls=2)
    mv = op(12, "aten::mv", [t("f32", 64, 16), t("f32", 16)], 1 * MS)
    copy = op(13, "aten::copy_", [t("f32", 4, 8)], 1 * MS)
    ops = [addbmm, addmm_, mv, copy]
    frames = [NativeFrame("kernel", "libtorch.so", "compute")]
    in_paths = profile(ops, stacks=Stacks(frames=frames, stacks=[[], [0]], paths=[[], [10, 11], [12, 13]],
                                          counts=[StackCount(1, 1, 0, 11, 1, MS), StackCount(1, 2, 0, 13, 1, MS)]))
    assert enclosing_gemm_ops(in_paths) == {10}
    # Spans end children first: addmm_ twice inside addbmm, then mv alone with a copy inside it.
    spans = Spans(op=[11, 11, 10, 13, 12], thread=[0, 0, 0, 0, 0], depth=[1, 1, 0, 1, 0],
                  start_ns=[10, 20, 5, 50, 45], dur_ns=[5, 5, 30, 2, 10], counters=[[], [], [], [], []])
    in_spans = profile(ops, spans=spans)
    assert enclosing_gemm_ops(in_spans) == {10}
    names = sorted(g.op_names[0] for g in gemm_groups(in_spans))
    assert names == ["aten::addmm_", "aten::mv"]  # addbmm's work is counted once, in its addmm_ calls


def repack_stacks(gemm_id: int, child_id: int, other_id: int) -> Stacks:
    frames = [
        NativeFrame("jit_brgemm_matmul_copy_b_bf16_t", "[jit]", "compute"),  # 0
        NativeFrame("dnnl::impl::cpu::x64::matmul::brgemm_matmul_t<(cpu_isa_t)1>::execute(ctx const&) const",
                    "libtorch_cpu.so", "compute"),  # 1
        NativeFrame("brgemm_kernel_execute", "[jit]", "compute"),  # 2
        NativeFrame("gomp_team_barrier_wait_end", "libgomp.so.1", "openmp"),  # 3
        NativeFrame("dnnl::impl::cpu::simple_reorder_impl<(dnnl_data_type_t)2, tag>::execute(ctx const&)",
                    "libtorch_cpu.so", "compute"),  # 4
        NativeFrame("__memmove_avx512_unaligned_erms", "libc.so.6", "other"),  # 5
        NativeFrame("mkl_blas_avx512_sgemm_packed_kernel", "libmkl.so", "compute"),  # 6: already packed
        NativeFrame("malloc", "libc.so.6", "allocator"),  # 7
    ]
    stacks = [[], [0, 1], [2, 1], [3, 4], [5, 4], [6], [7]]  # leaf first
    path = [[], [1, gemm_id], [1, gemm_id, child_id], [other_id]]

    def count(stack: int, path: int, op: int, ms: int, thread: int = 0) -> StackCount:
        return StackCount(stack=stack, path=path, thread=thread, op=op, samples=ms, cpu_ns=ms * MS)

    return Stacks(frames=frames, stacks=stacks, paths=path, counts=[
        count(1, 1, gemm_id, 30), count(1, 1, gemm_id, 10, thread=1),  # copy_b: 40 ms of repacking
        count(4, 1, gemm_id, 24, thread=1),  # memcpy under a reorder: repacking, named by the reorder
        count(2, 1, gemm_id, 20),  # the brgemm kernel
        count(5, 1, gemm_id, 6),  # MKL on packed weights: compute, not repacking
        count(3, 1, gemm_id, 6, thread=1),  # a barrier inside the reorder: the OpenMP runtime
        count(6, 2, child_id, 4),  # malloc in an op nested under the GEMM: its time, other
        count(2, 3, other_id, 50),  # another op: not this GEMM's
    ])


def test_native_split_from_synthetic_stacks() -> None:
    linear = op(1, "aten::linear", [t("bf16", 1, 2048), t("bf16", 8192, 2048), OpInput(kind="none")], 101 * MS)
    mm = op(2, "aten::mm", gemv_inputs(), 100 * MS, calls=10, self_ns=99 * MS)
    child = op(3, "aten::resolve_conj", [t("bf16", 1, 2048)], 1 * MS)
    other = op(4, "aten::add", [t("bf16", 1, 8)], 50 * MS)
    p = profile([linear, mm, child, other], mode="sampled", stacks=repack_stacks(2, 3, 4))
    g = only_group(p)
    split = g.native
    assert split is not None
    assert split.samples == 100 and split.cpu_ns == 100 * MS
    assert split.share("repack") == pytest.approx(0.64)
    assert split.share("compute") == pytest.approx(0.26)
    assert split.share("openmp") == pytest.approx(0.06)
    assert split.share("other") == pytest.approx(0.04)
    assert split.repack_functions == {"jit_brgemm_matmul_copy_b_bf16_t": 40 * MS,
                                      "cpu::simple_reorder_impl<…>": 24 * MS}
    assert split.repack_function == "jit_brgemm_matmul_copy_b_bf16_t"
    # 100 ms for 10 calls: 3.4 GB/s, 8% of the roof; the samples say why
    assert g.verdict.startswith("memory-bound by intensity")
    assert "64% of its samples repack the weights (jit_brgemm_matmul_copy_b_bf16_t)" in g.verdict
    # A program's (run): what its user can apply in it; the built-in decoder's: its own --compile.
    assert "torch._inductor.config.freezing = True" in g.verdict and "ipex.optimize(model)" in g.verdict
    assert "decode --compile" not in g.verdict and "compare --from" not in g.verdict
    assert "OpenMP" not in g.verdict  # 6% is below the share worth naming
    p.workload = decode_workload()
    g = only_group(p)
    assert "decode --compile: torch.compile with frozen weights" in g.verdict and "compare --from" in g.verdict


def test_too_few_samples_give_no_native_cause() -> None:
    mm = op(2, "aten::mm", gemv_inputs(), 100 * MS, calls=10)
    stacks = repack_stacks(2, 3, 4)
    stacks.counts = stacks.counts[:1]  # 30 samples, one stack
    stacks.counts[0].samples = 5
    g = only_group(profile([mm, op(3, "aten::resolve_conj", None, 1), op(4, "aten::add", None, 1)],
                           mode="sampled", stacks=stacks))
    assert "too few samples (5)" in g.verdict


def test_repacking_names() -> None:
    long = ("dnnl::impl::cpu::x64::matmul::brgemm_matmul_t<(dnnl::impl::cpu::x64::cpu_isa_t)13168>::"
            "copy_b_chunk_in_buffer(brg_matmul_exec_ctx_t const&, char const*, int) const::{lambda(long, int)#1}::"
            "operator()(long, int) const")
    assert repacking_name(long) == "brgemm_matmul_t<…>::copy_b_chunk_in_buffer(…) const"


def test_measured_traffic_beside_the_analytic_bytes() -> None:
    calls, time = 10, ns_at_gb_per_s(GEMV_BYTES, 10, 20.0)
    misses = [GEMV_BYTES * calls // 64 // 2, GEMV_BYTES * calls // 64 // 2]  # every byte missed once
    mm = op(1, "aten::mm", gemv_inputs(), time, calls=calls, counters={"LLC-load-misses": misses})
    p = profile([mm], events=("task-clock", "LLC-load-misses"))
    g = only_group(p)
    assert g.traffic is not None and g.traffic.event == "LLC-load-misses"
    assert g.traffic.bytes == sum(misses) * 64
    assert g.traffic.gb_per_s(g.time_ns) == pytest.approx(20.0, rel=1e-6)
    section = roofline_section(gemm_summary(p), 10)
    assert section is not None
    assert any(line.startswith("measured traffic: LLC-load-misses x 64 B") for line in section.lines)
    assert section.tables[0].rows[0]["measured_gbs"] == pytest.approx(20.0, rel=1e-6)
    plain = roofline_section(gemm_summary(profile([op(1, "aten::mm", gemv_inputs(), time, calls=calls)])), 10)
    assert plain is not None
    assert any("bytes are analytic only" in line and "no hardware PMU" in line for line in plain.lines)
    assert all(c.key != "measured_gbs" for c in plain.tables[0].columns)


def test_without_roofs_the_figures_stay_and_nothing_is_judged() -> None:
    g = only_group(profile([op(1, "aten::mm", gemv_inputs(), ns_at_gb_per_s(GEMV_BYTES, 1, 10.0))],
                           with_roofs=False))
    assert g.gb_per_s == pytest.approx(10.0, rel=1e-6)
    assert g.gflop_per_s == pytest.approx(GEMV_FLOPS / g.time_ns)
    assert (g.bound, g.ridge, g.roof_share, g.kernel_roof_share, g.lost_ns) == (None, None, None, None, None)
    assert g.verdict.startswith("not judged (no memory roof measured)")


def test_a_dtype_without_a_compute_roof() -> None:
    p = profile([op(1, "aten::mm", gemv_inputs("f16"), ns_at_gb_per_s(GEMV_BYTES, 1, 10.0))])
    g = only_group(p)
    assert g.bound is None and g.lost_ns is None
    assert g.verdict == "no f16 compute roof measured: reads 10.0 GB/s, 25% of the memory roof (40.0 GB/s)"


def test_section_table_sorted_by_time_lost() -> None:
    gemv = op(1, "aten::mm", gemv_inputs(), ns_at_gb_per_s(GEMV_BYTES, 10, 10.0), calls=10)  # loses 3/4
    square = op(2, "aten::mm", square_inputs(), round(SQUARE_FLOPS / 400.0))  # loses 1/5
    small = op(3, "aten::bmm", [t("bf16", 8, 4, 64), t("bf16", 8, 64, 16)], 1 * MS)
    unreadable = op(4, "aten::addmm", None, 2 * MS, calls=3)
    composite = op(5, "aten::linear", None, 99 * MS)  # its work is in its inner ops: not a GEMM row
    section = roofline_section(gemm_summary(profile([gemv, square, small, unreadable, composite])), top=2)
    assert section is not None and section.id == "gemms"
    table = section.tables[0]
    assert [c.key for c in table.columns] == ["shape", "ops", "dtype", "calls", "time", "share", "intensity",
                                              "gflops", "gbs", "roof", "roof_share", "kernel_share", "lost",
                                              "verdict"]
    assert all(c.unit in UNITS for c in table.columns)
    assert [row["shape"] for row in table.rows] == ["[1,2048]x[2048,8192]ᵀ", "[2048,2048]x[2048,2048]"]
    assert table.rows[0]["lost"] >= table.rows[1]["lost"]
    assert table.caption == "top 2 of 3 GEMM shapes by time lost against the roofs"
    total_self = gemv.self_ns + square.self_ns + small.self_ns + unreadable.self_ns + composite.self_ns
    assert table.rows[0]["share"] == pytest.approx(gemv.incl_ns / total_self)
    assert any("from the cache, measured 2026-11-21 10:00 UTC" in line and "spread 6.0%" in line
               for line in section.lines)
    assert any("FLOPs and bytes are analytic" in line for line in section.lines)
    assert any("native split not known" in line for line in section.lines)
    assert section.notes == ["1 GEMM-like op key(s) (3 calls, 2.0 ms) have no work figure: listed below with why, "
                             "not judged against the roofs"]
    listed = section.tables[1]
    assert [(r["op"], r["calls"], r["time"], r["why"], r["gemm_share"]) for r in listed.rows] == [
        ("aten::addmm", 3, 2 * MS, "its shapes were not recorded", None)]


def test_no_section_without_gemms() -> None:
    assert roofline_section(gemm_summary(profile([op(1, "aten::add", [t("f32", 4)], MS)])), 10) is None


def test_real_profile_counts_each_gemm_once() -> None:
    torch = pytest.importorskip("torch")
    import cpuprof

    functional = torch.nn.functional
    x1, x3 = torch.randn(1, 256), torch.randn(2, 4, 256)
    w, b = torch.randn(512, 256), torch.randn(512)
    with cpuprof.profile(mode="exact", warn=False) as session:
        for _ in range(7):
            functional.linear(x1, w)  # linear -> matmul -> mm
        for _ in range(5):
            functional.linear(x1, w, b)  # linear -> addmm
        for _ in range(3):
            torch.matmul(x3, w.t())  # matmul -> mm on the folded [8,256]
    assert session.profile is not None
    groups = {g.work.shape_text: g for g in gemm_groups(session.profile)}
    assert {s: (g.calls, g.op_names) for s, g in groups.items()} == {
        "[1,256]x[256,512]ᵀ": (7, ["aten::mm"]),
        "[1,256]x[256,512]ᵀ +bias": (5, ["aten::addmm"]),
        "[8,256]x[256,512]ᵀ": (3, ["aten::mm"]),
    }
    # the outer ops' work equals their inner op's, so nothing is lost by counting only the inner one
    for stat in session.profile.ops:
        if stat.name == "aten::linear" and stat.inputs and stat.inputs[2].kind == "none":
            outer = gemm_work(stat)
            assert outer is not None and outer.flops == groups["[1,256]x[256,512]ᵀ"].work.flops


# ---- the SVG chart


def svg_groups() -> list[GemmGroup]:
    ops = [op(1, "aten::mm", gemv_inputs(), 40 * MS, calls=10),
           op(2, "aten::mm", square_inputs(), 90 * MS),
           op(3, "aten::mm", [t("f32", 1, 2048), t("f32", 2048, 8192)], 9 * MS)]
    p = profile(ops)
    assert p.roofs is not None
    p.roofs = roofs(compute={"bf16": PEAK, "f32": 250.0})
    return gemm_groups(p)


def parse(doc: str) -> ET.Element:
    return ET.fromstring(doc)


def circles(root: ET.Element) -> list[ET.Element]:
    return root.findall(f".//{SVG}circle")


def test_svg_parses_with_one_circle_per_group_and_the_roofs() -> None:
    groups = svg_groups()
    root = parse(roofline_svg.render(groups, roofs(compute={"bf16": PEAK, "f32": 250.0}), "roofline"))
    assert len(circles(root)) == len(groups) == 3
    tips = [c.find(f"{SVG}title") for c in circles(root)]
    assert all(tip is not None and tip.text for tip in tips)
    text = " ".join(el.text or "" for el in root.iter())
    assert "memory 40 GB/s" in text and "bf16 peak 500 GFLOP/s" in text and "f32 peak 250 GFLOP/s" in text
    dashed = [line for line in root.iter(f"{SVG}line") if line.get("stroke-dasharray")
              and line.find(f"{SVG}title") is not None]
    assert len(dashed) == 1  # the bf16 kernel roof (no f32 kernel roof was measured)
    # circle area in proportion to time: the 90 ms circle has 90/40 the area of the 40 ms one
    radius = {tip.text.split(" ")[0]: float(c.get("r", 0)) for c, tip in zip(circles(root), tips, strict=True)
              if tip is not None and tip.text}
    assert (radius["[2048,2048]x[2048,2048]"] / radius["[1,2048]x[2048,8192]ᵀ"]) ** 2 == pytest.approx(90 / 40,
                                                                                                        rel=0.01)


def test_svg_places_points_on_the_log_axes() -> None:
    groups = svg_groups()
    root = parse(roofline_svg.render(groups, roofs(), "roofline"))
    by_shape = {}
    for c in circles(root):
        tip = c.find(f"{SVG}title")
        assert tip is not None and tip.text
        by_shape[tip.text.split(" ")[0] + tip.text.split(" ")[1]] = (float(c.get("cx", 0)), float(c.get("cy", 0)))
    gemv = by_shape["[1,2048]x[2048,8192]ᵀ(bf16):"]
    square = by_shape["[2048,2048]x[2048,2048](bf16):"]
    # higher intensity is further right, higher GFLOP/s higher up (smaller y)
    assert square[0] > gemv[0] and square[1] < gemv[1]


def test_svg_without_roofs_one_point_and_escaping() -> None:
    p = profile([op(1, "aten::mm", [t("bf16", 3, 5), t("bf16", 5, 7)], 1000)], with_roofs=False)
    groups = gemm_groups(p)
    doc = roofline_svg.render(groups, None, "GEMMs <of> \"a & b\"")
    root = parse(doc)
    assert len(circles(root)) == 1
    title = root.find(f"{SVG}title")
    assert title is not None and title.text == "GEMMs <of> \"a & b\""
    assert "no roofs measured" in doc


@pytest.mark.parametrize("scale", [1e-9, 1.0, 1e9])
def test_svg_extreme_values_stay_inside_the_chart(scale: float) -> None:
    ops = [op(1, "aten::mm", [t("f32", 1, 1), t("f32", 1, 1)], max(1, round(1e6 * scale))),  # intensity 1/6
           op(2, "aten::mm", [t("f32", 100_000, 100_000), t("f32", 100_000, 100_000)], 1),  # 1e6 flop/B in 1 ns
           op(3, "aten::mm", [t("f32", 4, 4), t("f32", 4, 4)], 0)]  # no time: no point
    groups = gemm_groups(profile(ops))
    root = parse(roofline_svg.render(groups, roofs(), "extremes"))
    points = circles(root)
    assert len(points) == 2
    width, height = float(root.get("width", 0)), float(root.get("height", 0))
    for c in points:
        cx, cy, r = (float(c.get(k, "nan")) for k in ("cx", "cy", "r"))
        assert all(math.isfinite(v) for v in (cx, cy, r))
        assert 0 <= cx <= width and 0 <= cy <= height and r > 0


def test_labels_of_points_at_one_intensity_do_not_overlap() -> None:
    """Six GEMVs of one intensity and nearly one speed (a decode's projections): their circles pile up;
    their labels are moved apart or left out (the tooltips name them), never drawn over each other."""
    ops = [op(k, "aten::mm", [t("bf16", 1, 2048), t("bf16", 2048, 1024 * k)], 40 * k * MS) for k in range(1, 7)]
    root = parse(roofline_svg.render(gemm_groups(profile(ops)), roofs(), "one intensity"))
    assert len(circles(root)) == 6
    labels = [el for el in root.iter(f"{SVG}text") if el.get("class") == "point-label"]
    assert labels
    boxes = []
    for el in labels:
        x, y, width = float(el.get("x", "nan")), float(el.get("y", "nan")), len(el.text or "") * 6.0
        x0 = x if el.get("text-anchor") == "start" else x - width
        boxes.append((x0, x0 + width, y - 10, y + 2))
    for i, a in enumerate(boxes):
        for b in boxes[i + 1:]:
            assert not (a[0] < b[1] and b[0] < a[1] and a[2] < b[3] and b[2] < a[3]), (a, b)


def test_svg_with_no_groups() -> None:
    root = parse(roofline_svg.render([], roofs(), "empty"))
    assert circles(root) == []
    assert any((el.text or "") == "no GEMM with measured time" for el in root.iter())


def test_attention_is_judged_by_its_own_roofs_not_the_gemv_kernel() -> None:
    b, hq, hkv, lq, lk, d = 1, 32, 8, 1, 512, 64
    inputs = [t("bf16", b, hq, lq, d), t("bf16", b, hkv, lk, d), t("bf16", b, hkv, lk, d), OpInput(kind="float"),
              OpInput(kind="bool"), OpInput(kind="none"), OpInput(kind="none")]
    sdpa = op(1, "aten::scaled_dot_product_attention", inputs[:3], 12 * MS, calls=10, self_ns=MS)
    flash = op(2, "aten::_scaled_dot_product_flash_attention_for_cpu", inputs, 10 * MS, calls=10)
    g = only_group(profile([sdpa, flash]))
    assert g.work.kind == "attention" and g.op_names == ["aten::_scaled_dot_product_flash_attention_for_cpu"]
    kv_bytes = 2 * b * hkv * lk * d * 2
    assert g.work.bytes_min == kv_bytes + 2 * b * hq * lq * d * 2  # the KV cache, q and the output
    assert g.bound == "memory"
    assert g.kernel_roof_share is None
    assert g.roof_share == pytest.approx(g.work.bytes_min * 10 / (10 * MS) / BW)


def gemm_kernel_stacks(engine_id: int, vllm_id: int, other_id: int) -> Stacks:
    """Samples of an op outside the GEMM table that runs oneDNN's brgemm (an engine's own GEMM), of
    vLLM's onednn_mm (in the table) on AMX, and of an elementwise op."""
    frames = [
        NativeFrame("jit_brgemm_kernel_t", "[jit]", "compute"),  # 0: no ISA in the name
        NativeFrame("dnnl::impl::cpu::x64::jit_avx512_core_brgemm_kernel_base_t::execute()", "libdnnl.so",
                    "compute"),  # 1: its caller names the ISA
        NativeFrame("jit_brgemm_amx_uker_base_t", "[jit]", "compute"),  # 2
        NativeFrame("dnnl::impl::cpu::x64::matmul::brgemm_matmul_t<(cpu_isa_t)13168>::execute(ctx const&) const",
                    "libtorch_cpu.so", "compute"),  # 3
        NativeFrame("at::native::AVX512::add_kernel(at::TensorIteratorBase&)", "libtorch_cpu.so", "compute"),  # 4
        NativeFrame("gomp_team_barrier_wait_end", "libgomp.so.1", "openmp"),  # 5
        NativeFrame("__memmove_avx512_unaligned_erms", "libc.so.6", "other"),  # 6
    ]
    stacks = [[], [0, 1], [2, 3], [4], [5], [6]]

    def count(stack: int, op: int, n: int) -> StackCount:
        return StackCount(stack=stack, path=0, thread=0, op=op, samples=n, cpu_ns=n * MS)

    return Stacks(frames=frames, stacks=stacks, counts=[
        count(1, engine_id, 40), count(5, engine_id, 10), count(4, engine_id, 10),  # 2/3 of its CPU in brgemm
        count(2, vllm_id, 45), count(4, vllm_id, 5),
        count(3, other_id, 60), count(5, other_id, 10),  # the add kernel and a barrier: not GEMM-like
    ])


def test_an_op_outside_the_table_mostly_in_gemm_kernels_is_listed_with_its_kernels() -> None:
    engine = op(1, "myengine::fused_linear", [t("bf16", 4, 512), t("i64")], 60 * MS, calls=20)
    onednn = op(2, "_C::onednn_mm", [t("bf16", 4, 3072), t("bf16", 4, 512), OpInput(kind="none"), t("i64")],
                50 * MS, calls=20)
    add = op(3, "aten::add", [t("bf16", 4, 512), t("bf16", 4, 512)], 70 * MS, calls=20)
    p = profile([engine, onednn, add], mode="sampled", stacks=gemm_kernel_stacks(1, 2, 3))
    summary = gemm_summary(p)
    assert summary is not None
    # the engine's op: never dropped, listed with its time and the kernels it ran
    assert [u.op.name for u in summary.unknown] == ["myengine::fused_linear"]
    unknown = summary.unknown[0]
    assert unknown.gemm_share == pytest.approx(40 / 60) and unknown.samples == 60
    assert "GEMM kernels" in unknown.reason
    assert unknown.kernels[0] == ("jit_brgemm_kernel_t (avx512_core)", 40 * MS)
    section = roofline_section(summary)
    assert section is not None
    listed = section.tables[1]
    assert listed.caption.startswith("GEMM-like, shape unknown")
    row = listed.rows[0]
    assert (row["op"], row["calls"], row["time"]) == ("myengine::fused_linear", 20, 60 * MS)
    assert row["kernels"].startswith("jit_brgemm_kernel_t (avx512_core) 67%")
    # vLLM's linear is in the table: a GEMM row of its own, judged, naming the kernel and its ISA
    group = only_group(p)
    assert group.op_names == ["_C::onednn_mm"] and group.work.n == 3072 and group.work.k == 512
    assert group.native is not None and group.native.kernel == "jit_brgemm_amx_uker_base_t (amx)"
    assert group.verdict.endswith("; kernel: jit_brgemm_amx_uker_base_t (amx)")


def test_the_kernels_isa_where_a_name_carries_it() -> None:
    from cpuprof.analysis.gemm_kernels import kernel_isa

    assert kernel_isa(["jit_brgemm_amx_uker_base_t"]) == "amx"
    assert kernel_isa(["mkl_blas_avx512_sgemm_kernel_0"]) == "avx512"
    assert kernel_isa(["jit_avx2_kernel_sgemm_kern"]) == "avx2"
    assert kernel_isa(["jit_avx512_core_gemv_bf16bf16f32_kern"]) == "avx512_core"
    assert kernel_isa(["at::native::AVX2::int8pack_mm_kernel_<c10::BFloat16>()"]) == "avx2"
    assert kernel_isa(["jit_brgemm_kernel_t", "brgemm_matmul_t<(cpu_isa_t)13168>::execute"]) is None
    assert kernel_isa(["dnnl::impl::cpu::x64::jit_uni_reorder_kernel_f32_t", "avxfoo"]) is None


def test_without_enough_samples_an_op_outside_the_table_is_not_called_a_gemm() -> None:
    engine = op(1, "myengine::fused_linear", None, 60 * MS)
    stacks = gemm_kernel_stacks(1, 2, 3)
    stacks.counts = [StackCount(stack=1, path=0, thread=0, op=1, samples=5, cpu_ns=5 * MS)]
    assert gemm_summary(profile([engine], mode="sampled", stacks=stacks)) is None


def test_weight_only_int8_and_int4_kernels_are_compute_not_repacking() -> None:
    frames = [NativeFrame("void at::native::(anonymous namespace)::tinygemm_kernel<1, 4>(…)", "libtorch_cpu.so",
                          "compute"),
              NativeFrame("at::native::(anonymous namespace)::int8pack_mm_kernel_<c10::BFloat16>(at::Tensor const&)",
                          "libtorch_cpu.so", "compute"),
              NativeFrame("at::native::_weight_int8pack_mm_cpu(at::Tensor const&)", "libtorch_cpu.so", "compute"),
              NativeFrame("[jit code at 0x7f0000001000]", "[jit]", "compute"),
              NativeFrame("dnnl::impl::cpu::x64::matmul::brgemm_matmul_t<(cpu_isa_t)13168>::execute(ctx const&) const",
                          "libdnnl.so.3", "compute")]
    int8 = op(1, "aten::_weight_int8pack_mm", [t("bf16", 1, 2048), t("i8", 8192, 2048), t("bf16", 8192)],
              100 * MS, calls=10)
    onednn = op(2, "_C::onednn_mm", [t("bf16", 1, 3072), t("bf16", 1, 512), OpInput(kind="none"), t("i64")],
                50 * MS, calls=10)
    stacks = Stacks(frames=frames, stacks=[[], [0, 1, 2], [3, 4]], counts=[
        StackCount(stack=1, path=0, thread=0, op=1, samples=100, cpu_ns=100 * MS),
        StackCount(stack=2, path=0, thread=0, op=2, samples=50, cpu_ns=50 * MS)])
    groups = {g.op_names[0]: g for g in gemm_groups(profile([int8, onednn], mode="sampled", stacks=stacks))}
    split = groups["aten::_weight_int8pack_mm"].native
    assert split is not None and split.share("repack") == 0 and split.share("compute") == 1
    assert split.kernel == "at::native::(…)::tinygemm_kernel<…>(…)"
    assert "repack" not in groups["aten::_weight_int8pack_mm"].verdict
    # JIT code without a perf map is named by the driver that runs it, not by its address
    onednn_split = groups["_C::onednn_mm"].native
    assert onednn_split is not None
    assert onednn_split.kernel == "unnamed JIT code under brgemm_matmul_t<…>::execute(…) const"


def test_the_isa_line_says_which_instruction_sets_the_gemms_ran_in_beside_what_the_cpu_has() -> None:
    """Known answer: 75 ms of samples in an MKL avx512 GEMV, 25 ms in ATen's int8 kernel (whose names
    carry no ISA); a CPU with AMX on which no sample was in an AMX kernel says so."""
    from profiles import make_profile

    frames = [NativeFrame("mkl_blas_avx512_gemv_bf16bf16f32_kernel_n", "libmkl.so", "compute"),
              NativeFrame("void at::native::(anonymous namespace)::tinygemm_kernel<1, 4>(…)", "libtorch_cpu.so",
                          "compute")]
    mm = op(1, "aten::mm", gemv_inputs(), 100 * MS, calls=10)
    int8 = op(2, "aten::_weight_int8pack_mm", [t("bf16", 1, 2048), t("i8", 8192, 2048), t("bf16", 8192)],
              100 * MS, calls=10)
    stacks = Stacks(frames=frames, stacks=[[], [0], [1]], counts=[
        StackCount(stack=1, path=0, thread=0, op=1, samples=300, cpu_ns=75 * MS),
        StackCount(stack=2, path=0, thread=0, op=2, samples=100, cpu_ns=25 * MS)])
    p = profile([mm, int8], mode="sampled", stacks=stacks)
    p.settings = make_profile().settings
    assert p.settings is not None
    p.settings.topology = dataclasses.replace(p.settings.topology,
                                              isa_flags=["avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16"])
    section = roofline_section(gemm_summary(p))
    assert section is not None
    (line,) = [line for line in section.lines if line.startswith("instruction sets")]
    assert line == ("instruction sets of the GEMMs' compute samples, by their kernels' names: avx512 75%; ISA not "
                    "visible 25% (kernels whose names carry none, as ATen's int8/int4 tinygemm); this CPU has avx2, "
                    "avx512f, avx512_bf16, amx_tile, amx_bf16 (/proc/cpuinfo); no sample was in an AMX kernel")
    rows = {row["ops"]: row["isa"] for row in section.tables[0].rows}
    assert rows == {"aten::mm": "avx512 100%", "aten::_weight_int8pack_mm": "not named 100%"}
    # A CPU without AMX says it has none; one whose flags were not read says so.
    p.settings.topology = dataclasses.replace(p.settings.topology, isa_flags=["avx2"])
    section = roofline_section(gemm_summary(p))
    assert section is not None and any(line.endswith("(/proc/cpuinfo); it has no AMX") for line in section.lines)


def test_isa_flags_are_read_from_cpuinfo(tmp_path) -> None:
    from cpuprof.machine.topology import _isa_flags

    x86 = "processor\t: 0\nflags\t\t: fpu sse4_2 avx avx2 fma avx512f avx512_vnni amx_int8 amx_tile ht\n"
    assert _isa_flags(x86) == ["sse4_2", "avx", "avx2", "fma", "avx512f", "avx512_vnni", "amx_tile", "amx_int8"]
    arm = "processor\t: 0\nFeatures\t: fp asimd evtstrm aes asimddp i8mm bf16 sve sve2\n"
    assert _isa_flags(arm) == ["asimd", "asimddp", "i8mm", "bf16", "sve", "sve2"]
    assert _isa_flags(None) == [] and _isa_flags("processor: 0\n") == []
