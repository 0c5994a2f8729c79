"""The child side of the launcher: what is really in force inside this process.

Environment variables and launcher flags say what was *asked*; a shell's
``LD_PRELOAD``, a library that calls ``sched_setaffinity``, or an OpenMP runtime
that ignores a variable can all make the truth differ. This module reads the
truth back from the kernel (``/proc/self``, ``get_mempolicy``, ``move_pages``)
and from the libraries actually mapped, and :func:`compare` turns any
difference from :meth:`cpuprof.launcher.ResolvedLaunch.requested` into one-line
warnings. Everything returned is JSON-ready, so a child can print it for its
parent.
"""

from __future__ import annotations

import ctypes
import os
import re
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from cpuprof import numa
from cpuprof.topology import format_cpulist

# Mapped-file names, including auditwheel-vendored copies such as libgomp-a34b3233.so.1.
_OPENMP_RE = re.compile(r"lib(gomp|iomp5|omp)(-[0-9a-f]+)?\.so(\.\d+)*")
_OPENMP_NAMES = {"gomp": "libgomp", "iomp5": "libiomp5", "omp": "libomp"}
_ALLOCATOR_RE = re.compile(r"lib(jemalloc|tcmalloc(?:_minimal)?)(-[0-9a-f]+)?\.so(\.\d+)*")
_ENV_PREFIXES = ("OMP_", "KMP_", "GOMP_", "MKL_")
_ENV_NAMES = ("LD_PRELOAD", "MALLOC_CONF")
# The OpenMP runtime --omp asks for, by the name used in "openmp" entries.
_RUNTIME_FOR_OMP = {"gnu": "libgomp", "intel": "libiomp5"}


def parse_task_stat(text: str) -> tuple[str, str, int]:
    """(comm, state, last CPU) from a /proc/.../stat line.

    comm may itself contain spaces and parentheses, so it is everything between
    the first "(" and the *last* ")"; fields after it are counted from there
    (state is field 3, the last CPU field 39).
    """
    head, _, rest = text.rpartition(")")
    fields = rest.split()
    return head.partition("(")[2], fields[0], int(fields[39 - 3])


def read_threads() -> list[dict[str, Any]]:
    """Every thread of this process: tid, name, state, affinity and last CPU."""
    threads = []
    for tid in sorted(int(entry) for entry in os.listdir("/proc/self/task")):
        try:
            name, state, last_cpu = parse_task_stat(Path(f"/proc/self/task/{tid}/stat").read_text())
            affinity = sorted(os.sched_getaffinity(tid))
        except (FileNotFoundError, ProcessLookupError):
            continue  # the thread exited while we looked
        threads.append(
            {"tid": tid, "name": name, "state": state, "affinity": affinity, "last_cpu": last_cpu}
        )
    return threads


def _mappings() -> list[tuple[int, int, str]]:
    """(start, end, path) of every file-backed mapping of this process."""
    result = []
    for line in Path("/proc/self/maps").read_text().splitlines():
        parts = line.split(maxsplit=5)
        if len(parts) == 6 and parts[5].startswith("/"):
            start, end = (int(x, 16) for x in parts[0].split("-"))
            result.append((start, end, parts[5]))
    return result


def _active_openmp(mappings: list[tuple[int, int, str]]) -> str | None:
    """Path of the library that serves omp_get_max_threads in the global symbol scope.

    That is the runtime torch's OpenMP calls bind to; with libiomp5 preloaded,
    torch's own libgomp is still mapped (it is a DT_NEEDED dependency) but
    interposed, so "which is loaded" alone cannot tell the two cases apart.
    """
    try:
        address = ctypes.cast(ctypes.CDLL(None)["omp_get_max_threads"], ctypes.c_void_p).value
    except AttributeError:
        return None  # no runtime in the global scope (not loaded, or loaded RTLD_LOCAL)
    return next((path for start, end, path in mappings if start <= (address or 0) < end), None)


def read_openmp(mappings: list[tuple[int, int, str]]) -> dict[str, Any]:
    """The OpenMP runtimes mapped, and which one is active (None if unknown)."""
    loaded = []
    for path in dict.fromkeys(path for _, _, path in mappings):
        match = _OPENMP_RE.fullmatch(os.path.basename(path.removesuffix(" (deleted)")))
        if match:
            loaded.append({"runtime": _OPENMP_NAMES[match.group(1)], "path": path})
    active_path = _active_openmp(mappings)
    active = next((entry for entry in loaded if entry["path"] == active_path), None)
    if active is None and len(loaded) == 1:
        active = loaded[0]  # the only runtime there is must be the one in use
    return {"loaded": loaded, "active": active}


def read_allocators(mappings: list[tuple[int, int, str]]) -> list[dict[str, str]]:
    """Replacement allocators (jemalloc, tcmalloc) mapped into this process."""
    found = []
    for path in dict.fromkeys(path for _, _, path in mappings):
        match = _ALLOCATOR_RE.fullmatch(os.path.basename(path.removesuffix(" (deleted)")))
        if match:
            found.append({"allocator": match.group(1).split("_")[0], "path": path})
    return found


def read_torch() -> dict[str, Any] | None:
    """torch's thread settings, only if torch is already imported (never imports it)."""
    torch = sys.modules.get("torch")
    if torch is None or not hasattr(torch, "get_num_threads"):
        return None
    return {
        "num_threads": torch.get_num_threads(),
        "num_interop_threads": torch.get_num_interop_threads(),
        "parallel_info": torch.__config__.parallel_info(),
    }


def read_mempolicy() -> dict[str, Any]:
    """The memory policy of the calling thread, or the error that prevented reading it."""
    try:
        mode, nodes = numa.get_mempolicy()
    except OSError as exc:
        return {"error": str(exc)}
    return {"mode": mode, "nodes": nodes}


def weight_pages(tensors: Iterable[Any], max_pages: int = 65536) -> dict[str, Any]:
    """Per-node page counts over the storages of CPU ``tensors`` (e.g. model.parameters()).

    Storages are counted once even when tensors share them (tied embeddings,
    views); at most ``max_pages`` pages are queried, sampled evenly.
    """
    regions: dict[int, int] = {}
    for tensor in tensors:
        if tensor.device.type != "cpu":
            continue
        storage = tensor.untyped_storage()
        address, nbytes = storage.data_ptr(), storage.nbytes()
        if address and nbytes:
            regions[address] = max(regions.get(address, 0), nbytes)
    return numa.regions_page_nodes(regions.items(), max_pages).to_dict()


def read_in_force(tensors: Iterable[Any] | None = None) -> dict[str, Any]:
    """Snapshot of the settings in force in this process (JSON-ready).

    Pass the model's tensors to also learn on which nodes the weights live.
    """
    mappings = _mappings()
    return {
        "pid": os.getpid(),
        "threads": read_threads(),
        "mempolicy": read_mempolicy(),
        "openmp": read_openmp(mappings),
        "allocators": read_allocators(mappings),
        "torch": read_torch(),
        "env": {
            key: value
            for key, value in sorted(os.environ.items())
            if key.startswith(_ENV_PREFIXES) or key in _ENV_NAMES
        },
        "weight_pages": weight_pages(tensors) if tensors is not None else None,
    }


def _nodes_text(nodes: Iterable[int]) -> str:
    text = format_cpulist(list(nodes))
    return f"node(s) {text}" if text else "no nodes"


def compare(requested: Mapping[str, Any], in_force: Mapping[str, Any]) -> list[str]:
    """One-line warnings for every way ``in_force`` differs from ``requested``.

    Works on the dicts as produced or after a JSON round trip. Checks that
    cannot be made (torch not imported, weights not given) are skipped.
    """
    warnings: list[str] = []

    torch_info = in_force.get("torch")
    if torch_info is not None and torch_info["num_threads"] != requested["threads"]:
        warnings.append(f"threads: asked {requested['threads']} but torch uses {torch_info['num_threads']}")

    env = in_force.get("env", {})
    for key, wanted in requested.get("env", {}).items():
        have = env.get(key)
        if have != wanted:
            have_text = "it unset" if have is None else have
            warnings.append(f"{key}: asked {wanted} but the process has {have_text}")

    allowed = set(requested["cpus"])
    outside: dict[tuple[int, ...], list[str]] = {}
    for thread in in_force.get("threads", []):
        extra = tuple(sorted(set(thread["affinity"]) - allowed))
        if extra:
            outside.setdefault(extra, []).append(f"{thread['tid']} ({thread['name']})")
    for extra, names in outside.items():
        warnings.append(
            f"affinity: thread(s) {', '.join(names)} may run on CPU(s) {format_cpulist(list(extra))}, "
            f"outside the requested {format_cpulist(list(allowed))}"
        )

    warnings.extend(_compare_openmp(requested, in_force.get("openmp", {})))
    warnings.extend(_compare_allocator(requested, in_force.get("allocators", [])))

    asked_policy = requested["mempolicy"]
    policy = in_force.get("mempolicy", {})
    asked_text = f"{asked_policy['mode']} to {_nodes_text(asked_policy['nodes'])}"
    if "error" in policy:
        warnings.append(f"memory policy: asked {asked_text} but it could not be read ({policy['error']})")
    elif (policy.get("mode"), list(policy.get("nodes", []))) != (asked_policy["mode"], asked_policy["nodes"]):
        warnings.append(
            f"memory policy: asked {asked_text} but it is {policy.get('mode')}"
            + (f" to {_nodes_text(policy['nodes'])}" if policy.get("nodes") else "")
        )

    pages = in_force.get("weight_pages")
    if pages and asked_policy["mode"] == "bind":
        bound = set(asked_policy["nodes"])
        elsewhere = {int(node): count for node, count in pages["nodes"].items() if int(node) not in bound}
        if elsewhere:
            resident = sum(pages["nodes"].values())
            warnings.append(
                f"weights: {sum(elsewhere.values())} of {resident} resident sampled pages are on "
                f"{_nodes_text(elsewhere)}, outside the bound {_nodes_text(bound)}"
            )
    return warnings


def _compare_openmp(requested: Mapping[str, Any], openmp: Mapping[str, Any]) -> list[str]:
    wanted = _RUNTIME_FOR_OMP[requested["omp"]]
    asked = f"OpenMP: asked {requested['omp']} ({wanted})"
    active = openmp.get("active")
    loaded = openmp.get("loaded", [])
    if active is not None:
        if active["runtime"] != wanted:
            return [f"{asked} but OpenMP calls go to {active['runtime']} ({active['path']})"]
        return []
    if not loaded:
        return [f"{asked} but no OpenMP runtime is loaded"]
    names = ", ".join(f"{entry['runtime']} ({entry['path']})" for entry in loaded)
    if all(entry["runtime"] != wanted for entry in loaded):
        return [f"{asked} but only {names} is loaded"]
    return [f"{asked}; {names} are loaded and which one serves OpenMP calls is unknown"]


def _compare_allocator(requested: Mapping[str, Any], allocators: list[Mapping[str, str]]) -> list[str]:
    wanted = requested["allocator"]
    names = {entry["allocator"] for entry in allocators}
    paths = ", ".join(entry["path"] for entry in allocators)
    if wanted == "default" and names:
        return [f"allocator: asked the default (glibc malloc) but {paths} is loaded"]
    if wanted != "default" and wanted not in names:
        found = f"only {paths} is loaded" if names else "it is not loaded"
        return [f"allocator: asked {wanted} but {found}"]
    if len(names) > 1:
        return [f"allocator: asked {wanted} but several are loaded: {paths}"]
    return []


def openmp_in_process() -> dict[str, Any]:
    """The OpenMP runtimes mapped into this process and the active one (see read_openmp)."""
    return read_openmp(_mappings())
