"""What this machine lets cpuprof measure, and why not where it cannot.

Shared by ``doctor`` (which prints all of it) and every profile (which records the part that
qualifies its numbers), so a saved profile says, for instance, that there was no PMU.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Any

# PMU device names under /sys/bus/event_source/devices that mean "this CPU's core counters".
CORE_PMU_NAMES = ("cpu", "cpu_core", "cpu_atom", "armv8_pmuv3", "armv8_pmuv3_0", "arm_cortex_a", "riscv-pmu")

def _read(path: str | Path) -> str | None:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None


def perf_event_paranoid() -> int | None:
    text = _read("/proc/sys/kernel/perf_event_paranoid")
    return int(text) if text and text.lstrip("-").isdigit() else None


def pmu_devices(sysfs_root: str = "/sys") -> list[str]:
    try:
        return sorted(os.listdir(f"{sysfs_root}/bus/event_source/devices"))
    except OSError:
        return []


def hardware_pmu(sysfs_root: str = "/sys") -> str | None:
    """The core PMU's device name, or None when the CPU (or the hypervisor) exposes none."""
    for device in pmu_devices(sysfs_root):
        if device in CORE_PMU_NAMES or device.startswith("armv8_") or device.startswith("armv9_"):
            return device
    return None


def openmp_runtimes() -> dict[str, Any]:
    """OpenMP runtimes mapped into this process, the active one, and whether it has OMPT."""
    from .in_force import openmp_in_process

    found = openmp_in_process()
    for entry in found["loaded"]:
        entry["ompt"] = ompt_support(entry["runtime"])
    return found


def ompt_support(runtime: str) -> str:
    if "GNU" in runtime or "gomp" in runtime:
        return "no: libgomp never calls an OMPT tool (use --omp intel for OpenMP thread statistics)"
    return "yes: the runtime loads a tool named by OMP_TOOL_LIBRARIES"


def intel_openmp_library() -> str | None:
    for directory in (Path(sys.prefix) / "lib", Path(sys.base_prefix) / "lib"):
        candidate = directory / "libiomp5.so"
        if candidate.exists():
            return str(candidate)
    return None


def seccomp_mode() -> int:
    for line in (_read("/proc/self/status") or "").splitlines():
        if line.startswith("Seccomp:"):
            return int(line.split()[1])
    return 0


def ptrace_status() -> dict[str, Any]:
    """Whether py-spy can attach to a child process here, and why not."""
    scope_text = _read("/proc/sys/kernel/yama/ptrace_scope")
    scope = int(scope_text) if scope_text and scope_text.isdigit() else None
    root = os.geteuid() == 0
    py_spy = shutil.which("py-spy")
    if py_spy is None:
        ok, reason = False, "py-spy is not installed (pip install py-spy)"
    elif scope == 3:
        ok, reason = False, "kernel.yama.ptrace_scope is 3: ptrace is disabled for everyone"
    elif scope in (1, 2) and not root:
        ok, reason = False, f"kernel.yama.ptrace_scope is {scope}: attaching needs root or CAP_SYS_PTRACE"
    elif seccomp_mode() == 2 and not root:
        ok, reason = False, "a seccomp filter may block ptrace (container)"
    else:
        ok, reason = True, ""
    return {"ok": ok, "reason": reason, "ptrace_scope": scope, "root": root, "py_spy": py_spy}


def collection_capabilities() -> dict[str, Any]:
    """The facts that qualify a profile's numbers, recorded in every profile."""
    pmu = hardware_pmu()
    return {
        "hardware_pmu": pmu,
        "hardware_pmu_reason": None if pmu else "no core PMU in /sys/bus/event_source/devices "
                                                 "(a VM without a virtual PMU, or an unsupported CPU)",
        "perf_event_paranoid": perf_event_paranoid(),
        "openmp": openmp_runtimes(),
        "cpus_online": os.cpu_count(),
    }


# Events doctor probes beyond the generic list: the tracepoints cpuprof's presets use.
DOCTOR_TRACEPOINTS = (
    "sched:sched_switch", "sched:sched_migrate_task", "sched:sched_wakeup",
    "syscalls:sys_enter_futex", "lock:contention_begin",
)


def hypervisor() -> str | None:
    cpuinfo = _read("/proc/cpuinfo") or ""
    if " hypervisor" not in cpuinfo:
        return None
    vendor = _read("/sys/class/dmi/id/sys_vendor") or ""
    product = _read("/sys/class/dmi/id/product_name") or ""
    return " ".join(part for part in (vendor, product) if part) or "unknown hypervisor"


def doctor(sysfs_root: str = "/sys") -> dict[str, Any]:
    """Everything cpuprof can and cannot measure here, with a reason for each 'cannot'."""
    from . import native
    from .topology import read_topology

    nat = native.load()
    events = [nat.probe_event(name) for name in nat.generic_event_names()]
    events += [nat.probe_event(name) for name in DOCTOR_TRACEPOINTS]
    for device in pmu_devices(sysfs_root):
        events_dir = Path(sysfs_root) / "bus/event_source/devices" / device / "events"
        if events_dir.is_dir():
            events += [nat.probe_event(f"{device}/{alias.name}/") for alias in sorted(events_dir.iterdir())
                       if "." not in alias.name]
    topo = read_topology()
    pmu = hardware_pmu(sysfs_root)
    paranoid = perf_event_paranoid()
    intel = intel_openmp_library()
    import torch

    return {
        "cpu": {
            "model": topo.model_name, "logical_cpus": topo.logical_cpus, "physical_cores": topo.physical_cores,
            "sockets": topo.sockets, "online": [c for c in topo.online_cpus], "hypervisor": hypervisor(),
        },
        "numa": [{"node": n.id, "cpus": n.cpus, "mem_total_bytes": n.mem_total_bytes,
                  "mem_free_bytes": n.mem_free_bytes} for n in topo.nodes],
        "kernel": os.uname().release,
        "perf_event_paranoid": paranoid,
        "root": os.geteuid() == 0,
        "seccomp": seccomp_mode(),
        "hardware_pmu": pmu,
        "pmu_devices": pmu_devices(sysfs_root),
        "events": events,
        "torch": torch.__version__,
        "openmp": openmp_runtimes(),
        "intel_openmp": {"path": intel, "ompt": ompt_support("libiomp5") if intel else None},
        "ptrace": ptrace_status(),
    }
