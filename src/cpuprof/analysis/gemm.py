"""The work of one GEMM-like op, from the shapes the dispatcher recorded: FLOPs, and the least
traffic any kernel needs for it (each operand read once, the output written once).

These are analytic figures, the same for every machine and every kernel: what the roofline
(``roofline.py``) divides the measured time by. An op whose shapes were not recorded, or do not
fit the op's signature, has no work (``None``), never a guess.

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

    @property
    def intensity(self) -> float:
        """Arithmetic intensity, flop per byte of the least traffic."""
        return self.flops / self.bytes_min if self.bytes_min else 0.0


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


class _Unreadable(Exception):
    """The recorded inputs do not fit the op's signature."""


def _tensor(inputs: list[OpInput], index: int, ndims: tuple[int, ...] | None = None) -> _Tensor:
    if index >= len(inputs):
        raise _Unreadable
    inp = inputs[index]
    if inp.kind != "tensor" or inp.sizes is None or inp.dtype not in ELEMENT_BYTES:
        raise _Unreadable
    if any(size < 0 for size in inp.sizes) or (ndims is not None and len(inp.sizes) not in ndims):
        raise _Unreadable
    return _Tensor(inp.dtype, list(inp.sizes), list(inp.strides) if inp.strides is not None else None)


def _optional_tensor(inputs: list[OpInput], index: int) -> _Tensor | None:
    """An optional tensor argument (a bias): None when absent or passed as None."""
    if index >= len(inputs) or inputs[index].kind in ("none", "undefined"):
        return None
    return _tensor(inputs, index)


def _gemm(a: _Tensor, b_shape_mark: str, m: int, n: int, k: int, batch: int, reads: int, weight_bytes: int,
          out_dtype: str | None = None, bias: _Tensor | None = None, weight_dtype: str | None = None,
          out_elements: int | None = None) -> GemmWork:
    """A GEMM's work: 2 m n k flops per product; ``reads`` are the input bytes besides the bias."""
    out_bytes = (out_elements if out_elements is not None else batch * m * n) * ELEMENT_BYTES[out_dtype or a.dtype]
    bias_bytes = bias.bytes if bias is not None else 0
    text = f"[{m},{k}]{a.matrix_mark()}x[{k},{n}]{b_shape_mark}"
    if batch != 1:
        text = f"{batch}×{text}"
    if weight_dtype is not None and weight_dtype != a.dtype:
        text += f" ({weight_dtype} weight)"
    if bias is not None:
        text += " +bias"
    return GemmWork(kind="gemm", m=m, n=n, k=k, batch=batch, flops=2 * batch * m * n * k,
                    bytes_min=reads + bias_bytes + out_bytes, weight_bytes=weight_bytes, dtype=a.dtype,
                    shape_text=text)


def _mm(inputs: list[OpInput], first: int = 0, bias: _Tensor | None = None, out_dtype: str | None = None) -> GemmWork:
    a, b = _tensor(inputs, first, (2,)), _tensor(inputs, first + 1, (2,))
    (m, k), (k2, n) = a.sizes, b.sizes
    if k != k2:
        raise _Unreadable
    return _gemm(a, b.matrix_mark(), m, n, k, 1, a.bytes + b.bytes, b.bytes, out_dtype=out_dtype, bias=bias,
                 weight_dtype=b.dtype)


def _addmm(inputs: list[OpInput]) -> GemmWork:
    # addmm(self, mat1, mat2): self (the bias, or the matrix updated in place) is read once.
    return _mm(inputs, first=1, bias=_optional_tensor(inputs, 0))


def _bmm(inputs: list[OpInput], first: int = 0, bias: _Tensor | None = None, reduce_batch: bool = False) -> GemmWork:
    a, b = _tensor(inputs, first, (3,)), _tensor(inputs, first + 1, (3,))
    (batch, m, k), (batch2, k2, n) = a.sizes, b.sizes
    if k != k2 or batch != batch2:
        raise _Unreadable
    # addbmm sums the products: its output is one [m,n].
    return _gemm(a, b.matrix_mark(), m, n, k, batch, a.bytes + b.bytes, b.bytes, bias=bias, weight_dtype=b.dtype,
                 out_elements=m * n if reduce_batch else None)


def _baddbmm(inputs: list[OpInput]) -> GemmWork:
    return _bmm(inputs, first=1, bias=_optional_tensor(inputs, 0))


def _addbmm(inputs: list[OpInput]) -> GemmWork:
    return _bmm(inputs, first=1, bias=_optional_tensor(inputs, 0), reduce_batch=True)


def _mv(inputs: list[OpInput], first: int = 0, bias: _Tensor | None = None) -> GemmWork:
    return _mv_of(_tensor(inputs, first, (2,)), _tensor(inputs, first + 1, (1,)), bias)


def _mv_of(mat: _Tensor, vec: _Tensor, bias: _Tensor | None) -> GemmWork:
    """mat [n,k] x vec [k]: a GEMV whose matrix is the weight, stored like nn.Linear's [out,in]."""
    if mat.ndim != 2 or vec.ndim != 1:
        raise _Unreadable
    (n, k), (k2,) = mat.sizes, vec.sizes
    if k != k2:
        raise _Unreadable
    weight_view = _Tensor(mat.dtype, [k, n], [mat.strides[1], mat.strides[0]] if mat.strides else None)
    return _gemm(vec, weight_view.matrix_mark(), 1, n, k, 1, mat.bytes + vec.bytes, mat.bytes, bias=bias)


def _addmv(inputs: list[OpInput]) -> GemmWork:
    return _mv(inputs, first=1, bias=_optional_tensor(inputs, 0))


def _linear_of(x: _Tensor, weight: _Tensor, bias: _Tensor | None, extra_reads: int = 0,
               packed: bool = False) -> GemmWork:
    """input [..., k] x weight [n, k]ᵀ: the leading dims of the input are the GEMM's rows."""
    if x.ndim < 1 or weight.ndim != 2:
        raise _Unreadable
    n, k = weight.sizes
    if x.sizes[-1] != k:
        raise _Unreadable
    m = math.prod(x.sizes[:-1])
    # oneDNN's prepacked weights are opaque tensors: they report all-zero strides.
    packed = packed or bool(weight.strides) and not any(weight.strides or [])
    if packed:
        mark = PACKED_MARK
    else:
        # The weight as the GEMM's [k,n] operand: nn.Linear's row-major [n,k] reads as transposed.
        view_strides = [weight.strides[1], weight.strides[0]] if weight.strides else None
        mark = _Tensor(weight.dtype, [k, n], view_strides).matrix_mark()
    x2 = _Tensor(x.dtype, [m, k], [k, 1])  # the rows as one matrix: contiguous for the shape text
    return _gemm(x2, mark, m, n, k, 1, x.bytes + weight.bytes + extra_reads, weight.bytes, bias=bias,
                 weight_dtype=weight.dtype)


def _linear(inputs: list[OpInput]) -> GemmWork:
    # aten::linear, aten::mkldnn_linear (input, weight, bias?)
    return _linear_of(_tensor(inputs, 0), _tensor(inputs, 1, (2,)), _optional_tensor(inputs, 2))


def _linear_pointwise(inputs: list[OpInput]) -> GemmWork:
    # Both overloads record the same name: (X, W, B?, attr, scalars, algorithm) and, fused with a
    # binary op, (X, other, W, B?, attr). The binary one has a 2-D weight third.
    third = inputs[2] if len(inputs) > 2 else None
    if third is not None and third.kind == "tensor" and third.sizes is not None and len(third.sizes) == 2:
        other = _tensor(inputs, 1)
        return _linear_of(_tensor(inputs, 0), _tensor(inputs, 2, (2,)), _optional_tensor(inputs, 3),
                          extra_reads=other.bytes)
    return _linear(inputs)


def _mkl_linear(inputs: list[OpInput]) -> GemmWork:
    # mkl::_mkl_linear(X, MKL_W, ORI_W, B?, batch_size): MKL_W is an opaque packed buffer (padded
    # for the batch size); ORI_W [n,k] gives the shape, and the least a kernel must read.
    return _linear_of(_tensor(inputs, 0), _tensor(inputs, 2, (2,)), _optional_tensor(inputs, 3), packed=True)


def _weight_int8pack_mm(inputs: list[OpInput]) -> GemmWork:
    # (A [m,k], B int8 [n,k], scales [n]): the scales are read once too.
    return _linear_of(_tensor(inputs, 0, (2,)), _tensor(inputs, 1, (2,)), None,
                      extra_reads=_tensor(inputs, 2).bytes)


def _int_mm(inputs: list[OpInput]) -> GemmWork:
    return _mm(inputs, out_dtype="i32")


def _broadcast(a: list[int], b: list[int]) -> list[int]:
    out = []
    for i in range(1, max(len(a), len(b)) + 1):
        x = a[-i] if i <= len(a) else 1
        y = b[-i] if i <= len(b) else 1
        if x != y and 1 not in (x, y):
            raise _Unreadable
        out.append(max(x, y) if 0 not in (x, y) else 0)
    return list(reversed(out))


def _matmul(inputs: list[OpInput]) -> GemmWork:
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


def _attention(inputs: list[OpInput]) -> GemmWork:
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
                    weight_bytes=key.bytes + value.bytes, dtype=q.dtype, shape_text=text)


# Every op name whose work this module reads, by how it reads its inputs: the names torch 2.13
# records on CPU for matrix products (checked against torch's op registry in the tests).
_READERS: dict[str, Callable[[list[OpInput]], GemmWork]] = {
    "aten::mm": _mm,
    "aten::addmm": _addmm,
    "aten::addmm_": _addmm,
    "aten::_addmm_activation": _addmm,  # addmm fused with GELU/ReLU (torch.compile)
    "aten::bmm": _bmm,
    "aten::baddbmm": _baddbmm,
    "aten::baddbmm_": _baddbmm,
    "aten::addbmm": _addbmm,
    "aten::addbmm_": _addbmm,
    "aten::mv": _mv,
    "aten::addmv": _addmv,
    "aten::addmv_": _addmv,
    "aten::_int_mm": _int_mm,
    "aten::linear": _linear,
    "aten::mkldnn_linear": _linear,
    "mkldnn::_linear_pointwise": _linear_pointwise,  # oneDNN linear (torch.compile with freezing)
    "mkl::_mkl_linear": _mkl_linear,  # MKL-packed f32 weights (torch.compile with freezing)
    "aten::_weight_int8pack_mm": _weight_int8pack_mm,
    "aten::matmul": _matmul,
    "aten::scaled_dot_product_attention": _attention,
    "aten::_scaled_dot_product_attention_math": _attention,
    "aten::_scaled_dot_product_flash_attention_for_cpu": _attention,
    "aten::_scaled_dot_product_flash_attention": _attention,
    "aten::_scaled_dot_product_efficient_attention": _attention,
}

GEMM_OPS = frozenset(_READERS)


def is_gemm_like(name: str) -> bool:
    return name in _READERS


def gemm_work(op: OpStat) -> GemmWork | None:
    """One call's work, or None: not a GEMM-like op, shapes not recorded, or shapes that do not fit
    the op's signature."""
    reader = _READERS.get(op.name)
    if reader is None or op.inputs is None:
        return None
    try:
        work = reader(op.inputs)
    except (_Unreadable, ValueError, IndexError, TypeError, KeyError):
        return None
    if work.flops <= 0 or work.bytes_min <= 0:
        return None  # an empty product: nothing to judge
    return work


__all__ = ["COMPOSITE_OPS", "ELEMENT_BYTES", "GEMM_OPS", "GemmWork", "gemm_work", "is_gemm_like"]
