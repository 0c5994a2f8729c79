"""The instruction sets behind the roofs: which one each roof kernel ran, the cores' arithmetic peak
measured by a register-only FMA loop, and the theoretical peak derived from the ISA, the FMA pipes
and the clock.

A roof measured through torch is what torch reaches; these say what the machine itself allows, so a
user sees how far torch's GEMV and GEMM are from it. The pipes per core are not in /proc/cpuinfo:
they come from a short table of the cores whose FMA width is documented, and a core outside it gets
no theoretical figure (the measured loop still stands).
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from ..model.roofs import ArithmeticPeak, repeated
from .topology import _model_name

# The roof kernels' ISA may be capped below the CPU's (as ONEDNN_MAX_CPU_ISA caps oneDNN's), to see
# what a machine without AVX-512 would measure: avx512, avx2 or sse2.
MAX_ISA_ENV = "CPUPROF_MAX_ISA"
# The FMA loop runs until one repetition takes at least this, so the team's start is noise.
FMA_MIN_SECONDS = 0.05
FMA_START_ITERATIONS = 1 << 16
FMA_REPETITIONS = 5

_VECTOR_BITS = {"avx512": 512, "avx2": 256, "sse2": 128}


def cpuinfo_fields(cpuinfo: str | None) -> dict[str, str]:
    """The first processor's fields of /proc/cpuinfo."""
    fields: dict[str, str] = {}
    for line in (cpuinfo or "").splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            if fields:
                break  # the blank line after the first processor
            continue
        fields.setdefault(key.strip(), value.strip())
    return fields


def fma_pipes(fields: dict[str, str], isa: str) -> tuple[int | None, str]:
    """The f32 FLOP per cycle per core with ``isa``'s vectors, and where the pipe count comes from.

    Documented FMA widths: AMD Zen 1 has two 128-bit FMA pipes, Zen 2 to Zen 4 two 256-bit ones (Zen 4
    runs a 512-bit instruction on both halves), Zen 5 two 512-bit ones; Intel cores since Haswell two
    256-bit ones, and Xeons with AVX-512 two 512-bit ones (some Skylake/Cascade Lake Silver and Gold
    5xxx parts have one: the derived figure is then twice theirs, and the loop shows it).
    """
    if isa == "sse2":
        return None, "sse2 has no fused multiply-add: not derived"
    if isa not in ("avx512", "avx2"):
        return None, f"cpuprof's table of FMA pipes is of x86 cores, not of this {isa} build: not derived"
    vendor, flags = fields.get("vendor_id", ""), set(fields.get("flags", "").split())
    try:
        family, model = int(fields.get("cpu family", "")), int(fields.get("model", ""))
    except ValueError:
        return None, "the CPU family is not in /proc/cpuinfo: not derived"
    if vendor == "AuthenticAMD":
        if family == 0x17:
            pipe_bits, core = (128, "Zen 1") if model < 0x30 else (256, "Zen 2")
        elif family == 0x19:
            pipe_bits, core = 256, ("Zen 4" if "avx512f" in flags else "Zen 3")
        elif family == 0x1A:
            pipe_bits, core = (512, "Zen 5") if "avx512f" in flags else (256, "Zen 5")
        else:
            return None, f"AMD family {family:#x} is not in cpuprof's table of FMA pipes: not derived"
    elif vendor == "GenuineIntel":
        if "avx512f" in flags:
            pipe_bits, core = 512, "an Intel core with AVX-512 (assumed 2 FMA units; some parts have 1)"
        elif "fma" in flags:
            pipe_bits, core = 256, "an Intel core with AVX2"
        else:
            return None, "an Intel core without FMA: not derived"
    else:
        return None, f"vendor {vendor or 'unknown'} is not in cpuprof's table of FMA pipes: not derived"
    lane_bits = min(pipe_bits, _VECTOR_BITS[isa])
    flop = 2 * (lane_bits // 32) * 2  # two pipes, f32 lanes each, two FLOP per FMA
    extra = " (AVX-512 on both halves)" if core == "Zen 4" and isa == "avx512" else ""
    return flop, f"{core}: 2 x {pipe_bits}-bit FMA pipes{extra}, {isa} vectors"


def clock_ghz(cpus: list[int], root: str | Path = "/") -> tuple[float | None, str]:
    """The cores' clock the OS reports: cpufreq's maximum where there is one, else /proc/cpuinfo's "cpu
    MHz" (under a hypervisor, usually the nominal clock: cores may boost above it)."""
    cpu = cpus[0] if cpus else 0
    text = _read(Path(root, f"sys/devices/system/cpu/cpu{cpu}/cpufreq/cpuinfo_max_freq"))
    if text and text.strip().isdigit() and int(text) > 0:
        return int(text) / 1e6, "cpufreq's cpuinfo_max_freq"
    mhz = cpuinfo_fields(_read(Path(root, "proc/cpuinfo"))).get("cpu MHz", "")
    try:
        if float(mhz) > 0:
            return float(mhz) / 1e3, "/proc/cpuinfo's cpu MHz (under a VM, the nominal clock)"
    except ValueError:
        pass
    match = re.search(r"@\s*([\d.]+)\s*GHz", _model_name(_read(Path(root, "proc/cpuinfo"))) or "")
    if match:
        return float(match.group(1)), "the model name's nominal clock"
    return None, "no clock reported"


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def roofs_isa() -> str:
    """The ISA the native roof kernels run: the widest this CPU has, capped by CPUPROF_MAX_ISA.
    Raises ValueError for a cap that is no ISA."""
    from .. import native

    return str(native.load().roofs_isa(os.environ.get(MAX_ISA_ENV, "").strip().lower()))


def roofs_isas() -> list[str]:
    """Every ISA the native roof kernels can run here, widest first (capped as roofs_isa is)."""
    widest = roofs_isa()
    order = list(_VECTOR_BITS)
    return order[order.index(widest):] if widest in order else [widest]


def measure_peak(threads: int, cpus: list[int], isa: str, progress: Callable[[str], None]) -> ArithmeticPeak:
    from .. import native

    nat = native.load()
    progress(f"calibrating: f32 FMA peak (register-only {isa} loop, {threads} thread{'s' if threads > 1 else ''}) ...")
    iterations = FMA_START_ITERATIONS
    while min(nat.fma_seconds(isa, threads, iterations, 1)) < FMA_MIN_SECONDS:
        iterations *= 2
    seconds = nat.fma_seconds(isa, threads, iterations, FMA_REPETITIONS)
    flops = threads * iterations * nat.fma_flops_per_iteration(isa)
    fields = cpuinfo_fields(_read(Path("/proc/cpuinfo")))
    flop, pipes = fma_pipes(fields, isa)
    ghz, source = clock_ghz(cpus)
    flags = set(fields.get("flags", "").split())
    bf16 = 2 if isa == "avx512" and "avx512_bf16" in flags and "amx_bf16" not in flags else 0
    return ArithmeticPeak(isa=isa, threads=threads, gflop_per_s=repeated([flops / s / 1e9 for s in seconds]),
                          flop_per_cycle=flop, pipes=pipes, ghz=ghz, ghz_source=source, bf16_factor=bf16)


# oneDNN's verbose lines name the implementation that ran ("brg_matmul:avx512_core_bf16"); MKL's name
# the routine (its code path is not in them).
_ONEDNN_EXEC = re.compile(r"onednn_verbose,(?:v1,)?(?:primitive,)?exec,cpu,(\w+),([^,]+),")
_MKL_CALL = re.compile(r"MKL_VERBOSE\s+(\w+)\(")


def kernel_names(call: Callable[[], object]) -> str:
    """The kernels torch's libraries say ``call`` ran (oneDNN's implementation, MKL's routine), from
    their verbose output captured off this process's stdout; "" where none said (ATen's own kernel) or
    the output could not be captured: a label, never a reason for the measurement to fail."""
    import torch

    try:
        with _stdout_captured() as read_back:
            with contextlib.ExitStack() as stack:
                if torch.backends.mkldnn.is_available():
                    stack.enter_context(torch.backends.mkldnn.verbose(torch.backends.mkldnn.VERBOSE_ON))
                if torch.backends.mkl.is_available():
                    stack.enter_context(torch.backends.mkl.verbose(torch.backends.mkl.VERBOSE_ON))
                call()
    except (OSError, AssertionError, RuntimeError):  # no temporary file, no fd 1, verbose mode refused
        call()
        return ""
    names: list[str] = []
    for line in read_back():
        match = _ONEDNN_EXEC.search(line)
        name = (f"oneDNN {match.group(2)}" if match and match.group(1) != "reorder"
                else f"MKL {m.group(1)}" if (m := _MKL_CALL.search(line)) else None)
        if name and name not in names:
            names.append(name)
    return ", ".join(names)


def _flush_c_stdio() -> None:
    """C's stdout buffer out to the fd it was written for (oneDNN flushes its own lines; not all do)."""
    import ctypes

    try:
        ctypes.CDLL(None).fflush(None)
    except (OSError, AttributeError):
        pass


@contextlib.contextmanager
def _stdout_captured() -> Iterator[Callable[[], list[str]]]:
    """File descriptor 1 sent to a temporary file for the block (the libraries write there from C);
    put back whatever happens, Python's and C's buffers flushed to the right side of the switch."""
    lines: list[str] = []
    with tempfile.TemporaryFile(mode="w+b") as sink:
        sys.stdout.flush()
        _flush_c_stdio()
        saved = os.dup(1)
        try:
            os.dup2(sink.fileno(), 1)
            try:
                yield lambda: lines
            finally:
                with contextlib.suppress(OSError, ValueError):
                    sys.stdout.flush()
                _flush_c_stdio()
                os.dup2(saved, 1)
        finally:
            os.close(saved)
        sink.seek(0)
        lines.extend(sink.read(1 << 20).decode(errors="replace").splitlines())
