"""Topology from sysfs: a recorded two-socket tree, the no-NUMA fallback, and this machine."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from cpuprof.errors import CpuprofError
from cpuprof.machine.topology import Topology, format_cpulist, parse_cpulist, read_topology
from cpuprof.model.codec import from_json, to_json

GIB_KB = 64 * 1024 * 1024  # 64 GiB in kB


def write_two_socket_tree(root: Path) -> Path:
    """2 sockets = 2 nodes, 4 cores x 2 threads each, numbered like Intel servers:
    node 0 holds CPUs 0-3 and their siblings 8-11, node 1 holds 4-7 and 12-15."""
    cpu_dir = root / "sys/devices/system/cpu"
    cpu_dir.mkdir(parents=True)
    (cpu_dir / "online").write_text("0-15\n")
    for cpu in range(16):
        first = cpu % 8
        topo = cpu_dir / f"cpu{cpu}" / "topology"
        topo.mkdir(parents=True)
        (topo / "core_id").write_text(f"{first % 4}\n")
        (topo / "physical_package_id").write_text(f"{first // 4}\n")
        (topo / "thread_siblings_list").write_text(f"{first},{first + 8}\n")
    node_dir = root / "sys/devices/system/node"
    for node, (cpulist, distance) in enumerate([("0-3,8-11", "10 21"), ("4-7,12-15", "21 10")]):
        path = node_dir / f"node{node}"
        path.mkdir(parents=True)
        (path / "cpulist").write_text(cpulist + "\n")
        (path / "distance").write_text(distance + "\n")
        (path / "meminfo").write_text(
            f"Node {node} MemTotal:       {GIB_KB} kB\n"
            f"Node {node} MemFree:        {GIB_KB // 2} kB\n"
            f"Node {node} MemUsed:        {GIB_KB // 2} kB\n"
            f"Node {node} HugePages_Total:     0\n"
        )
    (node_dir / "online").write_text("0-1\n")
    (root / "proc").mkdir()
    (root / "proc/cpuinfo").write_text(
        "processor\t: 0\nvendor_id\t: GenuineIntel\ncpu family\t: 6\n"
        "model name\t: Fake Xeon 8480\ncpu MHz\t\t: 2000.000\n\n"
    )
    (root / "proc/meminfo").write_text(f"MemTotal:       {2 * GIB_KB} kB\nMemFree:        {GIB_KB} kB\n")
    return root


@pytest.fixture
def two_socket(tmp_path: Path) -> Path:
    return write_two_socket_tree(tmp_path)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0-3,8-11", [0, 1, 2, 3, 8, 9, 10, 11]),
        ("5", [5]),
        ("", []),
        ("0-1\n", [0, 1]),
        (" 4-5 , 2 ", [2, 4, 5]),
        ("3,3,1-3", [1, 2, 3]),
    ],
)
def test_parse_cpulist(text: str, expected: list[int]) -> None:
    assert parse_cpulist(text) == expected


@pytest.mark.parametrize("text", ["a", "1-", "-1", "3-1", "0-3;5", "1.5"])
def test_parse_cpulist_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        parse_cpulist(text)


@pytest.mark.parametrize(
    ("ids", "expected"),
    [
        ([0, 1, 2, 3, 8, 9, 10, 11], "0-3,8-11"),
        ([0, 2], "0,2"),
        ([], ""),
        ([3, 1, 2, 2, 7], "1-3,7"),
        ([0, 1], "0-1"),
    ],
)
def test_format_cpulist(ids: list[int], expected: str) -> None:
    assert format_cpulist(ids) == expected
    assert parse_cpulist(expected) == sorted(set(ids))


def test_two_socket_tree(two_socket: Path) -> None:
    topo = read_topology(two_socket)
    assert topo.online_cpus == list(range(16))
    assert topo.node_ids == [0, 1]
    assert topo.numa_in_sysfs
    node0, node1 = topo.nodes
    assert node0.cpus == [0, 1, 2, 3, 8, 9, 10, 11]
    assert node1.cpus == [4, 5, 6, 7, 12, 13, 14, 15]
    assert node0.mem_total_bytes == 64 * 2**30
    assert node0.mem_free_bytes == 32 * 2**30
    assert node0.distances == {0: 10, 1: 21}
    assert node1.distances == {0: 21, 1: 10}
    assert topo.model_name == "Fake Xeon 8480"
    assert (topo.logical_cpus, topo.physical_cores, topo.threads_per_core, topo.sockets) == (16, 8, 2, 2)
    assert topo.cores(node0.cpus) == [[0, 8], [1, 9], [2, 10], [3, 11]]
    assert topo.cores([1, 9, 4]) == [[1, 9], [4]]
    cpu9 = topo.cpus[9]
    assert (cpu9.node, cpu9.package_id, cpu9.core_id, cpu9.siblings) == (0, 0, 1, [1, 9])
    assert topo.cpus[12].package_id == 1
    assert topo.node(1) is node1
    with pytest.raises(KeyError):
        topo.node(7)


def test_topology_round_trips_through_the_profile_codec(two_socket: Path) -> None:
    topo = read_topology(two_socket)
    data = json.loads(json.dumps(to_json(topo)))
    assert data["online_cpus"] == list(range(16))
    assert data["nodes"][1] == {
        "id": 1,
        "cpus": [4, 5, 6, 7, 12, 13, 14, 15],
        "mem_total_bytes": 64 * 2**30,
        "mem_free_bytes": 32 * 2**30,
        "distances": {"0": 21, "1": 10},
    }
    assert data["cpus"][0]["siblings"] == [0, 8]
    back = from_json(Topology, data)
    assert back == topo and back.physical_cores == 8 and back.node(1).distances == {0: 21, 1: 10}


def test_offline_cpu_leaves_nodes_and_siblings(two_socket: Path) -> None:
    (two_socket / "sys/devices/system/cpu/online").write_text("0-14\n")
    topo = read_topology(two_socket)
    assert 15 not in topo.node(1).cpus
    assert topo.cpus[7].siblings == [7]
    assert topo.physical_cores == 8


def test_no_node_directory_is_one_node(two_socket: Path) -> None:
    shutil.rmtree(two_socket / "sys/devices/system/node")
    topo = read_topology(two_socket)
    assert not topo.numa_in_sysfs
    assert topo.node_ids == [0]
    assert topo.nodes[0].cpus == list(range(16))
    assert topo.nodes[0].mem_total_bytes == 128 * 2**30  # from proc/meminfo
    assert topo.nodes[0].distances == {0: 10}
    assert {cpu.node for cpu in topo.cpus} == {0}


def test_missing_details_degrade(tmp_path: Path) -> None:
    """No online summary, no topology dirs, no cpuinfo: still a usable answer."""
    cpu_dir = tmp_path / "sys/devices/system/cpu"
    for cpu in range(3):
        (cpu_dir / f"cpu{cpu}").mkdir(parents=True)
    (cpu_dir / "cpu2" / "online").write_text("0\n")
    (cpu_dir / "cpufreq").mkdir()
    topo = read_topology(tmp_path)
    assert topo.online_cpus == [0, 1]
    assert topo.model_name is None
    assert (topo.physical_cores, topo.threads_per_core, topo.sockets) == (2, 1, 1)
    assert topo.nodes[0].mem_total_bytes is None


def test_arm_cpuinfo_names_the_part(two_socket: Path) -> None:
    (two_socket / "proc/cpuinfo").write_text("processor\t: 0\nCPU implementer\t: 0x41\nCPU part\t: 0xd0c\n")
    assert read_topology(two_socket).model_name == "ARM implementer 0x41 part 0xd0c"


def test_no_cpus_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(CpuprofError, match="no online CPUs"):
        read_topology(tmp_path)


def test_this_machine() -> None:
    topo = read_topology()
    assert topo.online_cpus
    assert set(os.sched_getaffinity(0)) <= set(topo.online_cpus)
    assert 1 <= topo.physical_cores <= topo.logical_cpus == len(topo.online_cpus)
    assert topo.sockets >= 1
    # Every online CPU sits in exactly one node.
    assert sorted(cpu for node in topo.nodes for cpu in node.cpus) == topo.online_cpus
    json.dumps(to_json(topo))
