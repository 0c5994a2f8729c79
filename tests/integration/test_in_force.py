"""Launch real children the way `cpuprof decode` does and read back what is in force."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import cpuprof
from cpuprof.launch.environment import LaunchSettings, ResolvedLaunch, validate
from cpuprof.launch.in_force import compare, parse_task_stat, read_in_force
from cpuprof.machine import numa
from cpuprof.machine.topology import read_topology
from cpuprof.model import (
    AllocatorInfo,
    InForce,
    MemPolicy,
    OpenMPInfo,
    OpenMPRuntime,
    Requested,
    ThreadPlacement,
    WeightPages,
)
from cpuprof.model.codec import from_json, to_json

SRC = str(Path(cpuprof.__path__[0]).parent)

CHILD = """
import json, torch
from cpuprof.launch.in_force import read_in_force
from cpuprof.model.codec import to_json
weight = torch.randn(1024, 1024)
for _ in range(3):
    torch.mm(weight, weight)  # starts the OpenMP worker threads
print(json.dumps(to_json(read_in_force([weight, weight.t()]))))
"""


def launch(
    settings: LaunchSettings, extra_env: dict[str, str] | None = None, pin: bool = True
) -> tuple[ResolvedLaunch, InForce]:
    """Run CHILD under ``settings``; ``pin=False`` skips the pre-exec hook (a mis-configuration)."""
    resolved = validate(settings, read_topology())
    env = resolved.child_env()
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [SRC, env.get("PYTHONPATH")]))
    env.update(extra_env or {})
    result = subprocess.run(
        [sys.executable, "-c", CHILD],
        env=env,
        preexec_fn=resolved.preexec() if pin else None,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return resolved, from_json(InForce, json.loads(result.stdout))


def pinned(omp: str) -> LaunchSettings:
    # Two threads on one CPU, so there is an OpenMP worker whose affinity to check.
    return LaunchSettings(threads=2, numa=0, cpus=[0], omp=omp, oversubscribe=True)


@pytest.mark.parametrize(("omp", "runtime"), [("gnu", "libgomp"), ("intel", "libiomp5")])
def test_child_runs_as_requested(omp: str, runtime: str) -> None:
    resolved, state = launch(pinned(omp))
    threads = state.threads
    assert len(threads) >= 2  # the main thread and at least one OpenMP worker
    assert all(thread.affinity == [0] for thread in threads), threads
    assert all(thread.last_cpu == 0 for thread in threads)
    assert state.mempolicy == MemPolicy(mode="bind", nodes=[0])
    assert state.openmp.active.runtime == runtime
    assert state.openmp.active.ompt == (omp == "intel")
    loaded = {entry.runtime for entry in state.openmp.loaded}
    # torch's libgomp stays mapped under the Intel runtime (it is a dependency), but interposed.
    assert loaded == ({"libgomp"} if omp == "gnu" else {"libgomp", "libiomp5"})
    if omp == "intel":
        assert state.openmp.active.path == resolved.omp_library
    assert state.torch.num_threads == 2
    assert state.env["OMP_NUM_THREADS"] == "2"
    pages = state.weight_pages
    assert pages.pages_total >= 1024 * 1024 * 4 // pages.page_size  # the transpose shares the storage
    assert set(pages.nodes) == {0}
    assert compare(resolved.requested(), state) == []


def test_misconfigured_child_is_reported() -> None:
    """Thread count overridden, Intel runtime not preloaded, no pinning or binding."""
    # torch sizes its OpenMP pool from MKL_NUM_THREADS when that is set, so override both.
    overrides = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "LD_PRELOAD": ""}
    resolved, state = launch(pinned("intel"), extra_env=overrides, pin=False)
    warnings = compare(resolved.requested(), state)
    assert "threads: asked 2 but torch uses 1" in warnings
    assert "OMP_NUM_THREADS: asked 2 but the process has 1" in warnings
    assert "MKL_NUM_THREADS: the launch leaves it unset but the process has 1" in warnings
    expected_openmp = "OpenMP: asked intel (libiomp5) but OpenMP calls go to libgomp"
    assert any(w.startswith(expected_openmp) for w in warnings)
    assert "memory policy: asked bind to node(s) 0 but it is default" in warnings
    if len(os.sched_getaffinity(0)) > 1:
        affinity = [w for w in warnings if w.startswith("affinity: thread(s) ")]
        assert affinity and affinity[0].endswith("outside the requested 0")
    assert all("\n" not in w for w in warnings)


# --- reading in this process ----------------------------------------------------


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("42 (python) S 1 " + "0 " * 34 + "3 0 0", ("python", "S", 3)),
        ("7 (a) (b c)) R 1 " + "0 " * 34 + "11 0", ("a) (b c)", "R", 11)),
    ],
)
def test_parse_task_stat(line: str, expected: tuple[str, str, int]) -> None:
    assert parse_task_stat(line) == expected


def test_read_in_force_here() -> None:
    state = read_in_force()
    assert state.pid == os.getpid()
    main = next(t for t in state.threads if t.tid == os.getpid())
    assert main.affinity == sorted(os.sched_getaffinity(0))
    assert main.state == "R"
    assert state.weight_pages is None
    assert from_json(InForce, json.loads(json.dumps(to_json(state)))) == state


def test_page_nodes_samples_and_counts_untouched_pages() -> None:
    page = os.sysconf("SC_PAGE_SIZE")
    touched = np.ones(1000 * page // 8)
    counts = numa.page_nodes(touched.ctypes.data, touched.nbytes, max_pages=100)
    assert counts.pages_queried == 100
    assert counts.pages_total in (1000, 1001)  # 1001 when the buffer is not page aligned
    assert sum(counts.nodes.values()) == 100
    assert counts.scale == counts.pages_total / 100

    untouched = np.empty(64 * 1024 * 1024 // 8)  # large enough for its own fresh mmap
    counts = numa.page_nodes(untouched.ctypes.data, untouched.nbytes)
    assert counts.not_present > 0.9 * counts.pages_queried


def test_overlapping_regions_are_counted_once() -> None:
    buffer = np.ones(100 * os.sysconf("SC_PAGE_SIZE") // 8)
    whole = numa.page_nodes(buffer.ctypes.data, buffer.nbytes)
    merged = numa.regions_page_nodes([(buffer.ctypes.data, buffer.nbytes), (buffer.ctypes.data + 8, 64)])
    assert merged.pages_total == whole.pages_total


def test_set_mempolicy_error_names_the_call() -> None:
    with pytest.raises(OSError) as exc:
        numa.set_mempolicy(numa.MPOL_BIND, [1023])
    assert exc.value.errno is not None
    assert "set_mempolicy(bind, nodes [1023])" in str(exc.value)
    assert numa.get_mempolicy() == ("default", [])


# --- compare on hand-made states --------------------------------------------------

REQUESTED = Requested(threads=2, cpus=[0], bind="close", places="cores", omp="gnu", omp_library=None,
                      allocator="jemalloc", allocator_library="/c/libjemalloc.so.2",
                      mempolicy=MemPolicy(mode="bind", nodes=[0]), env={})


def test_compare_weight_pages_allocator_and_runtime() -> None:
    state = InForce(
        pid=1,
        threads=[ThreadPlacement(5, "python", "R", [0, 1], 0), ThreadPlacement(6, "w", "S", [0, 1], 1)],
        mempolicy=MemPolicy(mode="bind", nodes=[0]),
        openmp=OpenMPInfo(),
        weight_pages=WeightPages(nodes={0: 5, 1: 3}, not_present=2),
    )
    assert compare(REQUESTED, state) == [
        "affinity: thread(s) 5 (python), 6 (w) may run on CPU(s) 1, outside the requested 0",
        "OpenMP: asked gnu (libgomp) but no OpenMP runtime is loaded",
        "allocator: asked jemalloc but it is not loaded",
        "weights: 3 of 8 resident sampled pages are on node(s) 1, outside the bound node(s) 0",
    ]


def test_compare_both_runtimes_without_an_active_one() -> None:
    state = InForce(
        pid=1, threads=[],
        openmp=OpenMPInfo(loaded=[OpenMPRuntime("libgomp", "/a/libgomp.so.1", False),
                                  OpenMPRuntime("libiomp5", "/b/libiomp5.so", True)], active=None),
        allocators=[AllocatorInfo("jemalloc", "/c/libjemalloc.so.2")],
        mempolicy=MemPolicy(mode="unknown", error="get_mempolicy() failed: Function not implemented"),
    )
    assert compare(REQUESTED, state) == [
        "OpenMP: asked gnu (libgomp); libgomp (/a/libgomp.so.1), libiomp5 (/b/libiomp5.so) are loaded "
        "and which one serves OpenMP calls is unknown",
        "memory policy: asked bind to node(s) 0 but it could not be read "
        "(get_mempolicy() failed: Function not implemented)",
    ]
