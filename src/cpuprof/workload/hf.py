"""Decode a local Hugging Face checkpoint instead of the built-in random-weight model.

transformers is an optional extra: the built-in model needs only torch, and installing
transformers must never be allowed to pull in another torch.  Loading is strictly local
(``local_files_only``): a profiler run should not download gigabytes behind the user's back.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from cpuprof.errors import CpuprofError, UsageError
from cpuprof.workload.llama import DTYPES
from cpuprof.workload.presets import ModelConfig


def config_from_hf(hf_config: Any, name: str) -> ModelConfig:
    """The ModelConfig of a Llama-family transformers config, for validation and byte counts."""
    heads = hf_config.num_attention_heads
    rope_parameters = getattr(hf_config, "rope_parameters", None) or {}  # transformers >= 5
    return ModelConfig(
        name=name,
        hidden=hf_config.hidden_size,
        layers=hf_config.num_hidden_layers,
        heads=heads,
        kv_heads=getattr(hf_config, "num_key_value_heads", None) or heads,
        ffn=hf_config.intermediate_size,
        vocab=hf_config.vocab_size,
        tied_embeddings=bool(getattr(hf_config, "tie_word_embeddings", False)),
        rope_theta=float(getattr(hf_config, "rope_theta", None) or rope_parameters.get("rope_theta", 1e4)),
        max_seq=hf_config.max_position_embeddings,
        norm_eps=float(getattr(hf_config, "rms_norm_eps", 1e-6)),
    )


class HFDecodeModel:
    """A transformers causal LM behind the interface run_decode uses for the built-in model.

    transformers keeps its own growing cache, so positions are implied by the cache length:
    a call at start_pos 0 starts a new sequence, later calls must follow on in order.
    """

    def __init__(self, model: Any, cfg: ModelConfig, dtype: torch.dtype) -> None:
        self.model = model
        self.cfg = cfg
        self.dtype = dtype
        self._past: Any = None

    def __call__(self, input_ids: Tensor, start_pos: int) -> Tensor:
        if start_pos == 0:
            self._past = None
        out = self.model(input_ids=input_ids, past_key_values=self._past, use_cache=True)
        self._past = out.past_key_values
        return out.logits[:, -1].float()

    def reset_cache(self, batch: int = 1, max_seq: int | None = None) -> None:
        """Drop the cache; transformers sizes its own, so batch and max_seq are not needed."""
        self._past = None

    def parameter_tensors(self) -> list[Tensor]:
        return [p.detach() for p in self.model.parameters()]


def load_hf(path: str | os.PathLike[str], dtype: torch.dtype) -> HFDecodeModel:
    """Load the checkpoint directory ``path`` in ``dtype`` through transformers, offline."""
    directory = Path(path)
    readable = directory.is_dir() and os.access(directory, os.R_OK | os.X_OK)
    if not (readable and (directory / "config.json").is_file()):
        raise UsageError(f"--hf {path}: not a readable directory with a config.json")
    if dtype not in DTYPES.values():
        raise UsageError(f"cannot load the model in {dtype}; choose one of: {', '.join(DTYPES)}")
    try:
        import transformers
    except ImportError as exc:
        raise CpuprofError(
            "--hf needs transformers, which is not installed: pip install 'cpuprof[hf]'"
        ) from exc
    try:
        model = transformers.AutoModelForCausalLM.from_pretrained(
            directory, torch_dtype=dtype, local_files_only=True, attn_implementation="sdpa"
        )
    except (OSError, ValueError) as exc:
        raise CpuprofError(f"--hf {path}: cannot load the checkpoint: {exc}") from exc
    model.eval()
    return HFDecodeModel(model, config_from_hf(model.config, directory.name), dtype)
