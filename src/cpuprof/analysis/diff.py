"""What changed from one profile (A, before) to another (B, after): ops, GEMMs, regions, threads,
counters, settings and throughput, what changed most first, as a report every renderer lays out.

Ops are matched by the op table's key: name, inputs (dtype, sizes, strides) and enclosing regions;
an op key on one side only is added (only in B) or removed (only in A). When both profiles are
decodes, times are compared per generated token, so runs of different lengths compare; otherwise
as totals. Every change is B − A: negative is less time in B.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from .. import defaults
from ..model import CPU_EVENT, OpStat, Profile, format_cpulist
from ..model.codec import to_json
from ..units import fmt_ns, fmt_percent, fmt_rate
from .gemm import gemm_work, is_gemm_like
from .labels import inputs_text
from .report_model import Column, Report, Section, Table
from .roofline import GemmGroup, gemm_groups
from .threads import run_queue_warning

# perf's software clocks count nanoseconds; every other event is a count.
TIME_EVENTS = ("task-clock", "cpu-clock")
A_LABEL, B_LABEL, DELTA_LABEL = "A", "B", "B − A"
OpKey = tuple[str, str, tuple[str, ...]]  # name, inputs as recorded, regions


def generated_tokens(profile: Profile) -> int | None:
    """Tokens a decode profile generated while profiled: the prefill's token and one per decode step,
    for every sequence of the batch. None when it is no decode, or no token was generated yet."""
    wl = profile.workload
    if wl is None:
        return None
    if wl.output_ids:
        return sum(len(ids) for ids in wl.output_ids)
    if wl.steps_done:
        return wl.batch * (wl.steps_done + 1)  # saved before the end: the tokens are not kept yet
    return None


def op_kind(op: OpStat) -> str:
    """"GEMM" for a matrix product (analysis/gemm.py's list), "attention" for scaled dot-product
    attention, "" for any other op."""
    if not is_gemm_like(op.name):
        return ""
    work = gemm_work(op)
    if work is not None:
        return "GEMM" if work.kind == "gemm" else work.kind
    return "attention" if "attention" in op.name else "GEMM"


def op_key(op: OpStat) -> OpKey:
    """The op table's key: name, every recorded input as recorded, and the enclosing regions."""
    inputs = json.dumps(to_json(op.inputs), sort_keys=True) + ("…" if op.inputs_truncated else "")
    return op.name, inputs, tuple(op.region)


@dataclass
class OpFigures:
    """One side's figures for an op key (summed if the key occurs more than once, as it can in a
    migrated version-1 profile that kept no strides)."""

    calls: int = 0
    self_ns: int = 0
    incl_ns: int = 0


@dataclass
class Change:
    """One compared figure: A's and B's (None where that side does not have it)."""

    a: float | None
    b: float | None

    @property
    def delta(self) -> float:
        """B − A, a missing side counting as zero (an added op adds all its time)."""
        return (self.b or 0.0) - (self.a or 0.0)

    @property
    def relative(self) -> float | None:
        """B − A over A; None when A is missing or zero."""
        return self.delta / self.a if self.a else None


@dataclass
class OpChange:
    name: str
    kind: str  # "GEMM", "attention" or ""
    op: OpStat  # A's op where A has it, else B's: for its inputs and regions as text
    a: OpFigures | None
    b: OpFigures | None
    compared: Change  # self time, per generated token when both are decodes

    @property
    def status(self) -> str:
        return "added" if self.a is None else "removed" if self.b is None else ""


@dataclass
class ProfileDiff:
    """Two profiles, before (a) and after (b), and what they are compared by (not a configuration
    sweep: that is :class:`cpuprof.model.compare.Comparison`)."""

    a: Profile
    b: Profile
    tokens_a: int | None
    tokens_b: int | None

    @property
    def per_token(self) -> bool:
        return bool(self.tokens_a and self.tokens_b)

    def compared(self, a: float | None, b: float | None) -> Change:
        """Totals (times, counts) as compared: per generated token when both are decodes, else as they are."""
        if self.tokens_a and self.tokens_b:
            return Change(None if a is None else a / self.tokens_a, None if b is None else b / self.tokens_b)
        return Change(a, b)


def profile_diff(a: Profile, b: Profile) -> ProfileDiff:
    return ProfileDiff(a=a, b=b, tokens_a=generated_tokens(a), tokens_b=generated_tokens(b))


def _op_figures(profile: Profile, kind: str = "op") -> dict[OpKey, tuple[OpStat, OpFigures]]:
    """Each key's first op (for its text) and its figures, over the ops of one ``kind``."""
    out: dict[OpKey, tuple[OpStat, OpFigures]] = {}
    for op in profile.ops:
        if op.kind != kind or not op.calls:
            continue
        _, figures = out.setdefault(op_key(op), (op, OpFigures()))
        figures.calls += op.calls
        figures.self_ns += op.self_ns
        figures.incl_ns += op.incl_ns
    return out


def _by_change(changes: Iterable[Any], delta: Callable[[Any], float], name: Callable[[Any], str]) -> list[Any]:
    """Largest absolute change first; equal changes by name, so the order is stable."""
    return sorted(changes, key=lambda c: (-abs(delta(c)), name(c)))


def op_changes(cmp: ProfileDiff) -> list[OpChange]:
    """Every op key of either profile, the largest change in self time (per token for decodes) first."""
    a_ops, b_ops = _op_figures(cmp.a), _op_figures(cmp.b)
    changes = []
    for key in list(a_ops) + [k for k in b_ops if k not in a_ops]:
        a_op, a_fig = a_ops.get(key, (None, None))
        b_op, b_fig = b_ops.get(key, (None, None))
        op = a_op or b_op
        assert op is not None
        changes.append(OpChange(name=op.name, kind=op_kind(op), op=op, a=a_fig, b=b_fig,
                                compared=cmp.compared(a_fig.self_ns if a_fig else None,
                                                      b_fig.self_ns if b_fig else None)))
    return _by_change(changes, lambda c: c.compared.delta, lambda c: c.name)


@dataclass
class GemmChange:
    shape: str
    dtype: str
    ops: str
    calls_a: int | None
    calls_b: int | None
    time: Change  # the GEMM ops' total time (per token for decodes)
    gb_per_s: Change  # least bytes / time


# The layout marks of a GEMM's shape text: transposed, prepacked, other strides.
_LAYOUT_MARKS = re.compile("[ᵀᵖ*]")


def _keyed_groups(groups: list[GemmGroup], other: list[GemmGroup]) -> dict[tuple[str, str, str], GemmGroup]:
    """GEMM groups by kind, dtype and shape. The same product with its weight laid out anew (torch.compile
    prepacks what eager mode transposes) is one GEMM that got faster or slower, so the layout is left out of
    the key, unless two groups of one side differ only by it."""
    def loose(g: GemmGroup) -> tuple[str, str, str]:
        return (g.work.kind, g.work.dtype, _LAYOUT_MARKS.sub("", g.shape_text))

    counts = Counter(loose(g) for g in groups)
    other_counts = Counter(loose(g) for g in other)
    return {(loose(g) if counts[loose(g)] == 1 and other_counts[loose(g)] <= 1
             else (g.work.kind, g.work.dtype, g.shape_text)): g for g in groups}


def gemm_changes(cmp: ProfileDiff) -> list[GemmChange]:
    """Each GEMM shape (roofline.py's groups: one row per shape, each counted once at its innermost
    GEMM-like op), the largest change in time first."""
    a_groups = _keyed_groups(gemm_groups(cmp.a), gemm_groups(cmp.b))
    b_groups = _keyed_groups(gemm_groups(cmp.b), gemm_groups(cmp.a))
    changes = []
    for key in list(a_groups) + [k for k in b_groups if k not in a_groups]:
        ga, gb = a_groups.get(key), b_groups.get(key)
        names = list(dict.fromkeys((ga.op_names if ga else []) + (gb.op_names if gb else [])))
        shape = (ga or gb).shape_text  # type: ignore[union-attr]
        if ga and gb and ga.shape_text != gb.shape_text:
            shape = f"{ga.shape_text} → {gb.shape_text}"  # the same product, its weight laid out anew
        changes.append(GemmChange(
            shape=shape, dtype=key[1], ops=", ".join(names), calls_a=ga.calls if ga else None,
            calls_b=gb.calls if gb else None,
            time=cmp.compared(ga.time_ns if ga else None, gb.time_ns if gb else None),
            gb_per_s=Change(ga.gb_per_s if ga else None, gb.gb_per_s if gb else None)))
    return _by_change(changes, lambda c: c.time.delta, lambda c: c.shape)


# -- the report -------------------------------------------------------------------------------------


def _sign(value: float) -> str:
    return "+" if value > 0 else "-" if value < 0 else ""


def _signed_ns(ns: float) -> str:
    return _sign(ns) + fmt_ns(abs(ns))


def _change_text(change: Change, fmt: Callable[[float], str] = fmt_ns) -> str:
    """"A → B (B − A, relative)", each side "-" where it is missing."""
    a = fmt(change.a) if change.a is not None else "-"
    b = fmt(change.b) if change.b is not None else "-"
    if change.a is None or change.b is None:
        return f"{a} → {b}"
    delta = _sign(change.delta) + fmt(abs(change.delta))
    relative = change.relative
    share = f", {_sign(relative)}{fmt_percent(abs(relative))}" if relative is not None else ""
    return f"{a} → {b} ({delta}{share})"


def _describe(profile: Profile) -> str:
    """What a profile is, in a few words: the decode or program, the threads, when."""
    wl = profile.workload
    if wl is not None:
        what = f"decode of {wl.model.name} ({wl.model.dtype}, batch {wl.batch}, {wl.new_tokens} steps)"
    elif profile.meta.argv:
        what = "python " + " ".join(profile.meta.argv)
    else:
        what = "profile"
    threads = profile.settings.requested.threads if profile.settings else None
    on = f", {threads} thread{'s' if threads != 1 else ''}" if threads is not None else ""
    return f"{what}{on}, {profile.meta.created}" + ("" if profile.status.complete else ", PARTIAL")


def _workload_differences(cmp: ProfileDiff) -> list[str]:
    a, b = cmp.a, cmp.b
    wa, wb = a.workload, b.workload
    if (wa is None) != (wb is None):
        return ["one is a decode and the other is not"]
    if wa is not None and wb is not None:
        pairs = [("model", wa.model.name, wb.model.name), ("dtype", wa.model.dtype, wb.model.dtype),
                 ("batch", wa.batch, wb.batch), ("prompt", wa.prompt_len, wb.prompt_len)]
        if not cmp.per_token:  # per-token figures are what make runs of different lengths comparable
            pairs.append(("decode steps", wa.new_tokens, wb.new_tokens))
        return [f"{name} {x} vs {y}" for name, x, y in pairs if x != y]
    if a.meta.program() == b.meta.program():
        return []
    return [f"programs {' '.join(a.meta.program())} vs {' '.join(b.meta.program())}"]


def _warnings(cmp: ProfileDiff) -> list[str]:
    out = []
    for label, p in ((A_LABEL, cmp.a), (B_LABEL, cmp.b)):
        if not p.status.complete:
            out.append(f"{label} is PARTIAL: {p.status.reason or 'the run did not finish'}")
        if not p.profiled:
            out.append(f"{label} was not profiled: it has no ops, threads or counters to compare")
        disturbed = run_queue_warning(p) if p.profiled else None
        if disturbed is not None:
            # Another process on its CPUs makes a side slower for reasons that are not its settings.
            out.append(f"{label} was disturbed: {disturbed[0].lower()}{disturbed[1:]} Its changes below are partly "
                       "the machine's, not the settings'; diff two runs made on a quiet machine")
    differences = _workload_differences(cmp)
    if differences:
        out.append(f"A and B ran different workloads ({'; '.join(differences)}): not every change below comes "
                   "from the settings")
    ca, cb = cmp.a.collection, cmp.b.collection
    if ca is not None and cb is not None and ca.mode != cb.mode:
        out.append(f"A was profiled in {ca.mode} mode and B in {cb.mode} mode: their per-op CPU figures were "
                   "obtained differently")
    return out


def _ops_section(cmp: ProfileDiff, top: int) -> Section:
    changes = op_changes(cmp)
    per_token = cmp.per_token
    unit = "self/token" if per_token else "self"
    columns = [
        Column("op", "op"),
        Column("kind", "kind", help="GEMM: a matrix product (mm, addmm, bmm, linear, matmul, ...); attention: "
                                    "scaled dot-product attention"),
        Column("inputs", "inputs"),
        Column("region", "region"),
        Column("change", "change", help="added: only in B; removed: only in A"),
        Column("calls_a", "calls A", "int"), Column("calls_b", "calls B", "int"),
        Column("self_a", "self A", "ns"), Column("self_b", "self B", "ns"),
    ]
    if per_token:
        columns += [Column("a", "A /token", "ns"), Column("b", "B /token", "ns")]
    columns += [Column("delta", f"Δ {unit}", "ns", help=f"B − A of the {unit} time" + (
        " (self time / the tokens the run generated)" if per_token else "")),
                Column("relative", "Δ %", "share", help="B − A over A")]
    rows = []
    for c in changes[:top]:
        row: dict[str, Any] = {
            "op": c.name, "kind": c.kind, "inputs": inputs_text(c.op), "region": "/".join(c.op.region),
            "change": c.status, "calls_a": c.a.calls if c.a else None, "calls_b": c.b.calls if c.b else None,
            "self_a": c.a.self_ns if c.a else None, "self_b": c.b.self_ns if c.b else None,
            "delta": c.compared.delta, "relative": c.compared.relative}
        if per_token:
            row["a"], row["b"] = c.compared.a, c.compared.b
        rows.append(row)
    added = sum(c.status == "added" for c in changes)
    removed = sum(c.status == "removed" for c in changes)
    both = len(changes) - added - removed
    lines = [f"{both} op key{'s' if both != 1 else ''} in both, {added} added (only in B), {removed} removed "
             "(only in A); keyed as the op table keys them: name, inputs (dtype, sizes, strides) and region"]
    total = cmp.compared(sum(c.a.self_ns for c in changes if c.a), sum(c.b.self_ns for c in changes if c.b))
    gemm = cmp.compared(sum(c.a.self_ns for c in changes if c.a and c.kind),
                        sum(c.b.self_ns for c in changes if c.b and c.kind))
    what = "per generated token" if per_token else "in all"
    lines.append(f"op self time {what}: {_change_text(total)}; of it GEMM and attention ops {_change_text(gemm)}, "
                 f"other ops {_change_text(Change((total.a or 0) - (gemm.a or 0), (total.b or 0) - (gemm.b or 0)))}")
    if per_token:
        lines.append(f"per token: A generated {cmp.tokens_a:,} tokens and B {cmp.tokens_b:,} (the prefill's and "
                     "one per decode step, every sequence of the batch) while profiled")
    caption = (f"top {len(rows)} of {len(changes)} op keys by the size of the change in {unit} time "
               f"(B − A; negative: less time in B)")
    return Section("ops", "Ops: what changed most", lines, [Table(columns, rows, caption=caption)])


def _gemms_section(cmp: ProfileDiff, top: int) -> Section | None:
    changes = gemm_changes(cmp)
    if not changes:
        return None
    per = " per token" if cmp.per_token else ""
    columns = [
        Column("shape", "shape", help="[m,k]x[k,n] per product, as the GEMM table writes it"),
        Column("ops", "ops"), Column("dtype", "dtype"),
        Column("calls_a", "calls A", "int"), Column("calls_b", "calls B", "int"),
        Column("a", f"time A{per}", "ns"), Column("b", f"time B{per}", "ns"),
        Column("delta", "Δ time", "ns", help="B − A of the GEMM's time (its innermost GEMM-like op, with the small "
                                             "ops it calls)" + (", per generated token" if per else "")),
        Column("relative", "Δ %", "share"),
        Column("gbs_a", "GB/s A", "ratio", help="least bytes (each operand read once) / time"),
        Column("gbs_b", "GB/s B", "ratio"),
    ]
    rows = [{"shape": c.shape, "ops": c.ops, "dtype": c.dtype, "calls_a": c.calls_a, "calls_b": c.calls_b,
             "a": c.time.a, "b": c.time.b, "delta": c.time.delta, "relative": c.time.relative,
             "gbs_a": c.gb_per_s.a, "gbs_b": c.gb_per_s.b} for c in changes[:top]]
    caption = f"top {len(rows)} of {len(changes)} GEMM shapes by the size of the change in time{per} (B − A)"
    return Section("gemms", "GEMMs: what changed most", [], [Table(columns, rows, caption=caption)])


def _regions_section(cmp: ProfileDiff, top: int) -> Section | None:
    a_regions, b_regions = _op_figures(cmp.a, "region"), _op_figures(cmp.b, "region")
    if not a_regions and not b_regions:
        return None
    changes = []
    for key in list(a_regions) + [k for k in b_regions if k not in a_regions]:
        a = a_regions.get(key)
        b = b_regions.get(key)
        path = "/".join([*key[2], key[0]])
        changes.append((path, a[1] if a else None, b[1] if b else None,
                        cmp.compared(a[1].incl_ns if a else None, b[1].incl_ns if b else None)))
    changes = _by_change(changes, lambda c: c[3].delta, lambda c: c[0])
    per = " per token" if cmp.per_token else ""
    columns = [Column("region", "region"), Column("calls_a", "calls A", "int"), Column("calls_b", "calls B", "int"),
               Column("a", f"total A{per}", "ns"), Column("b", f"total B{per}", "ns"),
               Column("delta", "Δ total", "ns", help="B − A of the wall time inside the region"),
               Column("relative", "Δ %", "share")]
    rows = [{"region": path, "calls_a": a.calls if a else None, "calls_b": b.calls if b else None,
             "a": change.a, "b": change.b, "delta": change.delta, "relative": change.relative}
            for path, a, b, change in changes[:top]]
    return Section("regions", "Regions", [], [Table(columns, rows, caption="by the size of the change (B − A)")])


@dataclass
class ThreadFigures:
    wall_ns: int | None
    threads: int
    dispatch: int
    workers: int
    cpu_ns: int | None
    run_delay_ns: int | None
    delay_missing: int = 0  # threads whose run-queue delay could not be read (they exited first)

    @property
    def busy(self) -> float | None:
        return self.cpu_ns / self.wall_ns if self.cpu_ns is not None and self.wall_ns else None

    @property
    def waiting(self) -> float | None:
        return self.run_delay_ns / self.wall_ns if self.run_delay_ns is not None and self.wall_ns else None


def thread_figures(profile: Profile) -> ThreadFigures:
    threads = profile.threads
    cpus = [t.cpu_ns for t in threads]
    delays = [t.run_delay_ns for t in threads if t.run_delay_ns is not None]
    return ThreadFigures(
        wall_ns=profile.collection.wall_ns if profile.collection else None, threads=len(threads),
        dispatch=sum(t.role == "dispatch" for t in threads), workers=sum(t.role != "dispatch" for t in threads),
        cpu_ns=sum(c for c in cpus if c is not None) if profile.has_event(CPU_EVENT) else None,
        run_delay_ns=sum(delays) if delays else None, delay_missing=len(threads) - len(delays))


def _difference(a: float | None, b: float | None) -> float | None:
    return b - a if a is not None and b is not None else None


def _threads_section(cmp: ProfileDiff) -> Section:
    fa, fb = thread_figures(cmp.a), thread_figures(cmp.b)
    columns = [Column("run", "run"), Column("wall", "profiled", "ns", help="wall time profiled"),
               Column("threads", "threads", "int", help="threads that worked while profiled"),
               Column("dispatch", "dispatch", "int", help="threads that ran ATen ops"),
               Column("workers", "workers", "int", help="threads that worked for them (OpenMP, intra-op pool)"),
               Column("cpu", "CPU", "ns", help="CPU time of all of them (task-clock)"),
               Column("busy", "CPUs busy", "ratio", help="CPU / profiled wall time: CPUs busy on average"),
               Column("delay", "run-queue delay", "ns",
                      help="time they were runnable but waited for a CPU (the kernel's schedstat), summed"),
               Column("waiting", "waiting", "ratio", help="run-queue delay / profiled wall time: threads waiting "
                                                          "for a CPU on average")]
    rows = []
    for label, f in ((A_LABEL, fa), (B_LABEL, fb)):
        rows.append({"run": label, "wall": f.wall_ns, "threads": f.threads, "dispatch": f.dispatch,
                     "workers": f.workers, "cpu": f.cpu_ns, "busy": f.busy, "delay": f.run_delay_ns,
                     "waiting": f.waiting})
    rows.append({"run": DELTA_LABEL, "wall": _difference(fa.wall_ns, fb.wall_ns),
                 "threads": fb.threads - fa.threads, "dispatch": fb.dispatch - fa.dispatch,
                 "workers": fb.workers - fa.workers, "cpu": _difference(fa.cpu_ns, fb.cpu_ns),
                 "busy": _difference(fa.busy, fb.busy), "delay": _difference(fa.run_delay_ns, fb.run_delay_ns),
                 "waiting": _difference(fa.waiting, fb.waiting)})
    notes = [f"{label}: the run-queue delay of {f.delay_missing} thread(s) could not be read (they ended before "
             "the profile did); it is not in the sum" for label, f in ((A_LABEL, fa), (B_LABEL, fb))
             if f.delay_missing and f.run_delay_ns is not None]
    return Section("threads", "Threads", [], [Table(columns, rows)], notes)


def _counters_section(cmp: ProfileDiff) -> Section | None:
    ea = cmp.a.collection.event_names if cmp.a.collection else []
    eb = cmp.b.collection.event_names if cmp.b.collection else []
    both = [e for e in ea if e in eb]
    if not both:
        return None
    per = " per token" if cmp.per_token else ""
    tables = []
    # Counts per token are fractions, which a count's format would round away.
    count_unit = "ratio" if cmp.per_token else "count"
    for unit, events in ((count_unit, [e for e in both if e not in TIME_EVENTS]),
                         ("ns", [e for e in both if e in TIME_EVENTS])):
        if not events:
            continue
        columns = [Column("event", "event"), Column("a", f"A{per}", unit), Column("b", f"B{per}", unit),
                   Column("delta", DELTA_LABEL, unit), Column("relative", "Δ %", "share")]
        rows = []
        for event in events:
            totals = [sum(t.counters[event] for t in p.threads if event in t.counters) for p in (cmp.a, cmp.b)]
            change = cmp.compared(totals[0], totals[1])
            rows.append({"event": event, "a": change.a, "b": change.b, "delta": change.delta,
                         "relative": change.relative})
        rows = _by_change(rows, lambda r: r["relative"] or 0.0, lambda r: r["event"])  # counts of unlike events
        what = "times (ns)" if unit == "ns" else "counts"
        tables.append(Table(columns, rows, caption=f"event {what} over every thread of the profile, by the size "
                                                   "of the relative change"))
    notes = []
    for label, only in ((A_LABEL, [e for e in ea if e not in eb]), (B_LABEL, [e for e in eb if e not in ea])):
        if only:
            notes.append(f"counted in {label} only: {', '.join(only)}")
    return Section("counters", "Counters", [], tables, notes)


def _settings(profile: Profile) -> dict[str, str | None]:
    """Every setting that can differ between two runs, as text; None: not known for this profile."""
    out: dict[str, str | None] = {}
    s = profile.settings
    if s is not None:
        r, force = s.requested, s.in_force
        out["threads (asked)"] = str(r.threads)
        out["torch threads (in force)"] = str(force.torch.num_threads) if force and force.torch else None
        out["CPUs"] = format_cpulist(r.cpus)
        out["bind"] = r.bind
        out["OpenMP"] = (force.openmp.active.runtime if force and force.openmp.active else r.omp)
        out["allocator"] = (", ".join(a.allocator for a in force.allocators) or "glibc malloc") if force \
            else r.allocator
        policy = force.mempolicy if force else r.mempolicy
        out["memory policy"] = policy.mode + (f" {format_cpulist(policy.nodes)}" if policy.nodes else "")
        for key, value in sorted((force.env if force else r.env).items()):
            out[key] = value
    wl = profile.workload
    if wl is not None:
        out["model"] = f"{wl.model.name} ({wl.model.dtype})"
        out["batch, prompt, decode steps"] = f"{wl.batch}, {wl.prompt_len}, {wl.new_tokens}"
    elif profile.meta.argv:
        out["program"] = " ".join(profile.meta.argv)
    c = profile.collection
    out["profiler"] = (f"{c.mode}" + (f", {profile.sampling.hz} Hz" if profile.sampling else "")
                       + ("" if c.record_shapes else ", no shapes")) if c else "not profiled"
    out["events"] = ", ".join(c.event_names) if c else None
    out["torch"] = profile.meta.torch_version
    out["cpuprof"] = profile.meta.cpuprof_version
    out["host"] = profile.meta.hostname
    return out


def _settings_section(cmp: ProfileDiff) -> Section:
    sa, sb = _settings(cmp.a), _settings(cmp.b)
    names = list(sa) + [k for k in sb if k not in sa]
    differ = [n for n in names if sa.get(n) != sb.get(n)]
    same = [f"{n} {sa[n]}" for n in names if n not in differ and sa.get(n) is not None]
    lines = []
    for label, p in ((A_LABEL, cmp.a), (B_LABEL, cmp.b)):
        if p.settings is None:
            lines.append(f"{label} has no launch settings (profiled through the Python API, not launched by cpuprof)")
    if same:
        lines.append("the same in both: " + "; ".join(same))
    rows = [{"setting": n, "a": sa.get(n), "b": sb.get(n)} for n in differ]
    columns = [Column("setting", "setting"), Column("a", A_LABEL), Column("b", B_LABEL)]
    table = Table(columns, rows, caption="what differs (-: not known for that profile)")
    return Section("settings", "Settings", lines, [table])


def _throughput_section(cmp: ProfileDiff) -> Section | None:
    wa, wb = cmp.a.workload, cmp.b.workload
    if wa is None and wb is None:
        return None
    if wa is None or wb is None:
        return Section("throughput", "Throughput",
                       [f"only {A_LABEL if wa else B_LABEL} is a decode: throughput is not compared"])
    fa, fb = wa.figures, wb.figures
    metrics: list[tuple[str, float | None, float | None]] = [
        ("tokens/s", fa.tokens_per_s if fa else None, fb.tokens_per_s if fb else None),
        ("step latency p50 (ms)", fa.p50_ms if fa else None, fb.p50_ms if fb else None),
        ("step latency p90 (ms)", fa.p90_ms if fa else None, fb.p90_ms if fb else None),
        ("step latency p99 (ms)", fa.p99_ms if fa else None, fb.p99_ms if fb else None),
        ("time to first token (ms)", wa.ttft_s * 1e3 if wa.ttft_s is not None else None,
         wb.ttft_s * 1e3 if wb.ttft_s is not None else None),
    ]
    columns = [Column("metric", "metric"), Column("a", A_LABEL, "ratio"), Column("b", B_LABEL, "ratio"),
               Column("delta", DELTA_LABEL, "ratio"), Column("relative", "Δ %", "share")]
    rows = []
    for name, a, b in metrics:
        change = Change(a, b)
        rows.append({"metric": name, "a": a, "b": b, "delta": _difference(a, b), "relative": change.relative
                     if a is not None and b is not None else None})
    lines = []
    if fa and fb:
        tps = Change(fa.tokens_per_s, fb.tokens_per_s)
        lines.append(f"tokens/s {_change_text(tps, fmt_rate)} over {fa.measured_steps} and {fb.measured_steps} "
                     f"measured steps")
    return Section("throughput", "Throughput", lines, [Table(columns, rows)])


def diff_report(a: Profile, b: Profile, a_name: str = A_LABEL, b_name: str = B_LABEL,
                top: int = defaults.TOP_OPS) -> Report:
    """The report of what changed from ``a`` (before) to ``b`` (after)."""
    cmp = profile_diff(a, b)
    report = Report(title=f"cpuprof diff: {a_name} → {b_name}", warnings=_warnings(cmp))
    summary = [f"A (before): {a_name}: {_describe(a)}", f"B (after): {b_name}: {_describe(b)}",
               "every change is B − A: negative is less in B"]
    sections: list[Section | None] = [_throughput_section(cmp)]
    if a.profiled and b.profiled:
        changes = op_changes(cmp)
        if changes:
            most = "; ".join(f"{c.name} {inputs_text(c.op, 40)}{f' ({c.kind})' if c.kind else ''}: "
                             f"{_signed_ns(c.compared.delta)}" for c in changes[:3])
            summary.append(f"most changed ops (self time{' per token' if cmp.per_token else ''}): {most}")
        sections += [_ops_section(cmp, top), _gemms_section(cmp, top), _regions_section(cmp, top),
                     _threads_section(cmp), _counters_section(cmp)]
    sections.append(_settings_section(cmp))
    report.sections = [Section("summary", "Summary", summary)] + [s for s in sections if s is not None]
    return report


__all__ = ["Change", "GemmChange", "OpChange", "OpFigures", "ProfileDiff", "ThreadFigures", "diff_report",
           "gemm_changes", "generated_tokens", "op_changes", "op_key", "op_kind", "profile_diff", "thread_figures"]
