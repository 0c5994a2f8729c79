"""cpuprof's native Python frame readers follow CPython's internal frame layout, which changes with
every minor version (3.11, 3.12, 3.13). The suite itself runs on one interpreter; this test builds
both readers (the sampler's, csrc/python/python_stacks.cpp, and the op hook's callers,
csrc/python/python_callers.cpp) into a small extension without torch for every CPython 3.11 to
3.13 it finds here, and checks them against that interpreter's own view of its stacks
(python_frames_harness/check.py): each recorded op caller is the stack that called the op, on four
threads, through recursion, generators and comprehensions; each read of a parked thread is its
exact stack while other threads start and end."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HARNESS = Path(__file__).with_name("python_frames_harness")
VERSIONS = ("3.11", "3.12", "3.13")


def interpreter(version: str) -> str | None:
    """A CPython of that minor version that runs: this one, one pyenv installed, or one on PATH
    (not pyenv's shims, which pick a version by directory), with the GIL (no free-threaded build)."""
    pyenv = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
    found = sorted(glob.glob(f"{pyenv}/versions/{version}.*/bin/python{version}")) + [shutil.which(f"python{version}")]
    if f"{sys.version_info.major}.{sys.version_info.minor}" == version:
        found = [sys.executable]
    for python in found:
        if python is None or "/shims/" in python:
            continue
        ok = subprocess.run([python, "-c", "import sys, sysconfig; "
                             "sys.exit(1 if sysconfig.get_config_var('Py_GIL_DISABLED') else 0)"],
                            capture_output=True, timeout=60)
        if ok.returncode == 0:
            return python
    return None


def config_of(python: str) -> tuple[str, str]:
    out = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['include']); "
                          "print(sysconfig.get_config_var('EXT_SUFFIX'))"],
                         capture_output=True, text=True, timeout=60, check=True).stdout.split("\n")
    return out[0], out[1]


@pytest.mark.parametrize("version", VERSIONS)
def test_the_native_readers_see_the_interpreters_own_stacks(version: str, tmp_path: Path):
    python = interpreter(version)
    if python is None:
        pytest.skip(f"no CPython {version} here (on PATH or under pyenv) to build the readers against")
    if shutil.which("g++") is None or shutil.which("gcc") is None:
        pytest.skip("no gcc/g++ here to build the readers with")
    include, suffix = config_of(python)
    if not (Path(include) / "internal" / "pycore_frame.h").is_file():
        pytest.skip(f"CPython {version} at {python} has no internal headers ({include})")
    csrc = ROOT / "csrc"
    flags = ["-O2", "-fPIC", f"-I{csrc}", f"-I{include}"]
    lock = tmp_path / "thread_list_lock.o"
    subprocess.run(["gcc", *flags, "-c", str(csrc / "python" / "thread_list_lock.c"), "-o", str(lock)],
                   check=True, timeout=300)
    subprocess.run(["g++", "-std=c++17", "-shared", *flags, str(HARNESS / "harness.cpp"),
                    str(csrc / "python" / "python_callers.cpp"), str(csrc / "python" / "python_stacks.cpp"),
                    str(lock), "-o", str(tmp_path / f"frames_harness{suffix}")], check=True, timeout=300)
    result = subprocess.run([python, str(HARNESS / "check.py"), str(tmp_path)], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "each the interpreter's own stack" in result.stdout and "stack exact" in result.stdout, result.stdout
