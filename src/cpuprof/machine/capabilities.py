"""What this machine lets cpuprof measure, and why not where it cannot.

Shared by ``doctor`` (which reports all of it) and every profile (which records the part that
qualifies its numbers), so a saved profile says, for instance, that there was no PMU.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from ..model import Capabilities, OpenMPInfo
from .openmp import INTEL_OPENMP_HINT, find_intel_openmp, openmp_in_process
from .topology import read_topology

# PMU device names under /sys/bus/event_source/devices that mean "this CPU's core counters".
CORE_PMU_NAMES = ("cpu", "cpu_core", "cpu_atom", "armv8_pmuv3", "armv8_pmuv3_0", "arm_cortex_a", "riscv-pmu")

# Events doctor probes beyond the generic list: the tracepoints cpuprof's presets use.
DOCTOR_TRACEPOINTS = (
    "sched:sched_switch", "sched:sched_migrate_task", "sched:sched_wakeup",
    "syscalls:sys_enter_futex", "lock:contention_begin",
)


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


def seccomp_mode() -> int:
    for line in (_read("/proc/self/status") or "").splitlines():
        if line.startswith("Seccomp:"):
            return int(line.split()[1])
    return 0


def hypervisor() -> str | None:
    cpuinfo = _read("/proc/cpuinfo") or ""
    if " hypervisor" not in cpuinfo:
        return None
    vendor = _read("/sys/class/dmi/id/sys_vendor") or ""
    product = _read("/sys/class/dmi/id/product_name") or ""
    return " ".join(part for part in (vendor, product) if part) or "unknown hypervisor"


@dataclass
class PtraceStatus:
    ok: bool
    reason: str
    ptrace_scope: int | None
    root: bool
    py_spy: str | None


def ptrace_status() -> PtraceStatus:
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
    return PtraceStatus(ok=ok, reason=reason, ptrace_scope=scope, root=root, py_spy=py_spy)


def collection_capabilities() -> Capabilities:
    """The facts that qualify a profile's numbers, recorded in every profile."""
    pmu = hardware_pmu()
    return Capabilities(
        hardware_pmu=pmu,
        hardware_pmu_reason=None if pmu else ("no core PMU in /sys/bus/event_source/devices "
                                              "(a VM without a virtual PMU, or an unsupported CPU)"),
        perf_event_paranoid=perf_event_paranoid(),
        openmp=openmp_in_process(),
        cpus_online=os.cpu_count(),
    )


@dataclass
class EventStatus:
    name: str
    ok: bool
    kind: str
    errno: int
    errno_name: str
    reason: str


@dataclass
class CpuFacts:
    model: str | None
    logical_cpus: int
    physical_cores: int
    sockets: int
    online: list[int]
    hypervisor: str | None


@dataclass
class NodeFacts:
    node: int
    cpus: list[int]
    mem_total_bytes: int | None
    mem_free_bytes: int | None


@dataclass
class DoctorFindings:
    """Everything cpuprof can and cannot measure here, with a reason for each 'cannot'."""

    cpu: CpuFacts
    numa: list[NodeFacts]
    kernel: str
    perf_event_paranoid: int | None
    root: bool
    seccomp: int
    hardware_pmu: str | None
    pmu_devices: list[str]
    torch: str
    openmp: OpenMPInfo
    intel_openmp: str | None  # where --omp intel finds libiomp5; None: not installed
    intel_openmp_hint: str
    ptrace: PtraceStatus
    events: list[EventStatus] = field(default_factory=list)


def doctor(sysfs_root: str = "/sys") -> DoctorFindings:
    from .. import native

    nat = native.load()
    names = list(nat.generic_event_names()) + list(DOCTOR_TRACEPOINTS)
    for device in pmu_devices(sysfs_root):
        events_dir = Path(sysfs_root) / "bus/event_source/devices" / device / "events"
        if events_dir.is_dir():
            names += [f"{device}/{alias.name}/" for alias in sorted(events_dir.iterdir()) if "." not in alias.name]
    events = []
    for name in names:
        p = nat.probe_event(name)
        kind = "unknown" if p.kind is None else native.kind_name(p.kind)  # None: the name is no event
        events.append(EventStatus(name=p.name, ok=p.ok, kind=kind, errno=p.errno, errno_name=p.errno_name,
                                  reason=p.reason))
    topo = read_topology()
    intel = find_intel_openmp()
    import torch

    return DoctorFindings(
        cpu=CpuFacts(model=topo.model_name, logical_cpus=topo.logical_cpus, physical_cores=topo.physical_cores,
                     sockets=topo.sockets, online=list(topo.online_cpus), hypervisor=hypervisor()),
        numa=[NodeFacts(node=n.id, cpus=n.cpus, mem_total_bytes=n.mem_total_bytes, mem_free_bytes=n.mem_free_bytes)
              for n in topo.nodes],
        kernel=os.uname().release,
        perf_event_paranoid=perf_event_paranoid(),
        root=os.geteuid() == 0,
        seccomp=seccomp_mode(),
        hardware_pmu=hardware_pmu(sysfs_root),
        pmu_devices=pmu_devices(sysfs_root),
        torch=torch.__version__,
        openmp=openmp_in_process(),
        intel_openmp=str(intel) if intel else None,
        intel_openmp_hint=INTEL_OPENMP_HINT,
        ptrace=ptrace_status(),
        events=events,
    )
