"""Measuring the machine's roofs in this process, and caching them per machine, torch and binding.

The roofs are measured where they are used: in the process whose thread count, affinity, memory
policy and OpenMP runtime are the run's own (the decode child), because each of these changes
what the memory and the GEMM kernels reach. A calibration takes a few seconds, so its result is
cached, keyed by everything it depends on; an entry for the same machine and binding but another
torch or OpenMP runtime is not reused, and the reason is said in one line.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import functools
import hashlib
import json
import os
import re
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from .. import defaults
from ..errors import FileFormatError, NativeModuleError
from ..model.codec import DecodeError, from_json, to_json
from ..model.io import parse_json, read_regular_file
from ..model.roofs import BandwidthRoof, ComputeRoof, KernelRoof, MachineRoofs, Repeated, RoofProbe, repeated
from ..output_file import write_text
from .openmp import openmp_in_process
from .topology import _meminfo, _model_name

# 2: kernel roofs of quantized weights (KernelRoof.weights, group_size, elements_per_s, cached_shape).
# 3: the last probe of the memory kept with each entry (MachineRoofs.probe).
# 4: the read kernel (the memory roof), each kernel's ISA, the GEMV's paths, the cores' FMA peak.
# 5: MachineRoofs.calibration.
CACHE_VERSION = 5
# The calibration's method, kept with each entry: an entry measured another way is neither used nor
# stored, however the file's version reads (older entries are kept in a newer file).
# 1: the GEMV kernel roofs read a decoder's output head after its layers (GEMV_HEAD): measured on the
#    layers alone, a decode's head GEMV ran 40% above them.
CALIBRATION = 1
CACHE_FILE = "roofs.json"
# Entries kept in the cache file; the oldest go first (one per machine, torch, runtime and binding).
MAX_CACHE_ENTRIES = 64

DEFAULT_REPETITIONS = 7
# Times the bandwidth kernels are measured again when a GEMV read memory faster than they did
# (MachineRoofs.kernel_above_memory): a burst of another process's memory traffic is short.
BANDWIDTH_REMEASURES = 2
MIN_REPETITIONS = 5
# The probe before cached roofs are used: a few passes of the memory roof's kernel (see probe() for
# their size), in about 0.1 to 0.2 s with their first touch.
PROBE_REPETITIONS = 3
# How the warnings about a probe begin: its figures are the report's probe line, not a note again.
PROBE_NOTE = "a probe of the memory now read "
# A probe further than this (or than the cached kernel's own spread, if wider) from the cached memory
# roof says the memory is in another state than when it was measured: measure again. A shared VM's
# memory was seen moving between 49 and 74 GB/s within an hour; repetitions agree within ~10%.
PROBE_TOLERANCE = 0.25
# Every streamed array (and the GEMV weight) is at least this, and at least LLC_MULTIPLE times the
# last-level cache, so what is measured is memory, not cache.
MIN_STREAM_BYTES = 32 << 20
LLC_MULTIPLE = 4
# Assumed when sysfs does not say (a container without /sys/devices/system/cpu/*/cache).
FALLBACK_LLC_BYTES = 64 << 20
# The arrays may take at most this share of MemAvailable: a calibration must not push the
# machine (or the model about to be loaded) into swap or the OOM killer.
MEMORY_SHARE = 0.5
# Compute roof: square GEMMs from GEMM_START, doubled while one takes less than GEMM_MIN_SECONDS,
# so a timer's resolution and the thread team's start-up are noise, and the calibration stays short.
GEMM_START = 256
GEMM_MAX = 4096
GEMM_MIN_SECONDS = 0.03
# Kernel roof: a decode GEMV, one token's row against weights of this many input features
# (Llama-3.2-1B's hidden size) and output rows (its MLP width), read in turn.
GEMV_IN = 2048
GEMV_ROWS = 8192
# [out, in] of the weights a kernel roof reads, one decoder layer's MLP in its order: the gate and up
# projections (wide), then the down projection (long rows).
GEMV_LAYER = ((GEMV_ROWS, GEMV_IN), (GEMV_ROWS, GEMV_IN), (GEMV_IN, GEMV_ROWS))
# [out, in] of the output head read after the layers, as a decoder's LM head is: a tall weight streams
# faster than the MLP's (oneDNN's bf16 GEMV read 32 GB/s from [32768,2048] weights where it read 26 from
# the layers, about as fast as from Llama-3's whole [128256,2048] head), and a decode's head GEMV beat a
# roof measured on the layers alone by 40%. A quarter of that head: it costs a fifth of the memory.
GEMV_HEAD = (32768, GEMV_IN)

# STREAM's counting: the bytes of the named arrays each pass reads and writes.
STREAM_ARRAYS = {"copy": 2, "triad": 3, "read": 1}
DTYPE_BYTES = {"f32": 4, "bf16": 2, "f16": 2}

# Fingerprint entries that differ between two torch installs on one machine and binding; an
# entry that differs only in these gets a reason instead of silence.
_SOFTWARE = {"torch": "torch", "openmp": "the OpenMP runtime"}

Progress = Callable[[str], None]


@dataclasses.dataclass
class RoofsCache:
    """The cache file: every calibration this user ran, one per key."""

    version: int
    entries: list[MachineRoofs] = dataclasses.field(default_factory=list)


# --- what the calibration depends on ------------------------------------------------------------


def _read(path: str | Path) -> str | None:
    try:
        return Path(path).read_text()
    except OSError:
        return None


def _size_bytes(text: str) -> int | None:
    """sysfs cache sizes: "32K", "1024K", "32768K", sometimes "1M" or plain bytes."""
    match = re.fullmatch(r"\s*(\d+)\s*([KMG]?)\s*", text)
    if not match:
        return None
    return int(match.group(1)) << {"": 0, "K": 10, "M": 20, "G": 30}[match.group(2)]


def llc_bytes(root: str | Path = "/") -> int | None:
    """Size of cpu0's last-level cache (its highest-level unified or data cache), from sysfs."""
    base = Path(root, "sys/devices/system/cpu/cpu0/cache")
    best: tuple[int, int] | None = None
    for index in sorted(base.glob("index*")) if base.is_dir() else []:
        level_text, size_text = _read(index / "level"), _read(index / "size")
        if level_text is None or size_text is None or (_read(index / "type") or "").strip() == "Instruction":
            continue
        size = _size_bytes(size_text)
        if size is not None and level_text.strip().isdigit():
            best = max(best or (0, 0), (int(level_text), size))
    return best[1] if best else None


def mem_available_bytes() -> int | None:
    return _meminfo(_read("/proc/meminfo")).get("MemAvailable")


def fingerprint() -> dict[str, str]:
    """What the roofs depend on besides the binding: the CPU, the memory, torch and its OpenMP runtime.

    Imports torch (its version, and the OpenMP runtime it maps, are part of the answer).
    """
    import torch

    meminfo = _meminfo(_read("/proc/meminfo"))
    total = meminfo.get("MemTotal")
    active = openmp_in_process().active
    return {
        "cpu": _model_name(_read("/proc/cpuinfo")) or "unknown",
        "logical_cpus": str(os.cpu_count() or 0),
        # In GiB with one decimal: MemTotal moves by a few kB between kernels and boots.
        "memory": f"{total / 2**30:.1f} GiB" if total else "unknown",
        "torch": str(torch.__version__),
        "openmp": active.runtime if active else "unknown",
        # Where the arrays may live changes what they stream at (a remote node, interleaving).
        "memory_policy": _memory_policy(),
    }


def _memory_policy() -> str:
    from . import numa

    try:
        mode, nodes = numa.get_mempolicy()
        allowed = numa.mems_allowed()
    except OSError:
        return "unknown"
    return f"{mode} {','.join(map(str, nodes)) or '-'}; nodes allowed {','.join(map(str, allowed))}"


def cache_key(fp: dict[str, str], threads: int, cpus: Sequence[int]) -> str:
    text = json.dumps({"fingerprint": fp, "threads": threads, "cpus": sorted(cpus)}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def cache_path() -> Path:
    """$CPUPROF_CACHE_DIR/roofs.json, else $XDG_CACHE_HOME/cpuprof/roofs.json, else ~/.cache/cpuprof/."""
    if os.environ.get("CPUPROF_CACHE_DIR"):
        return Path(os.environ["CPUPROF_CACHE_DIR"], CACHE_FILE)
    if os.environ.get("XDG_CACHE_HOME"):
        return Path(os.environ["XDG_CACHE_HOME"], "cpuprof", CACHE_FILE)
    return Path.home() / ".cache" / "cpuprof" / CACHE_FILE


# --- measuring -----------------------------------------------------------------------------------


def _mib(nbytes: float) -> str:
    return f"{nbytes / 2**20:.0f} MiB"


def _threads(n: int) -> str:
    return f"{n} thread" if n == 1 else f"{n} threads"


def _memory_node() -> int | None:
    """The one node the calibration's memory can be on, when there is only one; None otherwise."""
    from . import numa

    try:
        allowed = numa.mems_allowed()
        if len(allowed) == 1:
            return allowed[0]
        mode, nodes = numa.get_mempolicy()
    except OSError:
        return None
    return nodes[0] if mode == "bind" and len(nodes) == 1 else None


def _bandwidth(
    kernel: str, array_bytes: int, threads: int, repetitions: int, available: int | None, progress: Progress,
    what: str = "calibrating", isa: str = "",
) -> BandwidthRoof:
    """One bandwidth kernel's figure, run in every ISA this CPU has (unless ``isa`` names one), keeping
    the fastest: one thread of this Zen 4 VM read memory at 21 GB/s with 16-byte loads and 16 with
    64-byte ones (the median of 8 rounds each, interleaved), and its 2-thread triad streamed 17% less
    with AVX-512 than a plain C triad built for the x86-64 baseline: the widest vectors are not always
    the memory's best reader or writer. The calibration runs the read kernel so, and copy and triad in
    the ISA that read fastest."""
    from .. import native
    from .isa import roofs_isas

    arrays = STREAM_ARRAYS[kernel]
    if available is not None and arrays * array_bytes > MEMORY_SHARE * available:
        counted = "1 array of" if arrays == 1 else f"{arrays} arrays of"
        raise MemoryError(f"{counted} {_mib(array_bytes)} need{'s' if arrays == 1 else ''} more than half of the "
                          f"{_mib(available)} available")
    isas = [isa] if isa else roofs_isas()
    plural = "s" if arrays > 1 else ""
    progress(f"{what}: {kernel} bandwidth ({_threads(threads)}, {arrays} array{plural} of {_mib(array_bytes)}, "
             f"{', '.join(isas)}) ...")
    moved = arrays * (array_bytes // 8 * 8)
    by_isa = {name: repeated([moved / s / 1e9 for s in native.load().stream_seconds(kernel, array_bytes, threads,
                                                                                    repetitions, name)])
              for name in isas}
    best = max(by_isa, key=lambda name: by_isa[name].best)
    return BandwidthRoof(
        kernel=kernel,
        gb_per_s=by_isa[best],
        threads=threads,
        array_bytes=array_bytes,
        node=_memory_node(),
        isa=best,
        isas={name: figure.best for name, figure in by_isa.items()} if len(by_isa) > 1 else {},
    )


def _torch_dtype(dtype: str) -> Any:
    import torch

    dtypes = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}
    if dtype not in dtypes:
        raise ValueError(f"unknown dtype {dtype!r} (known: {', '.join(dtypes)})")
    return dtypes[dtype]


def _timed(fn: Callable[..., object], *args: Any, **kwargs: Any) -> float:
    start = time.perf_counter()
    fn(*args, **kwargs)
    return time.perf_counter() - start


def _generator() -> Any:
    """A private generator: the calibration must not move the global RNG a workload seeds from."""
    import torch

    return torch.Generator().manual_seed(0)


def _compute(dtype: str, threads: int, repetitions: int, progress: Progress) -> ComputeRoof:
    import torch

    from .isa import kernel_names

    tdtype = _torch_dtype(dtype)
    progress(f"calibrating: {dtype} compute (square GEMMs, {_threads(threads)}) ...")
    generator = _generator()
    n = GEMM_START
    while True:
        a = torch.rand(n, n, dtype=tdtype, generator=generator)
        b = torch.rand(n, n, dtype=tdtype, generator=generator)
        # Into one preallocated output: a fresh one would be page-faulted in every repetition.
        c = torch.empty(n, n, dtype=tdtype)
        ran = kernel_names(lambda: torch.mm(a, b, out=c))  # noqa: B023 (the first call picks the kernel)
        elapsed = _timed(torch.mm, a, b, out=c)
        if elapsed >= GEMM_MIN_SECONDS or n >= GEMM_MAX:
            break
        n *= 2
    seconds = [elapsed] + [_timed(torch.mm, a, b, out=c) for _ in range(repetitions - 1)]
    return ComputeRoof(
        dtype=dtype, gflop_per_s=repeated([2 * n**3 / s / 1e9 for s in seconds]), threads=threads, size=n, isa=ran
    )


def _gemv_paths(dtype: str) -> dict[str, tuple[Callable[[Any], Any], Callable[[Any, Any, Any], Any]]]:
    """The GEMV paths torch offers for a weight in ``dtype``, by name: how to prepare a weight once (as a
    model's load or torch.compile's freezing does) and how to call it on a row. Prepacked weights are in
    the layout the kernel reads best; a decode through them (compiled, a serving engine) beats eager."""
    import torch
    import torch.nn.functional as F

    paths: dict[str, tuple[Callable[[Any], Any], Callable[[Any, Any, Any], Any]]] = {
        "F.linear": (lambda w: w, lambda x, packed, _w: F.linear(x, packed))}
    if torch.backends.mkldnn.is_available():
        paths["oneDNN prepacked"] = (
            lambda w: torch.ops.mkldnn._reorder_linear_weight(w, 1),
            lambda x, packed, _w: torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], ""))
    if dtype == "f32" and torch.backends.mkl.is_available():
        paths["MKL prepacked"] = (lambda w: torch.ops.mkl._mkl_reorder_linear_weight(w, 1),
                                  lambda x, packed, w: torch.ops.mkl._mkl_linear(x, packed, w, None, 1))
    return paths


def _layered_rates(calls: Sequence[tuple[int, Callable[[], object], int]], shapes: int,
                   repetitions: int) -> list[Repeated]:
    """GB/s per weight shape of ``calls`` (shape index, call, bytes it reads and writes) made in a
    decoder's order, each call timed by itself, over ``repetitions`` rounds after an untimed one. In
    that order a down projection after its layer's wide ones read 23 GB/s here where the same calls
    in a row read 18: a roof measured one shape at a time is not what a decode's GEMVs reach."""
    for _shape, call, _bytes in calls:
        call()  # untimed: the first calls choose the kernels and fault in their buffers
    rates: list[list[float]] = [[] for _ in range(shapes)]
    for _ in range(repetitions):
        seconds, moved = [0.0] * shapes, [0] * shapes
        for shape, call, nbytes in calls:
            seconds[shape] += _timed(call)
            moved[shape] += nbytes
        for shape in range(shapes):
            if seconds[shape] > 0:
                rates[shape].append(moved[shape] / seconds[shape] / 1e9)
    return [repeated(r) for r in rates]


@dataclasses.dataclass(frozen=True)
class DecoderWeights:
    """The weights a GEMV kernel roof reads in a decoder's order: ``layers`` times ``layer``, then the
    output head, together at least the bytes asked for (several times the last-level cache: read in
    turn, none stays in the caches)."""

    layer: tuple[tuple[int, int], ...]
    layers: int
    element_bytes: float

    @property
    def order(self) -> list[tuple[int, int]]:
        return [shape for _ in range(self.layers) for shape in self.layer] + [GEMV_HEAD]

    @property
    def shapes(self) -> list[tuple[int, int]]:
        return sorted(set(self.order))

    @property
    def nbytes(self) -> float:
        return sum(out * inputs for out, inputs in self.order) * self.element_bytes

    def count(self, shape: tuple[int, int]) -> int:
        return self.order.count(shape)

    def describe(self) -> str:
        layer = " + ".join(f"[{o},{i}]" for o, i in self.layer)
        return f"{self.layers} layers of {layer}, then a head [{GEMV_HEAD[0]},{GEMV_HEAD[1]}], in a decoder's order"


def _decoder_weights(layer: tuple[tuple[int, int], ...], element_bytes: float, weight_bytes: int,
                     available: int | None) -> DecoderWeights:
    """At least 2 layers, and as many as make ``weight_bytes``; a MemoryError where they need more than
    MEMORY_SHARE of the memory ``available``."""
    layer_bytes = sum(out * inputs for out, inputs in layer) * element_bytes
    weights = DecoderWeights(layer, max(2, -(-weight_bytes // max(1, int(layer_bytes)))), element_bytes)
    if available is not None and weights.nbytes > MEMORY_SHARE * available:
        raise MemoryError(f"{weights.describe()} ({_mib(weights.nbytes)}) need more than half of the "
                          f"{_mib(available)} available")
    return weights


def _kernel(
    dtype: str, weight_bytes: int, threads: int, repetitions: int, available: int | None, progress: Progress
) -> KernelRoof:
    """The best decode GEMV over every path torch offers for ``dtype``: layers of a decoder's weights
    (two wide projections, then a long-row one: GEMV_LAYER) and its head, together at least ``weight_bytes``, called
    in that order with each call timed, each path's weights prepared once before it is timed. The roof
    is the best shape's figure on the best path."""
    import torch

    from .isa import kernel_names

    tdtype = _torch_dtype(dtype)
    size = DTYPE_BYTES[dtype]
    weights = _decoder_weights(GEMV_LAYER, size, weight_bytes, available)
    # A prepacked path holds its copy beside the plain weights while it runs: where both do not fit, only
    # the plain path is measured.
    packed_fits = available is None or 2 * weights.nbytes <= MEMORY_SHARE * available
    progress(f"calibrating: {dtype} GEMV kernel roof ({weights.describe()}, every path torch offers, "
             f"{_threads(threads)}) ...")
    generator = _generator()
    shapes = weights.shapes
    rows = [(shapes.index(shape), torch.empty(*shape, dtype=tdtype).uniform_(-1, 1, generator=generator))
            for shape in weights.order]
    xs = [torch.empty(1, inputs, dtype=tdtype).uniform_(-1, 1, generator=generator) for _out, inputs in shapes]
    measured: dict[str, tuple[Repeated, str, int]] = {}  # path -> (its best shape's figure, kernel, shape index)
    failures: list[str] = []
    for name, (prepare, call) in _gemv_paths(dtype).items():
        if name != "F.linear" and not packed_fits:
            failures.append(f"{name}: a packed copy of the weights does not fit in the memory available")
            continue
        try:
            packed = [(k, prepare(w), w) for k, w in rows]
            ran = kernel_names(lambda: call(xs[packed[0][0]], packed[0][1], packed[0][2]))  # noqa: B023
            calls = [(k, functools.partial(call, xs[k], p, w), w.nbytes + xs[k].nbytes + w.shape[0] * size)
                     for k, p, w in packed]
            by_shape = _layered_rates(calls, len(shapes), repetitions)
        except (RuntimeError, AttributeError, TypeError, NotImplementedError) as exc:
            failures.append(f"{name}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}")
            continue
        finally:
            packed, calls = [], []
        best = max(range(len(shapes)), key=lambda k: by_shape[k].best)
        measured[name] = (by_shape[best], ran, best)
    if not measured:
        raise RuntimeError("no GEMV path ran (" + "; ".join(failures) + ")")
    path = max(measured, key=lambda name: measured[name][0].best)
    figure, ran, shape = measured[path]
    out, inputs = shapes[shape]
    count = weights.count(shapes[shape])
    return KernelRoof(dtype=dtype, gb_per_s=figure, threads=threads, shape=[1, inputs, out * count],
                      path=path, isa=ran, paths={name: m[0].best for name, m in measured.items()})


_WEIGHT_ELEMENT_BYTES = {"i8": 1.0, "i4": 0.5}
# The in-cache weight of a quantized kernel roof: a quarter of the last-level cache, at most this
# (read again and again, it stays in the caches), and calls are repeated until a repetition takes
# at least CACHED_MIN_SECONDS, so a timer's resolution is noise.
CACHED_MAX_BYTES = 8 << 20
CACHED_MIN_SECONDS = 0.02
# The out-of-cache quantized roof reads distinct weights of this many rows (Llama-3.2-1B's MLP width)
# in turn: torch's int4 kernel indexes a weight with 32-bit integers, and one weight several times a
# large last-level cache would overflow them.
QUANT_WEIGHT_ROWS = 8192
QUANT_LAYER = ((QUANT_WEIGHT_ROWS, GEMV_IN), (QUANT_WEIGHT_ROWS, GEMV_IN), (GEMV_IN, QUANT_WEIGHT_ROWS))


@dataclasses.dataclass(frozen=True)
class QuantKernel:
    """A quantized GEMV kernel roof a run needs: activations in ``dtype`` (f32, bf16), weights
    stored as ``weights`` (i8, i4), int4 in groups of ``group_size`` inputs."""

    dtype: str
    weights: str
    group_size: int = 0

    def measured_by(self, roof: KernelRoof) -> bool:
        return (roof.dtype, roof.weights, roof.group_size) == (self.dtype, self.weights, self.group_size)


def _quantized_calls(kernel: QuantKernel, shapes: Sequence[tuple[int, int]]) -> list[tuple[Callable[[], object], int]]:
    """A call of torch's int8 or int4 GEMV on a distinct random weight of each [out, in] of ``shapes``, in
    that order, with the bytes it reads and writes. The weights' values do not change the kernel's speed:
    int8 and packed int4 bytes are drawn at random (any byte is a valid pair of int4 weights), never
    quantized from a float matrix, so no float copy of hundreds of MB is ever made."""
    import torch

    tdtype = _torch_dtype(kernel.dtype)
    generator = _generator()
    rows: dict[int, Any] = {}  # one activation row per input width
    made: list[tuple[Callable[[], object], int]] = []
    for out, inputs in shapes:
        x = rows.setdefault(inputs, torch.empty(1, inputs, dtype=tdtype).uniform_(-1, 1, generator=generator))
        if kernel.weights == "i8":
            weight = torch.randint(-127, 128, (out, inputs), dtype=torch.int8, generator=generator)
            scales = torch.empty(out, dtype=tdtype).uniform_(0.001, 0.01, generator=generator)
            call = functools.partial(torch._weight_int8pack_mm, x, weight, scales)
        else:
            weight = torch.randint(0, 256, (out, inputs // 2), dtype=torch.uint8, generator=generator)
            scales = torch.empty(inputs // kernel.group_size, out, 2, dtype=tdtype).uniform_(0.001, 0.01,
                                                                                            generator=generator)
            call = functools.partial(torch._weight_int4pack_mm_for_cpu, x, weight, kernel.group_size, scales)
        made.append((call, x.nbytes + weight.nbytes + scales.nbytes + out * x.element_size()))
    return made


def _quant_kernel(kernel: QuantKernel, weight_bytes: int, cached_bytes: int, threads: int, repetitions: int,
                  available: int | None, progress: Progress) -> KernelRoof:
    """A quantized GEMV's roofs: bytes per second from layers of a decoder's weights (QUANT_LAYER: two
    wide projections, then a long-row one) and its head, together several times the last-level cache, called in that
    order with each call timed (as decode reads each layer's weights once per token: a weight read
    again and again stays in the caches, and its figure is not a decode's), the best shape's; and weight
    elements per second from one weight that stays in the caches (the dequantizing kernel's own speed,
    which binds where it is below what memory delivers), the best shape's."""
    per_element = _WEIGHT_ELEMENT_BYTES[kernel.weights]
    label = f"{kernel.dtype} x {'int8' if kernel.weights == 'i8' else f'int4 (group {kernel.group_size})'}"
    weights = _decoder_weights(QUANT_LAYER, per_element, weight_bytes, available)
    shapes = weights.shapes
    progress(f"calibrating: {label} GEMV kernel roof ({weights.describe()}, {_threads(threads)}) ...")
    order = weights.order
    calls = [(shapes.index(shape), call, nbytes)
             for shape, (call, nbytes) in zip(order, _quantized_calls(kernel, order), strict=True)]
    by_shape = _layered_rates(calls, len(shapes), repetitions)
    del calls
    best = max(range(len(shapes)), key=lambda k: by_shape[k].best)
    out, inputs = shapes[best]
    shape = [1, inputs, out * weights.count(shapes[best])]
    best_rate: tuple[Repeated, list[int]] | None = None
    for inputs in sorted({inputs for _out, inputs in shapes}):
        cached_out = max(256, int(cached_bytes / (inputs * per_element)) // 256 * 256)
        ((small, _bytes),) = _quantized_calls(kernel, [(cached_out, inputs)])
        small()
        repeat = max(1, int(CACHED_MIN_SECONDS / max(_timed(small), 1e-6)))
        elements = cached_out * inputs * repeat
        rate = repeated([elements / _timed(lambda: [small() for _ in range(repeat)])  # noqa: B023 (this shape's)
                         for _ in range(repetitions)])
        if best_rate is None or rate.best > best_rate[0].best:
            best_rate = (rate, [1, inputs, cached_out])
    assert best_rate is not None
    return KernelRoof(dtype=kernel.dtype, gb_per_s=by_shape[best], threads=threads, shape=shape,
                      weights=kernel.weights, group_size=kernel.group_size, elements_per_s=best_rate[0],
                      cached_shape=best_rate[1],
                      path="aten::_weight_int8pack_mm" if kernel.weights == "i8" else
                      "aten::_weight_int4pack_mm_for_cpu")


# Below this, a measuring window's run-queue share is one preemption's noise, not a busy machine.
MIN_BUSY_WINDOW_S = 0.5


def measure_quant_kernels(roofs: MachineRoofs, kernels: Sequence[QuantKernel], progress: Progress | None = None,
                          repetitions: int = DEFAULT_REPETITIONS) -> None:
    """Adds the quantized kernel roofs ``roofs`` lacks (one of another group size is replaced), on its
    threads; what cannot be measured is a line in its ``errors``."""
    import torch

    say = progress or (lambda _line: None)
    llc = llc_bytes() or FALLBACK_LLC_BYTES
    weight_bytes = max(LLC_MULTIPLE * llc, MIN_STREAM_BYTES)
    cached_bytes = min(llc // 4, CACHED_MAX_BYTES)
    torch_threads = torch.get_num_threads()
    if torch_threads != roofs.threads:
        torch.set_num_threads(roofs.threads)
    try:
        for kernel in kernels:
            if any(kernel.measured_by(k) for k in roofs.kernel):
                continue
            try:
                measured = _quant_kernel(kernel, weight_bytes, cached_bytes, roofs.threads,
                                         max(repetitions, MIN_REPETITIONS), mem_available_bytes(), say)
            except (ValueError, MemoryError, RuntimeError) as exc:
                roofs.errors.append(f"{kernel.dtype} x {kernel.weights} kernel roof not measured: {exc}")
                continue
            roofs.kernel = [k for k in roofs.kernel if (k.dtype, k.weights) != (kernel.dtype, kernel.weights)]
            roofs.kernel.append(measured)
    finally:
        if torch_threads != roofs.threads:
            torch.set_num_threads(torch_threads)


def calibrate(
    threads: int,
    cpus: list[int],
    dtypes: Sequence[str] = ("f32", "bf16"),
    progress: Progress | None = None,
    repetitions: int = DEFAULT_REPETITIONS,
) -> MachineRoofs:
    """Measures every roof in this process, on ``threads`` threads of the affinity already in force.

    ``cpus`` is recorded (and keys the cache), not applied. What cannot be measured becomes one
    line in ``errors`` and the rest is still measured; this never raises for a measurement.
    """
    import torch

    if threads < 1:
        raise ValueError(f"threads must be at least 1, not {threads}")
    repetitions = max(repetitions, MIN_REPETITIONS)
    say = progress or (lambda _line: None)
    started = time.perf_counter()
    fp = fingerprint()
    llc = llc_bytes() or FALLBACK_LLC_BYTES
    stream_bytes = max(LLC_MULTIPLE * llc, MIN_STREAM_BYTES)
    available = mem_available_bytes()
    roofs = MachineRoofs(
        fingerprint=fp,
        key=cache_key(fp, threads, cpus),
        measured=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        seconds=0.0,
        threads=threads,
        cpus=sorted(cpus),
        calibration=CALIBRATION,
    )
    torch_threads = torch.get_num_threads()
    if torch_threads != threads:
        torch.set_num_threads(threads)  # torch's GEMMs must run on the team being calibrated
    delay_before = process_run_delay_ns()
    try:
        _measure_bandwidths(roofs, STREAM_ARRAYS, stream_bytes, repetitions, available, say)
        try:
            from .isa import measure_peak, roofs_isa

            roofs.peak = measure_peak(threads, cpus, roofs_isa(), say)
        except (ValueError, RuntimeError, NativeModuleError) as exc:
            roofs.errors.append(f"the cores' FMA peak not measured: {exc}")
        for dtype in dtypes:
            try:
                roofs.compute.append(_compute(dtype, threads, repetitions, say))
            except (ValueError, MemoryError, RuntimeError) as exc:
                roofs.errors.append(f"{dtype} compute roof not measured: {exc}")
        for dtype in dtypes:
            try:
                roofs.kernel.append(_kernel(dtype, stream_bytes, threads, repetitions, available, say))
            except (ValueError, MemoryError, RuntimeError) as exc:
                roofs.errors.append(f"{dtype} kernel roof not measured: {exc}")
        for _ in range(BANDWIDTH_REMEASURES):
            above, memory = roofs.kernel_above_memory(), roofs.memory_gb_per_s()
            if above is None or memory is None:
                break
            say(f"calibrating: the {above.dtype} GEMV read {above.gb_per_s.best:.1f} GB/s from memory, above the "
                f"{memory:.1f} GB/s the bandwidth kernels measured (something else used memory then): measuring "
                "them again ...")
            _measure_bandwidths(roofs, [b.kernel for b in roofs.bandwidth], stream_bytes, repetitions, available, say)
    finally:
        if torch_threads != threads:
            torch.set_num_threads(torch_threads)
    roofs.seconds = time.perf_counter() - started
    roofs.run_queue_share = _busy_share(delay_before, roofs.seconds, threads)
    return roofs


def _measure_bandwidths(roofs: MachineRoofs, kernels: Iterable[str], array_bytes: int, repetitions: int,
                        available: int | None, progress: Progress) -> None:
    """Measures each STREAM kernel into ``roofs``; one measured before is replaced when this
    measurement's best is higher (the lower one was taken while something else used memory)."""
    # The read kernel (the memory roof) first, in every ISA; the others in the ISA that read fastest:
    # the same loads and stores, without three times the calibration's time.
    ordered = sorted(kernels, key=lambda k: k != "read")
    for kernel in ordered:
        reader = next((b.isa for b in roofs.bandwidth if b.kernel == "read" and b.isa), "")
        try:
            measured = _bandwidth(kernel, array_bytes, roofs.threads, repetitions, available, progress,
                                  isa="" if kernel == "read" else reader)
        except (ValueError, MemoryError, RuntimeError, NativeModuleError) as exc:
            if not any(b.kernel == kernel for b in roofs.bandwidth):
                roofs.errors.append(f"{kernel} bandwidth not measured: {exc}")
            continue
        before = [i for i, b in enumerate(roofs.bandwidth) if b.kernel == kernel]
        if not before:
            roofs.bandwidth.append(measured)
        elif roofs.bandwidth[before[0]].gb_per_s.best < measured.gb_per_s.best:
            roofs.bandwidth[before[0]] = measured


def _busy_share(delay_before: int | None, seconds: float, threads: int) -> float | None:
    """The calibrating threads' run-queue delay since ``delay_before`` / (``seconds`` x ``threads``)."""
    delay_after = process_run_delay_ns()
    if delay_before is None or delay_after is None or seconds <= 0:
        return None
    return max(0, delay_after - delay_before) / 1e9 / (seconds * threads)


def process_run_delay_ns(task_dir: str | Path = "/proc/self/task") -> int | None:
    """The run-queue delay of this process's threads so far (schedstat's second field: time runnable
    but waiting for a CPU), summed; None where schedstat cannot be read."""
    total, read = 0, False
    try:
        tasks = os.listdir(task_dir)
    except OSError:
        return None
    for tid in tasks:
        try:
            fields = Path(task_dir, tid, "schedstat").read_text().split()
            total += int(fields[1])
            read = True
        except (OSError, IndexError, ValueError):
            continue  # the thread ended while we looked, or a kernel without schedstat
    return total if read else None


# --- the cache -----------------------------------------------------------------------------------


class _Unusable(Exception):
    """The cache file exists but cannot be used; the message is the one line that says why."""


def _load(path: Path) -> RoofsCache | None:
    """The cache file, None when there is none; raises _Unusable when it cannot be used."""
    try:
        # A regular file of bounded size only: the cache's path comes from the environment, and a
        # FIFO or /dev/zero there must not hang or fill memory.
        data = read_regular_file(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except FileFormatError as exc:
        raise _Unusable(f"the roofs cache cannot be used: {exc}; measuring again") from exc
    except OSError as exc:
        raise _Unusable(f"the roofs cache {path} cannot be read ({exc.strerror or exc}); measuring again") from exc
    try:
        cache = from_json(RoofsCache, parse_json(data, path, "roofs cache"))
        # Each version only added fields with defaults: older files read as they are.
        if not 1 <= cache.version <= CACHE_VERSION:
            raise DecodeError(f"version {cache.version}, this cpuprof writes {CACHE_VERSION}")
    except (FileFormatError, DecodeError, RecursionError) as exc:
        what = "nested too deep" if isinstance(exc, RecursionError) else str(exc).removeprefix(f"{path}: ")
        raise _Unusable(f"the roofs cache {path} is damaged ({what}); measuring again") from exc
    return cache


def _differs(entry: MachineRoofs, fp: dict[str, str], threads: int, cpus: Sequence[int]) -> str | None:
    """Why an entry for this machine and binding measured with other software is not used."""
    if entry.threads != threads or entry.cpus != sorted(cpus):
        return None
    hardware = {k: v for k, v in fp.items() if k not in _SOFTWARE}
    if {k: v for k, v in entry.fingerprint.items() if k not in _SOFTWARE} != hardware:
        return None
    for name, label in _SOFTWARE.items():
        was, now = entry.fingerprint.get(name, "unknown"), fp.get(name, "unknown")
        if was != now:
            return f"cached roofs were measured with {label} {was}; this is {label} {now}: measuring again"
    return None


def _has_read_roof(roofs: MachineRoofs) -> bool:
    """The memory roof is the read kernel's: an entry without it (an older cpuprof's, or one whose read
    failed) is judged against another kernel's figure, so it is never cached nor taken from the cache;
    nor is one measured another way (CALIBRATION)."""
    return roofs.calibration == CALIBRATION and any(b.kernel == "read" for b in roofs.bandwidth)


def cached(threads: int, cpus: list[int]) -> tuple[MachineRoofs | None, str | None]:
    """The cached roofs for this machine, software, thread count and CPUs, or why there are none
    that can be used (None: simply not measured yet)."""
    try:
        cache = _load(cache_path())
    except _Unusable as exc:
        return None, str(exc)
    if cache is None:
        return None, None
    fp = fingerprint()
    key = cache_key(fp, threads, cpus)
    for entry in cache.entries:
        if entry.key == key and entry.fingerprint == fp and entry.threads == threads and entry.cpus == sorted(cpus):
            if not _has_read_roof(entry):
                return None, ("the cached roofs were measured by an older cpuprof (without the read-only memory "
                              "kernel, or the GEMV kernel roofs without a decoder's output head): measuring again")
            above = entry.kernel_above_memory()
            if above is not None:  # stored by a cpuprof that did not check: its memory roof is low
                return None, (f"the cached memory roof ({entry.memory_gb_per_s():.1f} GB/s) is below what its "
                              f"{above.dtype} GEMV read from memory ({above.gb_per_s.best:.1f} GB/s): measuring again")
            entry.from_cache = True
            return entry, None
    reasons = [r for r in (_differs(e, fp, threads, cpus) for e in reversed(cache.entries)) if r]
    return None, reasons[0] if reasons else None


def launch_entry(threads: int, cpus: list[int], omp: str, mempolicy: str,
                 nodes: Sequence[int] = ()) -> MachineRoofs | None:
    """The cached roofs for a launch of ``threads`` on ``cpus`` with this OpenMP runtime (gnu:
    torch's own, whichever it is; intel) and memory policy (mode and nodes), read without torch: a
    launcher decides by it whether to settle them before a program starts. The child that uses them
    checks the whole fingerprint."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        cache = _load(cache_path())
        torch_version = version("torch")
    except (_Unusable, PackageNotFoundError):
        return None
    if cache is None:
        return None
    cpu = _model_name(_read("/proc/cpuinfo")) or "unknown"
    policy = f"{mempolicy} {','.join(map(str, nodes)) or '-'};"  # as _memory_policy() writes it

    def runtime_matches(runtime: str) -> bool:
        return runtime.startswith("libiomp") == (omp == "intel")

    return next((e for e in cache.entries
                 if e.threads == threads and e.cpus == sorted(cpus) and e.fingerprint.get("cpu") == cpu
                 and e.fingerprint.get("torch") == torch_version and runtime_matches(e.fingerprint.get("openmp", ""))
                 and e.fingerprint.get("memory_policy", "").startswith(policy) and e.kernel_above_memory() is None
                 and _has_read_roof(e)),
                None)


def confirmed_within(roofs: MachineRoofs, seconds: float) -> float | None:
    """How long ago (s) ``roofs`` were measured or last agreed with a probe, if within ``seconds``."""
    times = [roofs.measured] + ([roofs.probe.at] if roofs.probe is not None and roofs.probe.outcome != "kept" else [])
    now = datetime.datetime.now(datetime.timezone.utc)
    ages = []
    for at in times:
        try:
            ages.append((now - datetime.datetime.fromisoformat(at)).total_seconds())
        except (TypeError, ValueError):
            continue
    recent = [age for age in ages if 0 <= age <= seconds]
    return min(recent) if recent else None


def probe(cached: MachineRoofs, progress: Progress | None = None) -> RoofProbe | None:
    """A short run of the memory roof's kernel at the cached roofs' thread count, held against that roof
    (outcome "agrees" or "remeasured", which the caller settles); None where it cannot run."""
    roof = cached.memory_roof()
    if roof is None:
        return None
    memory = roof.gb_per_s.best
    # Together the probe's arrays are at least the calibration's single array (four times the last-level
    # cache), so the caches serve little: the read kernel's own size, half of a triad's three.
    array_bytes = roof.array_bytes if roof.arrays == 1 else max(roof.array_bytes // 2, MIN_STREAM_BYTES)
    started = time.perf_counter()
    try:
        measured = _bandwidth(roof.kernel, array_bytes, cached.threads, PROBE_REPETITIONS, mem_available_bytes(),
                              progress or (lambda _line: None), what="probing", isa=roof.isa)
    except (ValueError, MemoryError, RuntimeError, NativeModuleError):
        return None
    best = measured.gb_per_s.best
    tolerance = max(PROBE_TOLERANCE, roof.gb_per_s.spread)
    agrees = (1 - tolerance) * memory <= best <= (1 + tolerance) * memory
    return RoofProbe(at=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), gb_per_s=best,
                     seconds=time.perf_counter() - started, cached_gb_per_s=memory, cached_measured=cached.measured,
                     outcome="agrees" if agrees else "remeasured", kernel=roof.kernel)


# A run at least this long probes the memory again at its end: a shared machine's memory was seen
# changing state within minutes; a shorter run's start probe, seconds before, stands for its end.
# CPUPROF_END_PROBE_AFTER_S changes it (0: every run).
END_PROBE_AFTER_S = 20.0
END_PROBE_ENV = "CPUPROF_END_PROBE_AFTER_S"


def end_probe_after_s() -> float:
    """END_PROBE_AFTER_S, or the environment's figure where it is a number of seconds."""
    try:
        seconds = float(os.environ.get(END_PROBE_ENV, ""))
    except ValueError:
        return END_PROBE_AFTER_S
    return seconds if seconds >= 0 else END_PROBE_AFTER_S


def probe_at_end(roofs: MachineRoofs, progress: Progress | None = None) -> RoofProbe | None:
    """The memory now, against the roof a run used since its start: outcome "agrees" or "changed"."""
    checked = probe(roofs, progress)
    if checked is not None and checked.outcome != "agrees":
        checked.outcome = "changed"
    return checked


@contextlib.contextmanager
def _cache_lock(path: Path) -> Iterator[None]:
    """Other runs' read-modify-writes of the cache file wait for this one's; where no lock file can be
    made (a read-only directory), none is taken: the write that follows fails on its own and says so."""
    import fcntl

    try:
        lock = open(path.with_name(path.name + ".lock"), "a")  # noqa: SIM115 (held across the yield)
    except OSError:
        yield
        return
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def record_probe(roofs: MachineRoofs) -> None:
    """Keeps ``roofs.probe`` with its cache entry: the file read again and only that entry's probe
    changed, and only if it is still the entry measured then (another run may have replaced it
    since), under a lock against other runs doing the same. Best effort, silent: the probe is a
    record for later readers, and this run has it already."""
    path = cache_path()
    try:
        with _cache_lock(path):
            cache = _load(path)
            entry = next((e for e in cache.entries if e.key == roofs.key and e.measured == roofs.measured),
                         None) if cache is not None else None
            if cache is None or entry is None:
                return
            entry.probe = roofs.probe
            write_text(path, json.dumps(to_json(cache), indent=1) + "\n", make_parents=True)
    except (OSError, _Unusable):
        return


def evict(key: str) -> str | None:
    """Removes ``key``'s entry from the cache; returns a warning if it cannot."""
    path = cache_path()
    with _cache_lock(path):
        return _evict(path, key)


def _evict(path: Path, key: str) -> str | None:
    try:
        cache = _load(path)
    except _Unusable:
        return None
    if cache is None or not any(e.key == key for e in cache.entries):
        return None
    cache.entries = [e for e in cache.entries if e.key != key]
    try:
        write_text(path, json.dumps(to_json(cache), indent=1) + "\n", make_parents=True)
    except OSError as exc:
        return f"cannot write the roofs cache {path} ({exc.strerror or exc})"
    return None


def store(roofs: MachineRoofs) -> str | None:
    """Adds ``roofs`` to the cache, replacing its key's entry; returns a warning if it cannot."""
    path = cache_path()
    with _cache_lock(path):
        return _store(path, roofs)


def _store(path: Path, roofs: MachineRoofs) -> str | None:
    try:
        cache = _load(path) or RoofsCache(version=CACHE_VERSION)
    except _Unusable:
        cache = RoofsCache(version=CACHE_VERSION)  # replaced whole: nothing in it can be trusted
    entry = dataclasses.replace(roofs, from_cache=False)
    entries = [e for e in cache.entries if e.key != roofs.key] + [entry]
    cache.entries = sorted(entries, key=lambda e: e.measured)[-MAX_CACHE_ENTRIES:]
    cache.version = CACHE_VERSION
    text = json.dumps(to_json(cache), indent=1) + "\n"
    try:
        # A regular file is written beside itself and renamed over: a reader never sees half a
        # file, and two runs storing at once leave one whole file (the last one's).
        write_text(path, text, make_parents=True)
    except OSError as exc:
        return f"cannot write the roofs cache {path} ({exc.strerror or exc}); they will be measured again next time"
    return None


def not_cached_because(roofs: MachineRoofs) -> str | None:
    """Why roofs this run measured are used for it but kept out of the cache; None: they are cached."""
    above = roofs.kernel_above_memory()
    if roofs.memory_gb_per_s() is None:
        return "roofs without a memory bandwidth are not cached; they will be measured again next time"
    if not _has_read_roof(roofs):
        return ("roofs without the read-only memory kernel (the memory roof), or measured another way, are not "
                "cached; they will be measured again next time")
    if above is not None:
        return (f"the memory bandwidth stayed at {roofs.memory_gb_per_s():.1f} GB/s when measured again, below the "
                f"{above.gb_per_s.best:.1f} GB/s the {above.dtype} GEMV read from memory: something else used "
                "memory while it was measured; the roofs are used for this run but not cached, and the memory roof "
                "is low; measure them again on a quiet machine (python -m cpuprof calibrate)")
    if roofs.run_queue_share is not None and roofs.run_queue_share > defaults.BUSY_CALIBRATION_SHARE:
        # A roof measured while another process held the CPUs is low, and every later verdict would
        # be judged against it: used for this run, said, never kept.
        return (f"the machine was busy while the roofs were measured (their threads waited for a CPU "
                f"{roofs.run_queue_share:.0%} of the time): they are used for this run but not cached, and are "
                "low; measure them again on a quiet machine (python -m cpuprof calibrate)")
    return None


def ensure(
    threads: int, cpus: list[int], force: bool = False, progress: Progress | None = None,
    quant_kernels: Sequence[QuantKernel] = (), keep_cached: bool = False, probe_memory: bool = True,
) -> tuple[MachineRoofs, list[str]]:
    """The roofs for this process's machine, software and binding: cached and confirmed by a probe of
    the memory now, else measured and stored. ``keep_cached``: a cached roof the probe disagrees with
    is kept (and said), not measured again. ``probe_memory``: False where the probe would read what
    other processes do at the same moment (the ranks of a group): the cached roofs are used as they
    are, with their last probe. ``quant_kernels``: the quantized GEMV roofs the run needs
    too; those the cached entry lacks are measured and added to it.

    Returns the roofs (``from_cache`` says which; ``probe`` what the probe read) and one-line
    warnings about the cache; what could not be measured is in the roofs' own ``errors``. Roofs
    without a memory bandwidth are not stored, so a run with more memory free measures them again.
    """
    warnings: list[str] = []
    checked: RoofProbe | None = None
    if not force:
        roofs, reason = cached(threads, cpus)
        if roofs is not None and probe_memory:
            roofs.probe = None  # the entry's last probe is another run's: this one probes for itself
            checked = _probed(roofs, keep_cached, progress, warnings)
            if checked is not None and checked.outcome == "remeasured":
                roofs = None
        if roofs is not None:
            missing = [k for k in quant_kernels if not any(k.measured_by(r) for r in roofs.kernel)]
            _add_quant_kernels(roofs, missing, threads, progress, warnings)
            roofs.from_cache = True
            return roofs, warnings
        if reason:
            warnings.append(reason)
    roofs = calibrate(threads, cpus, progress=progress)
    roofs.probe = checked  # the probe that found the cached roofs out of date, if one did
    if quant_kernels:
        measure_quant_kernels(roofs, quant_kernels, progress)
    reason = not_cached_because(roofs)
    if reason:
        warnings.append(reason)
        if checked is not None:  # the cached entry is known wrong now: no later run may take it
            problem = evict(roofs.key)
            if problem:
                warnings.append(problem)
    else:
        problem = store(roofs)
        if problem:
            warnings.append(problem)
    return roofs, warnings


def _probed(roofs: MachineRoofs, keep_cached: bool, progress: Progress | None,
            warnings: list[str]) -> RoofProbe | None:
    """Probes the memory against cached ``roofs`` (the cache carries a roof from one state of a
    shared machine's memory into another); sets ``roofs.probe`` unless it disagreed and is to be
    measured again (outcome "remeasured")."""
    checked = probe(roofs, progress)
    if checked is None:
        if roofs.memory_gb_per_s() is not None:
            warnings.append("the cached roofs could not be probed against the memory now (not enough memory free, "
                            "or the native module failed): used as cached")
        return None
    if checked.outcome != "remeasured" or keep_cached:
        roofs.probe = checked
    then = f"{checked.cached_gb_per_s:.1f} GB/s, measured {checked.cached_measured[:16].replace('T', ' ')} UTC"
    if checked.outcome != "agrees" and keep_cached:
        checked.outcome = "kept"
        warnings.append(f"{PROBE_NOTE}{checked.gb_per_s:.1f} GB/s, against the cached memory roof ({then}): kept "
                        "(--roofs cached); the ceiling and the GEMMs' shares of it are off by that much")
    if checked.outcome == "remeasured":
        warnings.append(f"{PROBE_NOTE}{checked.gb_per_s:.1f} GB/s, against the cached memory roof ({then}): the "
                        "memory is in another state; measuring the roofs again")
    return checked


def _add_quant_kernels(roofs: MachineRoofs, missing: list[QuantKernel], threads: int, progress: Progress | None,
                       warnings: list[str]) -> None:
    """Measures the quantized kernel roofs the cached ``roofs`` lack into them, and stores them (with
    the probe that confirmed them) where that is sound."""
    errors = len(roofs.errors)
    before = process_run_delay_ns()
    started = time.perf_counter()
    if missing:
        measure_quant_kernels(roofs, missing, progress)
    seconds = time.perf_counter() - started
    busy = _busy_share(before, seconds, threads) if missing else None
    if len(roofs.errors) > errors:
        return  # one could not be measured (its line is in the roofs): kept out of the cache, tried next run
    if busy is not None and seconds >= MIN_BUSY_WINDOW_S and busy > defaults.BUSY_CALIBRATION_SHARE:
        warnings.append(f"the machine was busy while the quantized kernel roofs were measured (their threads "
                        f"waited for a CPU {busy:.0%} of the time): used for this run, not cached")
        return
    kept = roofs.probe is not None and roofs.probe.outcome == "kept"
    if missing and not kept:  # quantized roofs measured in another state than the kept memory roof: never stored
        problem = store(roofs)
        if problem:
            warnings.append(problem)
    elif roofs.probe is not None and not kept:  # later readers see when the entry was last probed and what it read
        record_probe(roofs)
