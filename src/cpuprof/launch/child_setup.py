"""What every launched child (decode's and run's) does at its start and its end, in one place.

Kept free of torch and numpy: the script child imports it before the user's program runs, and
the program should import those itself, if at all.
"""

from __future__ import annotations

import faulthandler
import os
from pathlib import Path
from typing import TextIO

from .options import CRASH_FILENAME

# Set by the parent when cpuprof, not the user, asked oneDNN for a perf map (see launch.parent).
REMOVE_PERF_MAP = "CPUPROF_REMOVE_PERF_MAP"


def record_crashes(out_dir: str) -> TextIO:
    """A crash leaves every thread's Python stack in ``out_dir/crash.txt``, where the parent's error
    line points; the file stays open (and empty) for the child's life (faulthandler holds it), and
    the parent removes it when there was no crash."""
    crash_file = open(Path(out_dir) / CRASH_FILENAME, "w")  # noqa: SIM115
    faulthandler.enable(crash_file, all_threads=True)
    return crash_file


def remove_perf_map() -> None:
    """The perf map oneDNN wrote because the launcher asked for it: read by now, not kept."""
    if os.environ.get(REMOVE_PERF_MAP) == "1":
        try:
            os.unlink(f"/tmp/perf-{os.getpid()}.map")
        except OSError:
            pass
