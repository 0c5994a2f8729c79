"""Every GEMM against the machine's roofs: is it memory- or compute-bound, how close does it get to
that roof, how much time does the gap cost, and where (in native code) does that time go.

The work of each op comes from its recorded shapes (``gemm.py``: analytic FLOPs and the least
bytes any kernel must move); the time is measured; the roofs are measured (``model/roofs.py``).
Every verdict is computed from those figures, never from an op's name.

Nesting. ``aten::linear`` and ``aten::matmul`` have no kernel of their own: they call
``aten::addmm``/``aten::mm``/``aten::bmm``, which are recorded as ops of their own, and ``aten::addbmm``
calls ``aten::addmm_``. Counting both would count each GEMM twice, and the outer op's self time
is only its bookkeeping. So a GEMM is counted once, at the innermost GEMM-like op, with that op's
inclusive time (its own kernel plus the small ops it calls, such as a contiguous copy). An op key
is "outer" when its op has no kernel (``gemm.COMPOSITE_OPS``, a fact of torch's registry) or when
the profile shows a GEMM-like op nested under it: in a sample's op path (sampled mode) or in the
span timeline (``timeline=N``). Without either record, nested kernels that are not composites
cannot be told apart (none in torch 2.13's CPU paths an LLM runs).
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field

from .. import defaults
from ..model import SAMPLED, MachineRoofs, NativeFrame, OpStat, Profile
from ..model.workload import QUANT_WEIGHT_CODES
from ..units import fmt_bytes, fmt_count, fmt_ns, fmt_percent
from .gemm import COMPOSITE_OPS, GemmWork, gemm_work, is_gemm_like
from .gemm_kernels import KernelTally, UnknownGemm, isa_text, unknown_gemm_ops
from .labels import inputs_text
from .native import short_function
from .report_model import Column, Section, Table

# Within this share of the attainable figure a GEMM is "at the roof": STREAM's triad is itself
# 80-90% of what DRAM can do and best-of-N roofs vary by about 10% from run to run here, so the
# last fifth is not a gap another kernel could reliably close.
AT_ROOF_SHARE = 0.80
#: The weight-only quantized storages the kernel roofs are measured for, by GemmWork.weight_dtype's code.
QUANTIZED_WEIGHTS = {code: mode for mode, code in QUANT_WEIGHT_CODES.items()}
# Above the roof by more than the roofs' run-to-run spread: the bytes did not come from DRAM (they
# fit in the caches), or the roof was measured low.
ABOVE_ROOF_SHARE = 1.10
# A native category holding this share of a GEMM's sampled CPU is named as a cause: below it, it is
# within what a GEMM's ordinary overheads (dispatch, small copies, allocation) take.
CAUSE_SHARE = 0.20
# Where the measured traffic comes from: hardware cache-miss counters, one cache line per miss.
# LLC-load-misses first (a GEMM's traffic is its reads), the generic cache-misses (perf: "usually
# last-level cache misses") where that is all that was counted.
MISS_EVENTS = ("LLC-load-misses", "cache-misses")
CACHE_LINE_BYTES = 64

# Frames that repack a matrix into a kernel's blocked layout: oneDNN's brgemm copy kernels
# (jit_brgemm_matmul_copy_b...), its gemm driver's copy_bn/copy_bt kernels, reorders
# (simple_reorder, jit_uni_reorder), MKL's and cpublas's pack routines. "packed" (a kernel working on an
# already packed matrix), "unpack", "packet" (vector types), cpublas's could_pack (a query) and the
# weight-only GEMMs on packed weights (int8pack_mm_kernel_, int4pack_mm_kernel_: their compute) are
# not repacking.
REPACK_FRAME = re.compile(r"copy_?b|reorder|(?<!un)(?<!could_)pack(?!ed|et|_mm)", re.IGNORECASE)


@dataclass
class NativeGemmSplit:
    """What native code the samples under a GEMM's ops were in, as shares of their CPU time.

    A sample counts as OpenMP when its leaf is the OpenMP runtime (threads waiting or spinning,
    whatever they wait for: its fix is the threads, not the kernel); else as repacking when any
    frame of its stack repacks (the copy kernels' leaves are often unnamed JIT code or memcpy, the
    reorder that called them is not); else as compute when its leaf is compute code; else other."""

    samples: int = 0
    cpu_ns: int = 0
    by_part: dict[str, int] = field(default_factory=dict)  # "repack", "compute", "openmp", "other" -> CPU ns
    repack_functions: dict[str, int] = field(default_factory=dict)  # repacking_name -> CPU ns
    kernels: KernelTally = field(default_factory=KernelTally)  # the compute samples' leaves, with their ISA

    def share(self, part: str) -> float:
        return self.by_part.get(part, 0) / self.cpu_ns if self.cpu_ns else 0.0

    @property
    def repack_function(self) -> str | None:
        """The repacking function most of the repacking samples were under."""
        if not self.repack_functions:
            return None
        return max(self.repack_functions.items(), key=lambda kv: kv[1])[0]

    @property
    def enough_samples(self) -> bool:
        return self.samples >= defaults.MIN_SAMPLES

    @property
    def kernel(self) -> str | None:
        """The compute kernel most of its compute samples were in, "name (isa)" where a name says the ISA."""
        return self.kernels.kernel


@dataclass
class MeasuredTraffic:
    """Bytes the GEMM's ops moved from memory, from a cache-miss counter: misses x one cache line."""

    event: str
    bytes: int  # over all calls

    def gb_per_s(self, time_ns: int) -> float | None:
        return self.bytes / time_ns if time_ns else None


@dataclass
class GemmGroup:
    """The ops that run one GEMM (same kind, dtype and shape), across regions and op names: a
    model's 16 identical projections are one group."""

    work: GemmWork  # per call (for attention over a growing KV cache: the first length seen)
    calls: int
    time_ns: int  # inclusive time of the counted (innermost) ops, summed over calls
    ops: list[OpStat]  # the counted op keys
    total_flops: int = 0  # over every call (attention: each KV length's own work)
    total_bytes: int = 0
    shape_text: str = ""  # the row's label: work.shape_text, or the range of KV lengths it covers
    memory_s_at_roof: float = 0.0  # sum over calls of bytes / bandwidth and FLOPs / peak, when measured
    compute_s_at_roof: float = 0.0
    memory_gb_per_s: float | None = None  # the roofs it is judged against; None: not measured
    peak_gflop_per_s: float | None = None  # of its dtype
    kernel_gb_per_s: float | None = None  # torch's best GEMV of its dtype (and weight storage, if quantized)
    kernel_path: str = ""  # the path that best GEMV took ("oneDNN prepacked", "F.linear", the quantized op)
    # Quantized weights: torch's kernel's weight elements per second from a weight in the caches (its
    # dequantization's own speed); None: not quantized, or not measured.
    kernel_elements_per_s: float | None = None
    native: NativeGemmSplit | None = None  # None: no stacks in this profile
    traffic: MeasuredTraffic | None = None  # None: no cache-miss counter was counted
    verdict: str = ""
    program: bool = False  # a program's (run), not the built-in decoder's: its advice is the program's to apply

    @property
    def op_ids(self) -> list[int]:
        return [op.id for op in self.ops]

    @property
    def op_names(self) -> list[str]:
        return list(dict.fromkeys(op.name for op in self.ops))

    @property
    def flops(self) -> int:
        return self.total_flops

    @property
    def bytes(self) -> int:
        return self.total_bytes

    @property
    def intensity(self) -> float:
        return self.total_flops / self.total_bytes if self.total_bytes else 0.0

    @property
    def gflop_per_s(self) -> float | None:
        return self.flops / self.time_ns if self.time_ns else None  # flop/ns is GFLOP/s

    @property
    def gb_per_s(self) -> float | None:
        return self.bytes / self.time_ns if self.time_ns else None

    @property
    def ridge(self) -> float | None:
        """The intensity (flop/B) above which the compute roof binds instead of the memory roof."""
        if self.peak_gflop_per_s is None or not self.memory_gb_per_s:
            return None
        return self.peak_gflop_per_s / self.memory_gb_per_s

    @property
    def bound(self) -> str | None:
        """The roof that binds it in principle, from its intensity alone: "memory" or "compute"."""
        if self.peak_gflop_per_s is None or self.memory_gb_per_s is None:
            return None
        return "memory" if self.intensity * self.memory_gb_per_s < self.peak_gflop_per_s else "compute"

    @property
    def attainable_gflop_per_s(self) -> float | None:
        if self.peak_gflop_per_s is None or self.memory_gb_per_s is None:
            return None
        return min(self.peak_gflop_per_s, self.intensity * self.memory_gb_per_s)

    @property
    def roof_share(self) -> float | None:
        """Achieved over attainable: for a memory-bound GEMM its bandwidth over the memory roof."""
        attainable, achieved = self.attainable_gflop_per_s, self.gflop_per_s
        return achieved / attainable if attainable and achieved is not None else None

    @property
    def kernel_roof_share(self) -> float | None:
        """A memory-bound GEMM's bandwidth over the best torch's GEMV reaches for its dtype. Not for
        attention: its kernel is another one, and the GEMV's best says nothing about it."""
        if (self.bound != "memory" or self.work.kind != "gemm" or not self.kernel_gb_per_s
                or self.gb_per_s is None):
            return None
        return self.gb_per_s / self.kernel_gb_per_s

    @property
    def quantized_weights(self) -> str:
        """"i8" or "i4" for a weight-only quantized GEMM, else ""."""
        return self.work.weight_dtype if self.work.weight_dtype in QUANTIZED_WEIGHTS else ""

    @property
    def kernel_name(self) -> str:
        """What the kernel roof is of: "bf16", or "bf16 x int8" for a quantized weight."""
        weights = QUANTIZED_WEIGHTS.get(self.quantized_weights)
        return f"{self.work.dtype} x {weights}" if weights else self.work.dtype

    @property
    def dequant_ns(self) -> float | None:
        """The least time its calls take at the dequantizing kernel's in-cache rate: every weight
        element unpacked and scaled once per call (what binds where memory would deliver faster)."""
        if not self.kernel_elements_per_s or self.work.kind != "gemm":
            return None
        return self.calls * self.work.batch * self.work.n * self.work.k / self.kernel_elements_per_s * 1e9

    @property
    def ideal_ns(self) -> float | None:
        """The least time its calls could take at the roofs."""
        if not self.peak_gflop_per_s or not self.memory_gb_per_s:
            return None
        return max(self.total_flops / self.peak_gflop_per_s, self.total_bytes / self.memory_gb_per_s)

    @property
    def lost_ns(self) -> float | None:
        """Time beyond the roofs' least (never negative: a GEMM served from the caches beats the
        memory roof, and then loses nothing to it)."""
        ideal = self.ideal_ns
        return None if ideal is None else max(0.0, self.time_ns - ideal)


# Decode attention reads a KV cache one position longer every step: its calls are one GEMM whose
# length grows, and read as one row whose shape gives the range of lengths.
_KV_SHAPE = re.compile(r"kv\[(\d+),(\d+),(\d+),(\d+)\]")
_ANY_LENGTH = "⟨L⟩"


def _group_shape(work: GemmWork) -> str:
    if work.kind != "attention":
        return work.shape_text
    return _KV_SHAPE.sub(lambda m: f"kv[{m[1]},{m[2]},{_ANY_LENGTH},{m[4]}]", work.shape_text)


def roof_ns(group: GemmGroup, roofs: MachineRoofs) -> float:
    """The group's least time at the roofs, in ns: max(FLOPs / peak, bytes / bandwidth) over all its
    calls, from the roofs that were measured (a roof not measured binds nothing; 0.0 when neither was).
    Unlike ``ideal_ns`` it needs only one of the roofs, which the decode ceiling can use alone."""
    bw, peak = roofs.memory_gb_per_s(), roofs.compute_gflop_per_s(group.work.dtype)
    return max(group.bytes / bw if bw else 0.0, group.flops / peak if peak else 0.0)  # bytes / (GB/s) = ns


def _short(value: float) -> str:
    """Three significant digits, without an exponent."""
    if value >= 100:
        return f"{value:,.0f}"
    if value >= 10:
        return f"{value:.1f}"
    if value >= 1:
        return f"{value:.2f}"
    return f"{value:.2g}"


# What packs a program's weights once, where cpuprof's own decoder has its --compile.
PROGRAM_PREPACK = ("torch.compile of the model with frozen weights (torch._inductor.config.freezing = True, "
                   "under torch.no_grad()), or IPEX's ipex.optimize(model), packs them once")


def _native_causes(group: GemmGroup) -> list[str]:
    """What the samples say about a GEMM below its roof."""
    split = group.native
    if split is None:
        return ["native split not known (no stacks: exact mode)"]
    if not split.enough_samples:
        return [f"too few samples ({split.samples}) to say where its time went"]
    causes = []
    repack = split.share("repack")
    if repack >= CAUSE_SHARE:
        where = f" ({split.repack_function})" if split.repack_function else ""
        if group.program:
            causes.append(f"{fmt_percent(repack)} of its samples repack the weights{where}: {PROGRAM_PREPACK}")
        else:
            causes.append(f"{fmt_percent(repack)} of its samples repack the weights{where}: weights packed once "
                          "(decode --compile: torch.compile with frozen weights) usually fix that; measure it with "
                          "compare --from this profile's directory")
    openmp = split.share("openmp")
    if openmp >= CAUSE_SHARE:
        causes.append(f"{fmt_percent(openmp)} of its CPU is in the OpenMP runtime (threads waiting or spinning): "
                      + ("try fewer threads, another runtime and binding (run --threads, --omp, --bind)"
                         if group.program else "compare thread counts, runtimes and binding (compare --from "
                                               "proposes them)"))
    if not causes:
        compute = split.share("compute")
        causes.append(f"{fmt_percent(compute)} of its samples are in the compute kernel: the kernel itself runs "
                      "below the roof")
    return causes


def repacking_name(name: str) -> str:
    """The repacking function of a frame, short: its class and the function that matched, without
    template and argument lists ("brgemm_matmul_t<…>::copy_b_chunk_in_buffer(…) const"), so a
    function and the lambdas inside it read as one."""
    parts = short_function(NativeFrame(name, "", "other"), 10_000).split("::")
    hit = max((i for i, part in enumerate(parts) if REPACK_FRAME.search(part)), default=len(parts) - 1)
    return "::".join(parts[max(0, hit - 1):hit + 1])


def verdict(group: GemmGroup) -> str:
    """One line from the measured figures: which roof binds it, how close it gets, and why not closer;
    and the kernel that ran, from the samples, where there are enough of them."""
    text = _judged(group)
    split = group.native
    if split is not None and split.enough_samples and split.kernel is not None:
        text += f"; kernel: {split.kernel}"
    return text


def _judged(group: GemmGroup) -> str:
    achieved_gb, achieved_gflop = group.gb_per_s, group.gflop_per_s
    if achieved_gb is None or achieved_gflop is None:
        return "no time measured"
    bw, peak = group.memory_gb_per_s, group.peak_gflop_per_s
    if bw is None:
        return f"not judged (no memory roof measured): {_short(achieved_gflop)} GFLOP/s, {_short(achieved_gb)} GB/s"
    if peak is None:
        return (f"no {group.work.dtype} compute roof measured: reads {_short(achieved_gb)} GB/s, "
                f"{fmt_percent(achieved_gb / bw)} of the memory roof ({_short(bw)} GB/s)")
    share = group.roof_share
    ridge = group.ridge
    assert share is not None and ridge is not None
    if group.bound == "memory":
        if share >= ABOVE_ROOF_SHARE:
            return (f"above the memory roof ({_short(achieved_gb)} > {_short(bw)} GB/s): its "
                    f"{fmt_bytes(group.work.bytes_min)} per call come from the caches, memory does not bind it")
        if share >= AT_ROOF_SHARE:
            return f"at the memory roof ({fmt_percent(share)} of {_short(bw)} GB/s)"
        dequant = _dequant_binds(group, bw)
        if dequant is not None:
            return dequant + "; " + "; ".join(_native_causes(group))
        text = (f"memory-bound by intensity ({_short(group.intensity)} flop/B < ridge {_short(ridge)}) but running "
                f"at {fmt_percent(share)} of the bandwidth ({_short(achieved_gb)} of {_short(bw)} GB/s)")
        kernel_share = group.kernel_roof_share
        if kernel_share is not None and group.kernel_gb_per_s is not None:
            best = f"torch's best {group.kernel_name} GEMV" + (f" ({group.kernel_path})" if group.kernel_path else "")
            if kernel_share >= ABOVE_ROOF_SHARE:
                # Faster than the best of torch's paths at calibration, by more than the roofs' own noise: the
                # roof, not this GEMM, is what is wrong, and "the kernel binds it" would contradict the row.
                # Nothing of the samples follows: "the kernel runs below the roof" would contradict it too.
                return (text + f"; faster than {best} measured here ({_short(group.kernel_gb_per_s)} GB/s, this one "
                        f"{fmt_percent(kernel_share)} of it): the kernel roof was measured low (see its spread) or "
                        "this GEMM's weights partly stayed in the caches")
            if kernel_share >= AT_ROOF_SHARE:
                # As fast as torch's own GEMV: the kernel, not this call, binds it; the samples say
                # what that kernel spends its time on.
                # Between 100% and ABOVE_ROOF_SHARE it beat the roof by less than the roofs' own noise: said
                # so, since "binds" beside a figure above 100% would read as a contradiction.
                noise = (f" (above 100% by less than the {fmt_percent(ABOVE_ROOF_SHARE - 1)} allowed for the roofs' "
                         "run-to-run noise)" if kernel_share >= 1.005 else "")
                return (text + f": the kernel binds it ({best} reaches {_short(group.kernel_gb_per_s)} GB/s here; "
                        f"this one {fmt_percent(kernel_share)} of that{noise}); " + "; ".join(_native_causes(group)))
            text += f", and {fmt_percent(kernel_share)} of {best} ({_short(group.kernel_gb_per_s)} GB/s)"
        elif group.quantized_weights:
            text += f" (no {group.kernel_name} kernel roof measured: decode --quant measures it)"
        return text + "; " + "; ".join(_native_causes(group))
    if share >= ABOVE_ROOF_SHARE:
        return (f"above the measured {group.work.dtype} peak ({fmt_percent(share)} of {_short(peak)} GFLOP/s): "
                "the peak was measured low (see the roofs' spread)")
    if share >= AT_ROOF_SHARE:
        return f"compute-bound at {fmt_percent(share)} of the {group.work.dtype} peak ({_short(peak)} GFLOP/s)"
    return (f"compute-bound by intensity ({_short(group.intensity)} flop/B ≥ ridge {_short(ridge)}) at "
            f"{fmt_percent(share)} of the {group.work.dtype} peak ({_short(peak)} GFLOP/s); "
            + "; ".join(_native_causes(group)))


def _dequant_binds(group: GemmGroup, bw: float) -> str | None:
    """For quantized weights: the verdict when unpacking and scaling them takes longer than reading
    their bytes at the memory roof would (int4 on a CPU whose kernel unpacks slower than memory
    delivers): then time follows the weight's elements, not its bytes. None where memory binds first."""
    dequant_ns, rate = group.dequant_ns, group.kernel_elements_per_s
    if dequant_ns is None or rate is None or not group.time_ns:
        return None
    memory_ns = group.bytes / bw  # bytes / (GB/s) = ns
    if dequant_ns <= memory_ns:
        return None
    text = (f"bound by dequantization, not memory: torch's {group.kernel_name} kernel unpacks "
            f"{_short(rate / 1e9)} G weights/s from the caches, so its {fmt_count(group.work.n * group.work.k)} "
            f"weights per call need {fmt_ns(dequant_ns / group.calls)} where their bytes need "
            f"{fmt_ns(memory_ns / group.calls)} at the memory roof; ")
    share = dequant_ns / group.time_ns
    if share >= ABOVE_ROOF_SHARE:  # faster than the rate it cannot beat: the rate was measured low
        return text + (f"it ran faster ({fmt_percent(share)} of that rate): the rate was measured low (see its "
                       "spread among the roofs)")
    return text + f"it runs at {fmt_percent(share)} of that dequantization rate"


def enclosing_gemm_ops(profile: Profile) -> set[int]:
    """Ids of GEMM-like op keys the profile shows a GEMM-like op nested under: in a sample's op
    path, or in the span timeline."""
    gemm_ids = {op.id for op in profile.ops if op.kind == "op" and is_gemm_like(op.name)}
    outer: set[int] = set()
    if profile.stacks is not None:
        for path in profile.stacks.paths:
            inner_gemm = False
            for op_id in reversed(path):  # innermost first
                if op_id in gemm_ids and inner_gemm:
                    outer.add(op_id)
                inner_gemm = inner_gemm or op_id in gemm_ids
    spans = profile.spans
    if spans is not None:
        # Spans end children first: the spans that ended at depth d+1 since the last span at depth d
        # ended, and began after it began, are its children.
        pending: dict[tuple[int, int], list[tuple[int, bool]]] = defaultdict(list)  # (thread, depth) -> (start, gemm)
        for op_id, thread, depth, start in zip(spans.op, spans.thread, spans.depth, spans.start_ns, strict=False):
            children = pending.pop((thread, depth + 1), [])
            gemm_below = any(has_gemm for child_start, has_gemm in children if child_start >= start)
            if gemm_below and op_id in gemm_ids:
                outer.add(op_id)
            pending[(thread, depth)].append((start, gemm_below or op_id in gemm_ids))
    return outer


def counted_gemm_ops(profile: Profile) -> tuple[list[tuple[OpStat, GemmWork]], list[OpStat]]:
    """The innermost GEMM-like op keys with their work, and the GEMM-like op keys whose work could
    not be read (no shapes recorded, or shapes that do not fit the op)."""
    outer = enclosing_gemm_ops(profile)
    counted, unreadable = [], []
    for op in profile.ops:
        if op.kind != "op" or not is_gemm_like(op.name) or op.name in COMPOSITE_OPS or op.id in outer:
            continue
        work = gemm_work(op)
        if work is None:
            unreadable.append(op)
        else:
            counted.append((op, work))
    return counted, unreadable


def _native_splits(profile: Profile, group_of: dict[int, int], n_groups: int) -> list[NativeGemmSplit] | None:
    stacks = profile.stacks
    if stacks is None:
        return None
    splits = [NativeGemmSplit() for _ in range(n_groups)]
    for count in stacks.counts:
        index = group_of.get(count.op)
        if index is None:
            path = stacks.paths[count.path] if 0 <= count.path < len(stacks.paths) else []
            index = next((group_of[op_id] for op_id in reversed(path) if op_id in group_of), None)
        if index is None:
            continue
        split = splits[index]
        split.samples += count.samples
        split.cpu_ns += count.cpu_ns
        frames = [stacks.frames[f] for f in stacks.stacks[count.stack]] if 0 <= count.stack < len(stacks.stacks) \
            else []
        repacking = next((frame.name for frame in frames if REPACK_FRAME.search(frame.name)), None)
        if frames and frames[0].category == "openmp":
            part = "openmp"
        elif repacking is not None:
            part = "repack"
            name = repacking_name(repacking)
            split.repack_functions[name] = split.repack_functions.get(name, 0) + count.cpu_ns
        elif frames and frames[0].category == "compute":
            part = "compute"
            split.kernels.add(frames, count.cpu_ns)
        else:
            part = "other"
        split.by_part[part] = split.by_part.get(part, 0) + count.cpu_ns
    return splits


def _miss_event(profile: Profile) -> str | None:
    return next((e for e in MISS_EVENTS if profile.has_event(e)), None)


def _misses(op: OpStat, event: str) -> int | None:
    # Inclusive, like the time: the op's own kernel and the small ops it calls.
    values = op.counters_incl.get(event)
    if values is None:
        values = op.counters_self.get(event)
    return None if values is None else sum(values)


def gemm_groups(profile: Profile) -> list[GemmGroup]:
    """Every GEMM of the profile, grouped by (kind, dtype, shape), judged against ``profile.roofs``
    (without roofs: FLOPs, bytes and achieved rates only). In the profile's op order."""
    counted, _ = counted_gemm_ops(profile)
    groups: dict[tuple[str, str, str], GemmGroup] = {}
    index_of: dict[tuple[str, str, str], int] = {}
    group_of: dict[int, int] = {}  # op id -> index of its group
    event = _miss_event(profile)
    misses: dict[tuple[str, str, str], int] = defaultdict(int)
    missing_counts: set[tuple[str, str, str]] = set()
    kv_lengths: dict[tuple[str, str, str], set[int]] = defaultdict(set)
    for op, work in counted:
        key = (work.kind, work.dtype, _group_shape(work))
        group = groups.get(key)
        if group is None:
            group = groups[key] = GemmGroup(work=work, calls=0, time_ns=0, ops=[], shape_text=work.shape_text)
            index_of[key] = len(index_of)
        group.calls += op.calls
        group.time_ns += op.incl_ns
        group.total_flops += work.flops * op.calls
        group.total_bytes += work.bytes_min * op.calls
        group.ops.append(op)
        if work.kind == "attention":
            kv_lengths[key].add(work.n)
        group_of[op.id] = index_of[key]
        if event is not None:
            value = _misses(op, event)
            if value is None:
                missing_counts.add(key)
            else:
                misses[key] += value
    roofs: MachineRoofs | None = profile.roofs
    # int4's kernel roof is of the group size the decode used (0 where not known: a program's profile).
    quant = profile.workload.model.quant if profile.workload is not None else None
    group_size = quant.groups if quant is not None else 0
    ordered = list(groups.values())
    splits = _native_splits(profile, group_of, len(ordered))
    for index, (key, group) in enumerate(groups.items()):
        lengths = kv_lengths.get(key)
        if lengths and len(lengths) > 1:
            group.shape_text = key[2].replace(_ANY_LENGTH, f"{min(lengths)}…{max(lengths)}")
        if roofs is not None:
            group.memory_gb_per_s = roofs.memory_gb_per_s()
            group.peak_gflop_per_s = roofs.compute_gflop_per_s(group.work.dtype)
            kernel = roofs.kernel_roof(group.work.dtype, group.quantized_weights,
                                       group_size if group.quantized_weights == "i4" else 0)
            if kernel is not None:
                group.kernel_gb_per_s = kernel.gb_per_s.best
                group.kernel_path = kernel.path
                if group.quantized_weights and kernel.elements_per_s is not None:
                    group.kernel_elements_per_s = kernel.elements_per_s.best
        if splits is not None:
            group.native = splits[index]
        if event is not None and key not in missing_counts:
            group.traffic = MeasuredTraffic(event=event, bytes=misses[key] * CACHE_LINE_BYTES)
        group.program = profile.workload is None
        group.verdict = verdict(group)
    return ordered


def _roofs_used(roofs: MachineRoofs, dtypes: list[str]) -> list[str]:
    """The roofs the table is judged against, with their spread and where they came from."""
    parts = []
    bw = roofs.memory_gb_per_s()
    if bw is not None:
        best = roofs.memory_roof()
        assert best is not None
        kernel = "a read-only kernel" if best.kernel == "read" else f"STREAM {best.kernel}"
        parts.append(f"memory {_short(bw)} GB/s ({kernel}, best of {best.gb_per_s.repetitions}, "
                     f"spread {fmt_percent(best.gb_per_s.spread)})")
    for dtype in dtypes:
        compute = [c for c in roofs.compute if c.dtype == dtype]
        if compute:
            c = max(compute, key=lambda c: c.gflop_per_s.best)
            parts.append(f"{dtype} compute {_short(c.gflop_per_s.best)} GFLOP/s (spread "
                         f"{fmt_percent(c.gflop_per_s.spread)})")
        else:
            parts.append(f"{dtype} compute not measured")
        for weights in ("", *QUANTIZED_WEIGHTS):
            k = roofs.kernel_roof(dtype, weights)
            if k is None:
                continue
            name = f"{dtype} x {QUANTIZED_WEIGHTS[weights]}" if weights else dtype
            if weights == "i4":
                name += f" (group {k.group_size})"
            text = f"{name} GEMV kernel {_short(k.gb_per_s.best)} GB/s (spread {fmt_percent(k.gb_per_s.spread)})"
            if k.elements_per_s is not None:
                text = (text.removesuffix(")") + f"; in cache {_short(k.elements_per_s.best / 1e9)} G weights/s, "
                        "its dequantization's own speed)")
            parts.append(text)
    when = roofs.measured[:16].replace("T", " ")
    origin = f"from the cache, measured {when} UTC" if roofs.from_cache else f"measured for this run ({when} UTC)"
    return [f"roofs ({origin}, {roofs.threads} threads): " + "; ".join(parts)]


@dataclass
class GemmSummary:
    """Every GEMM shape of a profile against the roofs, with what the report says about how they were
    measured: computed here, phrased by :func:`roofline_section`."""

    groups: list[GemmGroup]
    ranked: list[GemmGroup]  # the costliest gap against the roofs first (by time where not judged)
    unknown: list[UnknownGemm]  # GEMM-like op keys whose work is not known: unreadable, or GEMM kernels by samples
    total_self_ns: int  # the summed self time of all ops
    roofs: MachineRoofs | None
    miss_event: str | None  # the cache-miss counter measured traffic is read from
    sampled: bool  # per-op counts are estimated from the samples
    no_hardware_pmu: bool  # the machine is known to have no hardware counters
    has_native: bool  # the profile has sampled stacks, so the native split is known
    isa_flags: list[str] = field(default_factory=list)  # the CPU's GEMM-relevant extensions (/proc/cpuinfo)

    @property
    def gemm_ns(self) -> int:
        return sum(g.time_ns for g in self.groups)

    @property
    def has_traffic(self) -> bool:
        return any(g.traffic is not None for g in self.groups)


def gemm_summary(profile: Profile) -> GemmSummary | None:
    """None where the profile was not profiled or ran no GEMM-like op."""
    if profile.collection is None:
        return None
    groups = gemm_groups(profile)
    _, unreadable = counted_gemm_ops(profile)
    unknown = unknown_gemm_ops(profile, unreadable)
    if not groups and not unknown:
        return None
    ranked = sorted(groups, key=lambda g: (g.lost_ns if g.lost_ns is not None else -1.0, g.time_ns), reverse=True)
    return GemmSummary(groups=groups, ranked=ranked, unknown=unknown,
                       total_self_ns=sum(op.self_ns for op in profile.ops if op.kind == "op"), roofs=profile.roofs,
                       miss_event=_miss_event(profile), sampled=profile.collection.mode == SAMPLED,
                       no_hardware_pmu=profile.capabilities is not None and not profile.capabilities.hardware_pmu,
                       has_native=profile.stacks is not None,
                       isa_flags=list(profile.settings.topology.isa_flags) if profile.settings is not None else [])


def roofline_section(summary: GemmSummary | None, top: int = defaults.TOP_OPS) -> Section | None:
    """Each GEMM shape against the roofs, the costliest gap first; None when the profile has none."""
    if summary is None:
        return None
    groups, ranked, total_self = summary.groups, summary.ranked, summary.total_self_ns
    has_native, has_traffic = summary.has_native, summary.has_traffic
    columns = [
        Column("shape", "shape", help="[m,k]x[k,n] per product (b× for batched); ᵀ: the [k,n] operand stored "
                                      "[n,k] (nn.Linear's weights); ᵖ: a prepacked weight; attention: q and kv shapes"),
        Column("ops", "ops", help="the ops that ran it (the innermost GEMM-like op of each call)"),
        Column("dtype", "dtype"),
        Column("calls", "calls", "int"),
        Column("time", "time", "ns", help="the ops' total time (with the small ops they call), summed over calls"),
        Column("share", "% op time", "share", help="time / the summed self time of all ops"),
        Column("intensity", "flop/B", "ratio", help="arithmetic intensity: FLOPs per byte of the least traffic"),
        Column("gflops", "GFLOP/s", "ratio", help="FLOPs / time"),
        Column("gbs", "GB/s", "ratio", help="least bytes (each operand read once, the output written once) / time"),
    ]
    if has_traffic:
        columns.append(Column("measured_gbs", "meas. GB/s", "ratio",
                              help="cache-miss counter x 64 B / time: the traffic the caches did not absorb"))
    columns += [
        Column("roof", "roof", help="the roof its intensity puts it under: memory (below the ridge) or compute"),
        Column("roof_share", "% roof", "share", help="GFLOP/s / min(peak, intensity x memory roof)"),
        Column("kernel_share", "% kernel", "share",
               help="memory-bound ones: GB/s / the best GB/s torch's own GEMV reaches for the dtype (and, for "
                    "quantized weights, their storage: weights several times the last-level cache, read in turn)"),
        Column("lost", "lost", "ns", help="time - calls x max(FLOPs / peak, bytes / memory roof)"),
    ]
    if has_native:
        columns += [Column("repack", "repack", "share", help="share of its sampled CPU under weight-repacking "
                                                               "frames (reorders, copy_b, pack)"),
                    Column("openmp", "OpenMP", "share", help="share of its sampled CPU in the OpenMP runtime"),
                    Column("isa", "ISA", help="the instruction sets its compute samples' kernels are named for "
                                              "(oneDNN's cpu_isa_t, MKL's and ATen's CPU-capability names), by "
                                              "share of their CPU; not named: the kernel's names carry none")]
    columns.append(Column("verdict", "verdict", help="computed from the figures on the row"))
    rows = []
    for group in ranked[:top]:
        row: dict[str, object] = {
            "shape": group.shape_text, "ops": ", ".join(group.op_names), "dtype": group.work.dtype,
            "calls": group.calls, "time": group.time_ns,
            "share": group.time_ns / total_self if total_self else None, "intensity": group.intensity,
            "gflops": group.gflop_per_s, "gbs": group.gb_per_s, "roof": group.bound or "-",
            "roof_share": group.roof_share, "kernel_share": group.kernel_roof_share,
            "lost": round(group.lost_ns) if group.lost_ns is not None else None, "verdict": group.verdict}
        if has_traffic:
            row["measured_gbs"] = group.traffic.gb_per_s(group.time_ns) if group.traffic else None
        if has_native:
            enough = group.native is not None and group.native.enough_samples
            row["repack"] = group.native.share("repack") if enough and group.native else None
            row["openmp"] = group.native.share("openmp") if enough and group.native else None
            row["isa"] = isa_text(group.native.kernels.by_isa()) if enough and group.native else "-"
        rows.append(row)
    lines = []
    gemm_time = summary.gemm_ns
    lines.append(f"{len(groups)} GEMM shape{'s' if len(groups) != 1 else ''} ({sum(g.calls for g in groups):,} calls, "
                 f"{fmt_ns(gemm_time)}" + (f", {fmt_percent(gemm_time / total_self)} of op time" if total_self else "")
                 + ")")
    if summary.roofs is not None:
        lines += _roofs_used(summary.roofs, sorted({g.work.dtype for g in groups}))
    else:
        lines.append("no roofs in this profile: FLOPs and bytes per second only, not judged "
                     "(`cpuprof calibrate` measures the roofs; `decode` and `run` then use them, and measure them "
                     "first where none are cached, unless --roofs off)")
    lines.append("FLOPs and bytes are analytic, from the recorded shapes: 2·m·n·k FLOPs per product, each operand "
                 "read once and the output written once (the least traffic any kernel needs); attention: QKᵀ and PV, "
                 "the KV cache read once at its KV heads")
    event = summary.miss_event
    if event is not None:
        lines.append(f"measured traffic: {event} x {CACHE_LINE_BYTES} B beside the analytic bytes"
                     + (" (sampled mode: per-op counts are estimated from the samples)" if summary.sampled else ""))
    else:
        lines.append("bytes are analytic only: no cache-miss counter was counted"
                     + (" (no hardware PMU on this machine)" if summary.no_hardware_pmu else ""))
    lines.append("each GEMM is counted once, at its innermost GEMM-like op with that op's total time "
                 "(aten::linear and aten::matmul only call mm/addmm/bmm)")
    if not has_native:
        lines.append("native split not known: this profile has no stacks (exact mode)")
    else:
        lines += _isa_lines(groups, summary.isa_flags)
    notes = []
    tables = []
    unknown = summary.unknown
    if unknown:
        calls = sum(u.op.calls for u in unknown)
        time = sum(u.op.incl_ns for u in unknown)
        notes.append(f"{len(unknown)} GEMM-like op key(s) ({calls:,} calls, {fmt_ns(time)}) have no work figure: "
                     "listed below with why, not judged against the roofs")
        tables.append(unknown_gemm_table(unknown, total_self, top))
    caption = (f"top {len(rows)} of {len(groups)} GEMM shapes by time lost against the roofs" if summary.roofs
               else f"top {len(rows)} of {len(groups)} GEMM shapes by time")
    return Section("gemms", "GEMMs against the roofs", lines,
                   ([Table(columns, rows, caption=caption)] if rows else []) + tables, notes)


def _isa_lines(groups: list[GemmGroup], cpu_flags: list[str]) -> list[str]:
    """Which instruction sets the GEMMs' kernels ran in, by their samples, beside what the CPU has:
    whether AMX or AVX-512 kernels were used at all."""
    by_isa: dict[str | None, int] = {}
    for group in groups:
        if group.native is not None:
            for isa, ns in group.native.kernels.by_isa().items():
                by_isa[isa] = by_isa.get(isa, 0) + ns
    total = sum(by_isa.values())
    has = f"this CPU has {', '.join(cpu_flags)} (/proc/cpuinfo)" if cpu_flags else "this CPU's extensions are not known"
    if not total:
        return [f"instruction sets: no sample of the GEMMs was in a compute kernel; {has}"]
    named = sorted(((isa, ns) for isa, ns in by_isa.items() if isa), key=lambda kv: kv[1], reverse=True)
    parts = [f"{isa} {fmt_percent(ns / total)}" for isa, ns in named]
    hidden = by_isa.get(None, 0)
    if hidden:
        parts.append(f"ISA not visible {fmt_percent(hidden / total)} (kernels whose names carry none, as ATen's "
                     "int8/int4 tinygemm)")
    line = f"instruction sets of the GEMMs' compute samples, by their kernels' names: {'; '.join(parts)}; {has}"
    amx = sum(ns for isa, ns in named if "amx" in isa)
    if any(flag.startswith("amx") for flag in cpu_flags):
        line += (f"; {fmt_percent(amx / total)} of their compute CPU was in AMX kernels" if amx
                 else "; no sample was in an AMX kernel")
    elif cpu_flags:
        line += "; it has no AMX"
    return [line]


def unknown_gemm_table(unknown: list[UnknownGemm], total_self_ns: int, top: int = defaults.TOP_OPS) -> Table:
    """GEMM-like ops whose work is not known: their time, why, and the kernels their samples ran."""
    columns = [
        Column("op", "op"), Column("inputs", "inputs"), Column("calls", "calls", "int"),
        Column("time", "time", "ns", help="the op's total time (with the small ops it calls), summed over calls"),
        Column("share", "% op time", "share", help="time / the summed self time of all ops"),
        Column("gemm_share", "in GEMM kernels", "share",
               help="share of its sampled CPU under GEMM frames (brgemm, gemm, gemv, matmul, ...)"),
        Column("why", "why no work figure"),
        Column("kernels", "kernels (share of its sampled CPU)", help="the functions its samples were in, most first"),
    ]
    rows: list[dict[str, object]] = []
    for u in unknown[:top]:
        kernels = ", ".join(f"{name} {fmt_percent(ns / u.cpu_ns)}" for name, ns in u.kernels) if u.cpu_ns else ""
        rows.append({"op": u.op.name, "inputs": inputs_text(u.op, 48), "calls": u.op.calls, "time": u.op.incl_ns,
                     "share": u.op.incl_ns / total_self_ns if total_self_ns else None, "gemm_share": u.gemm_share,
                     "why": u.reason, "kernels": kernels or "-"})
    return Table(columns, rows, caption=f"GEMM-like, shape unknown: {len(rows)} of {len(unknown)} op keys by time")


__all__ = ["ABOVE_ROOF_SHARE", "AT_ROOF_SHARE", "CAUSE_SHARE", "GemmGroup", "GemmSummary", "MeasuredTraffic",
           "NativeGemmSplit", "counted_gemm_ops", "enclosing_gemm_ops", "gemm_groups", "gemm_summary", "roof_ns",
           "roofline_section", "unknown_gemm_table", "verdict"]
