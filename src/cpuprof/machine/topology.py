"""CPU and NUMA topology, read from sysfs and procfs under a configurable root.

Everything is read from files (never from libnuma or lscpu) and relative to
``root``, so tests and bug reports can use a recorded copy of another machine's
``/sys`` and ``/proc``. Missing pieces degrade instead of failing: a kernel
without NUMA support has no ``/sys/devices/system/node`` and is treated as one
node 0 holding every online CPU; a CPU without ``topology/`` files counts as its
own core; an unknown CPU model is ``None``.
"""

from __future__ import annotations

import re
from pathlib import Path

from ..errors import CpuprofError
from ..model.machine import Cpu, Node, Topology, format_cpulist, parse_cpulist

__all__ = ["Cpu", "Node", "Topology", "format_cpulist", "parse_cpulist", "read_topology"]

_CPU_DIR = "sys/devices/system/cpu"
_NODE_DIR = "sys/devices/system/node"


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except (FileNotFoundError, NotADirectoryError, PermissionError):
        return None


def _read_int(path: Path) -> int | None:
    text = _read(path)
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def _numbered_dirs(parent: Path, prefix: str) -> list[int]:
    if not parent.is_dir():
        return []
    pattern = re.compile(re.escape(prefix) + r"(\d+)")
    return sorted(
        int(match.group(1))
        for entry in parent.iterdir()
        if (match := pattern.fullmatch(entry.name)) and entry.is_dir()
    )


def _online_cpus(cpu_dir: Path) -> list[int]:
    text = _read(cpu_dir / "online")
    if text is not None:
        return parse_cpulist(text)
    # Without the summary file, a CPU is online unless its own "online" says 0
    # (cpu0 often has no such file because it cannot be taken offline).
    return [cpu for cpu in _numbered_dirs(cpu_dir, "cpu") if _read_int(cpu_dir / f"cpu{cpu}" / "online") != 0]


def _meminfo(text: str | None) -> dict[str, int]:
    """Parse /proc/meminfo or node*/meminfo lines ("[Node 0 ]MemTotal:  65536 kB") into bytes."""
    values: dict[str, int] = {}
    for line in (text or "").splitlines():
        match = re.match(r"(?:Node\s+\d+\s+)?(\w+):\s+(\d+)(\s+kB)?", line)
        if match:
            values[match.group(1)] = int(match.group(2)) * (1024 if match.group(3) else 1)
    return values


# The instruction-set extensions matrix kernels choose between (x86's /proc/cpuinfo "flags", arm64's
# "Features"): what a GEMM's kernel could have used, beside what its samples say it did use.
GEMM_ISA_FLAGS = ("sse4_2", "avx", "avx2", "fma", "avx_vnni", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16",
                  "avx512_fp16", "amx_tile", "amx_int8", "amx_bf16", "amx_fp16", "asimd", "asimddp", "i8mm", "bf16",
                  "sve", "sve2", "sme")


def _isa_flags(cpuinfo: str | None) -> list[str]:
    """The GEMM-relevant extensions of the first CPU /proc/cpuinfo lists, in GEMM_ISA_FLAGS' order."""
    for line in (cpuinfo or "").splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() in ("flags", "Features"):
            present = set(value.split())
            return [flag for flag in GEMM_ISA_FLAGS if flag in present]
    return []


def _model_name(cpuinfo: str | None) -> str | None:
    """The CPU model from /proc/cpuinfo; the field is named differently per architecture."""
    fields: dict[str, str] = {}
    for line in (cpuinfo or "").splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() not in fields:
            fields[key.strip()] = value.strip()
    for key in ("model name", "Model Name", "cpu model", "Processor", "cpu"):
        if fields.get(key):
            return fields[key]
    if "CPU implementer" in fields:  # arm64 lists only numeric ids
        return f"ARM implementer {fields['CPU implementer']} part {fields.get('CPU part', '?')}"
    return None


def read_topology(root: str | Path = "/") -> Topology:
    """Read the topology of the machine whose /sys and /proc are under ``root``."""
    base = Path(root)
    cpu_dir = base / _CPU_DIR
    node_dir = base / _NODE_DIR
    online = _online_cpus(cpu_dir)
    if not online:
        raise CpuprofError(f"no online CPUs found under {cpu_dir}")
    online_set = set(online)

    node_ids = _numbered_dirs(node_dir, "node")
    nodes: list[Node] = []
    if node_ids:
        for node_id in node_ids:
            path = node_dir / f"node{node_id}"
            mem = _meminfo(_read(path / "meminfo"))
            distance_values = [int(d) for d in (_read(path / "distance") or "").split()]
            node_cpus = [cpu for cpu in parse_cpulist(_read(path / "cpulist") or "") if cpu in online_set]
            nodes.append(
                Node(
                    id=node_id,
                    cpus=node_cpus,
                    mem_total_bytes=mem.get("MemTotal"),
                    mem_free_bytes=mem.get("MemFree"),
                    # The kernel prints one distance per online node, in id order.
                    distances=dict(zip(node_ids, distance_values, strict=False)),
                )
            )
    else:
        mem = _meminfo(_read(base / "proc/meminfo"))
        nodes.append(Node(0, list(online), mem.get("MemTotal"), mem.get("MemFree"), {0: 10}))

    node_of = {cpu: node.id for node in nodes for cpu in node.cpus}
    cpus: list[Cpu] = []
    for cpu_id in online:
        topo = cpu_dir / f"cpu{cpu_id}" / "topology"
        siblings_text = _read(topo / "thread_siblings_list")
        siblings = [s for s in parse_cpulist(siblings_text) if s in online_set] if siblings_text else []
        cpus.append(
            Cpu(
                id=cpu_id,
                node=node_of.get(cpu_id, nodes[0].id),
                package_id=_read_int(topo / "physical_package_id"),
                core_id=_read_int(topo / "core_id"),
                siblings=list(siblings or [cpu_id]),
            )
        )

    return Topology(
        online_cpus=online,
        nodes=nodes,
        cpus=cpus,
        model_name=_model_name(cpuinfo := _read(base / "proc/cpuinfo")),
        numa_in_sysfs=bool(node_ids),
        isa_flags=_isa_flags(cpuinfo),
    )
