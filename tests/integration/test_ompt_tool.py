"""The OMPT tool (csrc/ompt) against known answers, in real processes with real OpenMP threads.

The tool and a small OpenMP workload library are compiled here; each case runs a Python child
with Intel's libiomp5 preloaded, the tool named by OMP_TOOL_LIBRARIES and two threads, which
drives the workload and reads the tool through :class:`cpuprof.collect.ompt.OmptReader`.
Busy loops end at deadlines counted from the region's start, so the imbalance each region makes
is known whatever the wake-up latency of the worker.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cpuprof.collect.ompt import LIBGOMP, NOT_BUILT, STARTED_WITHOUT, launch_env
from cpuprof.machine.openmp import find_intel_openmp
from cpuprof.model.contention import WAIT_KINDS

REPO = Path(__file__).resolve().parents[2]

WORKLOAD = r"""
#include <omp.h>
#include <stdint.h>
#include <time.h>

static volatile uint32_t g_op;
static volatile int g_sink[64];
uint32_t current_op(void) { return g_op; }
void set_op(uint32_t op) { g_op = op; }

static double seconds(clockid_t clock) {
  struct timespec t;
  clock_gettime(clock, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}
static double now(void) { return seconds(CLOCK_MONOTONIC); }
static double cpu(void) { return seconds(CLOCK_THREAD_CPUTIME_ID); }
static void busy_until(double deadline) { while (now() < deadline) {} }

/* Each region: the primary works until start + primary_ms, thread 1 until start + worker_ms.
   out[0]: the CPU share thread 1 got while it worked (what a spinning wait can get at most);
   out[1]: thread 1's wait at the closing barriers in ns as the threads saw it themselves (the
   primary's arrival minus thread 1's, summed over the regions). */
void imbalance(int regions, double primary_ms, double worker_ms, double* out) {
  double cpu_sum = 0, wall_sum = 0, wait_sum = 0;
  for (int r = 0; r < regions; r++) {
    double start = now(), primary_arrives = 0, worker_arrives = 0;
#pragma omp parallel
    {
      if (omp_get_thread_num() == 0) {
        busy_until(start + primary_ms * 1e-3);
        primary_arrives = now();
      } else {
        double w0 = now(), c0 = cpu();
        busy_until(start + worker_ms * 1e-3);
        if (omp_get_thread_num() == 1) {
          cpu_sum += cpu() - c0;
          worker_arrives = now();
          wall_sum += worker_arrives - w0;
        }
      }
    }
    if (primary_arrives > worker_arrives) wait_sum += primary_arrives - worker_arrives;
  }
  out[0] = wall_sum > 0 ? cpu_sum / wall_sum : 0;
  out[1] = wait_sum * 1e9;
}

void lock_loop(int n) {
  omp_lock_t lock;
  omp_init_lock(&lock);
#pragma omp parallel
  for (int i = 0; i < n; i++) {
    omp_set_lock(&lock);
    double end = now() + 1e-6;
    while (now() < end) {}
    omp_unset_lock(&lock);
  }
  omp_destroy_lock(&lock);
}

void serial_lock(void) {
  omp_lock_t lock;
  omp_init_lock(&lock);
  omp_set_lock(&lock);
  omp_unset_lock(&lock);
  omp_destroy_lock(&lock);
}

void regions(int n) {
  for (int i = 0; i < n; i++) {
#pragma omp parallel
    g_sink[omp_get_thread_num() & 63] = i;
  }
}
"""

# The child: runs one scenario and prints what the tool read, rows keyed by thread id.
CHILD = r"""
import ctypes, json, os, sys, threading
from cpuprof.collect.ompt import OmptReader

lib = ctypes.CDLL(sys.argv[1])
lib.imbalance.argtypes = [ctypes.c_int, ctypes.c_double, ctypes.c_double, ctypes.POINTER(ctypes.c_double)]
lib.imbalance.restype = None


def imbalance(regions, primary_ms, worker_ms):
    seen = (ctypes.c_double * 2)()
    lib.imbalance(regions, primary_ms, worker_ms, seen)
    out["share"] = seen[0]
    out.setdefault("seen_wait_ns", []).append(seen[1])

lib.set_op.argtypes = [ctypes.c_uint32]
reader = OmptReader()
info = reader.open()
out = {"info": vars(info).copy(), "main": threading.get_native_id(), "kinds": reader.kind_names()}
if info.active:
    reader.attach(ctypes.cast(lib.current_op, ctypes.c_void_p).value)
    reader.reset()
    reader.enable(True)
    scenario = sys.argv[2]
    if scenario == "imbalance":
        lib.set_op(7)
        imbalance(5, 30.0, 10.0)
    elif scenario == "blocktime":
        lib.set_op(7)
        imbalance(4, 25.0, 5.0)
    elif scenario == "locks":
        lib.set_op(9)
        lib.lock_loop(2000)
    elif scenario == "ops":
        lib.set_op(5); imbalance(2, 4.0, 1.0)
        lib.set_op(6); lib.regions(3)
        reader.enable(False)
        lib.set_op(13); lib.regions(3); lib.serial_lock()
        reader.enable(True)
        lib.set_op(8); imbalance(2, 4.0, 1.0)
        lib.set_op(12); lib.serial_lock()
        lib.set_op(0); lib.serial_lock()
    elif scenario == "many_ops":
        for op in range(100, 1300):
            lib.set_op(op)
            lib.regions(1)
    lib.set_op(99)
    lib.regions(1)  # a worker's last barrier is known only when it is forked again
    reader.enable(False)
    tids = {int(t): int(t) for t in os.listdir("/proc/self/task")}
    result = reader.read(tids)
    out["info"] = vars(result.info).copy()
    out["waits"] = [vars(w) for w in result.waits]
    out["work"] = [vars(w) for w in result.work]
print(json.dumps(out))
"""


def tool_sources() -> list[str]:
    """The tool's units, as CMakeLists.txt lists them (CPUPROF_OMPT_SOURCES)."""
    block = re.search(r"set\(CPUPROF_OMPT_SOURCES(.*?)\)", (REPO / "CMakeLists.txt").read_text(), re.S)
    assert block, "CMakeLists.txt has no CPUPROF_OMPT_SOURCES list"
    return [str(REPO / path) for path in block.group(1).split()]


def _header(libiomp5: Path) -> Path | None:
    candidates = [Path(sys.prefix, "opt/compiler/include/omp-tools.h"),
                  libiomp5.parent.parent / "opt/compiler/include/omp-tools.h"]
    return next((c for c in candidates if c.is_file()), None)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    libiomp5 = find_intel_openmp()
    if libiomp5 is None:
        pytest.skip("libiomp5 is not installed (pip install intel-openmp)")
    header = _header(libiomp5)
    if header is None:
        pytest.skip("omp-tools.h is not installed (it comes with pip install intel-openmp)")
    if shutil.which("g++") is None or shutil.which("gcc") is None:
        pytest.skip("g++ and gcc are needed to build the tool and the workload")
    where = tmp_path_factory.mktemp("ompt")
    tool = where / "libcpuprof_ompt.so"
    subprocess.run(["g++", "-std=c++17", "-O2", "-shared", "-fPIC", "-fvisibility=hidden", "-Wall", "-Wextra",
                    "-Werror", f"-I{REPO / 'csrc'}", f"-I{header.parent}", *tool_sources(),
                    "-o", str(tool)], check=True, capture_output=True, text=True)
    source = where / "workload.c"
    source.write_text(WORKLOAD)
    workload = where / "libworkload.so"
    subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-fopenmp", "-Wall", "-Wextra", "-Werror", str(source),
                    "-o", str(workload)], check=True, capture_output=True, text=True)
    return {"tool": tool, "workload": workload, "libiomp5": libiomp5}


def run_child(built: dict[str, Path], scenario: str, *, intel: bool = True, tool: bool = True,
              **env: str) -> dict:
    child_env = {k: v for k, v in os.environ.items()
                 if not k.startswith(("OMP_", "KMP_", "GOMP_")) and k != "LD_PRELOAD"}
    child_env["OMP_NUM_THREADS"] = "2"
    if intel:
        child_env["LD_PRELOAD"] = str(built["libiomp5"])
    if tool:
        child_env.update(launch_env(built["tool"]))
    child_env.update(env)
    result = subprocess.run([sys.executable, "-c", CHILD, str(built["workload"]), scenario], env=child_env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def waits(out: dict, **match: object) -> list[dict]:
    return [w for w in out["waits"] if all(w[k] == v for k, v in match.items())]


def work(out: dict, **match: object) -> list[dict]:
    return [w for w in out["work"] if all(w[k] == v for k, v in match.items())]


def worker_of(out: dict) -> int:
    workers = {w["thread"] for w in out["work"] if w["implicit_tasks"] and w["thread"] != out["main"]}
    assert len(workers) == 1, out["work"]
    return workers.pop()


def check_sane(out: dict) -> None:
    """Figures that cannot be right: more CPU than wall time, a wait with no count."""
    for w in out["waits"]:
        assert 0 <= w["cpu_ns"] <= w["wall_ns"], w
        assert w["count"] > 0, w
    assert out["info"]["records_dropped"] == 0
    assert out["info"]["records_unmapped"] == 0


def test_status_under_libiomp5(built: dict[str, Path]) -> None:
    out = run_child(built, "none")
    info = out["info"]
    assert info["active"], info
    assert info["error"] is None
    assert info["runtime"].startswith("Intel(R) OMP")
    assert info["library"] == str(built["tool"])
    assert tuple(out["kinds"]) == WAIT_KINDS
    assert set(info["callbacks"].values()) == {"always"}, info["callbacks"]
    assert set(info["callbacks"]) == {"thread_begin", "thread_end", "parallel_begin", "parallel_end",
                                      "implicit_task", "sync_region_wait", "mutex_acquire", "mutex_acquired",
                                      "mutex_released"}


def test_status_under_libgomp_is_not_active(built: dict[str, Path]) -> None:
    out = run_child(built, "none", intel=False)
    assert not out["info"]["active"]
    assert out["info"]["error"] == LIBGOMP
    assert out["info"]["library"] is None  # the tool was never loaded


def test_status_when_the_runtime_started_without_the_tool(built: dict[str, Path]) -> None:
    out = run_child(built, "none", tool=False)
    assert not out["info"]["active"]
    assert out["info"]["error"] in (STARTED_WITHOUT, NOT_BUILT)


def test_imbalance_is_the_workers_barrier_wait(built: dict[str, Path]) -> None:
    # 5 regions: the primary works 30 ms, the worker 10 ms; the worker waits 20 ms in each. That
    # is the answer only if the machine ran the worker at once: the worker times its own wait, and
    # a run where a busy machine delayed it is run again (up to 3 times), as the others are.
    for _ in range(3):
        out = run_child(built, "imbalance", KMP_BLOCKTIME="200")
        if out["seen_wait_ns"][0] / 5 == pytest.approx(20e6, rel=0.1):
            break
    check_sane(out)
    main, worker = out["main"], worker_of(out)
    [barrier] = waits(out, thread=worker, op=7, kind="barrier-implicit")
    assert barrier["count"] == 5
    assert barrier["wall_ns"] / 5 == pytest.approx(20e6, rel=0.15)
    # And what the threads saw themselves (a busy machine can delay the worker's start, or
    # preempt the primary between its last look at the clock and the barrier).
    assert barrier["wall_ns"] == pytest.approx(out["seen_wait_ns"][0], rel=0.1, abs=5 * 0.1e6)
    # The primary arrives last and hardly waits.
    [primary_barrier] = waits(out, thread=main, op=7, kind="barrier-implicit")
    assert primary_barrier["count"] == 5 and primary_barrier["wall_ns"] < 5 * 2e6
    # The worker's time between regions is idle, outside ops, not part of the barrier.
    assert [w["count"] for w in waits(out, thread=worker, kind="idle")] == [5]
    assert not waits(out, thread=worker, op=1, kind="barrier-implicit")
    [primary] = work(out, thread=main, op=7)
    assert primary["parallel_regions"] == 5 and primary["team_threads"] == 10
    assert primary["implicit_tasks"] == 5
    assert primary["parallel_ns"] / 5 == pytest.approx(30e6, rel=0.15)
    [task] = work(out, thread=worker, op=7)
    assert task["implicit_tasks"] == 5 and task["parallel_regions"] == 0
    # Its tasks last from its start until the barrier completed: never longer than the primary's.
    assert 10e6 * 5 < task["implicit_task_ns"] <= primary["implicit_task_ns"] * 1.02


def test_lock_contention_counts_every_acquisition(built: dict[str, Path]) -> None:
    out = run_child(built, "locks")
    check_sane(out)
    locks = waits(out, op=9, kind="lock")
    assert sorted(w["count"] for w in locks) == [2000, 2000]
    assert all(w["wall_ns"] > 0 for w in locks)
    assert len({w["thread"] for w in locks}) == 2
    assert sum(w["lock_acquisitions"] for w in work(out, op=9)) == 4000


def spin_fraction(out: dict) -> float:
    [barrier] = waits(out, thread=worker_of(out), op=7, kind="barrier-implicit")
    assert barrier["count"] == 4
    assert barrier["wall_ns"] == pytest.approx(out["seen_wait_ns"][0], rel=0.1, abs=4 * 0.1e6)
    return barrier["cpu_ns"] / barrier["wall_ns"]


def test_spin_or_sleep_follows_kmp_blocktime(built: dict[str, Path]) -> None:
    sleeping = run_child(built, "blocktime", KMP_BLOCKTIME="0")
    check_sane(sleeping)
    assert spin_fraction(sleeping) < 0.2
    # A spinning libiomp5 thread yields its CPU to any other runnable thread, so it spins on a CPU
    # only on a quiet machine: the worker's own CPU share while it worked tells whether it was one.
    for _ in range(3):
        spinning = run_child(built, "blocktime", KMP_BLOCKTIME="200")
        check_sane(spinning)
        if spinning["share"] > 0.95:
            break
    else:
        pytest.skip(f"the worker got {spinning['share']:.0%} of a CPU while it worked: the machine is too busy "
                    "to tell spinning from sleeping")
    assert spin_fraction(spinning) > 0.9


def test_waits_are_charged_to_the_op_that_forked_the_region(built: dict[str, Path]) -> None:
    out = run_child(built, "ops", KMP_BLOCKTIME="200")
    check_sane(out)
    main, worker = out["main"], worker_of(out)
    # Nothing from while recording was off (op 13), every region under its own op.
    assert {w["op"] for w in out["work"]} == {5, 6, 8, 12, 1, 99}
    assert {w["op"] for w in out["waits"]} <= {5, 6, 8, 12, 1, 99}
    for op, regions in ((5, 2), (6, 3), (8, 2), (99, 1)):
        [primary] = work(out, thread=main, op=op)
        assert primary["parallel_regions"] == regions and primary["team_threads"] == 2 * regions
        [task] = work(out, thread=worker, op=op)
        assert task["implicit_tasks"] == regions
    # The worker's barrier in op 8's regions (4 ms against 1 ms), as the threads saw it.
    [barrier] = waits(out, thread=worker, op=8, kind="barrier-implicit")
    assert barrier["count"] == 2
    assert barrier["wall_ns"] == pytest.approx(out["seen_wait_ns"][1], rel=0.2, abs=2 * 0.2e6)
    # A lock outside any region goes to the thread's own op, or to op 1 outside ops.
    assert [w["count"] for w in waits(out, thread=main, op=12, kind="lock")] == [1]
    assert [w["count"] for w in waits(out, thread=main, op=1, kind="lock")] == [1]
    assert work(out, thread=main, op=12)[0]["lock_acquisitions"] == 1


def test_tables_are_bounded_and_say_what_did_not_fit(built: dict[str, Path]) -> None:
    # 1200 ops, one region each: more than a thread's 1024 op slots.
    out = run_child(built, "many_ops")
    assert out["info"]["records_dropped"] > 0
    main = out["main"]
    rows = work(out, thread=main)
    assert 900 < len(rows) <= 1024
    # What was kept is whole: each op's one region, never a mix of two ops.
    assert all(r["parallel_regions"] == 1 and r["team_threads"] == 2 for r in rows if r["op"] != 99)
