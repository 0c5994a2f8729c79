"""Where decode --tp/--instances puts its ranks: NUMA nodes in order, whole cores, memory bound."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.unit.test_topology import write_two_socket_tree

from cpuprof.errors import UsageError
from cpuprof.launch.environment import LaunchSettings
from cpuprof.launch.ranks import place_ranks
from cpuprof.machine.topology import read_topology

ALL = set(range(16))


@pytest.fixture
def two_socket(tmp_path: Path):
    return read_topology(write_two_socket_tree(tmp_path))


def placed(n: int, topology, ranks_per_node: int | None = None, **settings) -> list[tuple[list[int], int | None]]:
    return [(p.cpus, p.node) for p in place_ranks(n, LaunchSettings(**settings), topology, ranks_per_node,
                                                  allowed_cpus=ALL)]


def test_one_rank_per_node_when_there_are_enough_nodes(two_socket):
    assert placed(2, two_socket) == [([0, 1, 2, 3, 8, 9, 10, 11], 0), ([4, 5, 6, 7, 12, 13, 14, 15], 1)]


def test_ranks_sharing_a_node_get_whole_cores(two_socket):
    # four ranks: two per node, each two cores with both of their hyperthreads
    assert placed(4, two_socket) == [([0, 1, 8, 9], 0), ([2, 3, 10, 11], 0), ([4, 5, 12, 13], 1),
                                     ([6, 7, 14, 15], 1)]


def test_ranks_per_node_packs_a_node_first(two_socket):
    assert placed(2, two_socket, ranks_per_node=2) == [([0, 1, 8, 9], 0), ([2, 3, 10, 11], 0)]


def test_numa_keeps_every_rank_on_that_node(two_socket):
    assert placed(2, two_socket, numa=1) == [([4, 5, 12, 13], 1), ([6, 7, 14, 15], 1)]


def test_cpus_narrow_the_share(two_socket):
    assert placed(2, two_socket, cpus=[0, 1, 4, 5]) == [([0, 1], 0), ([4, 5], 1)]


def test_more_ranks_than_cores_split_hyperthreads(two_socket):
    ranks = placed(16, two_socket)
    assert sorted(c for cpus, _ in ranks for c in cpus) == sorted(ALL)
    assert all(len(cpus) == 1 for cpus, _ in ranks)


@pytest.mark.parametrize("n, kwargs, message", [
    (4, {"ranks_per_node": 1}, "4 ranks at 1 per node need 4 NUMA nodes; 2 usable here"),
    (18, {}, "9 ranks on node 0 but it has only 8"),
    (2, {"numa": 3}, "--numa 3: this machine has NUMA node(s) 0-1"),
])
def test_impossible_placements_say_why(two_socket, n, kwargs, message):
    ranks_per_node = kwargs.pop("ranks_per_node", None)
    with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(")", r"\)")):
        placed(n, two_socket, ranks_per_node, **kwargs)


def test_one_node_machine_binds_no_memory():
    topology = read_topology()
    cpus = topology.online_cpus
    if len(cpus) < 2:
        pytest.skip("one CPU: nothing to split")
    ranks = place_ranks(2, LaunchSettings(), topology, allowed_cpus=set(cpus))
    if len(topology.node_ids) > 1:
        pytest.skip("this machine has several NUMA nodes")
    assert [r.node for r in ranks] == [None, None]
    assert set(ranks[0].cpus).isdisjoint(ranks[1].cpus)


def test_instances_start_together_and_a_missing_one_is_named(tmp_path: Path):
    """The start barrier of --instances: nobody passes before everyone is ready."""
    import threading
    import time

    from cpuprof.launch.ranks import start_barrier

    passed: list[float] = []

    def instance(rank: int, delay: float) -> None:
        time.sleep(delay)
        start_barrier(tmp_path, rank, 3, timeout_s=30)
        passed.append(time.monotonic())

    started = time.monotonic()
    threads = [threading.Thread(target=instance, args=(r, 0.3 * r)) for r in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(passed) == 3 and min(passed) - started >= 0.6  # the last came at 0.6 s; none went before
    alone = tmp_path / "alone"
    alone.mkdir()
    with pytest.raises(TimeoutError, match=r"instance\(s\) 1, 2 not ready after 0.2 s"):
        start_barrier(alone, 0, 3, timeout_s=0.2)
