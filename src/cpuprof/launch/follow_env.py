"""What a followed process knows before torch is imported, shared by the boot side
(:mod:`.followed`) and the profile side (:mod:`.followed_run`): the variables that name the follow
file and the launch's account of its variables, the launch's variables given back to the program,
and the process's run once it has one. Standard library only: imported as every followed Python
starts.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

FOLLOW_ENV = "CPUPROF_FOLLOW"  # names the follow file (followed_run.FollowConfig) a followed process reads
LAUNCH_ENV = "CPUPROF_LAUNCH_ENV"  # environment.LAUNCH_ENV_VAR: the launch's variables, and what they were
LAUNCH_CPUS_ENV = "CPUPROF_LAUNCH_CPUS"  # environment.LAUNCH_CPUS_VAR: the launch's CPU set, a JSON list
# The launch's variables that bind the program's OpenMP threads, each to one place: the thread that
# starts a process is then one of them, and the process inherits its one CPU, not the launch's set.
BINDING_VARS = ("OMP_PROC_BIND", "GOMP_CPU_AFFINITY", "KMP_AFFINITY")
FRONT_END_FILENAME = "front_end.json"  # model.run_layout.FRONT_END_FILENAME (this module imports only the stdlib)
MAX_CPUS = 1 << 16  # more than any machine has: a longer list read back is not the launch's


# environment.OWNED_VARS, the variables the launch decides (this module imports only the standard
# library; a unit test keeps the two the same).
LAUNCH_OWNED_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OMP_PROC_BIND", "OMP_PLACES", "GOMP_CPU_AFFINITY",
                     "KMP_AFFINITY")

# -- in a followed process ----------------------------------------------------------------------
current_run: Any = None  # the FollowedRun of this process, once torch is imported
# Wall time cpuprof took in this process as Python started: importing it and installing the hook
# (0 in a forked child: that was its parent's).
boot_ns = 0
# The launch's variables as they were before the launch, once this process has been given them back
# (None: it was not: a process forked from a followed one inherits its parent's as they are).
before_launch: dict[str, str | None] | None = None
# The CPU set this process was given back as it started: (the one it inherited, the launch's), or None.
cpus_given_back: tuple[list[int], list[int]] | None = None
# Its parent's threads given the launch's set (free_the_front_end): (the parent's pid, the threads
# moved, the CPU set they were bound to), or None.
front_end_freed: tuple[int, int, list[int]] | None = None


def launch_env_values(environ: Any = os.environ) -> dict[str, tuple[str | None, str | None]]:
    """The launch's own variables, as the launcher left them in the program's environment: {variable:
    (the launch's value, the value before the launch)}, None for unset, for every one of them; empty
    when not said, or when what is said is not that (it is read as untrusted input: only the launch's
    variables, only strings, all or nothing)."""
    raw = environ.get(LAUNCH_ENV)
    if not raw:
        return {}
    try:
        said = json.loads(raw)
    except (ValueError, RecursionError):
        return {}
    if not isinstance(said, dict) or set(said) - set(LAUNCH_OWNED_VARS):
        return {}
    values: dict[str, tuple[str | None, str | None]] = {}
    for key in LAUNCH_OWNED_VARS:
        pair = said.get(key, [None, None])
        if not (isinstance(pair, list) and len(pair) == 2
                and all(v is None or (isinstance(v, str) and "\0" not in v) for v in pair)):
            return {}
        values[key] = (pair[0], pair[1])
    return values


def give_back_the_programs_env(environ: Any = os.environ) -> dict[str, str | None]:
    """The launch's variables are for the program's own process: a process it starts gets the
    values it would have had without cpuprof (the OpenMP runtime reads them as torch loads, so this
    runs first of all). A variable the program set itself (vLLM's OMP_NUM_THREADS for its worker) is
    kept; one it set to the very value the launch gave cannot be told from it, and is given back too.
    The processes this one starts inherit what it has then: the launch's account is removed. Returns
    what was given back."""
    global before_launch
    values = launch_env_values(environ)
    environ.pop(LAUNCH_ENV, None)
    launch_cpus = _cpu_list(environ.pop(LAUNCH_CPUS_ENV, None))
    if not values:
        return {}
    if launch_cpus and any(values[key][0] not in (None, "false", "disabled") for key in BINDING_VARS):
        give_back_the_cpu_set(launch_cpus)
    given: dict[str, str | None] = {}
    for key, (launched, before) in values.items():
        if launched != before and environ.get(key) == launched:
            if before is None:
                environ.pop(key, None)
            else:
                environ[key] = before
            given[key] = before
    before_launch = {key: before for key, (_, before) in values.items()}
    return given


def give_back_the_cpu_set(launch_cpus: list[int], parent: int | None = None) -> bool:
    """A process inherits the CPU affinity of the thread that started it. In the program's process
    that thread is bound to one CPU by the launch's OpenMP binding (libgomp binds its initial thread
    as it loads), so without this a serving engine's processes would all start on that one CPU while
    the launch's other CPUs idle (vLLM's engine core and worker did, under `run --threads 2`, where
    without cpuprof the engine core had both). Given back: the launch's CPU set, where this process
    started on a smaller set that is the one its parent's main thread is bound to (what the binding
    did); a set the program chose for it otherwise (taskset, a CPU of its own) is kept. True when
    given back."""
    global cpus_given_back
    try:
        inherited = sorted(os.sched_getaffinity(0))
    except OSError:
        return False
    if not set(inherited) < set(launch_cpus):
        return False
    parent = os.getppid() if parent is None else parent
    if _allowed_cpus(parent) != inherited and not _freed_from(parent, inherited):
        return False
    try:
        os.sched_setaffinity(0, launch_cpus)
    except OSError:  # a CPU set narrowed since the launch (a cgroup): it runs where it was put
        return False
    cpus_given_back = (inherited, sorted(launch_cpus))
    return True


def free_the_front_end(parent: int, before_moving: Callable[[int, list[int], list[int]], None] | None = None) -> bool:
    """The program's process is bound by the launch's OpenMP binding (its initial thread, and every
    thread started from it, on the first place's CPUs) for the OpenMP team it is expected to run. One
    that starts a process importing torch before it has run a team is a front end (vLLM's ``LLM``,
    torchrun): its work is the processes', and bound it shares one CPU with them (vLLM binds its
    worker to the first CPU too). Called in a process the program's process (``parent``) started, as
    it imports torch, after give_back_the_cpu_set: the parent's threads still on the CPU set this
    process inherited get the launch's set, where no thread of the parent is bound elsewhere in the
    launch's set (its team). A program whose team ran before it started its workers keeps its
    binding. ``before_moving(threads, from, to)`` runs once before the first thread is moved (to say
    so first: a process started meanwhile reads it). True when moved."""
    global front_end_freed
    if cpus_given_back is None or os.getppid() != parent:
        return False
    bound, launch_cpus = cpus_given_back
    moved = 0
    for _ in range(3):  # the parent may start threads meanwhile, bound as the thread that starts them
        threads = _thread_cpus(parent)
        if threads is None or threads.get(parent) != bound:
            break
        if any(cpus != bound and set(cpus) < set(launch_cpus) for cpus in threads.values()):
            break  # its OpenMP team is bound across the launch's set: it does the work itself
        still = [tid for tid, cpus in threads.items() if cpus == bound]
        if not still:
            break
        if moved == 0 and before_moving is not None:
            before_moving(len(still), bound, launch_cpus)
        for tid in still:
            try:
                os.sched_setaffinity(tid, launch_cpus)
                moved += 1
            except OSError:  # the thread ended, or a cgroup narrowed the set: it stays where it is
                pass
    if moved:
        front_end_freed = (parent, moved, bound)
    return moved > 0


def _thread_cpus(pid: int) -> dict[int, list[int]] | None:
    """{thread id: the CPUs it may run on} for each thread of process ``pid`` (/proc), or None."""
    try:
        tids = [int(t) for t in os.listdir(f"/proc/{pid}/task") if t.isdigit()]
    except OSError:
        return None
    threads = {}
    for tid in tids:
        cpus = _allowed_cpus(pid, tid)
        if cpus is not None:
            threads[tid] = cpus
    return threads


def _freed_from(parent: int, inherited: list[int]) -> bool:
    """Whether ``parent`` is the front end a sibling of this process freed from ``inherited`` (its
    record, front_end.json beside the follow file, says so): this process was started while it was
    still bound, and booted after. The record is read back as untrusted input."""
    follow_file = os.environ.get(FOLLOW_ENV)
    if not follow_file:
        return False
    try:
        with open(Path(follow_file).parent / FRONT_END_FILENAME, encoding="utf-8") as record:
            said = json.loads(record.read(1 << 16))
    except (OSError, ValueError, RecursionError):
        return False
    return isinstance(said, dict) and said.get("pid") == parent and said.get("cpus_from") == inherited


def _cpu_list(raw: str | None) -> list[int]:
    """The launch's CPU set as the launcher wrote it, read as untrusted input: [] unless a JSON list
    of CPU numbers."""
    if not raw or len(raw) > 8 * MAX_CPUS:
        return []
    try:
        cpus = json.loads(raw)
    except (ValueError, RecursionError):
        return []
    if not isinstance(cpus, list) or not all(type(c) is int and 0 <= c < MAX_CPUS for c in cpus):
        return []
    return sorted(set(cpus))


def _allowed_cpus(pid: int, tid: int | None = None) -> list[int] | None:
    """The CPUs process ``pid``'s main thread (or its thread ``tid``) may run on (/proc), or None.
    (The list is parsed here, not by model.parse_cpulist: this module runs as every followed Python
    starts and imports only the standard library.)"""
    path = f"/proc/{pid}/status" if tid is None else f"/proc/{pid}/task/{tid}/status"
    try:
        with open(path, encoding="ascii", errors="replace") as status:
            text = status.read()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("Cpus_allowed_list:"):
            cpus: set[int] = set()
            try:
                for part in line.split(":", 1)[1].strip().split(","):
                    low, _, high = part.partition("-")
                    cpus.update(range(int(low), int(high or low) + 1))
            except ValueError:
                return None
            return sorted(cpus)
    return None


def warn(message: str) -> None:
    from ..safe_text import printable

    print(f"cpuprof: warning: process {os.getpid()}: {printable(message)}", file=sys.stderr)
