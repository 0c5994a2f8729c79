"""Known answers for the contention report with real OpenMP threads: a 3:1 imbalance built by the
test, profiled under GNU libgomp (from samples), and under Intel's libiomp5 through the OMPT tool
where this machine has it."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

IMBALANCE_SOURCE = r"""
#include <omp.h>
#include <time.h>

static double thread_cpu_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* Each call is one parallel region of 2 threads: the heavy one burns heavy_ms of its own CPU,
   the other light_ms, then both meet at the implicit barrier. */
void imbalanced_region(int heavy_thread, double heavy_ms, double light_ms) {
#pragma omp parallel num_threads(2)
    {
        double budget = omp_get_thread_num() == heavy_thread ? heavy_ms : light_ms;
        double start = thread_cpu_ms();
        volatile double sink = 0;
        while (thread_cpu_ms() - start < budget) sink += 1;
    }
}
"""

DRIVER = textwrap.dedent("""
    import ctypes, json, sys
    import torch, cpuprof
    from cpuprof.analysis.contention import analyse
    lib = ctypes.CDLL(sys.argv[1])
    lib.imbalanced_region.argtypes = [ctypes.c_int, ctypes.c_double, ctypes.c_double]
    heavy = int(sys.argv[2])
    torch.set_num_threads(2)
    lib.imbalanced_region(heavy, 5.0, 5.0)  # the team exists before profiling
    with cpuprof.profile("software", warn=False) as prof:
        with cpuprof.region("imbalanced"):
            for _ in range(8):
                lib.imbalanced_region(heavy, 30.0, 10.0)
    p = prof.profile
    c = analyse(p)
    row = next(o for o in c.ops if o.op.name == "imbalanced")
    print(json.dumps({"method": c.method, "roles": [t.role for t in p.threads], "wall": row.wall_ns,
                      "run_delay": sum(t.run_delay_ns or 0 for t in p.threads),
                      "imbalance": row.imbalance_ns,
                      "threads": [{"waiting": t.waiting_ns, "spin": t.spin_ns, "sleep": t.sleep_ns, "cpu": t.cpu_ns}
                                  for t in row.threads]}))
""")


@pytest.fixture(scope="module")
def imbalance_library(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("imbalance")
    source, library = folder / "imbalance.c", folder / "libimbalance.so"
    source.write_text(IMBALANCE_SOURCE)
    build = subprocess.run(["gcc", "-O1", "-fopenmp", "-shared", "-fPIC", str(source), "-o", str(library)],
                           capture_output=True, text=True)
    if build.returncode != 0:
        pytest.skip(f"cannot build the OpenMP test library with gcc: {build.stderr.strip()[:200]}")
    return library


# Run-queue delay (of the wall time) above which another process's work, not the imbalance under
# test, decides how long the threads wait.
TOO_BUSY_RUN_DELAY = 0.10


def run_driver(library: Path, heavy_thread: int) -> dict:
    """The run whose threads waited least for a CPU, of up to 3: on a shared 2-CPU machine another
    process's work stretches the regions and shows as time off CPU, which is not the imbalance
    under test (the report says so, from the run-queue delay)."""
    best: dict | None = None
    for _ in range(3):
        result = subprocess.run([sys.executable, "-c", DRIVER, str(library), str(heavy_thread)],
                                capture_output=True, text=True, timeout=300,
                                env={**__import__("os").environ, "OMP_NUM_THREADS": "2"})
        assert result.returncode == 0, result.stderr
        data = json.loads(result.stdout.strip().splitlines()[-1])
        if best is None or data["run_delay"] < best["run_delay"]:
            best = data
        if data["run_delay"] < 0.05 * data["wall"]:
            break
    assert best is not None
    if best["run_delay"] > TOO_BUSY_RUN_DELAY * best["wall"]:
        pytest.skip(f"the threads waited {best['run_delay'] / best['wall']:.0%} of the best of 3 runs for a CPU: "
                    "the machine is too busy for the 3:1 known answer")
    return best


@pytest.mark.parametrize("heavy_thread", [0, 1], ids=["primary-heavy", "worker-heavy"])
def test_lighter_thread_waits_two_thirds_of_a_3_to_1_region_from_samples(imbalance_library: Path,
                                                                        heavy_thread: int) -> None:
    data = run_driver(imbalance_library, heavy_thread)
    assert data["method"] == "samples"
    assert data["roles"] == ["dispatch", "worker"]
    light = 1 - heavy_thread
    wall = data["wall"]
    waits = [t["waiting"] / wall for t in data["threads"]]
    # 30 ms against 10 ms: the lighter thread waits 20 of every 30 ms; within 25% (libgomp, samples)
    assert waits[light] == pytest.approx(2 / 3, rel=0.25), data
    assert waits[heavy_thread] < 0.25, data  # the heavy thread hardly waits
    # VTune's imbalance: the waits over the team size, about 10 ms of every 30 ms region
    assert data["imbalance"] / wall == pytest.approx(1 / 3, rel=0.25), data


@pytest.mark.parametrize("omp", ["gnu", "intel"])
def test_decode_reports_contention_with_its_method_in_every_format(omp: str, tmp_path: Path) -> None:
    from cpuprof.collect.ompt import tool_library
    from cpuprof.machine.openmp import find_intel_openmp

    if omp == "intel" and (find_intel_openmp() is None or tool_library() is None):
        pytest.skip("--omp intel needs libiomp5 (pip install intel-openmp) and the OMPT tool built against its header")
    out = tmp_path / omp
    result = subprocess.run([sys.executable, "-m", "cpuprof", "decode", "--preset", "tiny", "--hidden", "256",
                             "--ffn", "1024", "--prompt-len", "8", "--new-tokens", "8", "--threads", "2",
                             "--omp", omp, "--roofs", "off", "--out", str(out), "--format", "json"],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    section = next(s for s in report["sections"] if s["id"] == "contention")
    method = "method: OMPT" if omp == "intel" else "method: samples"
    assert section["lines"][0].startswith(method), section["lines"][0]
    rows = section["tables"][0]["rows"]
    assert rows and {r["thread"] for r in rows} == {"T0", "T1"}
    for row in rows:  # no thread has more CPU than the op's wall time, nor spins longer than it waited
        assert row["cpu"] is None or row["cpu"] <= row["wall"], row
        if omp == "intel":  # exact waits: spin is their on-CPU part
            assert row["spin"] <= row["barrier"] + row["lock"] + 1, row
        else:  # spin is a part of the thread's sampled CPU
            assert row["spin"] is None or row["spin"] <= (row["cpu"] or 0) + 1, row
    from cpuprof.model import Profile

    profile = Profile.load(out)
    assert profile.openmp is not None and profile.openmp.info.active == (omp == "intel")
    if omp == "intel":
        assert any(w.kind == "barrier-implicit" and w.count > 0 for w in profile.openmp.waits)
        assert all(w.cpu_ns <= w.wall_ns for w in profile.openmp.waits)
        assert "barrier" in rows[0]
    else:
        assert "libgomp" in (profile.openmp.info.error or "")
    for fmt in ("terminal", "markdown"):
        rendered = subprocess.run([sys.executable, "-m", "cpuprof", "report", str(out), "--format", fmt],
                                  capture_output=True, text=True, timeout=120)
        assert rendered.returncode == 0, rendered.stderr
        assert "Contention: where the threads waited" in rendered.stdout and method in rendered.stdout
