"""Where the bytes live besides the weights: the KV cache by position, resident memory over the
run, and the page faults each op took."""

from __future__ import annotations

from ..model import Profile
from ..units import fmt_bytes
from .labels import inputs_text, region_text
from .report_model import Column, Section, Table

PAGE_FAULTS = "page-faults"
TOP_FAULTING_OPS = 5
TOP_ALLOCATING_OPS = 8


def _allocation_table(profile: Profile) -> Table | None:
    c = profile.collection
    if c is None or not c.memory_reported:
        return None
    ops = [op for op in profile.ops if op.allocs or op.frees]
    allocated = sum(op.alloc_bytes for op in ops)
    freed = sum(op.freed_bytes for op in ops)
    top = sorted((op for op in ops if op.allocs), key=lambda op: op.alloc_bytes, reverse=True)[:TOP_ALLOCATING_OPS]
    columns = [Column("op", "op"), Column("inputs", "inputs"), Column("region", "region"),
               Column("allocated", "allocated", "bytes", help="bytes torch's allocator handed out while it ran"),
               Column("allocs", "allocs", "count", help="allocations"),
               Column("per_call", "bytes/call", "bytes", help="allocated bytes per call"),
               Column("freed", "freed", "bytes", help="bytes given back while it ran (tensors that died in it)"),
               Column("calls", "calls", "int")]
    rows = [{"op": op.name, "inputs": inputs_text(op), "region": region_text(op), "allocated": op.alloc_bytes,
             "allocs": op.allocs, "per_call": op.alloc_bytes / op.calls if op.calls else None,
             "freed": op.freed_bytes, "calls": op.calls} for op in top]
    return Table(columns, rows, caption=f"ops by bytes allocated (torch's allocator reports, as torch.profiler's "
                                        f"profile_memory): {fmt_bytes(allocated)} allocated and {fmt_bytes(freed)} "
                                        "freed while profiled; a tensor's free is charged to whatever ran when it "
                                        "died, often Python between ops ([outside ATen ops])")


def memory_section(profile: Profile) -> Section | None:
    wl = profile.workload
    lines: list[str] = []
    if wl is None:
        table = _allocation_table(profile)
        return Section("memory", "Memory", [], [table]) if table is not None else None
    if len(wl.kv_cache) >= 2:
        first, last = wl.kv_cache[0], wl.kv_cache[-1]
        span = last.position - first.position
        per_position = (last.bytes - first.bytes) / span if span else None
        lines.append(f"KV cache (all layers, {wl.batch} sequence{'s' if wl.batch != 1 else ''}): "
                     f"{fmt_bytes(first.bytes)} at the prompt's end (position {first.position}), "
                     f"{fmt_bytes(last.bytes)} after the last step (position {last.position})"
                     + (f", {fmt_bytes(per_position)} more per position" if per_position else "")
                     + (f"; the weights are {fmt_bytes(wl.model.weight_bytes)}" if wl.model.weight_bytes else ""))
    timeline = wl.rss_timeline
    if timeline:
        by_phase = {p.phase: p for p in timeline}
        marks = [f"{name} {fmt_bytes(by_phase[key].rss_bytes)}"
                 for key, name in (("start", "at start"), ("built", "model built")) if key in by_phase]
        steps = [p for p in timeline if p.phase.startswith("step ")]
        if steps:
            growth = steps[-1].rss_bytes - steps[0].rss_bytes
            marks.append(f"first step {fmt_bytes(steps[0].rss_bytes)}, last step {fmt_bytes(steps[-1].rss_bytes)} "
                         f"({'+' if growth >= 0 else '-'}{fmt_bytes(abs(growth))} over {len(steps)} steps)")
        peak = f"; peak {fmt_bytes(wl.peak_rss_bytes)}" if wl.peak_rss_bytes else ""
        lines.append(f"resident memory (RSS): {', '.join(marks)}{peak} ({len(timeline)} points in the profile's "
                     "rss_timeline)")
    elif wl.peak_rss_bytes:
        lines.append(f"peak resident memory (RSS): {fmt_bytes(wl.peak_rss_bytes)}")
    tables = []
    allocating = _allocation_table(profile)
    if allocating is not None:
        tables.append(allocating)
    if profile.has_event(PAGE_FAULTS):
        faulting = sorted((op for op in profile.ops if op.kind == "op" and (op.self_total(PAGE_FAULTS) or 0) > 0),
                          key=lambda op: op.self_total(PAGE_FAULTS) or 0, reverse=True)
        total = sum(op.self_total(PAGE_FAULTS) or 0 for op in profile.ops)
        if faulting:
            columns = [Column("op", "op"), Column("inputs", "inputs"),
                       Column("faults", "page faults", "count", help="page faults of every thread while it ran"),
                       Column("per_call", "per call", "ratio", help="page faults per call"),
                       Column("calls", "calls", "int")]
            rows = [{"op": op.name, "inputs": inputs_text(op), "faults": op.self_total(PAGE_FAULTS),
                     "per_call": (op.self_total(PAGE_FAULTS) or 0) / op.calls if op.calls else None,
                     "calls": op.calls} for op in faulting[:TOP_FAULTING_OPS]]
            tables.append(Table(columns, rows, caption=f"ops that took page faults ({total:,} in all), most first: "
                                                       "memory touched for the first time, or given back and "
                                                       "taken again by the allocator"))
        else:
            lines.append("no op took a page fault while profiled: every page it touched was already mapped")
    if not lines and not tables:
        return None
    return Section("memory", "Memory", lines, tables)
