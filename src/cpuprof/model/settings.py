"""The settings of a launched run: what was asked, and what the child read back as in force."""

from __future__ import annotations

from dataclasses import dataclass, field

from .machine import OpenMPInfo, Topology


@dataclass
class MemPolicy:
    mode: str  # default, bind, interleave, preferred, ...
    nodes: list[int] = field(default_factory=list)
    error: str | None = None  # why it could not be read


@dataclass
class FrontEndGivenBack:
    """The program's process, bound by the launch's OpenMP binding, started a process importing torch
    before it had run an OpenMP team: a front end, whose threads on the launch's first CPUs that
    process gave the launch's whole set (launch.follow_env.free_the_front_end)."""

    pid: int  # the program's process
    by_pid: int  # the process it started, which moved them
    threads: int  # threads moved
    cpus_from: list[int]  # the CPUs the binding had put them on
    cpus_to: list[int]  # the launch's


@dataclass
class Requested:
    """What the launcher was asked for, after validation (the child's CPU set is resolved)."""

    threads: int
    cpus: list[int]
    bind: str  # close, spread, none
    places: str | None  # OMP_PLACES for libgomp
    omp: str  # gnu, intel
    omp_library: str | None  # the preloaded runtime; None: torch's own libgomp
    allocator: str  # default, jemalloc, tcmalloc
    allocator_library: str | None
    mempolicy: MemPolicy
    env: dict[str, str] = field(default_factory=dict)  # variables the launcher set (LD_PRELOAD aside)


@dataclass
class ThreadPlacement:
    tid: int
    name: str
    state: str  # R, S, D, ... from /proc
    affinity: list[int]
    last_cpu: int


@dataclass
class TorchThreads:
    num_threads: int
    num_interop_threads: int
    parallel_info: str


@dataclass
class AllocatorInfo:
    allocator: str  # jemalloc, tcmalloc
    path: str


@dataclass
class WeightPages:
    """Where some memory's pages live (the model's weights), from move_pages(2).

    When the memory spans more pages than were queried, the counts cover an evenly spaced
    sample; multiply by :attr:`scale` to estimate whole-region counts.
    """

    nodes: dict[int, int] = field(default_factory=dict)  # node -> queried pages resident there
    not_present: int = 0  # queried pages never touched or swapped out (-ENOENT)
    errors: dict[str, int] = field(default_factory=dict)  # other statuses by errno name (EFAULT: zero page)
    pages_total: int = 0
    pages_queried: int = 0
    page_size: int = 0

    @property
    def scale(self) -> float:
        return self.pages_total / self.pages_queried if self.pages_queried else 0.0


@dataclass
class InForce:
    """Read back inside the child, from the kernel and the libraries actually mapped."""

    pid: int
    threads: list[ThreadPlacement]
    mempolicy: MemPolicy
    openmp: OpenMPInfo
    allocators: list[AllocatorInfo] = field(default_factory=list)
    torch: TorchThreads | None = None
    env: dict[str, str] = field(default_factory=dict)  # OMP_*, KMP_*, GOMP_*, MKL_*, LD_PRELOAD, MALLOC_CONF
    weight_pages: WeightPages | None = None


@dataclass
class Settings:
    requested: Requested
    cpu_set: str  # how the CPU set was chosen, e.g. "node 0: 0-1"
    topology: Topology
    in_force: InForce | None = None  # read as the profile is saved (at the end, or a checkpoint)
    warnings: list[str] = field(default_factory=list)  # where what is in force differs from what was asked
    # Read as a program's process imported torch (cpuprof run): what is different in in_force was
    # changed since, by the program or a library it loaded (vLLM binds its own threads).
    at_start: InForce | None = None
    # A process the program started: the launch's thread and binding variables it began with set
    # other than before the launch (its program set them, as vLLM sets OMP_NUM_THREADS for its
    # worker), as "NAME=value" or "NAME unset".
    from_program: list[str] = field(default_factory=list)
    # A process the program started: what cpuprof gave back to it as it started, the launch's having
    # reached it by a way no launch variable says (the CPU set of the thread that started it).
    given_back: list[str] = field(default_factory=list)
    # The program's process: its threads given the launch's CPU set when it turned out to be a front end.
    front_end: FrontEndGivenBack | None = None
