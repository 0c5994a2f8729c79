"""The built-in LLM decode workload: model shapes, a random-weight Llama, the timed loop.

Names are loaded on first use: the decode launcher (the parent process) reads presets and checks
memory without importing torch, which only the child needs.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "SAMPLING_MODES": "sampling", "DecodeModel": "decode_loop", "DecodeResult": "decode_loop",
    "run_decode": "decode_loop",
    "HFModel": "hf", "load_hf": "hf", "run_hf_decode": "hf",
    "DTYPES": "llama", "REGIONS": "llama", "LlamaModel": "llama", "RegionFactory": "llama",
    "build_model": "llama",
    "PRESETS": "presets", "ModelConfig": "presets", "available_memory_bytes": "presets",
    "check_memory": "presets", "estimate_memory_bytes": "presets", "resolve_config": "presets",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
