"""The machine's measured limits (roofs) a profile's GEMMs and decode speed are judged against.

Every roof is measured, never taken from a datasheet: memory bandwidth by native STREAM-style
kernels at the run's thread count and binding, compute by large GEMMs through torch, and the
"kernel roof" by the best decode-shaped GEMV torch itself reaches. Each figure keeps its spread
over repetitions, so a report can say how far apart two figures must be to differ.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# A GEMV only reads its weight, and STREAM's triad figure leaves out its write-allocate traffic (a
# third more than it counts): a read stream can beat the triad figure by that, and by a little
# more, but one 1.5 times the triad's means the triad was measured on a memory something else used.
READ_OVER_TRIAD_MAX = 1.5


@dataclass
class Repeated:
    """One figure measured ``repetitions`` times: the best run, the median, and the spread."""

    best: float
    median: float
    spread: float  # (max - min) / median over the repetitions
    repetitions: int


@dataclass
class BandwidthRoof:
    """Memory bandwidth of one STREAM-style kernel, in GB/s (1e9 bytes/s, STREAM's own counting:
    copy moves 2 arrays' bytes per pass, triad 3; write-allocate traffic is not counted)."""

    kernel: str  # "copy" or "triad"
    gb_per_s: Repeated
    threads: int
    array_bytes: int  # each array's size (several times the last-level cache)
    node: int | None = None  # the NUMA node the arrays were on; None: the run's memory policy decided


@dataclass
class ComputeRoof:
    """Peak compute for one dtype: the best GFLOP/s of a large square GEMM through torch."""

    dtype: str  # f32, bf16
    gflop_per_s: Repeated
    threads: int
    size: int  # the GEMM was [size, size] x [size, size]


@dataclass
class KernelRoof:
    """The best bandwidth torch's own GEMV reaches at decode shapes (F.linear of one row by a weight
    matrix several times the last-level cache): what this torch build can do, as opposed to what
    the memory can."""

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


@dataclass
class RoofProbe:
    """A short triad run just before cached roofs were used: whether the memory is in the state the
    cached roof was measured in (a shared machine's memory moves between states its neighbours make,
    which no run-queue figure sees)."""

    at: str  # ISO 8601, UTC
    gb_per_s: float  # the best of its repetitions
    seconds: float
    cached_gb_per_s: float  # the cached memory roof it was held against
    cached_measured: str  # when that roof was measured (ISO 8601, UTC)
    outcome: str  # "agrees"; "remeasured": it disagreed, the roofs were measured again; "kept": --roofs cached

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
    # How busy the machine was while measuring: the calibrating threads' time runnable but waiting for
    # a CPU (schedstat) / (the calibration's wall time x its threads); None where it could not be read.
    run_queue_share: float | None = None
    probe: RoofProbe | None = None  # the last probe of the memory against them (kept with the cache entry)

    def memory_gb_per_s(self) -> float | None:
        """The memory roof: the best triad (STREAM's headline kernel), else the best copy."""
        for kernel in ("triad", "copy"):
            figures = [b.gb_per_s.best for b in self.bandwidth if b.kernel == kernel]
            if figures:
                return max(figures)
        return None

    def kernel_above_memory(self) -> KernelRoof | None:
        """The unquantized GEMV kernel roof that read its weight from memory faster than the triad
        allows, if one did: then the bandwidth was measured while something else used memory
        (another process, a neighbouring VM) and the memory roof is low. Checked against the triad
        only (copy's counting leaves out half of what it moves, so a healthy GEMV can read 1.5 times
        copy's figure), and against unquantized GEMVs only (a quantized kernel's bytes include its
        scales and it may be bound by dequantizing, so it is no read stream to hold the triad to)."""
        triad = [b.gb_per_s.best for b in self.bandwidth if b.kernel == "triad"]
        if not triad:
            return None
        above = [k for k in self.kernel if not k.weights and k.gb_per_s.best > READ_OVER_TRIAD_MAX * max(triad)]
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
