"""Loads the C++ core, refusing a torch other than the one it was built against.

The extension links libtorch's C++ ABI, so importing it under another torch would fail with an
undefined symbol or, worse, crash later. The version it was built with is written by CMake into
``_build_info.py``, which is read before the extension itself is touched. An install made where
torch was not importable has an empty version there and no extension: the viewer, whose commands
read saved profiles; :func:`require` refuses the others up front, in one line.
"""

from __future__ import annotations

import functools
import importlib.util
import sys
from types import ModuleType
from typing import TYPE_CHECKING

from .errors import NativeModuleError

if TYPE_CHECKING:
    from typing import TypeAlias

    from ._native import CountingMode, EntryKind, EventKind, InputKind, UnwindStop

    NativeKind: TypeAlias = CountingMode | EntryKind | InputKind | EventKind | UnwindStop

REBUILD_HINT = "rebuild it with: pip install --no-build-isolation --force-reinstall --no-deps ."
#: The torch cpuprof is built and tested against (README's install commands pin the same).
TORCH_REQUIREMENT = "torch==2.13.0"


class NativeUnavailable(NativeModuleError):
    """A command that runs the profiler, refused before anything starts because this install cannot
    (no torch, or no native module): exit code 2, as for bad input."""

    exit_code = 2


#: What each kind the core hands out is called in the profile model and its saved files, by enum
#: and member (csrc/common/enum_list.h binds every C++ value; the member names are C++'s, these the
#: model's, frozen so old profiles still load). Converted where a snapshot becomes a Profile
#: (collect/build.py), never in the model or the analyses; a test fails for a member missing here.
KIND_NAMES: dict[str, dict[str, str]] = {
    "CountingMode": {"exact": "exact", "sampled": "sampled"},
    "EntryKind": {"op": "op", "region": "region", "special": "special"},
    "InputKind": {"tensor": "tensor", "tensor_list": "tensor_list", "none": "none", "int": "int", "float": "float",
                  "bool": "bool", "int_list": "int_list", "other": "other", "unknown_shape": "unknown_shape",
                  "undefined": "undefined"},
    "EventKind": {"hardware": "hardware", "hardware_cache": "hardware-cache", "software": "software", "raw": "raw",
                  "pmu": "pmu", "tracepoint": "tracepoint"},
    "UnwindStop": {"outermost": "outermost frame", "stack_copy_end": "end of the copied stack",
                   "no_unwind_info": "no unwind information", "bad_frame": "implausible frame",
                   "depth_limit": "depth limit", "no_user_stack": "no user registers",
                   "interpreter": "Python interpreter"},
}


def kind_name(kind: NativeKind) -> str:
    """The profile model's name for one of the core's enum values (:data:`KIND_NAMES`)."""
    return KIND_NAMES[type(kind).__name__][kind.name]


def check_torch_version(built: str, installed: str) -> None:
    """Raises NativeModuleError when the two torch versions differ (local suffix included)."""
    if built != installed:
        raise NativeModuleError(
            f"cpuprof's native module was built against torch {built} but torch {installed} is "
            f"installed; {REBUILD_HINT}"
        )


def missing() -> str | None:
    """What this install lacks to load the native module, found without importing torch or the
    extension (the launcher never imports torch); None when nothing is seen missing. A torch of
    another version is caught only by :func:`load`, which compares the versions."""
    try:
        from . import _build_info
    except ImportError:
        return "cpuprof's native module is not built (no cpuprof/_build_info.py)"
    has_torch = importlib.util.find_spec("torch") is not None
    if not _build_info.TORCH_VERSION:
        if has_torch:
            return ("this cpuprof was installed without its native module, where torch was not importable "
                    "(pip install . builds in an isolated environment, hence --no-build-isolation)")
        return "this install has neither (a viewer: report, diff, flamegraph and trace read saved profiles)"
    if not has_torch:
        return f"torch is not installed (the native module was built against torch {_build_info.TORCH_VERSION})"
    if importlib.util.find_spec("cpuprof._native") is None:
        return "the native module is missing from this install"
    return None


def require(command: str) -> None:
    """Raises NativeUnavailable, naming ``command``, what it lacks and how to install it, when
    :func:`missing` finds something; the commands that run the profiler call it before anything
    starts."""
    problem = missing()
    if problem is not None:
        raise NativeUnavailable(
            f"{command} needs torch ({TORCH_REQUIREMENT}) and cpuprof's native module built against it; {problem}. "
            f"To profile: pip install {TORCH_REQUIREMENT} scikit-build-core pybind11, then in cpuprof's source: "
            "pip install --no-build-isolation --force-reinstall --no-deps ."
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
    if not _build_info.TORCH_VERSION:
        raise NativeModuleError(f"this cpuprof was installed without its native module (torch was not importable "
                                f"where it was built); {REBUILD_HINT}")
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
