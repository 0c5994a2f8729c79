"""The code checks the project holds itself to: ruff, mypy, and the native stub against the module."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=600)


@pytest.mark.skipif(importlib.util.find_spec("ruff") is None, reason="ruff is not installed (pip install ruff)")
def test_ruff():
    result = run("ruff", "check", "src", "tests", "benches")
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.skipif(importlib.util.find_spec("mypy") is None, reason="mypy is not installed (pip install mypy)")
def test_mypy():
    result = run("mypy", "src")
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.skipif(importlib.util.find_spec("mypy") is None, reason="mypy is not installed (pip install mypy)")
def test_native_stub_matches_the_module():
    """_native.pyi is hand-written; stubtest compares it with the built extension, name by name."""
    result = run("mypy.stubtest", "cpuprof._native", "cpuprof._native_testing", "cpuprof._test_utils",
                 "--allowlist", str(ROOT / "tests/native/stubtest-allowlist.txt"))
    assert result.returncode == 0, result.stdout + result.stderr
