"""Where sampled CPU time went in native code: per op and per thread, by the function the CPU was
in (the stack's leaf) and by what that code is (compute kernel, OpenMP runtime, allocator, ...)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

from .. import defaults
from ..model import CATEGORIES, NativeFrame, OpStat, Profile, Sampling, StackCount
from ..units import fmt_ns, fmt_percent
from .labels import inputs_text, team_order, thread_label
from .report_model import Column, Section, Table

CATEGORY_NAMES = {
    "compute": "compute kernels (BLAS, oneDNN, ATen, JIT code)",
    "openmp": "OpenMP runtime (barriers, spinning, waking)",
    "allocator": "memory allocation",
    "interpreter": "Python interpreter",
    "framework": "PyTorch framework (dispatch, tensor bookkeeping)",
    "kernel": "operating system kernel (system calls, page faults)",
    "other": "other code",
}


@dataclass
class NativeSplit:
    cpu_ns: int = 0
    samples: int = 0
    by_category: dict[str, int] = field(default_factory=dict)  # category -> CPU ns
    by_function: dict[int, int] = field(default_factory=dict)  # leaf frame index -> CPU ns

    def share(self, category: str) -> float:
        return self.by_category.get(category, 0) / self.cpu_ns if self.cpu_ns else 0.0

    def top_functions(self, n: int = 3) -> list[tuple[int, int]]:
        return sorted(self.by_function.items(), key=lambda kv: kv[1], reverse=True)[:n]


def leaf(profile: Profile, stack: int) -> NativeFrame | None:
    assert profile.stacks is not None
    frames = profile.stacks.stacks[stack]
    return profile.stacks.frames[frames[0]] if frames else None


def _split_by(profile: Profile, key: Callable[[StackCount], int]) -> dict[int, NativeSplit]:
    """The samples grouped by ``key``, each group split by leaf category and function."""
    out: dict[int, NativeSplit] = defaultdict(NativeSplit)
    if profile.stacks is None:
        return out
    stacks = profile.stacks
    for c in stacks.counts:
        split = out[key(c)]
        split.cpu_ns += c.cpu_ns
        split.samples += c.samples
        frames = stacks.stacks[c.stack]
        category = stacks.frames[frames[0]].category if frames else "other"
        split.by_category[category] = split.by_category.get(category, 0) + c.cpu_ns
        if frames:
            split.by_function[frames[0]] = split.by_function.get(frames[0], 0) + c.cpu_ns
    return out


def by_op(profile: Profile) -> dict[int, NativeSplit]:
    """Per op id: the samples that landed in it (all threads)."""
    return _split_by(profile, lambda c: c.op)


def by_thread(profile: Profile) -> dict[int, NativeSplit]:
    """Per thread index: its samples."""
    return _split_by(profile, lambda c: c.thread)


def short_function(frame: NativeFrame, width: int = 48) -> str:
    """A function name short enough for a table cell: C++ argument lists and templates elided."""
    name = frame.name
    out, depth = [], 0
    for ch in name:  # drop "<...>" and "(...)" contents, keeping the brackets as markers
        if ch in "<(":
            if depth == 0:
                out.append(ch + "…" + (">" if ch == "<" else ")"))
            depth += 1
        elif ch in ">)":
            depth = max(0, depth - 1)
        elif depth == 0:
            out.append(ch)
    short = "".join(out)
    return short if len(short) <= width else "…" + short[-(width - 1):]


@dataclass
class NativeSummary:
    """What native code the samples were in, per op and per thread: computed here, phrased by
    :func:`native_section`."""

    sampling: Sampling
    frames: list[NativeFrame]
    categories: list[str]  # the categories any op's samples fell in, in CATEGORIES' order
    ops: list[tuple[OpStat, NativeSplit]]  # by sampled CPU time, most first, at most ``top``
    threads: list[tuple[int, str, NativeSplit]]  # (thread index, its role, its split), team order
    outermost_share: float | None  # share of unwound user stacks walked whole: to their outermost frame or
    # the Python interpreter (rootward of which is the interpreter's own recursion)
    unwind_shares: dict[str, float]  # every other way an unwind ended, as a share of the unwound
    unnamed_jit: bool  # JIT code in the stacks with no perf map to name it


# How an unwind ends when nothing was missed: the thread's first frame, or the Python interpreter,
# where the walk stops on purpose (rootward is the evaluation loop calling itself; py-spy reads it).
WHOLE_WALKS = ("outermost frame", "Python interpreter")
# Stacks cut at the copied stack's end above this share get a note on what they lost and the remedy.
CUT_STACKS_WORTH_A_HINT = 0.1


def native_summary(profile: Profile, top: int) -> NativeSummary | None:
    """None where the profile has no sampled stacks."""
    if profile.stacks is None or profile.sampling is None or not profile.stacks.counts:
        return None
    splits = by_op(profile)
    ops = {op.id: op for op in profile.ops}
    ranked = sorted(splits.items(), key=lambda kv: kv[1].cpu_ns, reverse=True)[:top]
    threads = by_thread(profile)
    s = profile.sampling
    unwound = sum(s.unwind.values())
    frames = profile.stacks.frames
    return NativeSummary(
        sampling=s, frames=frames,
        categories=[c for c in CATEGORIES if any(split.by_category.get(c) for split in splits.values())],
        ops=[(ops[op_id], split) for op_id, split in ranked if op_id in ops and split.cpu_ns],
        threads=[(i, profile.threads[i].role, threads[i]) for i in team_order(profile)
                 if i in threads and threads[i].cpu_ns],
        outermost_share=sum(s.unwind.get(r, 0) for r in WHOLE_WALKS) / unwound if unwound else None,
        unwind_shares={reason: n / unwound for reason, n in s.unwind.items() if reason not in WHOLE_WALKS}
        if unwound else {},
        unnamed_jit=s.jit_symbols is None and any(f.module == "[jit]" and f.name.startswith("[jit code")
                                                  for f in frames))


def native_section(summary: NativeSummary | None) -> Section | None:
    """The summary as two tables (ops, threads) with how the stacks were taken."""
    if summary is None:
        return None
    shown, frames = summary.categories, summary.frames

    def where(split: NativeSplit) -> str:
        return ", ".join(f"{short_function(frames[f])} {fmt_percent(ns / split.cpu_ns)}"
                         for f, ns in split.top_functions(3))

    columns = [Column("op", "op"), Column("inputs", "inputs"), Column("samples", "samples", "int"),
               Column("cpu", "CPU", "ns", help="CPU time of the samples (all threads)")]
    columns += [Column(c, c, "share", help=CATEGORY_NAMES[c]) for c in shown]
    columns.append(Column("functions", "where (share of the op's CPU)",
                          help="the functions the CPU was in (the stacks' leaves), most first"))
    rows = []
    for op, split in summary.ops:
        row: dict[str, object] = {"op": op.name, "inputs": inputs_text(op, 40), "samples": split.samples,
                                  "cpu": split.cpu_ns}
        row.update({c: split.share(c) for c in shown})
        row["functions"] = where(split)
        rows.append(row)
    tcols = [Column("thread", "thread"), Column("role", "role"), Column("cpu", "CPU", "ns")]
    tcols += [Column(c, c, "share") for c in shown]
    tcols.append(Column("functions", "where"))
    trows = []
    for i, role, split in summary.threads:
        row = {"thread": thread_label(i), "role": role, "cpu": split.cpu_ns}
        row.update({c: split.share(c) for c in shown})
        row["functions"] = where(split)
        trows.append(row)
    s = summary.sampling
    lines = [f"{s.samples:,} samples at {s.hz} Hz of each thread's CPU time, each with its kernel call chain and a "
             f"{s.stack_bytes:,}-byte copy of its user stack, unwound with the libraries' DWARF unwind tables "
             "(frame pointers or a stack scan where code has none, as JIT code)"]
    py = s.python
    if py is not None and py.error is None:
        placed = ("read on the op timeline's clock (a change placed halfway between the two reads around it, "
                  "or half a period before the read after periods not read)"
                  if py.cpu_ns is not None else f"placed on the op timeline within ±{fmt_ns(py.clock_error_ns)}")
        read = f"{py.samples:,} stacks"
        if py.ticks_covered:
            read += (f" read; {py.ticks_covered:,} periods not read, every op-running thread having begun an op "
                     "within a switch interval, or slept")
        lines.append(f"Python frames from {py.source} at {py.hz} Hz ({read}), {placed}, and joined to "
                     f"{py.joined:,} samples of the op-running threads ({py.unmatched:,} found no Python stack)")
        if py.op_caller_changes:
            lost = (f"; {py.op_callers_lost:,} changes were lost to a full buffer, and until the next change recorded "
                    "the samples took the reads"
                    if py.op_callers_lost else "")
            workers = (f"; {py.workers_joined:,} samples of worker threads took the caller of the op they worked for"
                       if py.workers_joined else "")
            between = (f", {py.op_callers_between:,} between ops with no read within a period took the caller of "
                       "their thread's last op" if py.op_callers_between else "")
            lines.append(f"{py.op_callers:,} of those samples were inside ops and took the Python caller recorded at "
                         f"their op's begin (exact; {py.op_caller_changes:,} changes of caller recorded){between}, "
                         f"the rest the sampler's reads{lost}{workers}")
        if py.stopped:
            kept = (", except inside ops, whose callers the op hook kept recording until its buffer was full"
                    if py.op_caller_changes else "")
            lines.append(f"the Python sampler stopped before the profile did ({py.stopped}): later samples have no "
                         f"Python frames{kept}")
    notes = []
    if summary.outermost_share is not None:
        others = ", ".join(f"{reason}: {fmt_percent(share)}" for reason, share in summary.unwind_shares.items())
        notes.append(f"user stacks unwound to their outermost frame or the Python interpreter in "
                     f"{fmt_percent(summary.outermost_share)} of samples" + (f"; {others}" if others else ""))
        if summary.unwind_shares.get("end of the copied stack", 0) >= CUT_STACKS_WORTH_A_HINT:
            copied = summary.sampling.stack_bytes
            remedy = ("it is the most a sample can copy" if copied >= defaults.MAX_STACK_BYTES else
                      "--stack-bytes (stack_bytes= in cpuprof.profile) above it reaches further, at more locked "
                      "memory per thread")
            notes.append(f"a stack truncated at the {copied:,}-byte user-stack copy (perf's dump size for DWARF "
                         "unwinding) lost only its callers nearest the thread's start (on a dispatching thread, the "
                         "frames between the kernel and Python, such as torch's dispatch): each sample's op comes "
                         f"from the op hook, not from its stack; {remedy}")
    if summary.unnamed_jit:
        notes.append("some code generated at run time is unnamed: no perf map names it. cpuprof's launches (decode, "
                     "run) set ONEDNN_JIT_PROFILE=2, so the kernels of torch's own oneDNN are named; unnamed ones come "
                     "from another JIT (MKL's, or a library's own copy of oneDNN, as vLLM's), or from a profile made "
                     "without a cpuprof launch (then set ONEDNN_JIT_PROFILE=2 before the first matmul)")
    if s.unresolved_frames:
        notes.append(f"{s.unresolved_frames:,} {'address' if s.unresolved_frames == 1 else 'addresses'} had no "
                     "symbol (stripped libraries): shown as library+offset")
    return Section("native", "Native code (from the samples' stacks)", lines,
                   [Table(columns, rows, caption="ops by sampled CPU time: what kind of code it was in"),
                    Table(tcols, trows, caption="threads: what kind of code their CPU time was in")], notes)


__all__ = ["CATEGORIES", "CATEGORY_NAMES", "NativeSplit", "NativeSummary", "by_op", "by_thread", "leaf",
           "native_section", "native_summary", "short_function"]
