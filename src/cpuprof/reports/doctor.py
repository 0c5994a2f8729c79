"""``doctor``'s findings as text: what this machine can measure, and why not."""

from __future__ import annotations

import json
from typing import TextIO

from ..machine.capabilities import DoctorFindings, EventStatus
from ..model import format_cpulist
from ..model.codec import to_json
from ..units import fmt_bytes

# Spellings perf accepts for the same event; listed once.
ALIASES = {"cpu-cycles", "branches", "cs", "faults", "migrations"}


def render_json(findings: DoctorFindings, out: TextIO) -> None:
    json.dump(to_json(findings), out, indent=1)
    out.write("\n")


def render_terminal(d: DoctorFindings, out: TextIO) -> None:
    lines = ["cpuprof doctor: what this machine can measure", ""]
    cpu = d.cpu
    vm = f", virtual machine ({cpu.hypervisor})" if cpu.hypervisor else ""
    lines.append(f"CPU       {cpu.model or 'unknown model'}: {cpu.logical_cpus} logical CPUs, "
                 f"{cpu.physical_cores} cores, {cpu.sockets} socket(s){vm}")
    nodes = ", ".join(f"node {n.node}: CPUs {format_cpulist(n.cpus)}, {_gb(n.mem_total_bytes)} "
                      f"({_gb(n.mem_free_bytes)} free)" for n in d.numa)
    lines.append(f"NUMA      {len(d.numa)} node(s): {nodes}")
    who = "root: not restricted by it" if d.root else "not root: user-space counting only above 1"
    lines.append(f"kernel    {d.kernel}; perf_event_paranoid {d.perf_event_paranoid} ({who}); "
                 f"seccomp {'filter active' if d.seccomp == 2 else 'off'}")
    if d.hardware_pmu:
        lines.append(f"PMU       {d.hardware_pmu}: hardware events available")
    else:
        vm_hint = " (a VM needs a virtual PMU)" if cpu.hypervisor else ""
        lines.append(f"PMU       none: no core PMU is exposed{vm_hint}"
                     + "; cycles, instructions and cache events cannot be counted, software events and "
                       "tracepoints can")
    lines.append(f"torch     {d.torch}")
    for entry in d.openmp.loaded:
        active = " (active)" if d.openmp.active and d.openmp.active.path == entry.path else ""
        ompt = "accepts an OMPT tool" if entry.ompt else "no OMPT (libgomp never calls an OMPT tool)"
        lines.append(f"OpenMP    {entry.runtime}{active} {entry.path}; {ompt}")
    if not d.openmp.loaded:
        lines.append("OpenMP    no OpenMP runtime is loaded by torch here")
    found = d.intel_openmp or f"not installed ({d.intel_openmp_hint})"
    lines.append(f"          Intel OpenMP (libiomp5) for --omp intel: {found}")
    pt = d.ptrace
    lines.append(f"py-spy    {'attach allowed' if pt.ok else 'unavailable: ' + pt.reason}"
                 + (f" ({pt.py_spy})" if pt.py_spy else ""))
    lines.append("")
    lines.append("Events (each opened and read once on this thread)")
    lines.extend(_event_lines(d.events))
    out.write("\n".join(lines) + "\n")


def _gb(n: int | None) -> str:
    return fmt_bytes(n) if n else "?"


def _event_lines(events: list[EventStatus]) -> list[str]:
    """Countable events by kind, then the rest grouped by the reason they cannot be counted."""
    lines = []
    shown = [e for e in events if e.name not in ALIASES]
    by_kind: dict[str, list[str]] = {}
    for e in shown:
        if e.ok:
            by_kind.setdefault(e.kind, []).append(e.name)
    for kind, names in by_kind.items():
        lines.append(f"  ok  {kind}: {', '.join(names)}")
    by_reason: dict[tuple[str, str], list[str]] = {}
    for e in shown:
        if not e.ok:
            by_reason.setdefault((e.errno_name or str(e.errno), e.reason), []).append(e.name)
    for (err, reason), names in by_reason.items():
        listed = ", ".join(names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "")
        lines.append(f"  no  {listed}")
        lines.append(f"        {err}: {reason}")
    ok = sum(e.ok for e in shown)
    lines.append(f"  {ok} of {len(shown)} events can be counted (python -m cpuprof doctor --json lists each)")
    return lines
