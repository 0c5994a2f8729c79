"""The terminal report: where the time goes per op, across every thread of the team.

Reads only the Profile model. Every derived number is computed here from counters that exist;
a metric whose counters were not measured is left out and the header says why, never shown as 0.
"""

from __future__ import annotations

from typing import TextIO

from ..model import OpStat, Profile, ThreadStat

# Derived metrics: (label, numerator event, denominator event, scale).
RATIOS = (
    ("IPC", "instructions", "cycles", 1.0),
    ("cache miss%", "cache-misses", "cache-references", 100.0),
    ("LLC miss%", "LLC-load-misses", "LLC-loads", 100.0),
    ("dTLB miss%", "dTLB-load-misses", "dTLB-loads", 100.0),
    ("branch miss%", "branch-misses", "branch-instructions", 100.0),
)
CPU_EVENT = "task-clock"
MIN_SAMPLES = 30  # ~18% relative error (1/sqrt(n)): below it a ratio is noise
# Counted events shown as plain totals per op, in this order when present.
COUNT_COLUMNS = (
    ("ctx-sw", "context-switches"),
    ("migr", "cpu-migrations"),
    ("faults", "page-faults"),
    ("sched_switch", "sched:sched_switch"),
    ("futex", "syscalls:sys_enter_futex"),
)


def fmt_ns(ns: float) -> str:
    if ns >= 1e9:
        return f"{ns / 1e9:.2f} s"
    if ns >= 1e6:
        return f"{ns / 1e6:.1f} ms"
    if ns >= 1e3:
        return f"{ns / 1e3:.1f} µs"
    return f"{ns:.0f} ns"


def fmt_count(value: float) -> str:
    for limit, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= limit:
            return f"{value / limit:.1f}{suffix}"
    return f"{value:.0f}"


def fmt_bytes(n: float) -> str:
    for limit, suffix in ((1e9, "GB"), (1e6, "MB"), (1e3, "kB")):
        if n >= limit:
            return f"{n / limit:.2f} {suffix}"
    return f"{n:.0f} B"


def _table(rows: list[list[str]], align: str) -> list[str]:
    """Left/right aligned columns; `align` has one 'l' or 'r' per column."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = []
    for row in rows:
        cells = [cell.ljust(w) if a == "l" else cell.rjust(w) for cell, w, a in zip(row, widths, align)]
        lines.append("  " + "  ".join(cells).rstrip())
    return lines


def active_threads(profile: Profile) -> list[int]:
    """Indices of threads that did work (the team), dispatching threads first."""
    order = {"dispatch": 0, "worker": 1}
    indexed = [(order[t.role], i) for i, t in enumerate(profile.threads) if t.role in order]
    return [i for _, i in sorted(indexed)]


def thread_label(index: int, thread: ThreadStat) -> str:
    return f"T{index}"


def source_line(profile: Profile) -> str:
    c = profile.collection
    if c.mode == "exact":
        how = "read from every thread at every op boundary (exact per op)"
    else:
        how = (f"read from the team at the first op boundary after every {c.sample_interval_us} µs and "
               "charged to the op running then (statistical per op; exact per thread)")
    kinds = sorted({e.kind for e in c.events})
    return f"counters: {', '.join(c.event_names)} ({'/'.join(kinds)} events), {how}"


def render(profile: Profile, out: TextIO, top: int = 20) -> None:
    # What was asked and what was in force disagree: that qualifies every number below.
    for warning in profile.settings.get("warnings", []):
        out.write(f"WARNING: {warning}\n")
    if profile.workload:
        _workload(profile, out)
    if profile.settings:
        _settings(profile, out)
    if profile.collection.mode == "off":
        out.write("\nnot profiled (--no-profile): no counters were collected\n")
        return
    if profile.workload or profile.settings:
        out.write("\n")
    w = out.write
    c = profile.collection
    wall = c.wall_ns
    status = ""
    if not profile.status.get("complete", True):
        status = f"  [PARTIAL: {profile.status.get('reason', 'run did not finish')}]"
    w(f"cpuprof profile: {fmt_ns(wall)} wall, {profile.overhead.ops:,} ops, {c.mode} mode{status}\n")
    w(f"  {source_line(profile)}\n")
    caps = profile.capabilities
    if not caps.get("hardware_pmu"):
        w("  no hardware PMU: cycles, instructions and cache events cannot be counted here, so IPC and "
          "miss rates are not shown\n")
    hardware_drops = [d for d in profile.dropped_events]
    for d in hardware_drops:
        if caps.get("hardware_pmu") or "PMU" not in d.reason:
            w(f"  dropped {d.name}: {d.reason}\n")
    _overhead(profile, out)
    _threads(profile, out)
    _ops(profile, out, top)
    _regions(profile, out)
    _limits(profile, out)


def _overhead(profile: Profile, out: TextIO) -> None:
    o = profile.overhead
    wall = profile.collection.wall_ns
    if not wall:
        return
    hook_pct = 100.0 * o.hook_ns / wall
    sampler_pct = 100.0 * o.sampler_cpu_ns / wall
    samples = f", {o.samples:,} samples" if profile.collection.mode == "sampled" else ""
    out.write(f"  overhead: op hook {fmt_ns(o.hook_ns)} ({hook_pct:.2f}% of wall, {o.per_op_ns:.0f} ns/op{samples}); "
              f"thread-discovery thread {fmt_ns(o.sampler_cpu_ns)} CPU ({sampler_pct:.2f}% of one CPU)\n")


def _threads(profile: Profile, out: TextIO) -> None:
    wall = profile.collection.wall_ns
    team = active_threads(profile)
    counted = [e for _, e in COUNT_COLUMNS if profile.has_event(e)]
    header = ["thread", "tid", "name", "role", "CPU time", "util"] + [
        label for label, e in COUNT_COLUMNS if e in counted]
    rows = [header]
    for i in team:
        t = profile.threads[i]
        cpu = t.cpu_ns
        util = f"{100.0 * cpu / wall:.0f}%" if cpu is not None and wall else "-"
        rows.append([thread_label(i, t), str(t.tid), t.name, t.role, fmt_ns(cpu) if cpu is not None else "-", util]
                    + [fmt_count(t.counters.get(e, 0)) for e in counted])
    out.write("\nThreads (CPU time from task-clock, per thread; util = CPU time / wall time)\n")
    if len(rows) > 1:
        out.write("\n".join(_table(rows, "lrllrr" + "r" * len(counted))) + "\n")
    idle = len(profile.threads) - len(team)
    total_cpu = sum(profile.threads[i].cpu_ns or 0 for i in team)
    if wall:
        out.write(f"  {len(team)} busy threads used {fmt_ns(total_cpu)} CPU in {fmt_ns(wall)}: "
                  f"{total_cpu / wall:.2f} CPUs on average")
        out.write(f"; {idle} idle thread{'s' if idle != 1 else ''} not shown\n" if idle else "\n")


def _op_cpu(op: OpStat) -> int | None:
    return op.self_total(CPU_EVENT)


def _ops(profile: Profile, out: TextIO, top: int) -> None:
    ops = [op for op in profile.ops if op.kind == "op" and op.calls]
    total_self = sum(op.self_ns for op in ops) or 1
    team = active_threads(profile)
    ratios = [r for r in RATIOS if profile.has_event(r[1]) and profile.has_event(r[2])]
    counted = [(label, e) for label, e in COUNT_COLUMNS if profile.has_event(e)]
    has_cpu = profile.has_event(CPU_EVENT)
    header = ["op", "calls", "self", "%", "total", "avg"]
    sampled = profile.collection.mode == "sampled"
    if sampled:
        header += ["samples"]
    if has_cpu:
        header += ["CPU (all thr)", "busy thr"] + [f"CPU {thread_label(i, profile.threads[i])}" for i in team]
    header += [label for label, _ in counted] + [label for label, *_ in ratios] + ["shapes"]
    rows = [header]
    for op in sorted(ops, key=lambda o: o.self_ns, reverse=True)[:top]:
        name = op.name if not op.region else f"{op.name} @{op.region}"
        row = [name if len(name) <= 48 else name[:47] + "…", f"{op.calls:,}", fmt_ns(op.self_ns),
               f"{100.0 * op.self_ns / total_self:.1f}",
               fmt_ns(op.incl_ns), fmt_ns(op.incl_ns / op.calls)]
        if sampled:
            row.append(str(op.samples))
        if has_cpu:
            cpu = _op_cpu(op) or 0
            per_thread = op.counters_self.get(CPU_EVENT, [])
            # A ratio over a handful of samples is noise, not a measurement.
            reliable = op.self_ns and (not sampled or op.samples >= MIN_SAMPLES)
            row += [fmt_ns(cpu), f"{cpu / op.self_ns:.2f}" if reliable else "-"]
            row += [fmt_ns(per_thread[i]) if i < len(per_thread) else "-" for i in team]
        for _, e in counted:
            row.append(fmt_count(op.self_total(e) or 0))
        for _, num, den, scale in ratios:
            n, d = op.self_total(num) or 0, op.self_total(den) or 0
            row.append(f"{scale * n / d:.2f}" if d else "-")
        row.append(op.shapes[:60] + ("…" if len(op.shapes) > 60 else ""))
        rows.append(row)
    note = (f"; sampled mode: counters per op are estimates from the samples shown, busy thr needs "
            f">= {MIN_SAMPLES}") if sampled else ""
    out.write(f"\nTop {min(top, len(ops))} ops by self time (of {len(ops)} op keys; "
              f"busy thr = CPU time of all threads / self wall time{note})\n")
    if len(rows) > 1:
        align = ("lrrrrr" + ("r" if sampled else "") + ("rr" + "r" * len(team) if has_cpu else "")
                 + "r" * (len(counted) + len(ratios)) + "l")
        out.write("\n".join(_table(rows, align)) + "\n")
    outside = [op for op in profile.ops if op.kind == "special" and op.name.startswith("[outside")]
    if outside and has_cpu:
        cpu = outside[0].self_total(CPU_EVENT) or 0
        out.write(f"  CPU time outside ATen ops (Python, framework, spinning workers between ops): {fmt_ns(cpu)}\n")


def _regions(profile: Profile, out: TextIO) -> None:
    regions = [op for op in profile.ops if op.kind == "region" and op.calls]
    if not regions:
        return
    wall = profile.collection.wall_ns or 1
    rows = [["region", "calls", "total", "% wall", "CPU (all thr)"]]
    for r in sorted(regions, key=lambda r: r.incl_ns, reverse=True):
        name = r.name if not r.region else f"{r.region}/{r.name}"
        cpu = r.incl_total(CPU_EVENT)
        rows.append([name, f"{r.calls:,}", fmt_ns(r.incl_ns), f"{100.0 * r.incl_ns / wall:.1f}",
                     fmt_ns(cpu) if cpu is not None else "-"])
    out.write("\nRegions\n" + "\n".join(_table(rows, "lrrrr")) + "\n")


def _limits(profile: Profile, out: TextIO) -> None:
    lim = profile.limits
    notes = []
    if lim.ops_overflowed:
        notes.append(f"{lim.ops_overflowed:,} op calls fell into '[other ops]' "
                     f"(op table of {lim.op_capacity} keys full)")
    if lim.spans_dropped:
        notes.append(f"timeline kept the last {lim.span_capacity:,} spans; {lim.spans_dropped:,} older ones dropped")
    if lim.too_deep:
        notes.append(f"{lim.too_deep:,} ops nested deeper than 64 levels were timed only as part of their parents")
    if lim.unattributed_ops:
        notes.append(f"{lim.unattributed_ops:,} ops ran on threads beyond the 32 tracked dispatch threads")
    if lim.truncated_ops:
        notes.append(f"{lim.truncated_ops:,} ops were still running when profiling stopped (not counted)")
    if lim.unmatched_ends:
        notes.append(f"{lim.unmatched_ends:,} op ends had no begin in this session on their thread (ignored)")
    user_only = [e.name for e in profile.collection.events if e.user_only]
    if user_only:
        notes.append(f"counted in user mode only (kernel mode refused by perf_event_paranoid): {', '.join(user_only)}")
    if lim.threads_beyond_limit:
        notes.append(f"{lim.threads_beyond_limit} threads beyond the 64 monitored were not counted")
    scaled = sorted({e for t in profile.threads for e in t.scaled} | set(profile.collection.scaled_events))
    if scaled:
        notes.append(f"multiplexed (scaled by time_enabled/time_running): {', '.join(scaled)}")
    for note in notes:
        out.write(f"  note: {note}\n")


def _workload(profile: Profile, out: TextIO) -> None:
    wl = profile.workload
    w = out.write
    params = wl.get("params")
    weights = wl.get("weight_bytes")
    head = f"decode {wl.get('model', '?')}"
    if params:
        head += f" ({fmt_count(params)} params, {wl.get('dtype')}, {fmt_bytes(weights)} of weights)"
    head += (f", batch {wl.get('batch')}, prompt {wl.get('prompt_len')}, {wl.get('new_tokens')} decode steps"
             f" ({wl.get('steps_done', 0)} done)")
    w(head + "\n")
    tps = wl.get("tokens_per_s")
    if tps:
        w(f"  throughput {tps:.2f} tokens/s after {wl.get('warmup_steps', 0)} warm-up steps; step latency "
          f"p50 {wl.get('p50_ms', 0):.1f} ms, p90 {wl.get('p90_ms', 0):.1f} ms, p99 {wl.get('p99_ms', 0):.1f} ms")
        if wl.get("ttft_s") is not None:
            w(f"; time to first token {wl['ttft_s'] * 1e3:.1f} ms")
        w("\n")
        per_token = wl.get("bytes_read_per_token")
        if per_token:
            gbs = per_token * tps / wl.get("batch", 1) / 1e9 if wl.get("batch") else per_token * tps / 1e9
            w(f"  memory traffic: {fmt_bytes(per_token)} read per token (weights + KV cache, analytic) "
              f"x {tps:.2f} tokens/s = {gbs:.1f} GB/s effective\n")
    rss = wl.get("peak_rss_bytes")
    if rss:
        w(f"  peak RSS {rss / 1e9:.2f} GB" + (f"; model built in {wl['build_s']:.1f} s" if wl.get("build_s") else "")
          + f"; {wl.get('source', '')}\n")


def _settings(profile: Profile, out: TextIO) -> None:
    st = profile.settings
    w = out.write
    force = st.get("in_force") or {}
    torch_info = force.get("torch") or {}
    omp = (force.get("openmp") or {}).get("active") or {}
    policy = force.get("mempolicy") or {}
    policy_text = policy.get("mode", "?") + (f" node(s) {','.join(map(str, policy['nodes']))}"
                                             if policy.get("nodes") else "")
    allocs = ", ".join(a["allocator"] for a in force.get("allocators", [])) or "glibc malloc"
    w(f"settings in force (read back in the child): {torch_info.get('num_threads', '?')} torch threads, "
      f"CPUs {st.get('cpu_set', '?')}, memory policy {policy_text}, OpenMP {omp.get('runtime', '?')}, "
      f"allocator {allocs}\n")
    env = force.get("env") or {}
    if env:
        w("  env: " + " ".join(f"{k}={v}" for k, v in env.items() if k != "LD_PRELOAD") + "\n")
    pages = force.get("weight_pages") or {}
    nodes = pages.get("nodes") or {}
    total = sum(nodes.values())
    if total:
        share = ", ".join(f"node {n}: {100.0 * c / total:.0f}%" for n, c in sorted(nodes.items()))
        w(f"  weight pages: {share} (of {pages.get('pages_queried', total):,} pages queried"
          f"{'; ' + str(pages['not_present']) + ' not present' if pages.get('not_present') else ''})\n")
    threads = force.get("threads") or []
    if threads:
        from ..topology import format_cpulist

        cells = [f"{t['tid']}:{format_cpulist(t['affinity'])}@{t['last_cpu']}" for t in threads]
        w(f"  threads (tid:allowed CPUs@last CPU): {' '.join(cells)}\n")
