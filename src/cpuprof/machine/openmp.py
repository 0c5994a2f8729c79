"""OpenMP runtimes: which one is installed for ``--omp intel``, which are loaded, which is active."""

from __future__ import annotations

import ctypes
import os
import re
from pathlib import Path

from ..model.machine import OpenMPInfo, OpenMPRuntime
from .libraries import find_library, mappings, python_lib_dirs

# Mapped-file names, including auditwheel-vendored copies such as libgomp-a34b3233.so.1.
_OPENMP_RE = re.compile(r"lib(gomp|iomp5|omp)(-[0-9a-f]+)?\.so(\.\d+)*")
_OPENMP_NAMES = {"gomp": "libgomp", "iomp5": "libiomp5", "omp": "libomp"}

INTEL_OPENMP_HINT = "pip install intel-openmp"


def find_intel_openmp() -> Path | None:
    """libiomp5.so where ``pip install intel-openmp`` puts it, or in the system's libraries."""
    return find_library(("libiomp5.so",), python_lib_dirs())


def supports_ompt(runtime: str) -> bool:
    """libgomp never calls an OMPT tool; Intel's and LLVM's runtimes load one named by OMP_TOOL_LIBRARIES."""
    return runtime != "libgomp"


def _active_path(maps: list[tuple[int, int, str]]) -> str | None:
    """Path of the library that serves omp_get_max_threads in the global symbol scope.

    That is the runtime torch's OpenMP calls bind to; with libiomp5 preloaded, torch's own
    libgomp is still mapped (it is a DT_NEEDED dependency) but interposed, so "which is loaded"
    alone cannot tell the two cases apart.
    """
    try:
        address = ctypes.cast(ctypes.CDLL(None)["omp_get_max_threads"], ctypes.c_void_p).value
    except AttributeError:
        return None  # no runtime in the global scope (not loaded, or loaded RTLD_LOCAL)
    return next((path for start, end, path in maps if start <= (address or 0) < end), None)


def openmp_from_mappings(maps: list[tuple[int, int, str]]) -> OpenMPInfo:
    """The OpenMP runtimes mapped, and which one is active (None if unknown)."""
    loaded = []
    for path in dict.fromkeys(path for _, _, path in maps):
        match = _OPENMP_RE.fullmatch(os.path.basename(path.removesuffix(" (deleted)")))
        if match:
            runtime = _OPENMP_NAMES[match.group(1)]
            loaded.append(OpenMPRuntime(runtime=runtime, path=path, ompt=supports_ompt(runtime)))
    active_path = _active_path(maps)
    active = next((entry for entry in loaded if entry.path == active_path), None)
    if active is None and len(loaded) == 1:
        active = loaded[0]  # the only runtime there is must be the one in use
    return OpenMPInfo(loaded=loaded, active=active)


def openmp_in_process() -> OpenMPInfo:
    return openmp_from_mappings(mappings())
