"""A Llama-architecture decoder in plain PyTorch, with random weights, for profiling decode.

Why not transformers: the profiler must run anywhere torch runs, build a 1B-parameter model
in seconds without downloading weights, and label the ops it sees by block.  The op sequence
deliberately mirrors transformers' ``LlamaForCausalLM`` with SDPA attention (separate q/k/v/o
and gate/up/down projections, RMSNorm in fp32, rotate-half RoPE, ``enable_gqa`` SDPA), so
tokens/s and per-op profiles are comparable with a real checkpoint of the same shape.
Random weights change no op, shape or byte count, so performance is that of the real model.

Llama 3's long-context RoPE frequency scaling is left out: it alters table values only.

Tensor-parallel (``shard``): each rank holds whole query and KV heads and a slice of the
feed-forward width, as Megatron-style CPU serving splits it: q/k/v and gate/up by output rows
(column-parallel), o and down by input columns (row-parallel), each followed by an all-reduce of
the partial sums. Embedding, norms and lm_head are replicated. Every rank fills each full matrix
from the same seed and keeps its slice, so the shards together are exactly the unsharded model.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..errors import UsageError
from ..model.workload import NO_QUANT, WeightQuant
from .dtypes import DTYPE_NAMES, torch_dtype
from .presets import ModelConfig

#: A callable that names a block of the forward pass; the profiler attributes the ops run
#: inside the returned context manager to that name.
RegionFactory = Callable[[str], contextlib.AbstractContextManager[object]]

#: Sums a tensor of partial results across the tensor-parallel ranks, in place, and returns it.
Reduce = Callable[[Tensor], Tensor]


@dataclass(frozen=True)
class Shard:
    """One tensor-parallel rank's part of the model: ``rank`` of ``world`` equal parts."""

    rank: int = 0
    world: int = 1

    def part(self, size: int) -> slice:
        step = size // self.world
        return slice(self.rank * step, (self.rank + 1) * step)


def no_reduce(tensor: Tensor) -> Tensor:
    """One process holds the whole model: its partial sums are already the sums."""
    return tensor

#: Every name the model passes to its region factory.  Deliberately few and without layer
#: indices, so per-region tables stay small whatever the depth.
REGIONS: tuple[str, ...] = ("embed", "norm", "attention", "mlp", "lm_head")

#: Element types the model can be built in: what CPU LLM inference actually uses.
DTYPES: dict[str, torch.dtype] = {name: torch_dtype(name) for name in DTYPE_NAMES}

_INIT_STD = 0.02


def no_region(name: str) -> contextlib.AbstractContextManager[object]:
    """The default region factory: labels nothing, costs a function call."""
    return contextlib.nullcontext()


class RMSNorm(nn.Module):
    """Root-mean-square norm computed in fp32, as transformers does, then cast back."""

    def __init__(self, hidden: int, eps: float, dtype: torch.dtype) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden, dtype=dtype), requires_grad=False)
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


def project(x: Tensor, weight: Tensor | nn.Module) -> Tensor:
    """x times a projection's weightᵀ: ``F.linear`` for a plain weight, the quantized kernel for one
    stored quantized (``decode --quant``)."""
    return F.linear(x, weight) if isinstance(weight, Tensor) else weight(x)


def _rotate_half(x: Tensor) -> Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def _apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    return x * cos + _rotate_half(x) * sin


class Attention(nn.Module):
    """Grouped-query attention over a preallocated KV cache.

    The cache is written in place at the current positions and attention reads a view of
    the filled prefix: a decode step allocates nothing proportional to the context, unlike
    a ``torch.cat``-grown cache, whose copies would pollute the memory profile.
    """

    def __init__(self, cfg: ModelConfig, dtype: torch.dtype, shard: Shard = Shard()) -> None:
        super().__init__()
        # This rank's heads: whole heads, so attention itself needs nothing from the other ranks.
        self.heads, self.kv_heads, self.head_dim = cfg.heads // shard.world, cfg.kv_heads // shard.world, cfg.head_dim

        def weight(rows: int) -> nn.Parameter:
            return nn.Parameter(torch.empty(rows, cfg.hidden, dtype=dtype), requires_grad=False)

        self.q_proj = weight(self.heads * self.head_dim)
        self.k_proj = weight(self.kv_heads * self.head_dim)
        self.v_proj = weight(self.kv_heads * self.head_dim)
        self.o_proj = nn.Parameter(torch.empty(cfg.hidden, self.heads * self.head_dim, dtype=dtype),
                                   requires_grad=False)
        self.k_cache: Tensor | None = None
        self.v_cache: Tensor | None = None

    def forward(self, x: Tensor, start_pos: int, cos: Tensor, sin: Tensor) -> Tensor:
        assert self.k_cache is not None and self.v_cache is not None
        batch, seq, hidden = x.shape
        q = project(x, self.q_proj).view(batch, seq, self.heads, self.head_dim).transpose(1, 2)
        k = project(x, self.k_proj).view(batch, seq, self.kv_heads, self.head_dim).transpose(1, 2)
        v = project(x, self.v_proj).view(batch, seq, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = _apply_rope(q, cos, sin), _apply_rope(k, cos, sin)
        end = start_pos + seq
        self.k_cache[:, :, start_pos:end] = k
        self.v_cache[:, :, start_pos:end] = v
        keys, values = self.k_cache[:, :, :end], self.v_cache[:, :, :end]
        mask = None
        if seq > 1 and start_pos > 0:
            # A chunk after cached positions: SDPA's is_causal aligns the triangle top-left,
            # which would hide cached positions, so spell the mask out.
            mask = torch.arange(end) <= torch.arange(start_pos, end).unsqueeze(1)
        # A branch, not is_causal=<condition>: under torch.compile with dynamic shapes the condition is
        # symbolic, which SDPA refuses; a branch makes the compiler guard on it instead.
        if seq > 1 and start_pos == 0:
            out = F.scaled_dot_product_attention(q, keys, values, is_causal=True, enable_gqa=True)
        else:
            out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=True)
        return project(out.transpose(1, 2).reshape(batch, seq, self.heads * self.head_dim), self.o_proj)


class MLP(nn.Module):
    """SwiGLU feed-forward: down(silu(gate(x)) * up(x))."""

    def __init__(self, cfg: ModelConfig, dtype: torch.dtype, shard: Shard = Shard()) -> None:
        super().__init__()
        ffn = cfg.ffn // shard.world
        self.gate_proj = nn.Parameter(torch.empty(ffn, cfg.hidden, dtype=dtype), requires_grad=False)
        self.up_proj = nn.Parameter(torch.empty(ffn, cfg.hidden, dtype=dtype), requires_grad=False)
        self.down_proj = nn.Parameter(torch.empty(cfg.hidden, ffn, dtype=dtype), requires_grad=False)

    def forward(self, x: Tensor) -> Tensor:
        return project(F.silu(project(x, self.gate_proj)) * project(x, self.up_proj), self.down_proj)


class DecoderLayer(nn.Module):
    """Pre-norm residual block: x + attention(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, cfg: ModelConfig, dtype: torch.dtype, shard: Shard = Shard()) -> None:
        super().__init__()
        self.input_norm = RMSNorm(cfg.hidden, cfg.norm_eps, dtype)
        self.attention = Attention(cfg, dtype, shard)
        self.post_attention_norm = RMSNorm(cfg.hidden, cfg.norm_eps, dtype)
        self.mlp = MLP(cfg, dtype, shard)

    def forward(self, x: Tensor, start_pos: int, cos: Tensor, sin: Tensor, region: RegionFactory,
                reduce: Reduce = no_reduce) -> Tensor:
        with region("norm"):
            h = self.input_norm(x)
        with region("attention"):
            x = x + reduce(self.attention(h, start_pos, cos, sin))
        with region("norm"):
            h = self.post_attention_norm(x)
        with region("mlp"):
            return x + reduce(self.mlp(h))


class LlamaModel(nn.Module):
    """The decoder plus its KV cache; ``model(input_ids, start_pos)`` returns last-position logits.

    ``region`` may be reassigned at any time, e.g. by a profiler that wants op attribution.
    """

    def __init__(self, cfg: ModelConfig, dtype: torch.dtype, region: RegionFactory | None = None,
                 shard: Shard = Shard(), reduce: Reduce = no_reduce) -> None:
        super().__init__()
        self.cfg = cfg
        self.dtype = dtype
        self.shard = shard
        self.reduce = reduce
        self.region: RegionFactory = region or no_region
        self.embed = nn.Parameter(torch.empty(cfg.vocab, cfg.hidden, dtype=dtype), requires_grad=False)
        self.layers = nn.ModuleList(DecoderLayer(cfg, dtype, shard) for _ in range(cfg.layers))
        self.final_norm = RMSNorm(cfg.hidden, cfg.norm_eps, dtype)
        self.lm_head = (
            self.embed
            if cfg.tied_embeddings
            else nn.Parameter(torch.empty(cfg.vocab, cfg.hidden, dtype=dtype), requires_grad=False)
        )
        exponents = torch.arange(0, cfg.head_dim, 2, dtype=torch.float32) / cfg.head_dim
        inv_freq = 1.0 / cfg.rope_theta**exponents
        freqs = torch.outer(torch.arange(cfg.max_seq, dtype=torch.float32), inv_freq)
        angles = torch.cat((freqs, freqs), dim=-1)
        # Cast like transformers does, so the rotary multiply runs in the model dtype.
        self.rope_cos: Tensor
        self.rope_sin: Tensor
        self.register_buffer("rope_cos", angles.cos().to(dtype), persistent=False)
        self.register_buffer("rope_sin", angles.sin().to(dtype), persistent=False)
        self.cache_batch = 0
        self.cache_len = 0
        self.quant = NO_QUANT

    @torch.no_grad()
    def reset_cache(self, batch: int = 1, max_seq: int | None = None) -> None:
        """Allocate a zeroed KV cache for ``batch`` sequences of up to ``max_seq`` positions.

        Zeroing touches every page now, so first-touch page faults land here and not in the
        timed decode steps.  Sizing to the run (not ``cfg.max_seq``) keeps memory honest.
        """
        length = self.cfg.max_seq if max_seq is None else max_seq
        if not 1 <= length <= self.cfg.max_seq:
            raise ValueError(f"cache length {length} outside 1..{self.cfg.max_seq}")
        shape = (batch, self.cfg.kv_heads // self.shard.world, length, self.cfg.head_dim)
        for layer in self.decoder_layers():
            attention = layer.attention
            if attention.k_cache is not None and attention.v_cache is not None and attention.k_cache.shape == shape:
                # The same tensors, zeroed: a compiled model guards on their identity and would recompile.
                attention.k_cache.zero_()
                attention.v_cache.zero_()
                continue
            attention.k_cache = None  # free the old cache before allocating the new one
            attention.v_cache = None
            attention.k_cache = torch.zeros(shape, dtype=self.dtype)
            attention.v_cache = torch.zeros(shape, dtype=self.dtype)
        self.cache_batch, self.cache_len = batch, length

    @torch.no_grad()
    def forward(self, input_ids: Tensor, start_pos: int) -> Tensor:
        """Run ``input_ids`` [batch, seq] at positions start_pos.. and return fp32 logits [batch, vocab].

        A prefill passes the prompt with start_pos 0; a decode step passes one token per
        sequence.  A cache of the right batch is allocated on demand at start_pos 0.
        """
        batch, seq = input_ids.shape
        if batch != self.cache_batch and start_pos == 0:
            self.reset_cache(batch)
        if batch != self.cache_batch or not 0 <= start_pos <= self.cache_len - seq:
            raise ValueError(
                f"positions {start_pos}..{start_pos + seq} of batch {batch} do not fit the KV cache "
                f"({self.cache_batch} x {self.cache_len}); call reset_cache() first"
            )
        region = self.region
        cos = self.rope_cos[start_pos : start_pos + seq]
        sin = self.rope_sin[start_pos : start_pos + seq]
        with region("embed"):
            x = F.embedding(input_ids, self.embed)
        for layer in self.decoder_layers():
            x = layer(x, start_pos, cos, sin, region, self.reduce)
        with region("norm"):
            x = self.final_norm(x[:, -1:])  # only the last position's logits are needed
        with region("lm_head"):
            return project(x, self.lm_head)[:, -1].float()

    def decoder_layers(self) -> list[DecoderLayer]:
        return [layer for layer in self.layers if isinstance(layer, DecoderLayer)]

    def parameter_tensors(self) -> list[Tensor]:
        """Every weight tensor once (tied ones once), e.g. to ask where their pages live."""
        return [p.detach() for p in self.parameters()]


_PROJECTIONS = {"attention": ("q_proj", "k_proj", "v_proj", "o_proj"), "mlp": ("gate_proj", "up_proj", "down_proj")}


@torch.no_grad()
def quantize_model(model: LlamaModel, quant: WeightQuant, progress: Callable[[int, int], None] | None = None) -> None:
    """Stores every projection and the lm_head as ``quant`` says, in place (a layer's weights in
    the model's dtype are freed as it is done); the embedding stays for its lookups, so a tied
    lm_head becomes a quantized copy of it. ``progress(done_layers, total_layers)`` as layers finish."""
    from .quantize import quantized

    problem = model.cfg.quant_problem(quant, model.shard.world)
    if problem is not None:
        raise UsageError(problem)
    if not quant.quantized:
        return
    layers = model.decoder_layers()
    for done, layer in enumerate(layers, start=1):
        for block, names in _PROJECTIONS.items():
            owner = getattr(layer, block)
            for name in names:
                _replace(owner, name, quantized(getattr(owner, name), quant))
        if progress is not None:
            progress(done, len(layers))
    _replace(model, "lm_head", quantized(model.lm_head, quant))
    model.quant = quant


def _replace(owner: nn.Module, name: str, module: nn.Module) -> None:
    """A weight becomes a module (torch refuses to assign one over a registered parameter)."""
    delattr(owner, name)
    setattr(owner, name, module)


def _fill_normal(tensor: Tensor, seed: int, full_shape: torch.Size | None = None,
                 dim: int = 0, part: slice | None = None) -> None:
    """Fills ``tensor`` from ``seed``; a shard is filled as its slice ``part`` along ``dim`` of the
    full matrix of ``full_shape`` drawn from the same seed (one full matrix at a time in memory)."""
    generator = torch.Generator().manual_seed(seed)
    if full_shape is None or part is None:
        tensor.normal_(0.0, _INIT_STD, generator=generator)
        return
    full = torch.empty(full_shape, dtype=tensor.dtype).normal_(0.0, _INIT_STD, generator=generator)
    tensor.copy_(full[part] if dim == 0 else full[:, part])


def build_model(
    cfg: ModelConfig,
    dtype: torch.dtype,
    seed: int = 0,
    progress: Callable[[int, int], None] | None = None,
    region: RegionFactory | None = None,
    shard: Shard = Shard(),
    reduce: Reduce = no_reduce,
) -> LlamaModel:
    """A model of shape ``cfg`` with N(0, 0.02) weights, allocated directly in ``dtype``.

    Each weight gets its own generator, seeded from ``seed`` and the weight's index, so the
    tensors fill in parallel (``normal_`` releases the GIL) yet the result is deterministic;
    nothing is materialised in fp32 first, so peak memory is about the weights' size.
    ``progress(done_layers, total_layers)`` is called as layers finish.

    ``shard``: this rank's part of a tensor-parallel model, whose partial sums ``reduce`` adds up
    across the ranks.
    """
    if dtype not in DTYPES.values():
        raise UsageError(f"cannot build the model in {dtype}; choose one of: {', '.join(DTYPES)}")
    problem = cfg.shard_problem(shard.world)
    if problem is not None:
        raise UsageError(f"cannot split the model tensor-parallel: {problem}")
    model = LlamaModel(cfg, dtype, region, shard, reduce)
    # Norm weights stay at one, as in a freshly initialised transformers model.
    per_layer = [
        [layer.attention.q_proj, layer.attention.k_proj, layer.attention.v_proj, layer.attention.o_proj,
         layer.mlp.gate_proj, layer.mlp.up_proj, layer.mlp.down_proj]
        for layer in model.decoder_layers()
    ]
    heads = [model.embed] if cfg.tied_embeddings else [model.embed, model.lm_head]
    # A shard's matrices: their full shapes and the dimension split (rows: column-parallel).
    full_shapes: dict[int, tuple[torch.Size, int]] = {}
    if shard.world > 1:
        q, kv = cfg.heads * cfg.head_dim, cfg.kv_dim
        for layer in model.decoder_layers():
            a, m = layer.attention, layer.mlp
            for param, shape, dim in ((a.q_proj, (q, cfg.hidden), 0), (a.k_proj, (kv, cfg.hidden), 0),
                                      (a.v_proj, (kv, cfg.hidden), 0), (a.o_proj, (cfg.hidden, q), 1),
                                      (m.gate_proj, (cfg.ffn, cfg.hidden), 0), (m.up_proj, (cfg.ffn, cfg.hidden), 0),
                                      (m.down_proj, (cfg.hidden, cfg.ffn), 1)):
                full_shapes[id(param)] = (torch.Size(shape), dim)
    with ThreadPoolExecutor(max_workers=max(1, torch.get_num_threads())) as pool:
        index = itertools.count()

        def submit(weights: list[nn.Parameter]) -> list[Future[None]]:
            futures = []
            for w in weights:
                weight_seed = (seed * 65_536 + next(index)) % 2**63
                full_shape, dim = full_shapes.get(id(w), (None, 0))
                futures.append(pool.submit(_fill_normal, w.data, weight_seed, full_shape, dim,
                                           None if full_shape is None else shard.part(full_shape[dim])))
            return futures

        head_futures = submit(heads)
        layer_futures = [submit(weights) for weights in per_layer]
        for future in head_futures:
            future.result()
        for done, futures in enumerate(layer_futures, start=1):
            for future in futures:
                future.result()
            if progress is not None:
                progress(done, cfg.layers)
    return model
