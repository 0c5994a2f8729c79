"""Model shapes for the built-in decode workload (the shape type, :class:`ModelConfig`, and its
arithmetic are in ``cpuprof.model.workload``: a profile records the shape, and reports read it
without this package).

Everything here is computed from the shapes alone, without building a model, so the CLI can
refuse a run that would not fit in memory before it allocates gigabytes, and the reports can
put an analytic "bytes read per token" next to measured bandwidth.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from ..errors import CpuprofError, UsageError
from ..model.workload import NO_QUANT, ModelConfig, WeightQuant
from .dtypes import name_for_bytes

#: The shape fields a user may change with ``--layers`` and friends.  ``max_seq`` is here
#: too because it sizes the rotary tables and bounds prompt + generated tokens.
OVERRIDABLE_FIELDS: tuple[str, ...] = ("layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "max_seq")

_GB = 1e9
_FP32_BYTES = 4
#: Fixed allowance for the torch, MKL and oneDNN runtimes and the Python interpreter.
_RUNTIME_OVERHEAD_BYTES = 400 * 1024 * 1024


PRESETS: dict[str, ModelConfig] = {
    cfg.name: cfg
    for cfg in (
        ModelConfig(
            name="llama-3.2-1b", hidden=2048, layers=16, heads=32, kv_heads=8, ffn=8192,
            vocab=128256, tied_embeddings=True, rope_theta=500000.0, max_seq=8192, norm_eps=1e-5,
        ),
        ModelConfig(
            name="llama-3.1-8b", hidden=4096, layers=32, heads=32, kv_heads=8, ffn=14336,
            vocab=128256, tied_embeddings=False, rope_theta=500000.0, max_seq=8192, norm_eps=1e-5,
        ),
        ModelConfig(
            name="tiny", hidden=64, layers=2, heads=4, kv_heads=2, ffn=128,
            vocab=256, tied_embeddings=True, rope_theta=10000.0, max_seq=256, norm_eps=1e-5,
        ),
    )
}


def resolve_config(preset: str, overrides: dict[str, int]) -> ModelConfig:
    """The preset's shape with the user's overrides applied, checked for consistency.

    Checks run on the result, so an override that breaks the preset's other fields (e.g.
    ``--heads 5`` on hidden 2048) is reported rather than producing a model that cannot be built.
    """
    if preset not in PRESETS:
        raise UsageError(f"unknown preset {preset!r}; choose one of: {', '.join(PRESETS)}")
    unknown = sorted(set(overrides) - set(OVERRIDABLE_FIELDS))
    if unknown:
        raise UsageError(
            f"cannot override {', '.join(unknown)}; overridable fields: {', '.join(OVERRIDABLE_FIELDS)}"
        )
    # Each override's range is its option's type (options_spec.positive_int).
    assert all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in overrides.values()), overrides
    cfg = dataclasses.replace(PRESETS[preset], **overrides)  # type: ignore[arg-type]  # int fields, checked above
    if cfg.hidden % cfg.heads:
        raise UsageError(
            f"hidden size {cfg.hidden} is not divisible by heads {cfg.heads}; choose heads dividing {cfg.hidden}"
        )
    if cfg.heads % cfg.kv_heads:
        raise UsageError(
            f"heads {cfg.heads} is not divisible by kv-heads {cfg.kv_heads}; choose kv-heads dividing {cfg.heads}"
        )
    if cfg.head_dim % 2:
        raise UsageError(
            f"head size {cfg.head_dim} (hidden / heads) is odd; rotary embeddings need an even head size"
        )
    return cfg


def estimate_memory_bytes(cfg: ModelConfig, dtype_bytes: int, batch: int, max_seq: int, shards: int = 1,
                          quant: WeightQuant = NO_QUANT) -> int:
    """Resident memory a run needs: weights, KV cache, prefill activations and a fixed margin.

    The activation term assumes a prefill of ``max_seq`` tokens holds a handful of fp32
    hidden-sized tensors and the MLP intermediates at once; it errs high, since the point is
    to refuse runs that would be killed by the OOM killer, not to be exact.

    ``shards``: one tensor-parallel rank of that many, which holds its slice of every layer's
    matrices, KV cache and MLP activations, and the replicated rest whole.

    ``quant``: the model is built in ``dtype_bytes`` and quantized a matrix at a time, each freed
    once converted: the peak is the unquantized model with one quantized matrix (the lm_head, the
    largest) beside it, or the quantized model if that is larger.
    """
    activations = batch * max_seq * (6 * cfg.hidden + 3 * cfg.ffn // shards) * _FP32_BYTES
    logits = 4 * batch * cfg.vocab * _FP32_BYTES
    rope_tables = 2 * cfg.max_seq * cfg.head_dim * _FP32_BYTES
    weights = cfg.weight_bytes(dtype_bytes, shards=shards)
    if quant.quantized:
        weights = max(weights + quant.matrix_bytes(cfg.vocab, cfg.hidden, dtype_bytes),
                      cfg.weight_bytes(dtype_bytes, quant, shards))
    return (
        weights
        + cfg.kv_cache_bytes(dtype_bytes, max_seq, batch) // shards
        + activations
        + logits
        + rope_tables
        + _RUNTIME_OVERHEAD_BYTES
    )


def available_memory_bytes(meminfo: Path = Path("/proc/meminfo")) -> int:
    """The kernel's estimate of memory available without swapping (MemAvailable)."""
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError) as exc:
        raise CpuprofError(f"cannot read MemAvailable from {meminfo}: {exc}") from exc
    raise CpuprofError(f"{meminfo} has no MemAvailable line; cannot check that the model fits")


def check_memory(
    cfg: ModelConfig,
    dtype_bytes: int,
    batch: int,
    max_seq: int,
    available_bytes: int | None = None,
    processes: int = 1,
    shards: int = 1,
    quant: WeightQuant = NO_QUANT,
) -> int:
    """Refuse a run that would not fit in available memory; return the estimate if it fits.

    Failing here, with the remedies spelled out, beats being OOM-killed minutes into a
    model build with nothing on disk.
    """
    needed = processes * estimate_memory_bytes(cfg, dtype_bytes, batch, max_seq, shards, quant)
    available = available_memory_bytes() if available_bytes is None else available_bytes
    if needed <= available:
        return needed
    remedies: list[str] = []
    if dtype_bytes > 2:
        remedies.append("--dtype bf16")
    if cfg.layers > 1:
        remedies.append("fewer --layers")
    if batch > 1:
        remedies.append("a smaller --batch")
    small = PRESETS["llama-3.2-1b"]
    if cfg.param_count() > small.param_count():
        remedies.append(f"the {small.name} preset")
    if processes > 1:
        remedies.append("fewer processes")
    advice = ""
    if remedies:
        advice = "; try " + (f"{', '.join(remedies[:-1])} or {remedies[-1]}" if len(remedies) > 1 else remedies[0])
    who = f"{processes} processes of preset {cfg.name}" if processes > 1 else f"preset {cfg.name}"
    raise UsageError(
        f"{who} need{'' if processes > 1 else 's'} about {needed / _GB:.1f} GB in {name_for_bytes(dtype_bytes)} "
        f"but only {available / _GB:.1f} GB is available{advice}"
    )
