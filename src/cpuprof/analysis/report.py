"""The report of a profile, as sections and tables every renderer lays out the same way."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from .. import defaults
from ..model import CPU_EVENT, EXACT, SAMPLED, Profile
from ..units import fmt_ns, fmt_percent
from .ceiling import ceiling_section
from .contention import OpTimeSplit, analyse, contention_section, op_time_split, summarize_contention
from .decode import decode_lines, settings_lines
from .labels import common_region_prefix, inputs_text, region_text, team_order, thread_label
from .memory import memory_section
from .native import native_section, native_summary
from .notes import limit_notes
from .ops import counted_ratios, cpu_is_statistical, op_ratios, op_table, region_rows
from .proposals import program_advice
from .report_model import Column, Report, Section, Table
from .roofline import gemm_summary, roofline_section
from .roofs import roofs_section
from .steady_state import SteadyState, startup_section, steady_state
from .steps import Steps, decode_section, find_steps
from .steps import ceiling_section as steps_ceiling_section
from .threads import BACKGROUND_UTILISATION, run_queue_warning, split_background, thread_rows
from .timeline import BusyTimeline, busy_timeline

# Counted events shown as totals, in this order when present: (header, event, help).
COUNTS = (
    ("ctx-sw", "context-switches", "context switches"),
    ("migr", "cpu-migrations", "moves to another CPU"),
    ("faults", "page-faults", "page faults"),
    ("sched_switch", "sched:sched_switch", "sched_switch tracepoint hits"),
    ("futex", "syscalls:sys_enter_futex", "futex system calls"),
)


@dataclass
class ProfileFigures:
    """What a profile's charts draw beside its report's tables, carried by the JSON report too."""

    busy_timeline: BusyTimeline | None = None  # each thread's CPU over the run, from the samples
    op_time: OpTimeSplit | None = None  # each team thread's time while ops ran: working, spinning, off CPU


def build_report(profile: Profile, top: int = defaults.TOP_OPS, whole_run: bool = False) -> Report:
    """``whole_run``: a program's op, region and GEMM tables over its whole run, not over the decode
    steps found in it."""
    report = Report(title="cpuprof report", figures=ProfileFigures())
    if profile.settings:
        report.warnings.extend(profile.settings.warnings)
    if profile.profiled:
        waiting = run_queue_warning(profile)
        if waiting:
            report.warnings.append(waiting)
    if not profile.status.complete:
        report.warnings.append(f"PARTIAL: {profile.status.reason or 'the run did not finish'}")
    if profile.workload is not None:
        report.title = f"cpuprof decode: {profile.workload.model.name}"
        report.sections.append(Section("decode", "Decode", decode_lines(profile.workload)))
    if profile.settings is not None:
        report.sections.append(Section("settings", "Settings in force (read back inside the profiled process)",
                                       settings_lines(profile.settings)))
    roofs = roofs_section(profile)
    on_demand = "--on-demand" in profile.meta.command  # its profiles are its windows'
    if profile.workload is None and not profile.profiled and roofs is not None and not on_demand:
        report.title = "cpuprof calibrate"  # the roofs alone: nothing was decoded
        report.sections.append(roofs)
        return report
    if not profile.profiled:
        if on_demand:
            why = ("profiled in windows, not here: an --on-demand run saves each window as its own run, in "
                   "window-N beside this profile (none, if no window was opened)")
        elif profile.status.complete:
            why = "not profiled (--no-profile): no counters were collected"
        else:
            why = f"not profiled: the run ended before profiling started ({profile.status.reason or 'unknown'})"
        report.sections.append(Section("profile", "Profile", [why]))
        return report
    # A program's decode, found in its op stream, where cpuprof did not run the decode itself.
    steps = find_steps(profile) if profile.workload is None else None
    if isinstance(steps, Steps):
        report.sections.append(decode_section(steps))
    # Against the machine's limits first: how far decoding is from its ceiling, and why.
    program_ceiling = steps_ceiling_section(profile, steps) if isinstance(steps, Steps) else None
    for section in (ceiling_section(profile) or program_ceiling, roofs):
        if section is not None:
            report.sections.append(section)
    # Steady state first: the tables of ops a program runs over its steps, its start-up apart.
    view = profile
    if isinstance(steps, Steps) and not whole_run:
        state = steady_state(profile, steps)
        if isinstance(state, SteadyState):
            view = state.profile
            startup = startup_section(state, profile, len(steps.steps))
            if startup is not None:
                report.sections.append(startup)
        else:
            report.warnings.append(f"the tables are over the whole run, not the decode steps: {state}")
    if isinstance(steps, Steps):
        advice = program_advice(view, profile, steps, over_steps=view is not profile)
        if advice:
            after = report.section("ceiling") or report.section("decode")
            assert after is not None  # steps give a Decode section
            report.sections.insert(report.sections.index(after) + 1,
                                   Section("advice", "What to try in the program (from the figures measured)",
                                           advice))
    contention = analyse(profile)
    report.figures = ProfileFigures(busy_timeline(profile), op_time_split(profile, contention))
    report.sections.append(_profile_section(profile))
    if isinstance(steps, str):  # one line: why this program's report has no Decode section
        report.sections[-1].notes.append(f"decode steps: none found in the op stream ({steps})")
    report.sections.append(_threads_section(profile))
    report.sections.append(_ops_section(view, top, threads_of=profile))
    # Regions right after the ops they hold; then each GEMM against the roofs, what native code
    # the samples were in, and where the memory went.
    for section in (_regions_section(view), roofline_section(gemm_summary(view), top),
                    contention_section(summarize_contention(profile, contention)),
                    native_section(native_summary(profile, top)), memory_section(profile)):
        if section is not None:
            report.sections.append(section)
    notes = limit_notes(profile)
    if notes:
        report.sections.append(Section("notes", "Notes", notes))
    return report


def _how_counted(profile: Profile) -> str:
    c = profile.collection
    assert c is not None
    if c.mode == EXACT:
        return "every team thread's counters read at both ends of every op (exact per op)"
    s = profile.sampling
    hz = f"{s.hz} Hz of each thread's CPU time" if s else "the sampling rate"
    if s is None or not s.cpu_by_interval_ns:
        return (f"every thread sampled by the kernel at {hz}, each sample charged to the op its thread was working "
                "for at that instant (statistical per op; exact per thread)")
    by_interval = s.cpu_by_interval_ns / max(1, s.cpu_by_interval_ns + s.cpu_by_sample_ns)
    return (f"CPU per op from each thread's on-CPU intervals (the kernel's switch records) laid over the ops its "
            f"dispatching thread ran, {fmt_percent(by_interval)} of it; the rest, and the other events and native "
            f"stacks, from samples at {hz} (statistical per op)")


def _profile_section(profile: Profile) -> Section:
    c = profile.collection
    assert c is not None and profile.overhead is not None
    o = profile.overhead
    kinds = "/".join(sorted({e.kind for e in c.events})) or "no"
    lines = [f"{fmt_ns(c.wall_ns)} profiled, {o.ops:,} ops, {c.mode} mode: {_how_counted(profile)}",
             f"counted: {', '.join(c.event_names) or 'nothing'} ({kinds} events)"]
    by_reason: dict[str, list[str]] = defaultdict(list)
    for d in profile.dropped_events:
        by_reason[d.reason].append(d.name)
    for reason, names in by_reason.items():
        consequence = ""
        if any(n in ("cycles", "instructions", "cache-misses", "cache-references") for n in names):
            consequence = "; IPC and miss rates are not shown"
        lines.append(f"not counted: {', '.join(names)}: {reason}{consequence}")
    if c.wall_ns:
        collector = ("collector thread (thread discovery; draining, unwinding and joining "
                     f"{o.samples:,} samples)" if c.mode == SAMPLED else "thread discovery")
        lines.append(f"profiler overhead: {fmt_ns(o.hook_ns)} in cpuprof's op callbacks "
                     f"({fmt_percent(o.hook_ns / c.wall_ns)} of the wall time, {o.per_op_ns:.0f} ns per op); "
                     f"{collector} {fmt_ns(o.discovery_cpu_ns)} of CPU "
                     f"({fmt_percent(o.discovery_cpu_ns / c.wall_ns)} of one CPU)")
        py = profile.sampling.python if profile.sampling is not None else None
        if py is not None and py.cpu_ns is not None:
            skipped = (f", {py.ticks_covered:,} periods not read: the ops' recorded callers gave every stack"
                       if py.ticks_covered else "")
            lines[-1] += (f"; Python stack sampler thread {fmt_ns(py.cpu_ns)} of CPU "
                          f"({fmt_percent(py.cpu_ns / c.wall_ns)} of one CPU, {py.samples:,} reads with the GIL "
                          f"held{skipped})")
    return Section("profile", "Profile", lines)


def _threads_section(profile: Profile) -> Section:
    c = profile.collection
    assert c is not None
    counted = [(h, e, help_) for h, e, help_ in COUNTS if profile.has_event(e)]
    columns = [
        Column("thread", "thread", help="the label used in the op table"),
        Column("tid", "tid", "int", align="r"),
        Column("name", "name"),
        Column("role", "role", help="dispatch: runs ATen ops; worker: did work for them (OpenMP, intra-op pool)"),
        Column("cpus", "allowed CPUs", help="the CPUs the thread may run on, read back inside the process"),
        Column("cpu", "CPU time", "ns", help="CPU time over the profile (task-clock)"),
        Column("util", "util", "share", help="CPU time / profiled wall time"),
        Column("wait", "waited", "share",
               help="time runnable but waiting for a CPU (run-queue delay, schedstat) / profiled wall time"),
    ] + [Column(e, h, "count", help=help_) for h, e, help_ in counted]
    rows = []
    threads = thread_rows(profile)
    shown, background = split_background(threads)
    for r in shown:
        row = {"thread": r.label, "tid": r.thread.tid, "name": r.thread.name, "role": r.thread.role,
               "cpus": _cpus_text(r.allowed_cpus), "cpu": r.cpu_ns, "util": r.utilisation, "wait": r.run_delay_share}
        for _, e, _ in counted:
            row[e] = r.thread.counters.get(e)
        rows.append(row)
    for kind, group in background.items():
        cpu = sum(r.cpu_ns or 0 for r in group) if all(r.cpu_ns is not None for r in group) else None
        row = {"thread": f"{group[0].label}…" if len(group) > 1 else group[0].label, "tid": None,
               "name": f"{kind} ×{len(group)}", "role": "background", "cpus": None, "cpu": cpu,
               "util": cpu / c.wall_ns if cpu is not None and c.wall_ns else None, "wait": None}
        for _, e, _ in counted:
            values = [r.thread.counters.get(e) for r in group]
            row[e] = sum(v for v in values if v is not None) if any(v is not None for v in values) else None
        rows.append(row)
    lines = []
    total_cpu = sum(r.cpu_ns or 0 for r in threads)
    if c.wall_ns:
        idle = sum(1 for t in profile.idle_threads if not t.uncounted)
        uncounted = len(profile.idle_threads) - idle
        # Without CPU time nothing says how much a thread worked (every idle thread is uncounted then).
        used = (f"using {fmt_ns(total_cpu)} of CPU in {fmt_ns(c.wall_ns)}: {total_cpu / c.wall_ns:.2f} CPUs on average"
                if profile.has_event(CPU_EVENT) else f"in {fmt_ns(c.wall_ns)}, their CPU time not counted")
        lines.append(f"{len(threads)} thread{'s' if len(threads) != 1 else ''} worked, {used}"
                     + (f"; {idle} more thread{'s' if idle != 1 else ''} did no work (not shown)" if idle else "")
                     + (f"; {uncounted} thread{'s' if uncounted != 1 else ''} could not be counted (see the notes)"
                        if uncounted else ""))
    table = Table(columns, rows)
    if background:
        count = sum(len(g) for g in background.values())
        table.legend_notes.append(
            f"background: {count} threads under {fmt_percent(BACKGROUND_UTILISATION)} of a CPU each that ran no op "
            "of their own (communication backends, message queues, tokenizer pools), one row per name: their "
            "count and their CPU together")
    return Section("threads", "Threads", lines, [table])


def _cpus_text(cpus: list[int] | None) -> str:
    if cpus is None:
        return "-"
    from ..model import format_cpulist

    return format_cpulist(cpus)


def _ops_section(profile: Profile, top: int, threads_of: Profile) -> Section:
    """``threads_of``: the whole run's profile, whose threads' CPU says which are background (``profile``
    may be a stretch of it, its threads' counters still the whole run's)."""
    c = profile.collection
    assert c is not None
    sampled = c.mode == SAMPLED
    statistical = cpu_is_statistical(profile)
    has_cpu = profile.has_event(CPU_EVENT)
    table = op_table(profile, top)
    # A column per thread the Threads table shows on its own row; the background threads it groups
    # (a vLLM worker has 40 idle gloo threads) are one column together.
    _, grouped = split_background(thread_rows(threads_of))
    background = {r.index for group in grouped.values() for r in group}
    order = [i for i in team_order(threads_of) if i not in background]
    counted = [(h, e, help_) for h, e, help_ in COUNTS if profile.has_event(e)]
    ratios = counted_ratios(profile)
    columns = [
        Column("op", "op", help="the ATen operator"),
        Column("inputs", "inputs", help="input dtypes and sizes; ᵀ marks a transposed view, * another strided layout"),
        Column("region", "region", help="the enclosing regions (cpuprof.region, record_function or nn.Module class)"),
        Column("calls", "calls", "int", help="times it ran"),
        Column("self", "self", "ns", help="wall time in the op itself, without the ops it called, summed over calls"),
        Column("share", "% self", "share", help="share of the summed self time of all ops"),
        Column("self_call", "self/call", "ns", help="self time per call"),
        Column("total", "total", "ns", help="wall time including the ops it called, summed over calls"),
    ]
    if sampled:
        hz = profile.sampling.hz if profile.sampling else defaults.SAMPLE_HZ
        columns.append(Column("samples", "samples", "int",
                              help=f"samples (of any thread) taken while it ran, each 1/{hz} s of a thread's CPU"
                                   + (f"; busy threads need {defaults.MIN_SAMPLES}" if statistical else
                                      " (its stacks and other events; its CPU comes from the threads' on-CPU "
                                      "intervals)")))
    if has_cpu:
        columns += [
            Column("cpu", "CPU", "ns", help="CPU time of all threads while it ran innermost (task-clock)"),
            Column("busy", "busy thr", "ratio",
                   help=f"CPU / self wall time: threads busy on average while it ran (at most {len(profile.threads)})"),
        ] + [Column(f"cpu_{i}", f"CPU {thread_label(i)}", "ns", help="") for i in order]
        if background:
            columns.append(Column("cpu_background", "CPU bg", "ns",
                                  help=f"CPU time of the {len(background)} background threads (see Threads) "
                                       "together while the op ran"))
    columns += [Column(e, h, "count", help=help_) for h, e, help_ in counted]
    columns += [Column(h, h, "ratio", help=help_) for h, _, _, _, help_ in ratios]
    prefix = common_region_prefix(profile)
    rows = []
    for r in table.rows:
        op = r.op
        row = {"op": op.name, "inputs": inputs_text(op), "region": region_text(op, len(prefix)), "calls": op.calls,
               "self": op.self_ns, "share": r.share, "self_call": r.self_per_call_ns, "total": op.incl_ns}
        if sampled:
            row["samples"] = op.samples
        if has_cpu:
            row["cpu"] = r.cpu_ns
            row["busy"] = r.busy_threads
            for i in order:
                row[f"cpu_{i}"] = r.cpu_per_thread[i] if i < len(r.cpu_per_thread) else None
            if background:
                values = [r.cpu_per_thread[i] for i in background if i < len(r.cpu_per_thread)]
                row["cpu_background"] = (sum(v for v in values if v is not None)
                                         if any(v is not None for v in values) else None)
        for _, e, _ in counted:
            row[e] = op.self_total(e)
        row.update(op_ratios(op, ratios))
        rows.append(row)
    legend = ["-: not measured" + (" (no sample landed in it)" if statistical else "")]
    if prefix:
        legend.append(f"regions are inside {'/'.join(prefix)}, which encloses every op that has one")
    if has_cpu:
        legend.append("per-thread CPU columns: CPU time of that thread (see Threads) while the op ran")
    caption = (f"top {len(rows)} of {table.n_keys} op keys (op, inputs, region) by self time; "
               f"{fmt_ns(table.total_self_ns)} of self time in all")
    notes = []
    if table.outside_cpu_ns is not None:
        notes.append(f"CPU time while no ATen op ran (Python, framework, workers spinning between ops): "
                     f"{fmt_ns(table.outside_cpu_ns)}")
    if table.profiler_cpu_ns:
        notes.append(f"CPU time inside cpuprof's own callbacks (and of workers spinning meanwhile), charged to no "
                     f"op: {fmt_ns(table.profiler_cpu_ns)}")
    if table.withheld_few_samples:
        notes.append(f"busy threads not shown for {table.withheld_few_samples} op key(s) with fewer than "
                     f"{defaults.MIN_SAMPLES} samples (too noisy)")
    if table.capped:
        notes.append(f"{table.capped} op key(s) had a thread's CPU a little above the op's wall time "
                     + ("(sampling noise, within three standard deviations)" if sampled else "(clock reads)")
                     + ": held to the wall time")
    if table.withheld_inconsistent:
        notes.append(f"CPU not shown for {table.withheld_inconsistent} op key(s) whose CPU exceeded what their "
                     "threads could spend in their wall time by more than measurement noise allows")
    return Section("ops", "Top ops", [], [Table(columns, rows, caption=caption, legend_notes=legend)], notes)


def _regions_section(profile: Profile) -> Section | None:
    regions = region_rows(profile)
    if not regions:
        return None
    c = profile.collection
    assert c is not None
    wall = c.wall_ns or 1
    columns = [
        Column("region", "region", help="regions nested in others are written outer/inner"),
        Column("calls", "calls", "int"),
        Column("total", "total", "ns", help="wall time inside the region, summed over calls"),
        Column("wall", "% wall", "share", help="total / profiled wall time"),
        Column("cpu", "CPU", "ns", help="CPU time of all threads inside the region"),
    ]
    rows = [{"region": "/".join([*row.region.region, row.region.name]), "calls": row.region.calls,
             "total": row.region.incl_ns, "wall": row.region.incl_ns / wall, "cpu": row.cpu_ns} for row in regions]
    notes = []
    withheld = sum(row.withheld for row in regions)
    if withheld:
        notes.append(f"CPU not shown for {withheld} region(s) whose sampled-mode estimate exceeded what their "
                     "threads could spend in their time")
    return Section("regions", "Regions", [], [Table(columns, rows, caption="by total time")], notes)
