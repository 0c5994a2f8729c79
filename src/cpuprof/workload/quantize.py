"""Weight-only quantization of the built-in model's projections (``decode --quant int8|int4``).

The kernels are torch's own CPU ones, which need no extra package: ``aten::_weight_int8pack_mm``
(int8 weights, one scale per output channel) and ``aten::_weight_int4pack_mm_for_cpu`` (int4
weights packed by ``aten::_convert_weight_to_int4pack_for_cpu``, a scale and a zero point per
group of inputs). Written here rather than taken from torchao: the two conversions are a dozen
lines each, torchao pins torch versions (installing it may make pip resolve another torch), and
its CPU path ends in these same two kernels.

The int4 scheme is the asymmetric one those kernels implement (as gpt-fast quantizes): a group's
15 steps span its minimum to its maximum, and a weight is ``(q - 8) * scale + zero`` with
``zero = min + 8 * scale``. int8 is symmetric per output row: ``q * scale``, ``scale = max|w| / 127``.
Both are computed in fp32 from the model's weights, a slice of rows at a time, so a matrix's fp32
copy never exists whole (the 1B model's lm_head would be 1 GB).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..model.workload import WeightQuant

#: Rows converted at a time: bounds the fp32 working copy to a few MB whatever the matrix.
_ROWS_PER_SLICE = 1024
#: The int4 kernel's packing of K: tiles of 16 inputs, two per inner step (what gpt-fast passes).
_INNER_K_TILES = 2


class Int8Weight(nn.Module):
    """A [n, k] weight as int8 with one scale per output row, in the activations' dtype."""

    def __init__(self, weight: Tensor) -> None:
        super().__init__()
        rows = weight.shape[0]
        q = torch.empty(weight.shape, dtype=torch.int8)
        scales = torch.empty(rows, dtype=weight.dtype)
        for start in range(0, rows, _ROWS_PER_SLICE):
            w = weight[start:start + _ROWS_PER_SLICE].float()
            scale = w.abs().amax(dim=1).clamp(min=1e-12) / 127
            q[start:start + _ROWS_PER_SLICE] = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8)
            scales[start:start + _ROWS_PER_SLICE] = scale.to(weight.dtype)
        self.weight = nn.Parameter(q, requires_grad=False)
        self.scales = nn.Parameter(scales, requires_grad=False)

    def forward(self, x: Tensor) -> Tensor:
        out = torch._weight_int8pack_mm(x.reshape(-1, x.shape[-1]), self.weight, self.scales)
        return out.view(*x.shape[:-1], out.shape[-1])

    def stored_bytes(self) -> int:
        return self.weight.nbytes + self.scales.nbytes


class Int4Weight(nn.Module):
    """A [n, k] weight as int4 in torch's CPU packing, with a scale and zero point per group of
    ``group_size`` inputs of each row ([k / group_size, n, 2], in the activations' dtype)."""

    def __init__(self, weight: Tensor, group_size: int) -> None:
        super().__init__()
        rows, cols = weight.shape
        self.group_size = group_size
        groups = cols // group_size
        packed = []
        scales_and_zeros = torch.empty(groups, rows, 2, dtype=weight.dtype)
        # Packed a slice of rows at a time (the packing keeps each 1024 rows' bytes together), so the
        # int32 codes it takes, 4 bytes a weight, never exist for a whole matrix.
        for start in range(0, rows, _ROWS_PER_SLICE):
            w = weight[start:start + _ROWS_PER_SLICE].float().view(-1, groups, group_size)
            low, high = w.amin(dim=-1), w.amax(dim=-1)
            scale = ((high - low) / 15).clamp(min=1e-12)
            q = torch.round((w - low[..., None]) / scale[..., None]).clamp(0, 15).to(torch.int32).view(-1, cols)
            packed.append(torch._convert_weight_to_int4pack_for_cpu(q, _INNER_K_TILES))
            # [rows, groups] -> the kernel's [groups, rows]
            scales_and_zeros[:, start:start + _ROWS_PER_SLICE, 0] = scale.t().to(weight.dtype)
            scales_and_zeros[:, start:start + _ROWS_PER_SLICE, 1] = (low + 8 * scale).t().to(weight.dtype)
        self.weight = nn.Parameter(torch.cat(packed), requires_grad=False)
        self.scales_and_zeros = nn.Parameter(scales_and_zeros, requires_grad=False)

    def forward(self, x: Tensor) -> Tensor:
        out = torch._weight_int4pack_mm_for_cpu(x.reshape(-1, x.shape[-1]), self.weight, self.group_size,
                                                self.scales_and_zeros)
        return out.view(*x.shape[:-1], out.shape[-1])

    def stored_bytes(self) -> int:
        return self.weight.nbytes + self.scales_and_zeros.nbytes


def quantized(weight: Tensor, quant: WeightQuant) -> nn.Module:
    """``weight`` ([n, k], torch's Linear layout) stored as ``quant`` says."""
    if quant.mode == "int8":
        return Int8Weight(weight)
    if quant.mode == "int4":
        return Int4Weight(weight, quant.group_size)
    raise ValueError(f"no quantized storage for {quant.mode!r}")


class QuantizedLinear(nn.Module):
    """An ``nn.Linear`` of a checkpoint with its weight stored quantized and its bias kept: what
    ``decode --hf PATH --quant`` makes of every projection and the output head."""

    def __init__(self, linear: nn.Linear, quant: WeightQuant) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.packed = quantized(linear.weight.detach(), quant)
        self.bias = linear.bias

    @property
    def weight(self) -> Tensor:
        """The stored weight (transformers reads the vocabulary size from the output head's rows)."""
        weight = self.packed.weight
        assert isinstance(weight, Tensor)
        return weight

    def forward(self, x: Tensor) -> Tensor:
        out = self.packed(x)
        return out + self.bias if self.bias is not None else out


def quantize_linears(model: nn.Module, quant: WeightQuant) -> int:
    """Every ``nn.Linear`` of ``model`` (a causal LM's projections and output head) stored as
    ``quant`` says, in place; the embedding stays for its lookups. Returns how many; UsageError,
    before any is converted, where the kernels cannot take them."""
    from ..errors import UsageError

    conv = sorted({type(m).__name__ for m in model.modules() if type(m).__name__ == "Conv1D"})
    if conv:
        raise UsageError(f"--quant {quant.mode}: the checkpoint's projections are transformers' {conv[0]}, not "
                         "nn.Linear: torch's weight-only kernels take an nn.Linear's [out, in] weight")
    targets = [(parent, name, child) for parent in model.modules() for name, child in parent.named_children()
               if type(child) is nn.Linear]
    if not targets:
        raise UsageError(f"--quant {quant.mode}: the checkpoint has no nn.Linear projections to quantize")
    if quant.mode == "int4":
        from ..model.workload import INT4_ROW_MULTIPLE

        odd = sorted({child.out_features for _, _, child in targets if child.out_features % INT4_ROW_MULTIPLE})
        if odd:
            raise UsageError(f"--quant int4: the checkpoint has projections of {odd[0]} output rows, which torch's "
                             f"int4 packing cannot take (it needs a multiple of {INT4_ROW_MULTIPLE}); --quant int8 can")
        bad = sorted({child.in_features for _, _, child in targets if child.in_features % quant.group_size})
        if bad:
            raise UsageError(f"--group-size {quant.group_size} does not divide the input width {bad[0]} of the "
                             "checkpoint's projections (each row is quantized in groups of that many inputs)")
    for parent, name, child in targets:
        setattr(parent, name, QuantizedLinear(child, quant))
    return len(targets)
