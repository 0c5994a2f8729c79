"""A Hugging Face checkpoint directory, read without torch or transformers.

The launcher checks ``--hf`` and sizes the run from these before it starts the child, so a typo
or a model that cannot fit costs a second, not a model load.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ..errors import FileFormatError, UsageError
from ..model.io import parse_json, read_regular_file
from .dtypes import DTYPE_BYTES

# Where a checkpoint keeps its weights; the parent sizes the run from these without loading them.
WEIGHT_FILE_PATTERNS = ("*.safetensors", "*.bin", "*.pt")
# config.json's dtype names, for the size of the stored weights.
STORED_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8, "int8": 1}


def read_config(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The checkpoint's config.json, or a UsageError saying what is wrong with it."""
    directory = Path(path)
    config_file = directory / "config.json"
    if not (directory.is_dir() and os.access(directory, os.R_OK | os.X_OK) and config_file.is_file()):
        raise UsageError(f"--hf {path}: not a readable directory with a config.json (a local Hugging Face checkpoint)")
    try:
        # Bounded and regular-file-only, as every JSON file cpuprof reads (model.io).
        data = parse_json(read_regular_file(config_file), config_file, "Hugging Face config")
    except (FileFormatError, OSError) as exc:
        raise UsageError(f"--hf {path}: config.json cannot be read ({exc})") from exc
    if not isinstance(data, dict):
        raise UsageError(f"--hf {path}: config.json is not a JSON object")
    return data


def checkpoint_weight_bytes(path: str | os.PathLike[str], dtype: str) -> int:
    """What the weights will occupy in ``dtype``: the files' size, rescaled from the stored dtype."""
    directory = Path(path)
    files = {f for pattern in WEIGHT_FILE_PATTERNS for f in directory.glob(pattern)}
    stored = sum(f.stat().st_size for f in files)
    config = read_config(path)
    stored_name = str(config.get("torch_dtype") or config.get("dtype") or "float32")
    return stored * DTYPE_BYTES[dtype] // STORED_DTYPE_BYTES.get(stored_name, 4)


def estimate_memory_bytes(path: str | os.PathLike[str], dtype: str, batch: int, max_seq: int) -> int:
    """Resident memory a decode of the checkpoint needs: weights, a full-attention KV cache of
    ``max_seq`` positions where the config gives its shape, and a fixed runtime margin. It errs
    high: the point is to refuse a run the OOM killer would end, not to be exact."""
    config = read_config(path)
    nested = config.get("text_config")
    text: dict[str, Any] = nested if isinstance(nested, dict) else config
    layers = int(text.get("num_hidden_layers") or 0)
    heads = int(text.get("num_attention_heads") or 0)
    kv_heads = int(text.get("num_key_value_heads") or heads)
    head_dim = int(text.get("head_dim") or (int(text.get("hidden_size") or 0) // heads if heads else 0))
    kv_cache = 2 * layers * kv_heads * head_dim * max_seq * batch * DTYPE_BYTES[dtype]
    runtime_margin = 600 * 1024 * 1024  # torch, transformers, MKL, oneDNN and the interpreter
    return checkpoint_weight_bytes(path, dtype) + kv_cache + runtime_margin
