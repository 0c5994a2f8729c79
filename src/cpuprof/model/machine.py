"""The machine as a profile records it: CPUs, cores, NUMA nodes, and the kernel's CPU-list syntax."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import groupby


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
    siblings: list[int]
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
    """The machine as sysfs describes it (see cpuprof.machine.topology for how it is read)."""

    online_cpus: list[int]
    nodes: list[Node]
    cpus: list[Cpu]
    model_name: str | None
    numa_in_sysfs: bool
    """False when /sys/devices/system/node was missing and one node 0 was assumed."""
    isa_flags: list[str] = field(default_factory=list)
    """The GEMM-relevant instruction-set extensions /proc/cpuinfo lists (avx512_bf16, amx_int8, ...)."""

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
                seen.setdefault(tuple(cpu.siblings), []).append(cpu.id)
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


@dataclass
class OpenMPRuntime:
    """An OpenMP runtime library mapped into a process."""

    runtime: str  # libgomp, libiomp5 or libomp
    path: str
    ompt: bool  # the runtime calls an OMPT tool named by OMP_TOOL_LIBRARIES (libgomp never does)


@dataclass
class OpenMPInfo:
    loaded: list[OpenMPRuntime] = field(default_factory=list)
    active: OpenMPRuntime | None = None  # the one serving omp_* calls; None when unknown
