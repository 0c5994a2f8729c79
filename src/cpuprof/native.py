"""Loads the C++ core, refusing a torch other than the one it was built against.

The extension links libtorch's C++ ABI, so importing it under another torch would fail with an
undefined symbol or, worse, crash later. The version it was built with is written by CMake into
``_build_info.py``, which is read before the extension itself is touched.
"""

from __future__ import annotations

import functools
import sys
from types import ModuleType

from .errors import NativeModuleError

REBUILD_HINT = "rebuild it with: pip install --no-build-isolation --force-reinstall --no-deps ."


def check_torch_version(built: str, installed: str) -> None:
    """Raises NativeModuleError when the two torch versions differ (local suffix included)."""
    if built != installed:
        raise NativeModuleError(
            f"cpuprof's native module was built against torch {built} but torch {installed} is "
            f"installed; {REBUILD_HINT}"
        )


@functools.cache
def load() -> ModuleType:
    """Returns ``cpuprof._native``, importing torch first (the extension needs its libraries)."""
    try:
        from . import _build_info
    except ImportError as exc:
        raise NativeModuleError(
            f"cpuprof's native module is not built (no cpuprof/_build_info.py); {REBUILD_HINT}"
        ) from exc
    try:
        import torch
    except ImportError as exc:
        raise NativeModuleError(
            f"cpuprof needs torch {_build_info.TORCH_VERSION}, which it was built against, "
            "and torch is not importable"
        ) from exc
    check_torch_version(_build_info.TORCH_VERSION, torch.__version__)
    try:
        from . import _native
    except ImportError as exc:
        raise NativeModuleError(f"cpuprof's native module failed to load ({exc}); {REBUILD_HINT}") from exc
    return _native


def loaded() -> bool:
    """True when the extension is already imported (doctor reports without forcing torch in)."""
    return "cpuprof._native" in sys.modules
