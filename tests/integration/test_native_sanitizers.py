"""The C++ core's concurrency under ThreadSanitizer and AddressSanitizer.

The core units have no torch or Python in them, so they build in seconds with a sanitizer and a
driver (tests/native/stress_session.cpp) that races the op path against the sampler, checkpoints
and start/stop. A data race or a memory error fails the test with the sanitizer's report.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def cmake_sources(name: str) -> list[str]:
    """The units of list `name` as CMakeLists.txt sets it (one list, so the two never differ)."""
    text = (ROOT / "CMakeLists.txt").read_text()
    block = re.search(rf"set\({name}(.*?)\)", text, re.S)
    assert block, f"CMakeLists.txt has no {name} list"
    return [str(ROOT / path) for path in block.group(1).split()]


def core_sources() -> list[str]:
    """The torch-free units."""
    return cmake_sources("CPUPROF_CORE_SOURCES")


def build_sanitized(tmp_path: Path, name: str, sources: list[str], sanitizer: str,
                    includes: tuple[Path, ...] = ()) -> Path:
    """Builds a driver with `sanitizer`; skips where its runtime is not installed."""
    binary = tmp_path / name
    # -O0: the sanitizers find the same races and errors unoptimised, and the build takes a third of
    # -O1's time (62 s against 22 s for the core here); the drivers run for a fixed time, not a fixed count.
    build = subprocess.run(
        ["g++", "-std=c++17", "-O0", "-g", f"-fsanitize={sanitizer}", "-fno-omit-frame-pointer",
         "-I", str(ROOT / "csrc"), *[f"-I{i}" for i in includes], *sources, "-o", str(binary), "-pthread"],
        capture_output=True, text=True, timeout=300)
    if build.returncode != 0 and "cannot find" in build.stderr and "san" in build.stderr:
        pytest.skip(f"the {sanitizer} sanitizer runtime is not installed: {build.stderr.strip()[:200]}")
    assert build.returncode == 0, build.stderr
    return binary


@pytest.mark.skipif(shutil.which("g++") is None, reason="no C++ compiler")
@pytest.mark.parametrize("sanitizer", ["thread", "address,undefined"])
def test_core_under_sanitizer(tmp_path: Path, sanitizer: str):
    binary = build_sanitized(tmp_path, "stress", core_sources() + [str(ROOT / "tests/native/stress_session.cpp")],
                             sanitizer)
    run = subprocess.run([str(binary)], capture_output=True, text=True, timeout=300,
                         env={"TSAN_OPTIONS": "halt_on_error=1", "ASAN_OPTIONS": "detect_leaks=1",
                              "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1", "PATH": "/usr/bin:/bin"})
    assert run.returncode == 0, run.stderr[-4000:]
    assert "ok:" in run.stdout
    assert "WARNING: ThreadSanitizer" not in run.stderr
    assert "runtime error" not in run.stderr


@pytest.mark.skipif(shutil.which("g++") is None, reason="no C++ compiler")
def test_unwinder_reads_nothing_but_its_stack_copy_whatever_the_registers(tmp_path: Path):
    """rbp and stack words can hold anything (JIT kernels use rbp as a plain register): near 2^64,
    `address + 8` wrapped and the bounds check passed a wild read, which killed a decode now and
    then with SIGSEGV. The driver unwinds 200,000 hostile stacks under AddressSanitizer."""
    sources = [str(ROOT / p) for p in ("csrc/unwind/frame_tables.cpp", "csrc/unwind/unwinder.cpp",
                                       "tests/native/hostile_unwind.cpp")]
    binary = build_sanitized(tmp_path, "hostile_unwind", sources, "address,undefined")
    run = subprocess.run([str(binary)], capture_output=True, text=True, timeout=300,
                         env={"UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1", "PATH": "/usr/bin:/bin"})
    assert run.returncode == 0, run.stderr[-4000:]
    assert "ok: " in run.stdout and "runtime error" not in run.stderr


def _omp_tools_include() -> Path | None:
    """Where the build finds omp-tools.h (CMakeLists.txt: pip install intel-openmp puts it there)."""
    include = Path(sys.prefix) / "opt/compiler/include"
    return include if (include / "omp-tools.h").is_file() else None


@pytest.mark.skipif(shutil.which("g++") is None, reason="no C++ compiler")
@pytest.mark.skipif(_omp_tools_include() is None, reason="omp-tools.h is not installed (pip install intel-openmp)")
def test_ompt_tables_renew_without_racing_the_reader(tmp_path: Path):
    """A reset makes every thread clear its own tables at its next callback, while the reader may
    be reading them: the clearing was a memset under the reader's atomic loads (a data race that
    ThreadSanitizer reported at once). Threads record waits through the tool's callbacks while
    the main thread resets and reads, under ThreadSanitizer."""
    include = _omp_tools_include()
    assert include is not None
    # The driver includes the callbacks' unit itself (they have internal linkage): the tool's other units
    # are built with it.
    tool = [s for s in cmake_sources("CPUPROF_OMPT_SOURCES") if not s.endswith("/ompt_callbacks.cpp")]
    binary = build_sanitized(tmp_path, "stress_ompt", tool + [str(ROOT / "tests/native/stress_ompt_reset.cpp")],
                             "thread", (include,))
    run = subprocess.run([str(binary)], capture_output=True, text=True, timeout=300,
                         env={"TSAN_OPTIONS": "halt_on_error=1", "PATH": "/usr/bin:/bin"})
    assert run.returncode == 0, (run.stdout + run.stderr)[-4000:]
    assert "ok:" in run.stdout
    assert "WARNING: ThreadSanitizer" not in run.stderr
