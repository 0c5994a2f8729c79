"""``cpuprof doctor``: what this machine can measure, and why not."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from .. import capabilities


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("doctor", help="what this machine can measure, and why not")
    p.add_argument("--json", action="store_true", help="print the findings as JSON")
    p.set_defaults(run=run)


def _gb(n: int | None) -> str:
    return f"{n / 1e9:.1f} GB" if n else "?"


def render(d: dict[str, Any]) -> str:
    from ..topology import format_cpulist

    lines = ["cpuprof doctor: what this machine can measure", ""]
    cpu = d["cpu"]
    vm = f", virtual machine ({cpu['hypervisor']})" if cpu["hypervisor"] else ""
    lines.append(f"CPU       {cpu['model'] or 'unknown model'}: {cpu['logical_cpus']} logical CPUs, "
                 f"{cpu['physical_cores']} cores, {cpu['sockets']} socket(s){vm}")
    nodes = ", ".join(f"node {n['node']}: CPUs {format_cpulist(n['cpus'])}, {_gb(n['mem_total_bytes'])} "
                      f"({_gb(n['mem_free_bytes'])} free)" for n in d["numa"])
    lines.append(f"NUMA      {len(d['numa'])} node(s): {nodes}")
    who = "root: not restricted by it" if d["root"] else "not root: user-space counting only above 1"
    lines.append(f"kernel    {d['kernel']}; perf_event_paranoid {d['perf_event_paranoid']} ({who}); "
                 f"seccomp {'filter active' if d['seccomp'] == 2 else 'off'}")
    if d["hardware_pmu"]:
        lines.append(f"PMU       {d['hardware_pmu']}: hardware events available")
    else:
        lines.append("PMU       none: no core PMU is exposed"
                     + (" (a VM needs a virtual PMU)" if cpu["hypervisor"] else "")
                     + "; cycles, instructions and cache events cannot be counted, software events and "
                       "tracepoints can")
    lines.append(f"torch     {d['torch']}")
    omp = d["openmp"]
    for entry in omp["loaded"]:
        active = " (active)" if omp["active"] and omp["active"]["path"] == entry["path"] else ""
        lines.append(f"OpenMP    {entry['runtime']}{active} {entry['path']}; OMPT {entry['ompt']}")
    if not omp["loaded"]:
        lines.append("OpenMP    no OpenMP runtime is loaded by torch here")
    intel = d["intel_openmp"]
    found = f"{intel['path']}; OMPT {intel['ompt']}" if intel["path"] else "not installed (pip install intel-openmp)"
    lines.append(f"          Intel OpenMP for --omp intel: {found}")
    pt = d["ptrace"]
    lines.append(f"py-spy    {'attach allowed' if pt['ok'] else 'unavailable: ' + pt['reason']}"
                 + (f" ({pt['py_spy']})" if pt["py_spy"] else ""))
    lines.append("")
    lines.append("Events (each opened and read once on this thread)")
    lines.extend(_event_lines(d["events"]))
    return "\n".join(lines) + "\n"


# Spellings perf accepts for the same event; listed once.
ALIASES = {"cpu-cycles", "branches", "cs", "faults", "migrations"}


def _event_lines(events: list[dict[str, Any]]) -> list[str]:
    """Countable events by kind, then the rest grouped by the reason they cannot be counted."""
    lines = []
    shown = [e for e in events if e["name"] not in ALIASES]
    by_kind: dict[str, list[str]] = {}
    for e in shown:
        if e["ok"]:
            by_kind.setdefault(e["kind"], []).append(e["name"])
    for kind, names in by_kind.items():
        lines.append(f"  ok  {kind}: {', '.join(names)}")
    by_reason: dict[tuple[str, str], list[str]] = {}
    for e in shown:
        if not e["ok"]:
            by_reason.setdefault((e["errno_name"] or str(e["errno"]), e["reason"]), []).append(e["name"])
    for (err, reason), names in by_reason.items():
        listed = ", ".join(names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "")
        lines.append(f"  no  {listed}")
        lines.append(f"        {err}: {reason}")
    ok = sum(e["ok"] for e in shown)
    lines.append(f"  {ok} of {len(shown)} events can be counted (python -m cpuprof doctor --json lists each)")
    return lines


def run(args: argparse.Namespace) -> int:
    findings = capabilities.doctor()
    if args.json:
        json.dump(findings, sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(render(findings))
    return 0
