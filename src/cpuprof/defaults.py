"""Every default and limit the Python side uses, defined once.

The core's own limits come from ``csrc/common/limits.h`` through ``_build_info`` (written by every
build, a viewer's without torch too), so the CLI can check options without importing torch;
``_native.limits`` holds the same values and a test checks that they agree. A source tree run
without a build (``PYTHONPATH=src``) reads the header itself, with the build's own pattern.
"""

from __future__ import annotations

import re
from pathlib import Path

from .errors import NativeModuleError
from .model.profile import COLLECTION_MODES, SAMPLED, CollectionMode

#: A limit's line in limits.h, as CMakeLists.txt reads it: ``constexpr <type> kName = <digits>;``.
LIMIT_LINE = re.compile(r"^constexpr [a-z_:0-9]+ (k[A-Za-z]+) = ([0-9]+);", re.MULTILINE)
SOURCE_LIMITS_HEADER = Path(__file__).resolve().parents[2] / "csrc" / "common" / "limits.h"


def read_limits_header(text: str) -> dict[str, int]:
    return {name: int(value) for name, value in LIMIT_LINE.findall(text)}


def _core_limits() -> dict[str, int]:
    try:
        from ._build_info import LIMITS
    except ImportError:
        pass
    else:
        return LIMITS
    if SOURCE_LIMITS_HEADER.is_file():
        return read_limits_header(SOURCE_LIMITS_HEADER.read_text())
    raise NativeModuleError(
        "cpuprof is not installed (no cpuprof/_build_info.py, and no csrc/common/limits.h beside the "
        "source): install it with: pip install ."
    )


CORE_LIMITS: dict[str, int] = _core_limits()

MAX_EVENTS: int = CORE_LIMITS["kMaxEvents"]
MAX_DEPTH: int = CORE_LIMITS["kMaxDepth"]
MAX_DISPATCH_THREADS: int = CORE_LIMITS["kMaxDispatchThreads"]
MAX_THREADS: int = CORE_LIMITS["kDefaultMaxThreads"]
MAX_THREADS_LIMIT: int = CORE_LIMITS["kMaxThreadsLimit"]
OP_CAPACITY: int = CORE_LIMITS["kDefaultOpCapacity"]
MIN_OP_CAPACITY: int = CORE_LIMITS["kMinOpCapacity"]
MAX_OP_CAPACITY: int = CORE_LIMITS["kMaxOpCapacity"]
MAX_TIMELINE: int = CORE_LIMITS["kMaxSpanCapacity"]
SAMPLE_HZ: int = CORE_LIMITS["kDefaultSampleHz"]
MIN_SAMPLE_HZ: int = CORE_LIMITS["kMinSampleHz"]
MAX_SAMPLE_HZ: int = CORE_LIMITS["kMaxSampleHz"]
STACK_BYTES: int = CORE_LIMITS["kDefaultStackBytes"]
MAX_STACK_BYTES: int = CORE_LIMITS["kMaxStackBytes"]
RING_PAGES: int = CORE_LIMITS["kDefaultRingPages"]
TIMELINE_SAMPLES: int = CORE_LIMITS["kDefaultTimelineSamples"]

# py-spy's rate beside the native sampler: its stacks are joined by time, so one period is the
# uncertainty of a Python frame's begin and end; py-spy's own default.
PYTHON_HZ = 100
MAX_PYTHON_HZ = 1000
# Who reads the Python stacks: a thread of cpuprof's inside the process (no second process, no
# ptrace; it takes the GIL for a few tens of µs per sample), or py-spy from outside.
PYTHON_SAMPLERS = ("in-process", "py-spy")
PYTHON_SAMPLER = "in-process"

# The collection modes are the profile model's (a typed enumeration, written in the schema).
MODES: tuple[CollectionMode, ...] = COLLECTION_MODES
DEFAULT_MODE: CollectionMode = SAMPLED
DEFAULT_EVENTS = "default"

# Reports: rows of the op table, in every command and format.
TOP_OPS = 20
# A sampled-mode ratio over fewer samples than this is noise (~18% relative error at 30).
MIN_SAMPLES = 30
# Run-queue delay above this share of a thread's time makes the report warn at the top.
RUN_QUEUE_WARNING_SHARE = 0.03

# decode
CHECKPOINT_S = 5.0
# Progress lines when the output is not a terminal (CI logs, `| tee`): at most this often.
PROGRESS_PLAIN_INTERVAL_S = 10.0

# How long the processes of a multi-process decode wait for each other to start and build (a
# loaded machine imports torch slowly); the decode's all-reduces use the rank timeout instead.
RANK_STARTUP_TIMEOUT_S = 300.0

# A calibration whose threads waited for a CPU more than this share of its time measured what
# another process left of the machine: its roofs are used for that run, said to be low, not cached.
BUSY_CALIBRATION_SHARE = 0.10

# Set by cpuprof's launcher in the processes it starts: the command the user typed, as a JSON list,
# for the profile's meta (a report names that, not the internal child's command line).
COMMAND_ENV = "CPUPROF_COMMAND"
MAX_COMMAND_ENV_BYTES = 32 * 1024

# The most bytes cpuprof reads back from one of its files (profile.json, compare.json, ranks.json,
# launch.json, the roofs cache, a checkpoint's config.json). Real profiles are a few MB (the tests'
# largest is 8 MB); the longest timeline the core keeps (kMaxSpanCapacity spans) is about 0.6 GB.
# Past this a file is not one cpuprof wrote, and reading it would only exhaust memory.
MAX_READ_BYTES = 2 * 1024**3
