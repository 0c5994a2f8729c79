"""The parent side of the decode launcher: turn thread/NUMA/OpenMP/allocator choices
into a child environment plus a pre-exec hook.

Why a pre-exec hook rather than setting things from inside the child: CPU
affinity and the memory policy are inherited across ``fork`` and kept across
``execve``, so applying them between the two means the child's very first
allocation, and every OpenMP worker thread it later creates, already obeys
them. OpenMP reads its environment once, at start-up, for the same reason.

The launcher owns the settings it decides: inherited thread-count and
thread-affinity variables, and OpenMP runtimes or allocators already in an
inherited ``LD_PRELOAD``, are dropped from the child's environment, so that a
``--omp gnu`` run cannot silently use libiomp5 because the shell preloaded it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import sys
import typing
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from fnmatch import fnmatch
from pathlib import Path
from typing import Final, Literal

from ..errors import CpuprofError, UsageError
from ..machine import numa
from ..machine.libraries import find_library
from ..machine.openmp import INTEL_OPENMP_HINT, find_intel_openmp
from ..model import MemPolicy, Requested, Topology, format_cpulist, parse_cpulist

# How OpenMP threads are placed on the chosen CPUs, which runtime runs them, which allocator is
# preloaded: the launch's enumerations, typed; the CLI takes its choices from these.
Bind = Literal["close", "spread", "none"]
Omp = Literal["gnu", "intel"]
Allocator = Literal["default", "jemalloc", "tcmalloc"]
BIND_CHOICES: Final[tuple[Bind, ...]] = typing.get_args(Bind)
OMP_CHOICES: Final[tuple[Omp, ...]] = typing.get_args(Omp)
ALLOCATOR_CHOICES: Final[tuple[Allocator, ...]] = typing.get_args(Allocator)

Blocktime = int | Literal["infinite"]

# libgomp has no time-based block time, only GOMP_SPINCOUNT: the number of
# busy-wait iterations (one relaxed load plus one PAUSE each) before a waiting
# thread sleeps on a futex. An approximation, measured on the Zen 5 machines
# here at about 38,000 iterations per millisecond; PAUSE latency differs by CPU
# generation (on older Intel cores it is ~10x shorter), so treat the mapping
# as order-of-magnitude.
GOMP_SPINS_PER_MS = 40_000

# Variables the launcher decides. Inherited values are removed so that, for
# example, a shell's OMP_PROC_BIND=true cannot turn a "--bind none" run into a
# bound one, or fight KMP_AFFINITY under the Intel runtime.
OWNED_VARS = (
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OMP_PROC_BIND",
    "OMP_PLACES",
    "GOMP_CPU_AFFINITY",
    "KMP_AFFINITY",
)

# In the program's environment: {variable: [the launch's value, the value before the launch]} for
# each owned variable set either way (None: unset; one not named was unset both ways). Named in
# launch/follow_env.py too, which imports only the standard library.
LAUNCH_ENV_VAR = "CPUPROF_LAUNCH_ENV"
# The launch's CPU set (a JSON list), which a process the program starts gets back where it inherited
# the one CPU of an OpenMP-bound thread instead (follow_env.give_back_the_cpu_set).
LAUNCH_CPUS_VAR = "CPUPROF_LAUNCH_CPUS"

# Preloaded libraries whose choice belongs to --omp / --allocator.
_OWNED_PRELOADS = ("libgomp*", "libiomp5*", "libomp.so*", "libjemalloc*", "libtcmalloc*")

_ALLOCATORS: dict[str, tuple[tuple[str, ...], str]] = {
    # --allocator: (file name patterns in preference order, Debian package)
    "jemalloc": (("libjemalloc.so*",), "libjemalloc2"),
    "tcmalloc": (("libtcmalloc_minimal.so*", "libtcmalloc.so*"), "libtcmalloc-minimal4"),
}


@dataclass
class LaunchSettings:
    """What the user asked for on the command line, parsed but not yet checked against the machine."""

    threads: int | None = None  # None: one per CPU of the chosen set
    numa: int | None = None
    cpus: list[int] | None = None
    bind: Bind = "close"
    omp: Omp = "gnu"
    blocktime_ms: Blocktime | None = None
    allocator: Allocator = "default"
    oversubscribe: bool = False


@dataclass(frozen=True)
class ResolvedLaunch:
    """Validated settings: the child's CPU set, memory nodes and environment."""

    settings: LaunchSettings
    cpus: list[int]
    """CPUs the child process (all its threads) is confined to."""
    mem_nodes: list[int]
    """Nodes memory is bound to with MPOL_BIND; empty keeps the kernel's default policy."""
    cpu_set_description: str
    """How the CPU set was chosen, for messages, e.g. "node 0: 0-1"."""
    places: str | None
    """OMP_PLACES ("cores" or "threads") for the GNU runtime; None when not used."""
    omp_library: str | None
    """Preloaded OpenMP runtime; None means torch's own libgomp."""
    allocator_library: str | None
    env: dict[str, str]
    """Variables to set in the child; LD_PRELOAD holds only the launcher's libraries."""

    def child_env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """The complete child environment: ``base`` (default os.environ) minus the
        variables and preloads the launcher owns, plus :attr:`env`."""
        source = os.environ if base is None else base
        result = {key: value for key, value in source.items() if key not in OWNED_VARS}
        inherited = [
            entry
            for entry in re.split(r"[:\s]+", source.get("LD_PRELOAD", ""))
            if entry and not any(fnmatch(os.path.basename(entry), p) for p in _OWNED_PRELOADS)
        ]
        # A cpuprof run inside a followed program (it runs `cpuprof decode`, say) is its own run:
        # its child is not one of the outer run's followed processes.
        result.pop("CPUPROF_FOLLOW", None)
        paths = [p for p in result.get("PYTHONPATH", "").split(os.pathsep)
                 if p and os.path.basename(os.path.normpath(p)) != "follow_boot"]
        if paths:
            result["PYTHONPATH"] = os.pathsep.join(paths)
        else:
            result.pop("PYTHONPATH", None)
        result.update(self.env)
        # The launch's own variables and what they were before it: a process the program starts gets
        # those back (launch/follow_env.py), so the launch's thread count and OpenMP binding are the
        # program's process's, not its workers' (its CPU set and memory policy are inherited by all).
        values = {key: [result.get(key), source.get(key)] for key in OWNED_VARS if key in result or key in source}
        result[LAUNCH_ENV_VAR] = json.dumps(values, sort_keys=True)
        result[LAUNCH_CPUS_VAR] = json.dumps(sorted(self.cpus))
        preload = [p for p in self.env.get("LD_PRELOAD", "").split(":") if p] + inherited
        if preload:
            result["LD_PRELOAD"] = ":".join(preload)
        else:
            result.pop("LD_PRELOAD", None)
        return result

    def preexec(self) -> Callable[[], None]:
        """A ``subprocess.Popen(preexec_fn=...)`` hook: pin the CPUs and bind memory, and tie the
        child's life to the launcher's.

        It runs in the forked child just before execve; all three survive execve, so torch and
        OpenMP start already confined. The child gets a SIGTERM when the launcher dies, however it
        died (``kill -9`` included): it saves what it measured and ends its followed processes,
        instead of running on unsupervised. (The signal follows the thread that started the child:
        the launcher starts its children from the thread that waits for them.)
        """
        cpus = list(self.cpus)
        nodes = list(self.mem_nodes)
        launcher = os.getpid()
        die_with_parent = parent_death_signal()  # looked up here: no dlopen in a forked child

        def apply() -> None:
            os.sched_setaffinity(0, cpus)
            if nodes:
                numa.set_mempolicy(numa.MPOL_BIND, nodes)
            die_with_parent(signal.SIGTERM)
            if os.getppid() != launcher:  # it died before the line above: nobody would supervise this run
                os._exit(1)

        return apply

    def requested(self) -> Requested:
        """What was asked for, as the profile records it (compared with what is in force)."""
        assert self.settings.threads is not None  # validate() resolved it
        return Requested(
            threads=self.settings.threads, cpus=list(self.cpus), bind=self.settings.bind, places=self.places,
            omp=self.settings.omp, omp_library=self.omp_library, allocator=self.settings.allocator,
            allocator_library=self.allocator_library,
            mempolicy=MemPolicy(mode="bind" if self.mem_nodes else "default", nodes=list(self.mem_nodes)),
            env={key: value for key, value in self.env.items() if key != "LD_PRELOAD"},
        )


_PR_SET_PDEATHSIG = 1


def parent_death_signal() -> Callable[[int], None]:
    """A function that asks, through prctl(PR_SET_PDEATHSIG), for a signal to this process when its
    parent (thread) ends."""
    import ctypes

    prctl = ctypes.CDLL(None, use_errno=True).prctl

    def ask(signum: int) -> None:
        if prctl(_PR_SET_PDEATHSIG, int(signum), 0, 0, 0) != 0:
            errno = ctypes.get_errno()
            raise OSError(errno, f"prctl(PR_SET_PDEATHSIG): {os.strerror(errno)}")

    return ask


def parse_threads(text: str) -> int:
    """Parse --threads: a positive whole number."""
    if not re.fullmatch(r"\d+", text.strip()) or int(text) < 1:
        raise UsageError(f"--threads {text}: expected a positive whole number")
    return int(text)


def parse_numa(text: str) -> int:
    """Parse --numa: a node number (whether it exists is checked by :func:`validate`)."""
    if not re.fullmatch(r"\d+", text.strip()):
        raise UsageError(f"--numa {text}: expected a NUMA node number (0, 1, ...)")
    return int(text)


def parse_blocktime(text: str) -> Blocktime:
    """Parse --blocktime: milliseconds a waiting OpenMP thread spins, or "infinite"."""
    value = text.strip().lower()
    if value == "infinite":
        return "infinite"
    if not re.fullmatch(r"\d+", value):
        raise UsageError(f"--blocktime {text}: expected milliseconds (0, 1, 200, ...) or 'infinite'")
    return int(value)


def parse_cpus(text: str, topology: Topology) -> list[int]:
    """Parse --cpus in the kernel's list syntax and check every CPU is online."""
    try:
        cpus = parse_cpulist(text)
    except ValueError:
        cpus = []
    if not cpus:
        raise UsageError(f"--cpus {text}: expected a CPU list like 0-3,8-11")
    _check_online(text, cpus, topology)
    return cpus


def _check_online(text: str, cpus: Collection[int], topology: Topology) -> None:
    outside = sorted(set(cpus) - set(topology.online_cpus))
    if outside:
        raise UsageError(
            f"--cpus {text}: CPU(s) {format_cpulist(outside)} not on this machine "
            f"(online CPUs: {format_cpulist(topology.online_cpus)})"
        )


def validate(
    settings: LaunchSettings,
    topology: Topology,
    *,
    allowed_cpus: Collection[int] | None = None,
    allowed_nodes: Collection[int] | None = None,
) -> ResolvedLaunch:
    """Check the settings against the machine and work out the child's environment.

    ``allowed_cpus``/``allowed_nodes`` are what this process may use (a cgroup
    cpuset can be narrower than the machine); by default they are read from the
    running process, pass them explicitly when ``topology`` is not this machine.
    Raises UsageError, naming the valid choices, for anything that cannot work.
    """
    _check_choice("--bind", settings.bind, BIND_CHOICES)
    _check_choice("--omp", settings.omp, OMP_CHOICES)
    _check_choice("--allocator", settings.allocator, ALLOCATOR_CHOICES)
    if settings.threads is not None and settings.threads < 1:
        raise UsageError(f"--threads {settings.threads}: expected a positive whole number")
    blocktime = settings.blocktime_ms
    if blocktime is not None and blocktime != "infinite" and blocktime < 0:
        raise UsageError(f"--blocktime {blocktime}: expected milliseconds (0, 1, 200, ...) or 'infinite'")

    cpus, description, mem_nodes = _cpu_set(settings, topology, allowed_cpus, allowed_nodes)
    if settings.threads is None:
        settings = dataclasses.replace(settings, threads=len(cpus))
    assert settings.threads is not None
    if settings.threads > len(cpus) and not settings.oversubscribe:
        raise UsageError(
            f"--threads {settings.threads}: only {len(cpus)} CPU{'s' if len(cpus) != 1 else ''} "
            f"in the chosen set ({description}); pass --oversubscribe to allow it"
        )

    omp_library = str(_find_intel_openmp()) if settings.omp == "intel" else None
    allocator_library = (
        str(_find_allocator(settings.allocator)) if settings.allocator != "default" else None
    )
    # One thread per physical core when there are enough cores; otherwise each
    # hardware thread has to be its own place. (KMP_AFFINITY has its own terms.)
    places = None
    if settings.omp == "gnu" and settings.bind != "none":
        places = "cores" if settings.threads <= len(topology.cores(cpus)) else "threads"

    # MKL_NUM_THREADS is removed (an owned variable) and never set: MKL then follows OMP_NUM_THREADS.
    # Set, it would outlive a program's own choice in the processes it starts: torch sizes its OpenMP
    # pool from MKL_NUM_THREADS at import, so vLLM's worker, given OMP_NUM_THREADS=1 and bound to one
    # CPU by vLLM, ran two OpenMP threads on that CPU and lost half its throughput.
    env = {"OMP_NUM_THREADS": str(settings.threads)}
    if settings.omp == "gnu":
        if places is not None:
            env["OMP_PROC_BIND"] = settings.bind
            env["OMP_PLACES"] = places
        if blocktime is not None:
            env["GOMP_SPINCOUNT"] = (
                "infinite" if blocktime == "infinite" else str(blocktime * GOMP_SPINS_PER_MS)
            )
    else:
        if settings.bind == "close":
            # compact,1,0: fill one thread per core before using a core's siblings.
            env["KMP_AFFINITY"] = "granularity=fine,compact,1,0"
        elif settings.bind == "spread":
            env["KMP_AFFINITY"] = "granularity=fine,scatter"
        if blocktime is not None:
            env["KMP_BLOCKTIME"] = str(blocktime)
    preload = [lib for lib in (omp_library, allocator_library) if lib]
    if preload:
        env["LD_PRELOAD"] = ":".join(preload)

    return ResolvedLaunch(
        settings=settings,
        cpus=cpus,
        mem_nodes=mem_nodes,
        cpu_set_description=description,
        places=places,
        omp_library=omp_library,
        allocator_library=allocator_library,
        env=env,
    )


def _check_choice(flag: str, value: str, choices: Sequence[str]) -> None:
    if value not in choices:
        raise UsageError(f"{flag} {value}: expected one of {', '.join(choices)}")


def _cpu_set(
    settings: LaunchSettings,
    topology: Topology,
    allowed_cpus: Collection[int] | None,
    allowed_nodes: Collection[int] | None,
) -> tuple[list[int], str, list[int]]:
    """The CPUs and memory nodes for the child, and a description of the CPU set."""
    allowed = set(os.sched_getaffinity(0) if allowed_cpus is None else allowed_cpus)
    requested_cpus = settings.cpus
    if requested_cpus is not None:
        if not requested_cpus:
            raise UsageError("--cpus: expected a CPU list like 0-3,8-11, got an empty one")
        cpulist = format_cpulist(requested_cpus)
        _check_online(cpulist, requested_cpus, topology)
        refused = sorted(set(requested_cpus) - allowed)
        if refused:
            raise UsageError(
                f"--cpus {cpulist}: CPU(s) {format_cpulist(refused)} are outside this process's "
                f"allowed CPUs ({format_cpulist(allowed)})"
            )

    if settings.numa is None:
        cpus = sorted(set(requested_cpus if requested_cpus is not None else topology.online_cpus) & allowed)
        if not cpus:
            raise UsageError(
                f"no usable CPU: online CPUs are {format_cpulist(topology.online_cpus)}, "
                f"this process may use {format_cpulist(allowed) or 'none'}"
            )
        description = f"--cpus {format_cpulist(cpus)}" if requested_cpus is not None else (
            f"all usable CPUs: {format_cpulist(cpus)}"
        )
        return cpus, description, []

    node_id = settings.numa
    if node_id not in topology.node_ids:
        raise UsageError(
            f"--numa {node_id}: this machine has NUMA node(s) {format_cpulist(topology.node_ids)}; "
            "pick one of them or drop --numa"
        )
    if allowed_nodes is None:
        try:
            allowed_nodes = numa.mems_allowed()
        except OSError as exc:
            raise CpuprofError(f"--numa {node_id}: this kernel cannot bind memory ({exc.strerror})") from exc
    if node_id not in allowed_nodes:
        raise UsageError(
            f"--numa {node_id}: this process may only allocate on node(s) "
            f"{format_cpulist(list(allowed_nodes))}"
        )
    node_cpus = topology.node(node_id).cpus
    cpus = sorted(set(node_cpus) & allowed & set(requested_cpus if requested_cpus is not None else node_cpus))
    if not cpus:
        if requested_cpus is not None:
            why = f"--cpus {format_cpulist(requested_cpus)} and --numa {node_id} share no usable CPU"
        else:
            why = f"--numa {node_id}: node {node_id} has no CPU this process may use"
        raise UsageError(
            f"{why} (node {node_id} has CPUs {format_cpulist(node_cpus) or 'none'}; "
            f"allowed CPUs: {format_cpulist(allowed)})"
        )
    suffix = f", --cpus {format_cpulist(requested_cpus)}" if requested_cpus is not None else ""
    return cpus, f"node {node_id}{suffix}: {format_cpulist(cpus)}", [node_id]


def _find_intel_openmp() -> Path:
    found = find_intel_openmp()
    if found is None:
        raise UsageError(
            f"--omp intel: libiomp5.so not found in {sys.prefix}/lib, the lib dirs next to "
            f"site-packages or the ldconfig cache; install it with: {INTEL_OPENMP_HINT}"
        )
    return found


def _find_allocator(name: str) -> Path:
    patterns, package = _ALLOCATORS[name]
    found = find_library(patterns, [Path(sys.prefix, "lib")])
    if found is None:
        raise UsageError(
            f"--allocator {name}: {patterns[0]} not found in {sys.prefix}/lib, the ldconfig cache "
            f"or the system lib dirs; install it with: apt-get install {package}"
        )
    return found
