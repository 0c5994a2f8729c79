"""The timed decode loop: prefill a random prompt, then generate token by token.

Latency is taken per step so a profile can show the distribution (and the warmup steps
that are slow while caches and allocators settle), not just a mean.  The measured loop's
wall time is taken separately from the per-step sum so a report can check that the
per-step timestamps account for the loop, i.e. that nothing big happens between steps.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import torch
from torch import Tensor

from ..model import StepFigures
from ..model.workload import NO_QUANT, PREFILL_REGION
from .figures import step_figures
from .llama import RegionFactory, no_region
from .presets import ModelConfig
from .sampling import SAMPLING_MODES


class DecodeModel(Protocol):
    """What run_decode needs from a model: the built-in Llama and the HF adapter both fit."""

    dtype: torch.dtype

    def __call__(self, input_ids: Tensor, start_pos: int) -> Tensor: ...

    def reset_cache(self, batch: int = 1, max_seq: int | None = None) -> None: ...


@dataclass
class DecodeResult:
    """Timings and output of one decode run; latencies in seconds unless the name says ms."""

    batch: int
    prompt_len: int
    ttft_s: float
    step_latencies_s: list[float]
    warmup_steps: int
    figures: StepFigures
    decode_wall_s: float
    #: Per sequence: the token from prefill, then one per decode step.
    generated_ids: list[list[int]]
    #: Per sequence: the prompt it was given (random, from the seed).
    prompt_ids: list[list[int]]
    #: Analytic bytes read per generated token at the mean context of the measured steps.
    bytes_read_per_token: int
    #: (context length, KV cache bytes at it): at the prompt's end and after the last step.
    kv_cache: list[tuple[int, int]] = field(default_factory=list)
    bytes_read_method: str = (
        "analytic, from the model shape: every weight matrix once per step, the KV cache and an embedding row "
        "per sequence, at the measured steps' mean context; divided by the batch"
    )

    @property
    def tokens_per_s(self) -> float:
        return self.figures.tokens_per_s


def _validate(cfg: ModelConfig, prompt_len: int, new_tokens: int, batch: int, warmup: int,
              sampling: str, top_k: int) -> None:
    # The command line's options are checked once, at the door (options_spec, launch.parent.prepare);
    # here they are a library call's preconditions.
    assert prompt_len >= 1 and batch >= 1 and 0 <= warmup < new_tokens, (prompt_len, batch, warmup, new_tokens)
    assert prompt_len + new_tokens <= cfg.max_seq, f"{prompt_len} + {new_tokens} positions > context {cfg.max_seq}"
    assert sampling in SAMPLING_MODES, sampling
    assert sampling != "topk" or 1 <= top_k <= cfg.vocab, f"top_k {top_k} of a vocabulary of {cfg.vocab}"


def _sampler(sampling: str, top_k: int, generator: torch.Generator) -> Callable[[Tensor], Tensor]:
    """A function from logits [batch, vocab] to next tokens [batch, 1]."""
    if sampling == "greedy":
        return lambda logits: logits.argmax(dim=-1, keepdim=True)

    def sample_top_k(logits: Tensor) -> Tensor:
        values, indices = torch.topk(logits, top_k, dim=-1)
        choice = torch.multinomial(torch.softmax(values, dim=-1), 1, generator=generator)
        return indices.gather(-1, choice)

    return sample_top_k


def bytes_read_method(model: DecodeModel) -> str:
    """How :func:`measured_bytes_per_token` counts, said of ``model`` (a tensor-parallel rank's share)."""
    method = DecodeResult.bytes_read_method
    quant = getattr(model, "quant", NO_QUANT)
    if quant.quantized:
        method += (f"; the projections and lm_head at their stored size ({quant.describe()}: the weights and "
                   "their scales), the embedding row and norms in the model's dtype")
    shards = getattr(getattr(model, "shard", None), "world", 1)
    if shards > 1:
        method += (f"; this tensor-parallel rank's 1/{shards} of every layer and of the KV cache, with the "
                   "replicated embedding, norms and lm_head whole")
    return method


def measured_bytes_per_token(model: DecodeModel, cfg: ModelConfig, prompt_len: int, warmup: int, steps: int,
                             batch: int) -> int | None:
    """The bytes a token reads (weights and KV cache), averaged over measured steps warmup..steps-1
    (a decode cut short counts the steps it did); None when none was measured."""
    # Step i reads the cache for positions 0..prompt_len+i; average over the measured steps.
    contexts = range(prompt_len + warmup + 1, prompt_len + steps + 1)
    if not contexts:
        return None
    # A tensor-parallel rank reads its shard: its own share of the bytes, not the model's.
    shards = getattr(getattr(model, "shard", None), "world", 1)
    quant = getattr(model, "quant", NO_QUANT)
    return sum(cfg.bytes_read_per_token(model.dtype.itemsize, c, batch, shards, quant)
               for c in contexts) // len(contexts)


def run_decode(
    model: DecodeModel,
    cfg: ModelConfig,
    *,
    prompt_len: int,
    new_tokens: int,
    batch: int = 1,
    warmup: int = 2,
    sampling: str = "greedy",
    top_k: int = 50,
    seed: int = 0,
    on_step: Callable[[int, float, int], None] | None = None,
    phase: RegionFactory | None = None,
    inference_mode: bool = True,
    cache_len: int | None = None,
) -> DecodeResult:
    """Prefill a seeded random prompt, then run ``new_tokens`` timed decode steps.

    ``phase`` names the prefill (region ``prefill``), so a profile can tell its compute-bound
    GEMMs from the decode steps' memory-bound ones.

    ``inference_mode=False`` runs under ``torch.no_grad`` instead, and ``cache_len`` sizes the KV
    cache other than to the run: both are what a compiled model needs (see the decode child).

    The first ``warmup`` steps are kept in ``step_latencies_s`` but left out of tokens/s
    and the percentiles.  ``on_step(step_index, latency_s, total_steps)`` runs after every
    step, outside the timed region, so progress display and checkpointing cost nothing
    in the figures.
    """
    _validate(cfg, prompt_len, new_tokens, batch, warmup, sampling, top_k)
    generator = torch.Generator().manual_seed(seed)
    sample = _sampler(sampling, top_k, generator)
    # A torch.compile'd model runs under no_grad: inductor cannot slice inference tensors with dynamic
    # bounds (it sets their version counter), and the KV cache is allocated in this context.
    with torch.inference_mode() if inference_mode else torch.no_grad():
        prompt = torch.randint(0, cfg.vocab, (batch, prompt_len), generator=generator)
        model.reset_cache(batch, cache_len or prompt_len + new_tokens)

        start = time.perf_counter_ns()
        with (phase or no_region)(PREFILL_REGION):
            token = sample(model(prompt, 0))
        ttft_ns = time.perf_counter_ns() - start

        tokens = [token]
        latencies_ns: list[int] = []
        callback_ns = 0
        measured_start = 0
        for step in range(new_tokens):
            if step == warmup:
                measured_start = time.perf_counter_ns()
            start = time.perf_counter_ns()
            token = sample(model(token, prompt_len + step))
            latencies_ns.append(time.perf_counter_ns() - start)
            tokens.append(token)
            if on_step is not None:
                callback_start = time.perf_counter_ns()
                on_step(step, latencies_ns[-1] / 1e9, new_tokens)
                if step >= warmup:
                    callback_ns += time.perf_counter_ns() - callback_start
        decode_wall_ns = time.perf_counter_ns() - measured_start - callback_ns

    latencies_s = [ns / 1e9 for ns in latencies_ns]
    figures = step_figures(latencies_s, warmup, batch)
    assert figures is not None  # _validate made new_tokens > warmup
    dtype_bytes = model.dtype.itemsize
    shards = getattr(getattr(model, "shard", None), "world", 1)
    bytes_per_token = measured_bytes_per_token(model, cfg, prompt_len, warmup, new_tokens, batch)
    assert bytes_per_token is not None
    result = DecodeResult(
        batch=batch,
        prompt_len=prompt_len,
        ttft_s=ttft_ns / 1e9,
        step_latencies_s=latencies_s,
        warmup_steps=warmup,
        figures=figures,
        decode_wall_s=decode_wall_ns / 1e9,
        generated_ids=torch.cat(tokens, dim=1).tolist(),
        prompt_ids=prompt.tolist(),
        bytes_read_per_token=bytes_per_token,
        kv_cache=[(c, cfg.kv_cache_bytes(dtype_bytes, c, batch) // shards)
                  for c in (prompt_len, prompt_len + new_tokens)],
    )
    result.bytes_read_method = bytes_read_method(model)
    return result
