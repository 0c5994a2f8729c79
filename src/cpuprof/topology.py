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
from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import groupby
from pathlib import Path

from cpuprof.errors import CpuprofError

_CPU_DIR = "sys/devices/system/cpu"
_NODE_DIR = "sys/devices/system/node"


def parse_cpulist(text: str) -> list[int]:
    """Parse the kernel's list format ("0-3,8-11", "5", "") into sorted unique ids.

    Raises ValueError for anything else, so callers can turn it into a usage error.
    """
    ids: set[int] = set()
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        match = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if match is None:
            raise ValueError(f"not a CPU list: {text.strip()!r} (expected e.g. 0-3,8-11)")
        low = int(match.group(1))
        high = int(match.group(2)) if match.group(2) is not None else low
        if high < low:
            raise ValueError(f"not a CPU list: {text.strip()!r} (range {part} runs backwards)")
        ids.update(range(low, high + 1))
    return sorted(ids)


def format_cpulist(ids: Iterable[int]) -> str:
    """Format ids the way the kernel does: sorted, consecutive runs as "a-b"."""
    parts: list[str] = []
    # Within a run of consecutive ids, id - position is constant.
    for _, group in groupby(enumerate(sorted(set(ids))), key=lambda pair: pair[1] - pair[0]):
        run = [cpu for _, cpu in group]
        parts.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(parts)


@dataclass(frozen=True)
class Cpu:
    """One online logical CPU and where it sits."""

    id: int
    node: int
    package_id: int | None
    core_id: int | None
    siblings: tuple[int, ...]
    """Online logical CPUs sharing this CPU's physical core (itself included)."""


@dataclass(frozen=True)
class Node:
    """One NUMA node: its online CPUs, its memory, and its distance to every node."""

    id: int
    cpus: list[int]
    mem_total_bytes: int | None
    mem_free_bytes: int | None
    distances: dict[int, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Topology:
    """The machine as sysfs describes it (see the module docstring for fallbacks)."""

    online_cpus: list[int]
    nodes: list[Node]
    cpus: list[Cpu]
    model_name: str | None
    numa_in_sysfs: bool
    """False when /sys/devices/system/node was missing and one node 0 was assumed."""

    @property
    def node_ids(self) -> list[int]:
        return [node.id for node in self.nodes]

    def node(self, node_id: int) -> Node:
        """The node with this id; KeyError if the machine has none."""
        for node in self.nodes:
            if node.id == node_id:
                return node
        raise KeyError(node_id)

    def cores(self, cpus: list[int] | None = None) -> list[list[int]]:
        """Physical cores as lists of logical CPUs, restricted to ``cpus`` if given.

        A core is identified by its thread siblings (unique machine-wide, unlike
        core_id, which repeats in every package).
        """
        wanted = set(self.online_cpus if cpus is None else cpus)
        seen: dict[tuple[int, ...], list[int]] = {}
        for cpu in self.cpus:
            if cpu.id in wanted:
                seen.setdefault(cpu.siblings, []).append(cpu.id)
        return sorted(seen.values())

    @property
    def logical_cpus(self) -> int:
        return len(self.online_cpus)

    @property
    def physical_cores(self) -> int:
        return len(self.cores())

    @property
    def threads_per_core(self) -> int:
        return max((len(core) for core in self.cores()), default=1)

    @property
    def sockets(self) -> int:
        """Distinct physical packages; CPUs without package information count as one."""
        return len({cpu.package_id for cpu in self.cpus}) if self.cpus else 0

    def to_dict(self) -> dict[str, object]:
        """A JSON-ready description (distance keys become strings, as JSON requires)."""
        return {
            "model_name": self.model_name,
            "online_cpus": format_cpulist(self.online_cpus),
            "logical_cpus": self.logical_cpus,
            "physical_cores": self.physical_cores,
            "threads_per_core": self.threads_per_core,
            "sockets": self.sockets,
            "numa_in_sysfs": self.numa_in_sysfs,
            "nodes": [
                {
                    "id": node.id,
                    "cpus": format_cpulist(node.cpus),
                    "mem_total_bytes": node.mem_total_bytes,
                    "mem_free_bytes": node.mem_free_bytes,
                    "distances": {str(other): d for other, d in sorted(node.distances.items())},
                }
                for node in self.nodes
            ],
            "cpus": [
                {
                    "id": cpu.id,
                    "node": cpu.node,
                    "package_id": cpu.package_id,
                    "core_id": cpu.core_id,
                    "siblings": format_cpulist(cpu.siblings),
                }
                for cpu in self.cpus
            ],
        }


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
            cpus = [cpu for cpu in parse_cpulist(_read(path / "cpulist") or "") if cpu in online_set]
            nodes.append(
                Node(
                    id=node_id,
                    cpus=cpus,
                    mem_total_bytes=mem.get("MemTotal"),
                    mem_free_bytes=mem.get("MemFree"),
                    # The kernel prints one distance per online node, in id order.
                    distances=dict(zip(node_ids, distance_values)),
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
                siblings=tuple(siblings or [cpu_id]),
            )
        )

    return Topology(
        online_cpus=online,
        nodes=nodes,
        cpus=cpus,
        model_name=_model_name(_read(base / "proc/cpuinfo")),
        numa_in_sysfs=bool(node_ids),
    )
