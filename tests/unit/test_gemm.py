"""The analytic work of GEMM-like ops: FLOPs and least bytes against counts written out by hand,
layouts that must not change them, and inputs that must give None rather than a guess."""

from __future__ import annotations

import random

import pytest
from profiles import tensor

from cpuprof.analysis.gemm import COMPOSITE_OPS, GEMM_OPS, GEMM_TABLE, GemmWork, gemm_work, why_no_work
from cpuprof.model import OpInput, OpStat

BF16, F32, I8, I32 = 2, 4, 1, 4  # bytes per element


t = tensor  # short: the tests write many inputs


def transposed(dtype: str, rows: int, cols: int) -> OpInput:
    """A [rows, cols] view of a row-major [cols, rows] matrix: w.t() of an nn.Linear weight."""
    return t(dtype, rows, cols, strides=[1, rows])


def scalar(kind: str) -> OpInput:
    return OpInput(kind=kind)


def op(name: str, *inputs: OpInput, calls: int = 1, self_ns: int = 1000) -> OpStat:
    return OpStat(id=1, kind="op", name=name, region=[], calls=calls, incl_ns=self_ns, self_ns=self_ns,
                  max_ns=self_ns, counters_self={}, counters_incl={}, inputs=list(inputs))


def work(name: str, *inputs: OpInput) -> GemmWork:
    w = gemm_work(op(name, *inputs))
    assert w is not None, f"{name} gave no work"
    return w


def test_mm() -> None:
    w = work("aten::mm", t("bf16", 4, 512), t("bf16", 512, 1024))
    assert (w.kind, w.m, w.k, w.n, w.batch, w.dtype) == ("gemm", 4, 512, 1024, 1, "bf16")
    assert w.flops == 2 * 4 * 1024 * 512
    a, b, out = 4 * 512, 512 * 1024, 4 * 1024
    assert w.bytes_min == (a + b + out) * BF16
    assert w.weight_bytes == 512 * 1024 * BF16
    assert w.intensity == pytest.approx(w.flops / w.bytes_min)
    assert w.shape_text == "[4,512]x[512,1024]"


def test_addmm_counts_the_bias_and_transposed_strides_change_no_count() -> None:
    w = work("aten::addmm", t("f32", 1024), t("f32", 8, 512), transposed("f32", 512, 1024), scalar("int"),
             scalar("int"))
    assert w.flops == 2 * 8 * 1024 * 512
    bias, a, b, out = 1024, 8 * 512, 512 * 1024, 8 * 1024
    assert w.bytes_min == (bias + a + b + out) * F32
    assert w.weight_bytes == b * F32
    assert w.shape_text == "[8,512]x[512,1024]ᵀ +bias"
    row_major = work("aten::addmm", t("f32", 1024), t("f32", 8, 512), t("f32", 512, 1024))
    assert (row_major.flops, row_major.bytes_min) == (w.flops, w.bytes_min)
    assert row_major.shape_text != w.shape_text  # a different layout is a different GEMM to group


def test_a_broadcast_bias_is_read_once() -> None:
    # bias.expand(8, 1024): stride 0 along the rows, 1024 elements in memory.
    w = work("aten::addmm", t("f32", 8, 1024, strides=[0, 1]), t("f32", 8, 512), t("f32", 512, 1024))
    assert w.bytes_min == (1024 + 8 * 512 + 512 * 1024 + 8 * 1024) * F32


def test_bmm() -> None:
    w = work("aten::bmm", t("bf16", 6, 4, 16), t("bf16", 6, 16, 8))
    assert (w.batch, w.m, w.k, w.n) == (6, 4, 16, 8)
    assert w.flops == 2 * 6 * 4 * 8 * 16
    assert w.bytes_min == (6 * 4 * 16 + 6 * 16 * 8 + 6 * 4 * 8) * BF16
    assert w.shape_text == "6×[4,16]x[16,8]"


def test_baddbmm() -> None:
    w = work("aten::baddbmm", t("f32", 2, 4, 8), t("f32", 2, 4, 16), t("f32", 2, 16, 8), scalar("int"), scalar("int"))
    assert w.flops == 2 * 2 * 4 * 8 * 16
    bias, a, b, out = 2 * 4 * 8, 2 * 4 * 16, 2 * 16 * 8, 2 * 4 * 8
    assert w.bytes_min == (bias + a + b + out) * F32


def test_addbmm_sums_the_batch_into_one_output() -> None:
    w = work("aten::addbmm", t("f32", 4, 8), t("f32", 2, 4, 16), t("f32", 2, 16, 8), scalar("int"), scalar("int"))
    assert w.flops == 2 * 2 * 4 * 8 * 16
    bias, a, b, out = 4 * 8, 2 * 4 * 16, 2 * 16 * 8, 4 * 8
    assert w.bytes_min == (bias + a + b + out) * F32


def test_linear_with_bias_decode_gemv() -> None:
    w = work("aten::linear", t("bf16", 1, 2048), t("bf16", 8192, 2048), t("bf16", 8192))
    assert (w.m, w.k, w.n) == (1, 2048, 8192)
    assert w.flops == 2 * 1 * 8192 * 2048
    x, weight, bias, out = 2048, 8192 * 2048, 8192, 8192
    assert w.bytes_min == (x + weight + bias + out) * BF16
    assert w.weight_bytes == weight * BF16
    # nn.Linear's [out, in] weight is the GEMM's [k, n] operand stored transposed.
    assert w.shape_text == "[1,2048]x[2048,8192]ᵀ +bias"


def test_linear_batched_3d_input_folds_leading_dims_into_rows() -> None:
    w = work("aten::linear", t("bf16", 2, 5, 512), t("bf16", 1024, 512), scalar("none"))
    assert (w.m, w.k, w.n, w.batch) == (2 * 5, 512, 1024, 1)
    assert w.flops == 2 * 10 * 1024 * 512
    assert w.bytes_min == (10 * 512 + 1024 * 512 + 10 * 1024) * BF16
    # the same GEMM as the addmm/mm torch runs for it, so they group together
    inner = work("aten::mm", t("bf16", 10, 512), transposed("bf16", 512, 1024))
    assert (inner.shape_text, inner.flops, inner.bytes_min) == (w.shape_text, w.flops, w.bytes_min)


def test_matmul_3d_by_2d_is_one_mm() -> None:
    w = work("aten::matmul", t("f32", 2, 5, 512), t("f32", 512, 1024))
    assert (w.m, w.k, w.n, w.batch) == (10, 512, 1024, 1)
    assert w.flops == 2 * 10 * 1024 * 512
    assert w.bytes_min == (10 * 512 + 512 * 1024 + 10 * 1024) * F32
    assert w.shape_text == "[10,512]x[512,1024]"


def test_matmul_broadcasts_batch_dims_and_reads_each_operand_once() -> None:
    w = work("aten::matmul", t("f32", 2, 3, 4, 16), t("f32", 1, 3, 16, 8))
    assert (w.batch, w.m, w.k, w.n) == (2 * 3, 4, 16, 8)
    assert w.flops == 2 * 6 * 4 * 8 * 16
    a, b, out = 2 * 3 * 4 * 16, 1 * 3 * 16 * 8, 6 * 4 * 8
    assert w.bytes_min == (a + b + out) * F32
    # a matrix times a batch: the matrix is read once
    w = work("aten::matmul", t("f32", 4, 16), t("f32", 2, 3, 16, 8))
    assert w.bytes_min == (4 * 16 + 2 * 3 * 16 * 8 + 6 * 4 * 8) * F32


def test_matrix_times_vector_reads_like_mv() -> None:
    mv = work("aten::mv", t("f32", 1024, 512), t("f32", 512))
    assert (mv.m, mv.k, mv.n) == (1, 512, 1024)
    assert mv.flops == 2 * 1024 * 512
    assert mv.bytes_min == (1024 * 512 + 512 + 1024) * F32
    assert mv.weight_bytes == 1024 * 512 * F32
    matmul = work("aten::matmul", t("f32", 1024, 512), t("f32", 512))
    assert (matmul.shape_text, matmul.flops, matmul.bytes_min) == (mv.shape_text, mv.flops, mv.bytes_min)
    addmv = work("aten::addmv", t("f32", 1024), t("f32", 1024, 512), t("f32", 512), scalar("int"), scalar("int"))
    assert addmv.bytes_min == mv.bytes_min + 1024 * F32


def test_sdpa_with_gqa_reads_the_kv_cache_at_its_kv_heads() -> None:
    # Llama-3.2-1B decode: 32 query heads share 8 KV heads, one new token against 512 cached.
    b, hq, hkv, lq, lk, d = 1, 32, 8, 1, 512, 64
    w = work("aten::_scaled_dot_product_flash_attention_for_cpu", t("bf16", b, hq, lq, d), t("bf16", b, hkv, lk, d),
             t("bf16", b, hkv, lk, d), scalar("float"), scalar("bool"), scalar("none"), scalar("none"))
    assert w.kind == "attention"
    qk = 2 * b * hq * lq * lk * d
    pv = 2 * b * hq * lq * lk * d
    assert w.flops == qk + pv
    q, k, v, out = b * hq * lq * d, b * hkv * lk * d, b * hkv * lk * d, b * hq * lq * d
    assert w.bytes_min == (q + k + v + out) * BF16
    assert w.weight_bytes == (k + v) * BF16
    assert w.shape_text == "q[1,32,1,64] kv[1,8,512,64]"
    # the public op has the same work (the roofline counts only the one that does it)
    outer = work("aten::scaled_dot_product_attention", t("bf16", b, hq, lq, d), t("bf16", b, hkv, lk, d),
                 t("bf16", b, hkv, lk, d), scalar("none"), scalar("float"), scalar("bool"), scalar("none"),
                 scalar("bool"))
    assert (outer.flops, outer.bytes_min) == (w.flops, w.bytes_min)


def test_sdpa_mask_and_value_dim() -> None:
    b, h, lq, lk, d, dv = 2, 4, 16, 16, 32, 48
    w = work("aten::scaled_dot_product_attention", t("f32", b, h, lq, d), t("f32", b, h, lk, d),
             t("f32", b, h, lk, dv), t("f32", lq, lk), scalar("float"), scalar("bool"))
    assert w.flops == 2 * b * h * lq * lk * d + 2 * b * h * lq * lk * dv
    q, k, v, mask, out = b * h * lq * d, b * h * lk * d, b * h * lk * dv, lq * lk, b * h * lq * dv
    assert w.bytes_min == (q + k + v + mask + out) * F32
    assert w.shape_text.endswith("dv 48 +mask")


def test_onednn_and_mkl_linears() -> None:
    x, weight = t("bf16", 4, 512), t("bf16", 1024, 512)
    plain = work("mkldnn::_linear_pointwise", x, weight, scalar("none"), scalar("other"), scalar("other"),
                 scalar("other"))
    assert plain.flops == 2 * 4 * 1024 * 512
    assert plain.bytes_min == (4 * 512 + 1024 * 512 + 4 * 1024) * BF16
    assert plain.shape_text == "[4,512]x[512,1024]ᵀ"
    # a weight prepacked by oneDNN is an opaque tensor: all-zero strides
    packed = work("mkldnn::_linear_pointwise", x, t("bf16", 1024, 512, strides=[0, 0]), scalar("none"),
                  scalar("other"), scalar("other"), scalar("other"))
    assert (packed.flops, packed.bytes_min) == (plain.flops, plain.bytes_min)
    assert packed.shape_text == "[4,512]x[512,1024]ᵖ"
    # the binary overload: (X, other, W, B, attr), the other operand read once
    binary = work("mkldnn::_linear_pointwise", x, t("bf16", 4, 1024), weight, scalar("none"), scalar("other"))
    assert binary.bytes_min == plain.bytes_min + 4 * 1024 * BF16
    # MKL's packed buffer is opaque and padded: the original weight gives the least bytes
    mkl = work("mkl::_mkl_linear", t("f32", 4, 512), t("f32", 1786913, 1, strides=[1, 1]), t("f32", 1024, 512),
               t("f32", 1024), scalar("int"))
    assert mkl.bytes_min == (4 * 512 + 1024 * 512 + 1024 + 4 * 1024) * F32
    assert mkl.shape_text == "[4,512]x[512,1024]ᵖ +bias"


def test_integer_and_int8_weight_gemms() -> None:
    w = work("aten::_int_mm", t("i8", 32, 64), t("i8", 64, 16))
    assert w.bytes_min == (32 * 64 + 64 * 16) * I8 + 32 * 16 * I32
    w = work("aten::_weight_int8pack_mm", t("bf16", 1, 2048), t("i8", 8192, 2048), t("bf16", 8192))
    assert w.flops == 2 * 8192 * 2048
    assert w.bytes_min == 2048 * BF16 + 8192 * 2048 * I8 + 8192 * BF16 + 8192 * BF16
    assert w.weight_bytes == 8192 * 2048 * I8
    assert "(i8 weight)" in w.shape_text


def test_int4_weight_gemm_reads_half_a_byte_per_weight() -> None:
    # x [8,1024] against an int4 [2048,1024] weight, packed two to a byte by
    # _convert_weight_to_int4pack_for_cpu (u8 [2048,512]); groups of 64: scales and zeros [16,2048,2].
    m, n, k, group = 8, 2048, 1024, 64
    w = work("aten::_weight_int4pack_mm_for_cpu", t("bf16", m, k), t("u8", n, k // 2), scalar("int"),
             t("bf16", k // group, n, 2))
    assert (w.m, w.n, w.k, w.dtype, w.weight_dtype, w.weight_element_bytes) == (m, n, k, "bf16", "i4", 0.5)
    assert w.flops == 2 * m * n * k
    assert w.weight_bytes == n * k // 2
    assert w.bytes_min == m * k * BF16 + n * k // 2 + (k // group) * n * 2 * BF16 + m * n * BF16
    assert w.shape_text == "[8,1024]x[1024,2048]ᵖ (i4 weight)"


def test_vllm_onednn_mm_reads_n_from_the_output_and_the_weight_behind_its_handle() -> None:
    # As recorded in a vLLM decode: onednn_mm(c bf16[4,3072], a bf16[4,512], bias None, handler i64[]).
    m, n, k = 4, 3072, 512
    w = work("_C::onednn_mm", t("bf16", m, n), t("bf16", m, k), scalar("none"), t("i64"))
    assert (w.kind, w.m, w.n, w.k, w.batch) == ("gemm", m, n, k, 1)
    assert w.flops == 2 * m * n * k
    # the prepacked weight: n·k elements of the activations' dtype (vLLM packs the model's weight as is)
    assert (w.weight_dtype, w.weight_element_bytes, w.weight_bytes) == ("bf16", 2, n * k * BF16)
    assert w.bytes_min == (m * k + n * k + m * n) * BF16
    assert w.shape_text == "[4,512]x[512,3072]ᵖ"
    with_bias = work("_C::onednn_mm", t("bf16", m, n), t("bf16", m, k), t("bf16", n), t("i64"))
    assert with_bias.bytes_min == w.bytes_min + n * BF16 and with_bias.shape_text.endswith(" +bias")
    # an output whose rows are not the activation's: not this op's signature
    assert gemm_work(op("_C::onednn_mm", t("bf16", 5, n), t("bf16", m, k), scalar("none"), t("i64"))) is None


def test_vllm_onednn_scaled_mm_has_an_int8_weight() -> None:
    # W8A8: c bf16[4,3072], a i8[4,512], a_scales f32[4,1], azp None, azp_adj None, bias None, handler.
    m, n, k = 4, 3072, 512
    w = work("_C::onednn_scaled_mm", t("bf16", m, n), t("i8", m, k), t("f32", m, 1), scalar("none"),
             scalar("none"), scalar("none"), t("i64"))
    assert (w.m, w.n, w.k, w.dtype, w.weight_dtype) == (m, n, k, "i8", "i8")
    assert w.flops == 2 * m * n * k
    assert w.weight_bytes == n * k * I8
    assert w.bytes_min == m * k * I8 + n * k * I8 + m * F32 + m * n * BF16


def test_vllm_paged_attention_is_listed_with_why_its_work_is_unknown() -> None:
    stat = op("_C::cpu_attention_with_kv_cache", t("bf16", 4, 8, 64), t("bf16", 100, 4, 16, 64),
              t("bf16", 100, 4, 16, 64), t("bf16", 4, 8, 64), t("i32", 5), t("i32", 4), scalar("float"))
    assert gemm_work(stat) is None
    reason = why_no_work(stat)
    assert reason is not None and "seq_lens" in reason
    assert why_no_work(op("aten::mm", t("bf16", 4, 512), t("bf16", 512, 8))) is None
    no_shapes = op("aten::mm")
    no_shapes.inputs = None
    assert why_no_work(no_shapes) == "its shapes were not recorded"


@pytest.mark.parametrize("inputs", [
    None,
    [],
    [t("bf16", 4, 512)],
    [t("bf16", 4, 512), t("bf16", 256, 1024)],  # inner dims differ
    [OpInput(kind="unknown_shape", dtype="bf16"), t("bf16", 512, 1024)],
    [t("other", 4, 512), t("other", 512, 1024)],  # an element size we do not know
    [t("bf16", 4, 512, 1), t("bf16", 512, 1024)],  # mm takes matrices
    [OpInput(kind="tensor", dtype="bf16", sizes=None), t("bf16", 512, 1024)],
    [scalar("none"), t("bf16", 512, 1024)],
    [t("bf16", 0, 512), t("bf16", 512, 1024)],  # an empty product: no work to judge
])
def test_unreadable_inputs_give_none(inputs: list[OpInput] | None) -> None:
    stat = op("aten::mm")
    stat.inputs = inputs
    assert gemm_work(stat) is None


def test_ops_that_are_not_gemms_give_none() -> None:
    assert gemm_work(op("aten::add", t("bf16", 4, 512), t("bf16", 4, 512))) is None
    assert gemm_work(op("aten::scaled_dot_product_attention", t("bf16", 1, 32, 1, 64), t("bf16", 1, 5, 512, 64),
                        t("bf16", 1, 5, 512, 64))) is None  # 32 query heads cannot share 5 KV heads


def test_random_inputs_never_raise() -> None:
    rng = random.Random(7)
    kinds = ["tensor", "tensor", "tensor", "none", "int", "unknown_shape", "tensor_list", "undefined"]
    dtypes = ["bf16", "f32", "i64", "other", None]
    for _ in range(3000):
        inputs = []
        for _ in range(rng.randint(0, 6)):
            kind = rng.choice(kinds)
            ndim = rng.randint(0, 5)
            sizes = [rng.choice([0, 1, 2, 3, 4, 16, -1]) for _ in range(ndim)] if rng.random() < 0.9 else None
            strides = [rng.choice([0, 1, 4, 16]) for _ in range(rng.choice([ndim, ndim, 1]))] \
                if rng.random() < 0.8 else None
            inputs.append(OpInput(kind=kind, dtype=rng.choice(dtypes), sizes=sizes, strides=strides))
        stat = op(rng.choice(sorted(GEMM_OPS)), *inputs)
        result = gemm_work(stat)
        assert result is None or (result.flops > 0 and result.bytes_min > 0)


def test_op_names_are_real_torch_ops_and_composites_have_no_kernel() -> None:
    torch = pytest.importorskip("torch")
    known = set(torch._C._dispatch_get_all_op_names())
    torch_ops = {name for name, spec in GEMM_TABLE.items() if spec.source == "torch"}
    assert torch_ops <= known, sorted(torch_ops - known)
    for name in torch_ops:
        composite = torch._C._dispatch_has_kernel_for_dispatch_key(name, "CompositeImplicitAutograd")
        assert composite == (name in COMPOSITE_OPS), name


# The arguments each vLLM row reads, by name, from vLLM 0.32's schemas (vllm._C): a test against the
# installed vLLM checks them where vLLM can be imported.
VLLM_ARGUMENTS = {
    "_C::onednn_mm": {"a": "a", "out": "c", "bias": "bias"},
    "_C::onednn_scaled_mm": {"a": "a", "out": "c", "bias": "bias", "reads": ("a_scales", "azp", "azp_adj")},
    "_C::weight_packed_linear": {"a": "mat1", "b": "mat2", "out": "out", "bias": "bias"},
    "_C::cpu_attention_with_kv_cache": {},
}


def test_the_vllm_rows_read_the_arguments_their_schemas_name() -> None:
    assert {name for name, spec in GEMM_TABLE.items() if spec.source == "vllm"} == set(VLLM_ARGUMENTS)
    # vllm._C registers the ops; importing it needs vLLM's own package (not installed in every test
    # environment: CI may add it).
    pytest.importorskip("vllm._C", reason="vLLM's CPU backend is not installed here: its op schemas cannot be read")
    import torch

    for name, fields in VLLM_ARGUMENTS.items():
        namespace, op_name = name.split("::")
        schema = getattr(getattr(torch.ops, namespace), op_name).default._schema
        arguments = [argument.name for argument in schema.arguments]
        spec = GEMM_TABLE[name]
        for field, expected in fields.items():
            position = getattr(spec, field)
            if isinstance(expected, tuple):
                assert tuple(arguments[i] for i in position) == expected, (name, field, arguments)
            else:
                assert arguments[position] == expected, (name, field, arguments)
