"""Which GEMM kernel ran, from the samples' native stacks, and the ops that ran GEMM kernels without
being in the GEMM table (``gemm.GEMM_TABLE``).

The kernel is the compute function most of a GEMM's samples were in (the stack's leaf): oneDNN's JIT
kernels are named by the perf map oneDNN writes (``jit_brgemm_kernel_t``, ``jit_brgemm_amx_uker_base_t``),
MKL's and ATen's by their symbols. Its instruction set is read from the names where they carry one
(``avx512_core_amx``, ``avx2``, MKL's ``mkl_blas_avx512_...``, ATen's ``at::native::AVX512::``): the
leaf's first, else the nearest caller's. Where no frame names it, none is given (oneDNN's C++ drivers
carry it only as a number, ``brgemm_matmul_t<(cpu_isa_t)13168>``, which changes between versions).

An op not in the table whose sampled CPU is mostly in GEMM kernels (an engine's own GEMM op, a new
quantized kernel) does a GEMM whose shape cpuprof cannot read: it is listed as "GEMM-like, shape
unknown" with its time and kernels, never dropped.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field

from .. import defaults
from ..model import NativeFrame, OpStat, Profile
from .gemm import COMPOSITE_OPS, is_gemm_like, why_no_work
from .native import short_function

# Frames of GEMM code: oneDNN's brgemm and jit gemm/gemv kernels and its matmul and inner-product
# drivers, MKL's, OpenBLAS's and BLIS's gemm kernels, ATen's cpublas and weight-only int8/int4 kernels
# (int8pack_mm_kernel_, int4pack_mm_kernel_), fbgemm, libxsmm, sgl-kernel's packed linears.
GEMM_FRAME = re.compile(r"gemm|gemv|matmul|inner_product|pack_mm|xsmm|tinygemm|packed_linear|sgemm|dgemm",
                        re.IGNORECASE)
# Instruction sets as kernels name them, longest first (oneDNN's cpu_isa_t names, MKL's and ATen's
# CPU_CAPABILITY namespaces). Bounded by anything but a letter or digit.
ISA = re.compile(r"(?<![a-z0-9])(avx512_core_amx_fp16|avx512_core_amx|avx512_core_fp16|avx512_core_bf16|"
                 r"avx512_core_vnni|avx512_core|avx512_mic|avx10_[0-9]+(?:_[0-9]+)?(?:_amx(?:_fp16)?)?|avx512|"
                 r"avx2_vnni_2|avx2_vnni|avx2|avx|sse41|amx_fp16|amx)(?![a-z0-9])", re.IGNORECASE)
# "Mostly in GEMM kernels": more than half of an op's sampled CPU.
GEMM_LIKE_SHARE = 0.5


def kernel_isa(names: list[str]) -> str | None:
    """The instruction set the first name carrying one names (leaf first), lower case."""
    for name in names:
        match = ISA.search(name)
        if match:
            return match.group(1).lower()
    return None


def kernel_text(name: str, isa: str | None) -> str:
    return f"{name} ({isa})" if isa else name


def is_gemm_frame(frame: NativeFrame) -> bool:
    return frame.category == "compute" and bool(GEMM_FRAME.search(frame.name))


@dataclass
class KernelTally:
    """Sampled CPU by kernel: (short name, ISA or None) -> CPU ns."""

    cpu_ns: dict[tuple[str, str | None], int] = field(default_factory=dict)

    def add(self, frames: list[NativeFrame], cpu_ns: int) -> None:
        """One sample's stack (leaf first): its leaf is the kernel, when compute code."""
        if not frames or frames[0].category != "compute":
            return
        compute = [f.name for f in frames if f.category == "compute"]
        name = short_function(frames[0], 64).removeprefix("void ")  # a function template's demangled return type
        if frames[0].module == "[jit]" and frames[0].name.startswith("[jit code"):
            # JIT code no perf map names (a library's own oneDNN that writes none): its address says
            # nothing to a reader; the nearest named caller says which driver generated it.
            caller = next((f for f in frames[1:] if not f.name.startswith("[jit code")), None)
            driver = "::".join(short_function(caller, 10_000).split("::")[-2:]) if caller is not None else None
            name = "unnamed JIT code" + (f" under {driver}" if driver else "")
        key = (name, kernel_isa(compute))
        self.cpu_ns[key] = self.cpu_ns.get(key, 0) + cpu_ns

    def top(self, n: int = 3) -> list[tuple[str, int]]:
        """The kernels with the most CPU, as "name (isa)" with their CPU ns."""
        ranked = sorted(self.cpu_ns.items(), key=lambda kv: kv[1], reverse=True)[:n]
        return [(kernel_text(name, isa), ns) for (name, isa), ns in ranked]

    @property
    def kernel(self) -> str | None:
        top = self.top(1)
        return top[0][0] if top else None

    def by_isa(self) -> dict[str | None, int]:
        """CPU ns by the instruction set the kernels' names carry (None: they carry none)."""
        out: dict[str | None, int] = {}
        for (_, isa), ns in self.cpu_ns.items():
            out[isa] = out.get(isa, 0) + ns
        return out


def isa_text(by_isa: dict[str | None, int]) -> str:
    """"avx512 96%, not named 4%": each instruction set's share of the kernels' CPU, most first."""
    total = sum(by_isa.values())
    if not total:
        return "-"
    ranked = sorted(by_isa.items(), key=lambda kv: kv[1], reverse=True)
    return ", ".join(f"{isa or 'not named'} {round(100 * ns / total)}%" for isa, ns in ranked)


@dataclass
class UnknownGemm:
    """A GEMM-like op key whose work is not known: in the table but unreadable, or not in the table
    and mostly in GEMM kernels."""

    op: OpStat
    reason: str
    samples: int = 0  # its samples (the op innermost), all threads
    cpu_ns: int = 0
    gemm_share: float | None = None  # share of its sampled CPU under GEMM frames; None: no stacks
    kernels: list[tuple[str, int]] = field(default_factory=list)  # "name (isa)", CPU ns; most first


def unknown_gemm_ops(profile: Profile, unreadable: list[OpStat]) -> list[UnknownGemm]:
    """The table's ops with no work (``unreadable``, from ``roofline.counted_gemm_ops``) and the ops
    outside it whose samples are mostly in GEMM kernels; the most time first."""
    by_op: dict[int, tuple[int, int, int, KernelTally]] = {}
    stacks = profile.stacks
    if stacks is not None:
        samples: dict[int, int] = defaultdict(int)
        cpu: dict[int, int] = defaultdict(int)
        gemm_cpu: dict[int, int] = defaultdict(int)
        tallies: dict[int, KernelTally] = defaultdict(KernelTally)
        for count in stacks.counts:
            frames = [stacks.frames[f] for f in stacks.stacks[count.stack]] \
                if 0 <= count.stack < len(stacks.stacks) else []
            samples[count.op] += count.samples
            cpu[count.op] += count.cpu_ns
            if any(is_gemm_frame(f) for f in frames):
                gemm_cpu[count.op] += count.cpu_ns
            tallies[count.op].add(frames, count.cpu_ns)
        by_op = {op_id: (samples[op_id], cpu[op_id], gemm_cpu[op_id], tallies[op_id]) for op_id in samples}
    out = []
    unreadable_ids = {op.id for op in unreadable}
    for op in profile.ops:
        if op.kind != "op" or op.name in COMPOSITE_OPS:
            continue
        n, cpu_ns, gemm_ns, tally = by_op.get(op.id, (0, 0, 0, KernelTally()))
        share = gemm_ns / cpu_ns if stacks is not None and cpu_ns else None
        if op.id in unreadable_ids:
            reason = why_no_work(op) or "its work could not be read"
        elif is_gemm_like(op.name):
            continue
        elif share is not None and n >= defaults.MIN_SAMPLES and share > GEMM_LIKE_SHARE:
            reason = "not in the GEMM table: most of its samples are in GEMM kernels"
        else:
            continue
        out.append(UnknownGemm(op=op, reason=reason, samples=n, cpu_ns=cpu_ns, gemm_share=share,
                               kernels=tally.top(3)))
    return sorted(out, key=lambda u: u.op.incl_ns, reverse=True)


__all__ = ["GEMM_FRAME", "GEMM_LIKE_SHARE", "ISA", "KernelTally", "UnknownGemm", "is_gemm_frame", "isa_text",
           "kernel_isa", "kernel_text", "unknown_gemm_ops"]
