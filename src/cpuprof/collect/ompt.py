"""OpenMP waits from cpuprof's OMPT tool (``libcpuprof_ompt.so``, built from ``csrc/ompt``).

The tool is a shared library of its own, loaded by the OpenMP runtime itself when it starts:
only runtimes that implement OMPT do that (Intel's libiomp5, LLVM's libomp), when the process is
launched with :func:`launch_env`'s variables; GNU libgomp, the runtime torch links, never calls an
OMPT tool. So the figures exist only for a child launched with ``--omp intel`` (libiomp5
preloaded) and the tool named by ``OMP_TOOL_LIBRARIES``; anywhere else :meth:`OmptReader.open`
says in one line why there are none.

The reader never loads the tool itself: a copy the runtime did not load would receive no
callbacks, so it only reaches the copy already mapped (``RTLD_NOLOAD``) and drives it through its
C API (``csrc/ompt/ompt_tool.h``) with ctypes.

What the figures mean (see the header for the details): each wait is an OMPT barrier, taskwait,
taskgroup or mutex wait with its wall time and the waiting thread's own CPU time over it (spin;
the rest is sleep), charged to the ATen op that forked the parallel region (op 1 outside ops).
A worker's wait at a region's closing barrier is cut where the barrier completed: the rest, until
the worker is forked again, is kind ``idle``, charged to op 1, with the CPU time placed first
(the runtime spins, then sleeps after KMP_BLOCKTIME). A worker's last barrier before the reading
is reported only once it is forked again or exits, so it is missing from a read taken before.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..machine.libraries import mappings
from ..machine.openmp import openmp_from_mappings
from ..model.contention import WAIT_KINDS, OmptInfo, OmpWait, OmpWork, OpenMPWaits

TOOL_NAME = "libcpuprof_ompt.so"
ABI = 1  # CPUPROF_OMPT_ABI in csrc/ompt/ompt_tool.h
_CALLBACK_COUNT = 9
# ompt_set_result_t
_SET_RESULTS = {0: "not registered", 1: "error", 2: "never", 3: "sometimes", 4: "sometimes_paired", 5: "always"}

NOT_BUILT = "the OMPT tool was not built (omp-tools.h was not found when cpuprof was built; pip install intel-openmp)"
LIBGOMP = "the OpenMP runtime in this process is libgomp, which never calls an OMPT tool (use --omp intel)"
STARTED_WITHOUT = ("OMPT needs the tool loaded when the runtime starts: the process was not launched by `cpuprof "
                   "decode`, `run` or `compare`, which name it in OMP_TOOL_LIBRARIES")
TURNED_OFF = "CPUPROF_OMPT=off kept the OMPT tool out of the launch"
NO_RUNTIME = "no OpenMP runtime is loaded in this process"


class _Status(ctypes.Structure):
    _fields_ = [
        ("abi", ctypes.c_int32),
        ("initialized", ctypes.c_int32),
        ("enabled", ctypes.c_int32),
        ("omp_version", ctypes.c_uint32),
        ("runtime_version", ctypes.c_char * 256),
        ("callbacks", ctypes.c_int32 * _CALLBACK_COUNT),
        ("threads", ctypes.c_uint64),
        ("threads_beyond_limit", ctypes.c_uint64),
        ("records_dropped", ctypes.c_uint64),
        ("waits_uncut", ctypes.c_uint64),
    ]


class _Wait(ctypes.Structure):
    _fields_ = [
        ("tid", ctypes.c_int32),
        ("op", ctypes.c_uint32),
        ("kind", ctypes.c_int32),
        ("reserved", ctypes.c_int32),
        ("count", ctypes.c_uint64),
        ("wall_ns", ctypes.c_uint64),
        ("cpu_ns", ctypes.c_uint64),
    ]


class _Work(ctypes.Structure):
    _fields_ = [
        ("tid", ctypes.c_int32),
        ("op", ctypes.c_uint32),
        ("parallel_regions", ctypes.c_uint64),
        ("team_threads", ctypes.c_uint64),
        ("parallel_ns", ctypes.c_uint64),
        ("implicit_tasks", ctypes.c_uint64),
        ("implicit_task_ns", ctypes.c_uint64),
        ("lock_acquisitions", ctypes.c_uint64),
    ]


def tool_library() -> Path | None:
    """The built tool, installed next to the package's ``_native`` module; None if not built."""
    dirs = []
    try:
        spec = importlib.util.find_spec("cpuprof._native")
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.origin:
        dirs.append(Path(spec.origin).parent)  # an editable install keeps it apart from the sources
    dirs.append(Path(__file__).resolve().parents[1])
    return next((d / TOOL_NAME for d in dirs if (d / TOOL_NAME).is_file()), None)


def launch_env(path: Path | str) -> dict[str, str]:
    """The variables that make an OMPT-capable runtime (libiomp5, LLVM libomp) load the tool when
    it starts; set them in the child's environment. libgomp ignores them: it never calls a tool."""
    return {"OMP_TOOL": "enabled", "OMP_TOOL_LIBRARIES": str(path)}


def _loaded_tool(maps: list[tuple[int, int, str]]) -> str | None:
    return next((path for _, _, path in maps if os.path.basename(path) == TOOL_NAME), None)


def _start_runtime() -> None:
    """Lets a runtime that is mapped but not yet started start now (it loads its tool then)."""
    try:
        ctypes.CDLL(None).omp_get_max_threads()
    except AttributeError:
        pass


class OmptReader:
    """The tool the OpenMP runtime loaded into this process, driven through its C API.

    ``open()`` first; the other methods are no-ops (``read`` returns no records) when the tool is
    not active. Call ``reset`` and ``read`` while no parallel region runs (session start and end).
    """

    def __init__(self) -> None:
        self._lib: ctypes.CDLL | None = None
        self._path: str | None = None
        self.info = OmptInfo(active=False, error="not opened")

    def open(self) -> OmptInfo:
        maps = mappings()
        path = _loaded_tool(maps)
        if path is None:
            openmp = openmp_from_mappings(maps)
            if (openmp.active is not None and openmp.active.ompt
                    and os.environ.get("OMP_TOOL_LIBRARIES") and os.environ.get("OMP_TOOL", "enabled") == "enabled"):
                _start_runtime()  # a preloaded runtime starts at its first call, not when mapped
                maps = mappings()
                path = _loaded_tool(maps)
        if path is None:
            self.info = OmptInfo(active=False, error=self._why_not(maps))
            return self.info
        try:
            lib = ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_GLOBAL)
        except OSError as exc:
            self.info = OmptInfo(active=False, library=path, error=f"cannot reach the loaded OMPT tool: {exc}")
            return self.info
        self._declare(lib)
        if lib.cpuprof_ompt_abi() != ABI:
            self.info = OmptInfo(active=False, library=path,
                                 error=f"the loaded OMPT tool {path} is from another cpuprof build (ABI "
                                       f"{lib.cpuprof_ompt_abi()}, expected {ABI})")
            return self.info
        self._lib, self._path = lib, path
        self.info = self._status()
        return self.info

    @staticmethod
    def _why_not(maps: list[tuple[int, int, str]]) -> str:
        openmp = openmp_from_mappings(maps)
        runtime = openmp.active
        if runtime is None:
            if not openmp.loaded:
                return NO_RUNTIME
            names = ", ".join(sorted({entry.runtime for entry in openmp.loaded}))
            return f"no OpenMP runtime here loaded the OMPT tool (loaded: {names}; the active one is unknown)"
        if not runtime.ompt:
            return LIBGOMP
        named = os.environ.get("OMP_TOOL_LIBRARIES")
        if named and os.environ.get("OMP_TOOL", "enabled") == "enabled":
            return (f"{runtime.runtime} did not load the OMPT tool named by OMP_TOOL_LIBRARIES ({named}); "
                    "OMP_TOOL_VERBOSE_INIT=stderr shows why")
        if tool_library() is None:
            return NOT_BUILT
        if os.environ.get("CPUPROF_OMPT") == "off":
            return TURNED_OFF
        return STARTED_WITHOUT

    @staticmethod
    def _declare(lib: ctypes.CDLL) -> None:
        lib.cpuprof_ompt_abi.restype = ctypes.c_int
        lib.cpuprof_ompt_attach.argtypes = [ctypes.c_void_p]
        lib.cpuprof_ompt_attach.restype = None
        lib.cpuprof_ompt_enable.argtypes = [ctypes.c_int]
        lib.cpuprof_ompt_enable.restype = None
        lib.cpuprof_ompt_reset.restype = None
        lib.cpuprof_ompt_get_status.argtypes = [ctypes.POINTER(_Status)]
        lib.cpuprof_ompt_get_status.restype = None
        lib.cpuprof_ompt_read_waits.argtypes = [ctypes.POINTER(_Wait), ctypes.c_long]
        lib.cpuprof_ompt_read_waits.restype = ctypes.c_long
        lib.cpuprof_ompt_read_work.argtypes = [ctypes.POINTER(_Work), ctypes.c_long]
        lib.cpuprof_ompt_read_work.restype = ctypes.c_long
        lib.cpuprof_ompt_kind_name.argtypes = [ctypes.c_int]
        lib.cpuprof_ompt_kind_name.restype = ctypes.c_char_p
        lib.cpuprof_ompt_callback_name.argtypes = [ctypes.c_int]
        lib.cpuprof_ompt_callback_name.restype = ctypes.c_char_p

    def _status(self) -> OmptInfo:
        assert self._lib is not None
        status = _Status()
        self._lib.cpuprof_ompt_get_status(ctypes.byref(status))
        callbacks = {}
        for index in range(_CALLBACK_COUNT):
            name = self._lib.cpuprof_ompt_callback_name(index).decode()
            callbacks[name] = _SET_RESULTS.get(status.callbacks[index], str(status.callbacks[index]))
        runtime = status.runtime_version.decode(errors="replace") or None
        error = None
        if not status.initialized:
            error = "the OpenMP runtime loaded the OMPT tool but did not initialize it"
        else:
            refused = [name for name, how in callbacks.items() if how not in ("always", "sometimes",
                                                                              "sometimes_paired")]
            if refused:
                error = f"the OpenMP runtime refused these OMPT callbacks: {', '.join(refused)}"
        return OmptInfo(active=bool(status.initialized), runtime=runtime, library=self._path, error=error,
                        callbacks=callbacks, records_dropped=status.records_dropped,
                        threads_beyond_limit=status.threads_beyond_limit, waits_uncut=status.waits_uncut)

    def kind_names(self) -> list[str]:
        """The tool's wait kinds by number (the same names as WAIT_KINDS)."""
        names: list[str] = []
        while self._lib is not None:
            name = self._lib.cpuprof_ompt_kind_name(len(names))
            if name is None:
                break
            names.append(name.decode())
        return names

    @property
    def active(self) -> bool:
        return self._lib is not None and self.info.active

    def attach(self, current_op_address: int) -> None:
        """Hands the tool the core's ``uint32_t current_op(void)`` (0 detaches)."""
        if self._lib is not None:
            self._lib.cpuprof_ompt_attach(ctypes.c_void_p(current_op_address or None))

    def enable(self, on: bool) -> None:
        if self._lib is not None:
            self._lib.cpuprof_ompt_enable(1 if on else 0)

    def reset(self) -> None:
        if self._lib is not None:
            self._lib.cpuprof_ompt_reset()

    def read(self, tid_to_thread_index: Mapping[int, int]) -> OpenMPWaits:
        """The records so far, with each thread id turned into its index in Profile.threads.

        Records of threads the map does not have are left out and counted in
        ``info.records_unmapped`` (rows of the same thread, op and kind are summed).
        """
        if self._lib is None:
            return OpenMPWaits(info=self.info)
        waits_raw = self._read(self._lib.cpuprof_ompt_read_waits, _Wait)
        work_raw = self._read(self._lib.cpuprof_ompt_read_work, _Work)
        info = self._status()
        kind_names = self.kind_names()
        unmapped = 0
        waits: dict[tuple[int, int, str], OmpWait] = {}
        for w in waits_raw:
            thread = tid_to_thread_index.get(w.tid)
            if thread is None:
                unmapped += 1
                continue
            kind = kind_names[w.kind] if 0 <= w.kind < len(kind_names) else "other-mutex"
            if kind not in WAIT_KINDS:
                kind = "other-mutex"
            entry = waits.setdefault((thread, w.op, kind), OmpWait(thread, w.op, kind, 0, 0, 0))
            entry.count += w.count
            entry.wall_ns += w.wall_ns
            entry.cpu_ns += w.cpu_ns
        work: dict[tuple[int, int], OmpWork] = {}
        for r in work_raw:
            thread = tid_to_thread_index.get(r.tid)
            if thread is None:
                unmapped += 1
                continue
            entry2 = work.setdefault((thread, r.op), OmpWork(thread, r.op))
            entry2.parallel_regions += r.parallel_regions
            entry2.team_threads += r.team_threads
            entry2.parallel_ns += r.parallel_ns
            entry2.implicit_tasks += r.implicit_tasks
            entry2.implicit_task_ns += r.implicit_task_ns
            entry2.lock_acquisitions += r.lock_acquisitions
        info.records_unmapped = unmapped
        self.info = info
        return OpenMPWaits(info=info, waits=sorted(waits.values(), key=lambda w: (w.thread, w.op, w.kind)),
                           work=sorted(work.values(), key=lambda w: (w.thread, w.op)))

    @staticmethod
    def _read(fn: Any, struct: type[ctypes.Structure]) -> list[Any]:
        capacity = 256
        while True:
            array = (struct * capacity)()
            count = fn(array, capacity)
            if count <= capacity:
                return list(array[:count])
            capacity = count + 64  # threads may add records between the two calls
