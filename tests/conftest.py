"""Test-session setup shared by every test."""

from __future__ import annotations

import os
import tempfile


def pytest_configure(config: object) -> None:
    # Roofs measured by decode runs in the tests go to a cache of this session's own, inherited by
    # every child process: a test never reads a developer's cached roofs nor writes into them, and
    # the measurement is paid once per launch shape, not once per test.
    if "CPUPROF_CACHE_DIR" not in os.environ:
        os.environ["CPUPROF_CACHE_DIR"] = tempfile.mkdtemp(prefix="cpuprof-test-cache-")
    # Terminal reports fit the terminal's width: the tests read them at one width, whatever the
    # developer's terminal or CI's pipe (every child inherits it).
    os.environ["COLUMNS"] = "120"
