"""cpuprof: a CPU-focused, low-level profiler for PyTorch LLM inference.

The names below load on first use: ``import cpuprof`` (and every command that reads saved
profiles) needs neither torch nor the native module, which only ``profile`` and ``region`` do.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.2.0"

if TYPE_CHECKING:
    from .collect import profile, region
    from .model import Profile

_EXPORTS = {"profile": "collect", "region": "collect", "Profile": "model"}

__all__ = ["Profile", "profile", "region", "__version__"]


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
