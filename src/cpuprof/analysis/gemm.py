"""The work of one GEMM-like op, from the shapes the dispatcher recorded: FLOPs, and the least
traffic any kernel needs for it (each operand read once, the output written once).

These are analytic figures, the same for every machine and every kernel: what the roofline
(``roofline.py``) divides the measured time by. An op whose shapes were not recorded, or do not
fit the op's signature, has no work (``None``), never a guess.

Which ops are GEMMs, and how to read each one, is one table (``GEMM_TABLE``): per op name, where
its activation, weight, output, bias and other operands are among its recorded inputs, the dtype
and element size of its weight where the recorded tensor does not say it (int4 packed in bytes; a
weight prepacked behind a handle, as vLLM's oneDNN linears keep theirs), and, for the few ops whose
work is not in their shapes at all, why. A handful of operand layouts (``_FORMS``) read every row.

Which op keys carry the work when GEMM-like ops nest (``aten::linear`` calls ``aten::addmm``,
``aten::matmul`` calls ``aten::mm`` or ``aten::bmm``): see ``COMPOSITE_OPS`` and ``roofline.py``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from ..model import OpInput, OpStat
from .labels import layout_mark

# Bytes per element of the dtypes the op hook names (csrc/sources/op_hook.cpp, short_dtype).
ELEMENT_BYTES = {
    "f64": 8, "f32": 4, "bf16": 2, "f16": 2, "f8e4m3": 1, "f8e5m2": 1,
    "i64": 8, "i32": 4, "i16": 2, "i8": 1, "u8": 1, "bool": 1, "qi8": 1, "qu8": 1,
    "c64": 8, "c128": 16,
}
# Weight dtypes no tensor carries (the hook records the bytes they are packed in): bytes per element.
PACKED_WEIGHT_BYTES = {"i4": 0.5}

# Marks the shape text gives the [k,n] operand, beside labels.layout_mark's 'ᵀ' (stored [n,k], as
# nn.Linear's weights) and '*' (other strides): a weight prepacked by oneDNN or MKL (opaque layout).
PACKED_MARK = "ᵖ"

# Ops that have no kernel of their own in torch 2.13 (CompositeImplicitAutograd: a test checks
# torch's registry): all their work runs in the GEMM-like ops they call, which are recorded as
# ops of their own. Their work is still computable (``gemm_work``), but the roofline counts it
# once, at the innermost GEMM-like op.
COMPOSITE_OPS = frozenset({
    "aten::linear",
    "aten::matmul",
    "aten::scaled_dot_product_attention",
    "aten::_scaled_dot_product_attention_math",  # bmm/matmul, softmax: its GEMMs are counted as bmm
})


@dataclass(frozen=True)
class GemmWork:
    """One call's work. For "gemm": ``batch`` products of [m,k] x [k,n]. For "attention": m is the
    query length, n the key length, k the head dimension, and batch is batch x query heads."""

    kind: str  # "gemm" or "attention"
    m: int
    n: int
    k: int
    batch: int
    flops: int
    bytes_min: int  # each input read once, the output written once
    weight_bytes: int  # the [k,n] operand (a weight, for linear); attention: the K and V read (the KV cache)
    dtype: str  # the activations' dtype: the compute roof it is judged against
    shape_text: str  # what makes two ops the same GEMM: shapes, layout of the [k,n] operand, bias
    weight_dtype: str = ""  # the [k,n] operand's dtype ("i4" for int4 packed in bytes); attention: the KV cache's
    weight_element_bytes: float = 0.0  # bytes per element of that operand (0.5 for int4)

    @property
    def intensity(self) -> float:
        """Arithmetic intensity, flop per byte of the least traffic."""
        return self.flops / self.bytes_min if self.bytes_min else 0.0


@dataclass(frozen=True)
class GemmOp:
    """One row of the table: how one op's recorded inputs give its GEMM. Positions index the op's
    recorded inputs (its schema's arguments, in order; an out argument such as vLLM's ``c`` is one)."""

    form: str  # how its operands are laid out: a key of _FORMS
    a: int = 0  # the activation: the [m,k] operand (for mv, the vector)
    b: int | None = 1  # the weight: the [k,n] operand; None: prepacked behind a handle, not an input
    out: int | None = None  # an output passed in (Tensor!): with the weight behind a handle, its shape gives n
    bias: int | None = None  # an optional tensor added to the product (or updated in place), read once
    reads: tuple[int, ...] = ()  # further tensors read once: scales, zero points, a fused operand
    # The weight's dtype where its recorded tensor does not say it: int4 packed in bytes, or a weight
    # behind a handle (None there: the activation's dtype, as the op computes in it).
    weight_dtype: str | None = None
    packed: bool = False  # the weight is in a kernel's blocked layout: n from its first dim, k from the activation
    out_dtype: str | None = None  # the output's dtype where it is not the activation's
    unknown: str | None = None  # why its work is not in its shapes at all: it is listed, never judged
    source: str = "torch"  # who registers it: "torch" (a test checks torch's registry) or "vllm"


class _Unreadable(Exception):
    """The recorded inputs do not fit the op's signature."""


@dataclass(frozen=True)
class _Tensor:
    dtype: str
    sizes: list[int]
    strides: list[int] | None

    @property
    def ndim(self) -> int:
        return len(self.sizes)

    @property
    def element_bytes(self) -> int:
        return ELEMENT_BYTES[self.dtype]

    @property
    def bytes(self) -> int:
        """Bytes in memory: a dimension expanded with stride 0 (a broadcast bias, GQA's repeated
        keys in the math path) is stored once and read once."""
        sizes = self.sizes
        strides = self.strides
        # mkldnn tensors report all-zero strides (they have none): count every element.
        if strides and len(strides) == len(sizes) and any(strides):
            sizes = [size for size, stride in zip(sizes, strides, strict=True) if stride != 0]
        return math.prod(sizes) * self.element_bytes

    def matrix_mark(self) -> str:
        """The layout of its last two dims: '' row-major, 'ᵀ' column-major, '*' other."""
        if self.ndim < 2 or not self.strides or len(self.strides) != self.ndim or not any(self.strides):
            return ""
        return layout_mark(self.sizes[-2:], self.strides[-2:])


def _tensor(inputs: list[OpInput], index: int, ndims: tuple[int, ...] | None = None) -> _Tensor:
    if index >= len(inputs):
        raise _Unreadable
    inp = inputs[index]
    if inp.kind != "tensor" or inp.sizes is None or inp.dtype not in ELEMENT_BYTES:
        raise _Unreadable
    if any(size < 0 for size in inp.sizes) or (ndims is not None and len(inp.sizes) not in ndims):
        raise _Unreadable
    return _Tensor(inp.dtype, list(inp.sizes), list(inp.strides) if inp.strides is not None else None)


def _optional_tensor(inputs: list[OpInput], index: int | None) -> _Tensor | None:
    """An optional tensor argument (a bias): None when absent or passed as None."""
    if index is None or index >= len(inputs) or inputs[index].kind in ("none", "undefined"):
        return None
    return _tensor(inputs, index)


def _extra_reads(spec: GemmOp, inputs: list[OpInput]) -> int:
    return sum(t.bytes for t in (_optional_tensor(inputs, i) for i in spec.reads) if t is not None)


def _gemm(a: _Tensor, b_shape_mark: str, m: int, n: int, k: int, batch: int, reads: int, weight_bytes: int,
          out_dtype: str | None = None, bias: _Tensor | None = None, weight_dtype: str | None = None,
          out_elements: int | None = None) -> GemmWork:
    """A GEMM's work: 2 m n k flops per product; ``reads`` are the input bytes besides the bias."""
    out_bytes = (out_elements if out_elements is not None else batch * m * n) * ELEMENT_BYTES[out_dtype or a.dtype]
    bias_bytes = bias.bytes if bias is not None else 0
    weight_dtype = weight_dtype or a.dtype
    text = f"[{m},{k}]{a.matrix_mark()}x[{k},{n}]{b_shape_mark}"
    if batch != 1:
        text = f"{batch}×{text}"
    if weight_dtype != a.dtype:
        text += f" ({weight_dtype} weight)"
    if bias is not None:
        text += " +bias"
    return GemmWork(kind="gemm", m=m, n=n, k=k, batch=batch, flops=2 * batch * m * n * k,
                    bytes_min=reads + bias_bytes + out_bytes, weight_bytes=weight_bytes, dtype=a.dtype,
                    shape_text=text, weight_dtype=weight_dtype, weight_element_bytes=_element_bytes(weight_dtype))


def _element_bytes(dtype: str) -> float:
    return PACKED_WEIGHT_BYTES.get(dtype) or float(ELEMENT_BYTES[dtype])


# -- the operand layouts every row of the table is read by -----------------------------------------


def _mm(spec: GemmOp, inputs: list[OpInput]) -> GemmWork:
    """a [m,k] x b [k,n] (mm, addmm, _int_mm)."""
    assert spec.b is not None
    a, b = _tensor(inputs, spec.a, (2,)), _tensor(inputs, spec.b, (2,))
    (m, k), (k2, n) = a.sizes, b.sizes
    if k != k2:
        raise _Unreadable
    return _gemm(a, b.matrix_mark(), m, n, k, 1, a.bytes + b.bytes + _extra_reads(spec, inputs), b.bytes,
                 out_dtype=spec.out_dtype, bias=_optional_tensor(inputs, spec.bias), weight_dtype=b.dtype)


def _bmm_of(spec: GemmOp, inputs: list[OpInput], reduce_batch: bool) -> GemmWork:
    assert spec.b is not None
    a, b = _tensor(inputs, spec.a, (3,)), _tensor(inputs, spec.b, (3,))
    (batch, m, k), (batch2, k2, n) = a.sizes, b.sizes
    if k != k2 or batch != batch2:
        raise _Unreadable
    # addbmm sums the products: its output is one [m,n].
    return _gemm(a, b.matrix_mark(), m, n, k, batch, a.bytes + b.bytes, b.bytes,
                 bias=_optional_tensor(inputs, spec.bias), weight_dtype=b.dtype,
                 out_elements=m * n if reduce_batch else None)


def _bmm(spec: GemmOp, inputs: list[OpInput]) -> GemmWork:
    """batch products of a [b,m,k] x b [b,k,n] (bmm, baddbmm)."""
    return _bmm_of(spec, inputs, reduce_batch=False)


def _bmm_sum(spec: GemmOp, inputs: list[OpInput]) -> GemmWork:
    """bmm whose products are summed into one [m,n] (addbmm)."""
    return _bmm_of(spec, inputs, reduce_batch=True)


def _mv(spec: GemmOp, inputs: list[OpInput]) -> GemmWork:
    """The matrix b [n,k] (the weight) times the vector a [k] (mv, addmv)."""
    assert spec.b is not None
    return _mv_of(_tensor(inputs, spec.b, (2,)), _tensor(inputs, spec.a, (1,)), _optional_tensor(inputs, spec.bias))


def _mv_of(mat: _Tensor, vec: _Tensor, bias: _Tensor | None) -> GemmWork:
    """mat [n,k] x vec [k]: a GEMV whose matrix is the weight, stored like nn.Linear's [out,in]."""
    if mat.ndim != 2 or vec.ndim != 1:
        raise _Unreadable
    (n, k), (k2,) = mat.sizes, vec.sizes
    if k != k2:
        raise _Unreadable
    weight_view = _Tensor(mat.dtype, [k, n], [mat.strides[1], mat.strides[0]] if mat.strides else None)
    return _gemm(vec, weight_view.matrix_mark(), 1, n, k, 1, mat.bytes + vec.bytes, mat.bytes, bias=bias)


def _linear_of(x: _Tensor, weight: _Tensor, bias: _Tensor | None, extra_reads: int = 0,
               packed: bool = False, weight_dtype: str | None = None, out_dtype: str | None = None) -> GemmWork:
    """input [..., k] x weight [n, k]ᵀ: the leading dims of the input are the GEMM's rows. A packed
    weight (a kernel's blocked layout, int4 packed two to a byte, padded) gives n by its first dim;
    k is the input's, and the least a kernel reads of it is n·k elements of the weight's dtype."""
    if x.ndim < 1 or weight.ndim != 2:
        raise _Unreadable
    n, k = weight.sizes
    m = math.prod(x.sizes[:-1])
    weight_dtype = weight_dtype or weight.dtype
    # oneDNN's prepacked weights are opaque tensors: they report all-zero strides.
    packed = packed or bool(weight.strides) and not any(weight.strides or [])
    if packed:
        k = x.sizes[-1]
        weight_bytes = math.ceil(n * k * _element_bytes(weight_dtype))
        mark = PACKED_MARK
    else:
        if x.sizes[-1] != k:
            raise _Unreadable
        weight_bytes = weight.bytes
        # The weight as the GEMM's [k,n] operand: nn.Linear's row-major [n,k] reads as transposed.
        view_strides = [weight.strides[1], weight.strides[0]] if weight.strides else None
        mark = _Tensor(weight.dtype, [k, n], view_strides).matrix_mark()
    x2 = _Tensor(x.dtype, [m, k], [k, 1])  # the rows as one matrix: contiguous for the shape text
    return _gemm(x2, mark, m, n, k, 1, x.bytes + weight_bytes + extra_reads, weight_bytes, bias=bias,
                 weight_dtype=weight_dtype, out_dtype=out_dtype)


def _linear(spec: GemmOp, inputs: list[OpInput]) -> GemmWork:
    """x [..., k] x weight [n,k]ᵀ (linear; int8/int4 weight-only GEMMs, whose scales are further reads)."""
    assert spec.b is not None
    return _linear_of(_tensor(inputs, spec.a), _tensor(inputs, spec.b, (2,)), _optional_tensor(inputs, spec.bias),
                      extra_reads=_extra_reads(spec, inputs), packed=spec.packed, weight_dtype=spec.weight_dtype,
                      out_dtype=spec.out_dtype)


def _linear_pointwise(spec: GemmOp, inputs: list[OpInput]) -> GemmWork:
    # Both overloads record the same name: (X, W, B?, attr, scalars, algorithm) and, fused with a
    # binary op, (X, other, W, B?, attr). The binary one has a 2-D weight third.
    third = inputs[2] if len(inputs) > 2 else None
    if third is not None and third.kind == "tensor" and third.sizes is not None and len(third.sizes) == 2:
        other = _tensor(inputs, 1)
        return _linear_of(_tensor(inputs, 0), _tensor(inputs, 2, (2,)), _optional_tensor(inputs, 3),
                          extra_reads=other.bytes)
    return _linear(spec, inputs)


def _handle(spec: GemmOp, inputs: list[OpInput]) -> GemmWork:
    """out [m,n] = a [m,k] x a weight prepacked behind a handle (vLLM's oneDNN linears: the weight is
    no input; its handle is an i64 scalar tensor). m and k come from the activation, n from the output
    (passed in as an argument), the weight's dtype from the table (else the activation's: the op
    computes in it). The weight the kernel reads is n·k elements of that dtype (its scales, held by
    the handle too, are not counted: n floats at most). With the weight an input in an opaque layout
    (``b``), its recorded dtype is the weight's."""
    a, out = _tensor(inputs, spec.a, (2,)), _tensor(inputs, spec.out if spec.out is not None else 0, (2,))
    (m, k), (m2, n) = a.sizes, out.sizes
    if m != m2:
        raise _Unreadable
    weight_dtype = spec.weight_dtype or (_tensor(inputs, spec.b).dtype if spec.b is not None else a.dtype)
    weight_bytes = math.ceil(n * k * _element_bytes(weight_dtype))
    return _gemm(a, PACKED_MARK, m, n, k, 1, a.bytes + weight_bytes + _extra_reads(spec, inputs), weight_bytes,
                 out_dtype=out.dtype, bias=_optional_tensor(inputs, spec.bias), weight_dtype=weight_dtype)


def _broadcast(a: list[int], b: list[int]) -> list[int]:
    out = []
    for i in range(1, max(len(a), len(b)) + 1):
        x = a[-i] if i <= len(a) else 1
        y = b[-i] if i <= len(b) else 1
        if x != y and 1 not in (x, y):
            raise _Unreadable
        out.append(max(x, y) if 0 not in (x, y) else 0)
    return list(reversed(out))


def _matmul(spec: GemmOp, inputs: list[OpInput]) -> GemmWork:
    """torch.matmul's rules: 1-D operands gain a dim of 1 (then lose it); an N-D first operand times
    a matrix folds its leading dims into rows (one mm); otherwise the batch dims broadcast (bmm),
    each operand still read once however often it is broadcast."""
    a, b = _tensor(inputs, 0), _tensor(inputs, 1)
    if a.ndim == 0 or b.ndim == 0:
        raise _Unreadable
    if b.ndim == 1 and a.ndim >= 2:
        # A matrix (leading dims folded into rows) times a vector: torch runs it as mv, whose
        # matrix is the weight; read it the same way so both group as one GEMV.
        rows = math.prod(a.sizes[:-1])
        mat = _Tensor(a.dtype, [rows, a.sizes[-1]], a.strides[-2:] if a.strides and a.ndim == 2 else None)
        return _mv_of(mat, b, None)
    k = a.sizes[-1]
    k2 = b.sizes[0] if b.ndim == 1 else b.sizes[-2]
    if k != k2:
        raise _Unreadable
    n = 1 if b.ndim == 1 else b.sizes[-1]
    b_mark = "" if b.ndim == 1 else b.matrix_mark()
    reads = a.bytes + b.bytes
    if b.ndim <= 2:
        m = math.prod(a.sizes[:-1])  # 1-D a: one row; N-D a: its leading dims fold into rows
        a2 = _Tensor(a.dtype, [m, k], a.strides[-2:] if a.ndim >= 2 and a.strides else None)
        return _gemm(a2, b_mark, m, n, k, 1, reads, b.bytes, weight_dtype=b.dtype)
    m = 1 if a.ndim == 1 else a.sizes[-2]
    batch_dims = _broadcast(a.sizes[:-2] if a.ndim >= 2 else [], b.sizes[:-2])
    batch = math.prod(batch_dims)
    a2 = _Tensor(a.dtype, [m, k], a.strides[-2:] if a.ndim >= 2 and a.strides else None)
    return _gemm(a2, b_mark, m, n, k, batch, reads, b.bytes, weight_dtype=b.dtype)


def _attention(spec: GemmOp, inputs: list[OpInput]) -> GemmWork:
    """Scaled dot-product attention: q [..., hq, Lq, d], k [..., hkv, Lk, d], v [..., hkv, Lk, dv].
    FLOPs: QKᵀ (2 Lq Lk d) and PV (2 Lq Lk dv) per query head; bytes: q, k and v read once (k and v
    are the KV cache: with GQA its hkv heads serve all hq query heads, so it is read at hkv heads),
    the output written once, and a mask or bias if one is passed. A causal mask's skipped blocks are
    not subtracted (the op's bool is not recorded): for prefill the FLOPs are an upper bound."""
    q, key, value = _tensor(inputs, 0), _tensor(inputs, 1), _tensor(inputs, 2)
    if not 2 <= q.ndim == key.ndim == value.ndim:
        raise _Unreadable
    lq, d = q.sizes[-2:]
    lk, d2 = key.sizes[-2:]
    lk2, dv = value.sizes[-2:]
    hq = q.sizes[-3] if q.ndim >= 3 else 1
    hkv = key.sizes[-3] if key.ndim >= 3 else 1
    batch = math.prod(q.sizes[:-3]) if q.ndim > 3 else 1
    if d != d2 or lk != lk2 or hkv <= 0 or hq % hkv:
        raise _Unreadable
    # Any further tensor of 2 dims or more is an attention mask or bias, read once.
    extra = 0
    for index in range(3, len(inputs)):
        if inputs[index].kind == "tensor":
            mask = _tensor(inputs, index)
            extra += mask.bytes if mask.ndim >= 2 else 0
    out_bytes = batch * hq * lq * dv * q.element_bytes
    flops = 2 * batch * hq * lq * lk * d + 2 * batch * hq * lq * lk * dv
    text = f"q[{batch},{hq},{lq},{d}] kv[{batch},{hkv},{lk},{d}]"
    if dv != d:
        text += f" dv {dv}"
    if extra:
        text += " +mask"
    return GemmWork(kind="attention", m=lq, n=lk, k=d, batch=batch * hq, flops=flops,
                    bytes_min=q.bytes + key.bytes + value.bytes + extra + out_bytes,
                    weight_bytes=key.bytes + value.bytes, dtype=q.dtype, shape_text=text,
                    weight_dtype=key.dtype, weight_element_bytes=float(key.element_bytes))


def _not_in_shapes(spec: GemmOp, inputs: list[OpInput]) -> GemmWork:
    raise _Unreadable


_FORMS: dict[str, Callable[[GemmOp, list[OpInput]], GemmWork]] = {
    "mm": _mm, "bmm": _bmm, "bmm_sum": _bmm_sum, "mv": _mv, "linear": _linear,
    "linear_pointwise": _linear_pointwise, "handle": _handle, "matmul": _matmul, "attention": _attention,
    "not_in_shapes": _not_in_shapes,
}

# vLLM's paged attention: q [tokens, hq, d] against a KV cache of [blocks, hkv, block size, d]. How
# many cached positions each sequence reads is a value (``seq_lens``), not a shape, and the hook
# records shapes only: its work is listed as not known rather than guessed from the cache's capacity.
_PAGED_KV = "its KV lengths are values (seq_lens), not shapes: the op hook records shapes only"

# Every op name whose work this module reads, and how: the names torch 2.13 records on CPU for matrix
# products (checked against torch's op registry in the tests), and vLLM 0.32's CPU ops (schemas read
# from its vllm._C: ``torch.ops._C.onednn_mm.default._schema``).
GEMM_TABLE: dict[str, GemmOp] = {
    "aten::mm": GemmOp("mm"),
    "aten::addmm": GemmOp("mm", a=1, b=2, bias=0),  # addmm(self, mat1, mat2): self, the bias, read once
    "aten::addmm_": GemmOp("mm", a=1, b=2, bias=0),
    "aten::_addmm_activation": GemmOp("mm", a=1, b=2, bias=0),  # addmm fused with GELU/ReLU (torch.compile)
    "aten::_int_mm": GemmOp("mm", out_dtype="i32"),  # int8 x int8 -> int32
    "aten::bmm": GemmOp("bmm"),
    "aten::baddbmm": GemmOp("bmm", a=1, b=2, bias=0),
    "aten::baddbmm_": GemmOp("bmm", a=1, b=2, bias=0),
    "aten::addbmm": GemmOp("bmm_sum", a=1, b=2, bias=0),
    "aten::addbmm_": GemmOp("bmm_sum", a=1, b=2, bias=0),
    "aten::mv": GemmOp("mv", a=1, b=0),  # mv(self: the matrix, vec)
    "aten::addmv": GemmOp("mv", a=2, b=1, bias=0),
    "aten::addmv_": GemmOp("mv", a=2, b=1, bias=0),
    "aten::linear": GemmOp("linear", bias=2),  # (input, weight [n,k], bias?)
    "aten::mkldnn_linear": GemmOp("linear", bias=2),
    "mkldnn::_linear_pointwise": GemmOp("linear_pointwise", bias=2),  # oneDNN linear (torch.compile, freezing)
    # mkl::_mkl_linear(X, MKL_W, ORI_W, B?, batch_size): MKL_W is an opaque packed buffer (padded for
    # the batch size); ORI_W [n,k] gives the shape, and the least a kernel must read.
    "mkl::_mkl_linear": GemmOp("linear", b=2, bias=3, packed=True),
    # (A [m,k], B int8 [n,k], scales [n]): the scales are read once too.
    "aten::_weight_int8pack_mm": GemmOp("linear", reads=(2,)),
    # (A [m,k], B u8 [n,k/2]: two int4 per byte, blocked by _convert_weight_to_int4pack_for_cpu,
    # qGroupSize, qScaleAndZeros [k/group,n,2]): n·k/2 bytes of weight, the scales and zeros read once.
    "aten::_weight_int4pack_mm_for_cpu": GemmOp("linear", reads=(3,), weight_dtype="i4", packed=True),
    "aten::matmul": GemmOp("matmul"),
    "aten::scaled_dot_product_attention": GemmOp("attention"),
    "aten::_scaled_dot_product_attention_math": GemmOp("attention"),
    "aten::_scaled_dot_product_flash_attention_for_cpu": GemmOp("attention"),
    "aten::_scaled_dot_product_flash_attention": GemmOp("attention"),
    "aten::_scaled_dot_product_efficient_attention": GemmOp("attention"),
    # vLLM's linear layers: onednn_mm(c [m,n] out, a [m,k], bias?, handler_tensor i64[]). The weight was
    # prepacked by create_onednn_mm_handler(weight [k,n]) in the activations' dtype (the model's).
    "_C::onednn_mm": GemmOp("handle", a=1, b=None, out=0, bias=2, source="vllm"),
    # Its int8 linears (W8A8): onednn_scaled_mm(c [m,n], a int8 [m,k], a_scales, azp?, azp_adj?, bias?,
    # handler_tensor): the weight is int8 (create_onednn_scaled_mm_handler quantizes nothing, it packs
    # the int8 [k,n] weight); the activation's scales and zero-point corrections are read once.
    "_C::onednn_scaled_mm": GemmOp("handle", a=1, b=None, out=0, bias=5, reads=(2, 3, 4), weight_dtype="i8",
                                   source="vllm"),
    # The sgl-kernel path (AMX machines): weight_packed_linear(out [m,n], mat1 [m,k], mat2 packed, bias?,
    # is_vnni): the packed weight's dtype is the weight's.
    "_C::weight_packed_linear": GemmOp("handle", a=1, b=2, out=0, bias=3, source="vllm"),
    "_C::cpu_attention_with_kv_cache": GemmOp("not_in_shapes", unknown=_PAGED_KV, source="vllm"),
}

GEMM_OPS = frozenset(GEMM_TABLE)


def is_gemm_like(name: str) -> bool:
    return name in GEMM_TABLE


def gemm_kind(name: str) -> str | None:
    """"gemm" or "attention" for an op in the table, None for any other."""
    spec = GEMM_TABLE.get(name)
    if spec is None:
        return None
    return "attention" if spec.form == "attention" or "attention" in name else "gemm"


def why_no_work(op: OpStat) -> str | None:
    """Why a GEMM-like op has no work figure; None when it has one (or is not GEMM-like)."""
    spec = GEMM_TABLE.get(op.name)
    if spec is None or gemm_work(op) is not None:
        return None
    if spec.unknown is not None:
        return spec.unknown
    if op.inputs is None:
        return "its shapes were not recorded"
    return "its recorded inputs do not fit the op's signature"


def gemm_work(op: OpStat) -> GemmWork | None:
    """One call's work, or None: not a GEMM-like op, shapes not recorded, shapes that do not fit
    the op's signature, or an op whose work is not in its shapes."""
    spec = GEMM_TABLE.get(op.name)
    if spec is None or op.inputs is None or spec.unknown is not None:
        return None
    try:
        work = _FORMS[spec.form](spec, op.inputs)
    except (_Unreadable, ValueError, IndexError, TypeError, KeyError):
        return None
    if work.flops <= 0 or work.bytes_min <= 0:
        return None  # an empty product: nothing to judge
    return work


__all__ = ["COMPOSITE_OPS", "ELEMENT_BYTES", "GEMM_OPS", "GEMM_TABLE", "GemmOp", "GemmWork", "gemm_kind",
           "gemm_work", "is_gemm_like", "why_no_work"]
