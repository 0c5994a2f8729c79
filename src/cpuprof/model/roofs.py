"""The machine's measured limits (roofs) a profile's GEMMs and decode speed are judged against.

Every roof is measured, never taken from a datasheet: memory bandwidth by native STREAM-style
kernels at the run's thread count and binding, compute by large GEMMs through torch, and the
"kernel roof" by the best decode-shaped GEMV torch itself reaches. Each figure keeps its spread
over repetitions, so a report can say how far apart two figures must be to differ.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

# A GEMV only reads its weight, and STREAM's triad figure leaves out its write-allocate traffic (a
# third more than it counts): a read stream can beat the triad figure by that, and by a little
# more, but one 1.5 times the triad's means the triad was measured on a memory something else used.
READ_OVER_TRIAD_MAX = 1.5
# A GEMV and the read kernel both only read: the GEMV may beat it by the run-to-run spread (up to
# 20-30% between minutes on a shared VM here), not more.
READ_OVER_READ_MAX = 1.3


@dataclass
class Repeated:
    """One figure measured ``repetitions`` times: the best run, the median, and the spread."""

    best: float
    median: float
    spread: float  # (max - min) / median over the repetitions
    repetitions: int


def repeated(values: Sequence[float]) -> Repeated:
    """Rates (higher is better) over repetitions: the best, the median and the relative spread."""
    median = statistics.median(values)
    spread = (max(values) - min(values)) / median if median > 0 else 0.0
    return Repeated(best=max(values), median=median, spread=spread, repetitions=len(values))


@dataclass
class BandwidthRoof:
    """Memory bandwidth of one STREAM-style kernel, in GB/s (1e9 bytes/s, STREAM's own counting:
    copy moves 2 arrays' bytes per pass, triad 3; write-allocate traffic is not counted)."""

    kernel: str  # "copy", "triad" or "read" (the sum of one array: only reads, as a decode reads weights)
    gb_per_s: Repeated
    threads: int
    array_bytes: int  # each array's size (several times the last-level cache)
    node: int | None = None  # the NUMA node the arrays were on; None: the run's memory policy decided
    isa: str = ""  # the instruction set the kernel's loops were built for (avx512, avx2, sse2); "": unknown
    isas: dict[str, float] = field(default_factory=dict)  # the best GB/s in each ISA it ran in (the fastest kept)

    @property
    def arrays(self) -> int:
        return {"triad": 3, "copy": 2}.get(self.kernel, 1)


@dataclass
class ComputeRoof:
    """Peak compute for one dtype: the best GFLOP/s of a large square GEMM through torch."""

    dtype: str  # f32, bf16
    gflop_per_s: Repeated
    threads: int
    size: int  # the GEMM was [size, size] x [size, size]
    isa: str = ""  # the kernel torch ran, as its library names it ("brg_matmul:avx512_core_bf16", "MKL SGEMM")


@dataclass
class KernelRoof:
    """The best bandwidth torch's own GEMV reaches at decode shapes (one row by weights together several
    times the last-level cache, read in turn as a decode reads its layers), over every path torch offers
    for the weights' storage (eager F.linear, and weights prepacked for oneDNN or MKL as torch.compile's
    freezing and serving engines keep them): what this torch build can do, as opposed to what the memory
    can."""

    dtype: str
    gb_per_s: Repeated
    threads: int
    shape: list[int]  # [1, in, out]: a [1, in] row times an [out, in] weight
    # How the weight was stored: "" in ``dtype`` (F.linear); "i8" or "i4": weight-only quantized, through
    # torch's int8 or int4 kernel (with its scales: their bytes are counted in gb_per_s).
    weights: str = ""
    group_size: int = 0  # i4: inputs per scale and zero point
    # Quantized: weight elements per second from a weight that stays in the caches (read again and
    # again), where memory does not bind: the dequantizing kernel's own speed. None: not measured.
    elements_per_s: Repeated | None = None
    cached_shape: list[int] = field(default_factory=list)  # [1, in, out] of that in-cache weight
    path: str = ""  # the fastest path: "F.linear", "oneDNN prepacked", "MKL prepacked", or the quantized op
    isa: str = ""  # the kernel that path ran, as its library names it; "": not reported
    # The best GB/s of every path measured (the fastest among them), so a report can say what prepacking gains.
    paths: dict[str, float] = field(default_factory=dict)


@dataclass
class ArithmeticPeak:
    """What the cores themselves can compute, beside what torch's GEMMs reach: a register-only loop of
    independent f32 fused multiply-adds on every thread (as likwid-bench's peakflops), and the
    theoretical peak derived from the instruction set, the FMA pipes and the clock."""

    isa: str  # the loop's instruction set (avx512, avx2, sse2)
    threads: int
    gflop_per_s: Repeated  # f32, measured by the loop
    # f32 FLOP per cycle per core with this ISA (pipes x lanes x 2), and where the pipes' count comes from;
    # None where the core is not known well enough to say.
    flop_per_cycle: int | None
    pipes: str  # "Zen 4: 2 x 256-bit FMA pipes (AVX-512 runs on both halves)", or why not derived
    ghz: float | None  # the clock the OS reports (max frequency, else /proc/cpuinfo's MHz)
    ghz_source: str  # "cpufreq cpuinfo_max_freq", "/proc/cpuinfo cpu MHz", ...
    bf16_factor: int = 0  # bf16 FLOP per f32 FLOP the ISA gives (2 with AVX512_BF16's dot products); 0: none

    def theoretical(self, dtype: str = "f32") -> float | None:
        """threads x FLOP/cycle x GHz, in GFLOP/s; None where the pipes or the clock are not known."""
        if self.flop_per_cycle is None or self.ghz is None:
            return None
        factor = 1 if dtype == "f32" else self.bf16_factor if dtype == "bf16" else 0
        return self.threads * self.flop_per_cycle * self.ghz * factor if factor else None

    @property
    def implied_ghz(self) -> float | None:
        """The clock the measured loop implies: above the reported one when the cores boost."""
        if self.flop_per_cycle is None:
            return None
        return self.gflop_per_s.best / (self.threads * self.flop_per_cycle)


@dataclass
class RoofProbe:
    """A short memory-roof kernel run just before cached roofs were used: whether the memory is in the state the
    cached roof was measured in (a shared machine's memory moves between states its neighbours make,
    which no run-queue figure sees)."""

    at: str  # ISO 8601, UTC
    gb_per_s: float  # the best of its repetitions
    seconds: float
    cached_gb_per_s: float  # the cached memory roof it was held against
    cached_measured: str  # when that roof was measured (ISO 8601, UTC)
    # Before use: "agrees"; "remeasured": it disagreed, the roofs were measured again; "kept": --roofs cached.
    # At the end of a long run (MachineRoofs.end_probe): "agrees", or "changed": the memory moved during it.
    outcome: str
    kernel: str = "triad"  # the bandwidth kernel it ran: the memory roof's

    @property
    def ratio(self) -> float:
        return self.gb_per_s / self.cached_gb_per_s if self.cached_gb_per_s else float("nan")


@dataclass
class MachineRoofs:
    """Roofs for one machine fingerprint, thread count and binding; cached, with their date."""

    fingerprint: dict[str, str]  # cpu model, cores, memory, torch version, OpenMP runtime
    key: str  # the cache key: a hash of the fingerprint, the thread count and the CPUs
    measured: str  # ISO 8601, UTC
    seconds: float  # how long the calibration took
    threads: int
    cpus: list[int]  # the CPUs the calibration ran on
    bandwidth: list[BandwidthRoof] = field(default_factory=list)
    compute: list[ComputeRoof] = field(default_factory=list)
    kernel: list[KernelRoof] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # what could not be measured, and why
    from_cache: bool = False  # True: read from the cache, not measured by this run
    # How it was measured: machine.roofs.CALIBRATION when it was (0: by a cpuprof before the number).
    calibration: int = 0
    # How busy the machine was while measuring: the calibrating threads' time runnable but waiting for
    # a CPU (schedstat) / (the calibration's wall time x its threads); None where it could not be read.
    run_queue_share: float | None = None
    probe: RoofProbe | None = None  # the last probe of the memory against them (kept with the cache entry)
    peak: ArithmeticPeak | None = None  # the cores' own f32 peak; None: not measured
    # A probe at the end of a long run, against the roof the run used: whether the memory changed state
    # during it. Never cached (it is this run's); None for a short run.
    end_probe: RoofProbe | None = None

    def memory_roof(self) -> BandwidthRoof | None:
        """The kernel whose best is the memory roof: the read kernel (a decode only reads its weights),
        else STREAM's triad, else copy."""
        for kernel in ("read", "triad", "copy"):
            found = [b for b in self.bandwidth if b.kernel == kernel]
            if found:
                return max(found, key=lambda b: b.gb_per_s.best)
        return None

    def memory_gb_per_s(self) -> float | None:
        roof = self.memory_roof()
        return roof.gb_per_s.best if roof is not None else None

    def kernel_above_memory(self) -> KernelRoof | None:
        """The unquantized GEMV kernel roof that read its weights from memory faster than the memory roof
        allows, if one did: then the bandwidth was measured while something else used memory (another
        process, a neighbouring VM) and the memory roof is low. Held against the read kernel (both only
        read) with READ_OVER_READ_MAX for the run-to-run spread, else against the triad with
        READ_OVER_TRIAD_MAX; against unquantized GEMVs only (a quantized kernel's bytes include its
        scales and it may be bound by dequantizing, so it is no read stream to hold the memory to)."""
        roof = self.memory_roof()
        if roof is None or roof.kernel == "copy":
            return None
        limit = (READ_OVER_READ_MAX if roof.kernel == "read" else READ_OVER_TRIAD_MAX) * roof.gb_per_s.best
        above = [k for k in self.kernel if not k.weights and k.gb_per_s.best > limit]
        return max(above, key=lambda k: k.gb_per_s.best) if above else None

    def compute_gflop_per_s(self, dtype: str) -> float | None:
        figures = [c.gflop_per_s.best for c in self.compute if c.dtype == dtype]
        return max(figures) if figures else None

    def kernel_gb_per_s(self, dtype: str, weights: str = "", group_size: int = 0) -> float | None:
        roof = self.kernel_roof(dtype, weights, group_size)
        return roof.gb_per_s.best if roof is not None else None

    def kernel_roof(self, dtype: str, weights: str = "", group_size: int = 0) -> KernelRoof | None:
        """The best GEMV kernel roof for activations in ``dtype`` and weights stored as ``weights``;
        ``group_size``: int4's groups, where known (0: any)."""
        found = [k for k in self.kernel if k.dtype == dtype and k.weights == weights
                 and (not group_size or k.group_size == group_size)]
        return max(found, key=lambda k: k.gb_per_s.best) if found else None
