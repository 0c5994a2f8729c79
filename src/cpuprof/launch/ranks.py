"""Several decode children at once: tensor-parallel ranks of one model, or independent instances.

Each rank is a whole decode child (:mod:`cpuprof.launch.child`), launched as ``decode`` launches
one, on its own share of the machine: the NUMA nodes in order, ``ranks_per_node`` to a node, each
node's CPUs split evenly between its ranks, memory bound to the node where there are several.
Tensor-parallel ranks meet through torch.distributed's env:// rendezvous on localhost (RANK,
WORLD_SIZE, MASTER_ADDR, MASTER_PORT, as torchrun sets them).

A rank that fails makes the others fail soon after (their next all-reduce loses its peer, or times
out); the ones still running after ``timeout_s`` are interrupted (they save what they measured),
then killed. Every rank's profile stays in its directory, and ``ranks.json`` says how each ended.
"""

from __future__ import annotations

import dataclasses
import math
import os
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .. import exit_codes
from ..errors import ChildFailed, UsageError
from ..machine.topology import read_topology
from ..model import Topology, format_cpulist, run_layout
from ..model.ranks import MultiRun, RankOutcome
from ..safe_text import printable
from . import environment, parent
from .options import DecodeOptions, RankConfig

MODES = ("tp", "instances")
BACKENDS = ("gloo", "ccl")
DEFAULT_TIMEOUT_S = 120.0
CHILD_LOG = "child.log"


@dataclass
class RankPlacement:
    rank: int
    cpus: list[int]
    node: int | None  # memory bound to this node; None: the kernel's default policy


def place_ranks(n: int, settings: environment.LaunchSettings, topology: Topology,
                ranks_per_node: int | None = None, allowed_cpus: set[int] | None = None) -> list[RankPlacement]:
    """Splits the machine (or the --numa node / --cpus set asked for) between ``n`` ranks.

    Ranks fill the NUMA nodes in order, ``ranks_per_node`` each (by default as few per node as
    fit: one per node when there are enough nodes), and share their node's CPUs evenly, in
    contiguous blocks so that a rank's threads are neighbours. Raises UsageError when a rank
    would get no CPU or the nodes cannot hold the ranks.
    """
    if n < 1:
        raise UsageError(f"expected at least one rank, got {n}")
    allowed = set(os.sched_getaffinity(0)) if allowed_cpus is None else allowed_cpus
    chosen = set(settings.cpus) if settings.cpus is not None else set(topology.online_cpus)
    chosen &= allowed
    if settings.numa is not None:
        if settings.numa not in topology.node_ids:
            raise UsageError(f"--numa {settings.numa}: this machine has NUMA node(s) "
                             f"{format_cpulist(topology.node_ids)}; pick one of them or drop --numa")
        nodes = [(settings.numa, sorted(chosen & set(topology.node(settings.numa).cpus)))]
    else:
        nodes = [(node_id, sorted(chosen & set(topology.node(node_id).cpus))) for node_id in topology.node_ids]
        nodes = [(node_id, cpus) for node_id, cpus in nodes if cpus]
        if not nodes:  # a topology without node information: the CPUs as one node
            nodes = [(0, sorted(chosen))]
    if ranks_per_node is None:
        ranks_per_node = math.ceil(n / len(nodes))
    elif ranks_per_node < 1:
        raise UsageError(f"--ranks-per-node {ranks_per_node}: expected a positive whole number")
    needed_nodes = math.ceil(n / ranks_per_node)
    if needed_nodes > len(nodes):
        raise UsageError(f"{n} ranks at {ranks_per_node} per node need {needed_nodes} NUMA nodes; "
                         f"{len(nodes)} usable here ({', '.join(str(i) for i, _ in nodes)}): "
                         "raise --ranks-per-node")
    bind_memory = settings.numa is not None or len(topology.node_ids) > 1
    placements = []
    for r in range(n):
        node_id, cpus = nodes[r // ranks_per_node]
        on_node = min(ranks_per_node, n - (r // ranks_per_node) * ranks_per_node)
        k = r % ranks_per_node
        # Whole physical cores where there are enough, so no two ranks share a core's hyperthreads.
        cores = topology.cores(cpus)
        units = cores if len(cores) >= on_node else [[cpu] for cpu in cpus]
        share = len(units) // on_node
        if share == 0:
            raise UsageError(f"{on_node} ranks on node {node_id} but it has only {len(cpus)} usable CPU(s) "
                             f"({format_cpulist(cpus)}): fewer ranks, or more nodes")
        mine = sorted(cpu for unit in units[k * share:(k + 1) * share] for cpu in unit)
        placements.append(RankPlacement(rank=r, cpus=mine, node=node_id if bind_memory else None))
    return placements


def free_port() -> int:
    """A TCP port free on localhost now, for the rendezvous (bound and released: a race with
    another program is possible but the rendezvous then fails with a clear error)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def check_options(options: DecodeOptions, mode: str, n: int, backend: str) -> None:
    """What makes a multi-process decode impossible, found before anything starts."""
    from ..workload.presets import resolve_config

    if mode not in MODES:
        raise UsageError(f"unknown multi-process mode {mode!r}; expected one of {', '.join(MODES)}")
    if n < 1:
        flag = "--tp" if mode == "tp" else "--instances"
        raise UsageError(f"{flag} {n}: expected a positive whole number")
    if mode != "tp":
        return
    wl = options.workload
    if wl.hf:
        raise UsageError("--tp splits the built-in model; a --hf checkpoint runs as one process (or use --instances)")
    if wl.compile:
        raise UsageError("--tp runs the model eagerly: --compile would have to trace through the all-reduces")
    if backend not in BACKENDS:
        raise UsageError(f"--backend {backend}: expected one of {', '.join(BACKENDS)}")
    if backend == "ccl":
        import importlib.util

        if importlib.util.find_spec("oneccl_bindings_for_pytorch") is None:
            raise UsageError("--backend ccl needs oneccl_bindings_for_pytorch (Intel's oneCCL for PyTorch), "
                             "which is not installed; the default gloo needs nothing")
    cfg = resolve_config(wl.preset, wl.overrides)
    problem = cfg.shard_problem(n) or cfg.quant_problem(wl.weight_quant(), n)
    if problem is not None:
        raise UsageError(f"--tp {n}: {problem}")


@dataclass
class PreparedRank:
    """One rank ready to start: where it runs, its validated launch, the child's config, its directory."""

    place: RankPlacement
    resolved: environment.ResolvedLaunch
    config: object
    directory: Path


def rank_launches(settings: environment.LaunchSettings, out_dir: Path, n: int,
                  ranks_per_node: int | None) -> list[tuple[RankPlacement, environment.LaunchSettings, Path]]:
    """Each rank's launch settings (its CPUs, its node, its threads: --threads, or one per CPU) and directory."""
    placements = place_ranks(n, settings, read_topology(), ranks_per_node)
    parent.check_out_dir(out_dir)
    out = []
    for place in placements:
        launch = dataclasses.replace(settings, cpus=place.cpus, numa=place.node)
        if launch.threads is None:
            launch = dataclasses.replace(launch, threads=len(place.cpus))
        out.append((place, launch, run_layout.rank_dir(out_dir, place.rank)))
    return out


def launch_ranks(options: DecodeOptions, out_dir: Path, mode: str, n: int, ranks_per_node: int | None = None,
                 backend: str = "gloo", timeout_s: float = DEFAULT_TIMEOUT_S, relay: bool = True) -> MultiRun:
    """``decode --tp N`` / ``--instances N``: ``n`` decode children, supervised; returns what ranks.json says.
    ``relay``: copy rank 0's log to stderr as it comes (a sweep keeps it in the log only)."""
    check_options(options, mode, n, backend)

    def prepare_rank(place: RankPlacement, launch: environment.LaunchSettings,
                     rank_dir: Path) -> tuple[environment.ResolvedLaunch, object]:
        resolved, config = parent.prepare(dataclasses.replace(options, launch=launch, out=str(rank_dir)), rank_dir)
        config.rank = RankConfig(mode=mode, rank=place.rank, world_size=n,
                                 backend=backend if mode == "tp" else None, timeout_s=timeout_s,
                                 cpus=list(place.cpus))
        return resolved, config

    return run_group(options.launch, out_dir, n, ranks_per_node, prepare_rank, mode=mode,
                     backend=backend if mode == "tp" else None, timeout_s=timeout_s,
                     profiled=options.profile.enabled, relay=relay,
                     check_group=lambda: _check_group_memory(options, mode, n))


def run_group(launch: environment.LaunchSettings, out_dir: Path, n: int, ranks_per_node: int | None,
              prepare_rank: Callable[[RankPlacement, environment.LaunchSettings, Path],
                                     tuple[environment.ResolvedLaunch, object]],
              mode: str, backend: str | None, timeout_s: float, profiled: bool, module: str = parent.CHILD_MODULE,
              relay: bool = True, check_group: Callable[[], None] | None = None,
              program_output: bool = False) -> MultiRun:
    """The one way a group of children runs (decode --tp/--instances, run --nproc, a sweep's group):
    the machine split between ``n`` ranks, each rank's child config made by ``prepare_rank`` (its
    bad input named with the rank and its CPUs), ``check_group`` (what all of them together
    need), then every rank started, supervised and recorded in ranks.json."""
    prepared = []
    for place, rank_launch, rank_dir in rank_launches(launch, out_dir, n, ranks_per_node):
        try:
            resolved, config = prepare_rank(place, rank_launch, rank_dir)
        except UsageError as exc:
            raise UsageError(f"rank {place.rank} (CPUs {format_cpulist(place.cpus)}): {exc}") from exc
        prepared.append(PreparedRank(place, resolved, config, rank_dir))
    if check_group is not None:
        check_group()
    return launch_group(prepared, out_dir, mode, backend, timeout_s, profiled=profiled, module=module, relay=relay,
                        program_output=program_output)


def group_failure(run: MultiRun, out_dir: Path, member: str = "rank") -> ChildFailed | None:
    """The one error for a group some of whose children failed, or None: the first failure's line, how
    many failed after it, where the profiles are; its exit code from :func:`cpuprof.exit_codes.of_group`.
    ``member``: what the line calls one child ("rank", "process")."""
    failed = run.failed()
    if not failed:
        return None
    first = failed[0].failure or f"rank {failed[0].rank} failed"
    others = f"{member}(es)" if member.endswith("s") else f"{member}(s)"
    more = f" (and {len(failed) - 1} more {others} failed after it)" if len(failed) > 1 else ""
    code = exit_codes.of_group([exit_codes.FAILED if r.returncode is None else r.returncode for r in failed],
                               run.interrupted)
    return ChildFailed(f"{first}{more}; every {member}'s profile so far is in {out_dir}/rank-*", code)


def _check_group_memory(options: DecodeOptions, mode: str, n: int) -> None:
    """Each rank alone fits (prepare checked that); all of them at once must fit too."""
    from ..workload.dtypes import dtype_bytes
    from ..workload.presets import check_memory, resolve_config

    wl = options.workload
    if wl.hf:
        return  # a checkpoint's estimate is per process; --instances of one checks it in prepare
    cfg = resolve_config(wl.preset, wl.overrides)
    check_memory(cfg, dtype_bytes(wl.dtype), wl.batch, wl.prompt_len + wl.new_tokens, processes=n,
                 shards=n if mode == "tp" else 1, quant=wl.weight_quant())


START_BARRIER_PREFIX = ".ready-rank-"


def start_barrier(group_dir: Path, rank: int, world_size: int, timeout_s: float, poll_s: float = 0.005) -> None:
    """Instances have no process group to meet in: each marks itself ready with a file in the
    group's directory and waits until every instance has. Raises TimeoutError naming who is missing."""
    (group_dir / f"{START_BARRIER_PREFIX}{rank}").touch()
    deadline = time.monotonic() + timeout_s
    while True:
        missing = [r for r in range(world_size) if not (group_dir / f"{START_BARRIER_PREFIX}{r}").exists()]
        if not missing:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"instance(s) {', '.join(map(str, missing))} not ready after {timeout_s:g} s")
        time.sleep(poll_s)


def launch_group(prepared: list[PreparedRank], out_dir: Path, mode: str, backend: str | None, timeout_s: float,
                 profiled: bool, module: str = parent.CHILD_MODULE, relay: bool = True,
                 program_output: bool = False) -> MultiRun:
    """Starts every prepared rank with torchrun's environment, supervises them, writes ranks.json.
    Every rank's output goes to child.log in its directory; rank 0's is relayed as it comes (unless
    ``relay`` is False): cpuprof's lines to stderr, marked with the rank, and with ``program_output``
    (run --nproc, a report for a person) the program's own to stdout as it printed them."""
    n = len(prepared)
    port = free_port()
    run = MultiRun(mode=mode, world_size=n, backend=backend, argv=list(sys.argv), timeout_s=timeout_s,
                   ranks=[RankOutcome(rank=p.place.rank, dir=p.directory.name, cpus=list(p.place.cpus),
                                      node=p.place.node, threads=p.resolved.settings.threads or len(p.place.cpus))
                          for p in prepared])
    run.save(out_dir)
    for stale in out_dir.glob(f"{START_BARRIER_PREFIX}*"):
        stale.unlink()  # an earlier group's marks in this directory would open the barrier early
    member = "instance" if mode == "instances" else "rank"  # independent decodes are not ranks of a group
    log_relay = LogRelay(prepared[0].directory / CHILD_LOG, label=f"{member} 0 of {n}", program_output=program_output)
    with parent.Supervision() as group:
        for p in prepared:
            env = {"RANK": str(p.place.rank), "LOCAL_RANK": str(p.place.rank), "WORLD_SIZE": str(n),
                   "LOCAL_WORLD_SIZE": str(n), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
            group.add(parent.start_child(p.resolved, p.config, p.directory, profiled,
                                         log=p.directory / CHILD_LOG, module=module, extra_env=env))
        ended = group.wait(timeout_s, on_poll=log_relay.poll if relay else None)
    if relay:
        log_relay.poll()
    first = min((e for e in ended if e.returncode != 0), key=lambda e: e.ended_s, default=None)
    for p, e in zip(prepared, ended, strict=True):
        outcome = parent.finish_child(p.directory, e.returncode, interrupted=e.interrupted)
        entry = run.ranks[p.place.rank]
        entry.returncode = e.returncode
        entry.ended_s = round(e.ended_s, 3)
        entry.failure = parent.failure_message(outcome, child=f"{member} {p.place.rank}")
        if entry.failure is None:
            continue
        if outcome.interrupted:
            run.interrupted = True  # "rank K was interrupted; ..."
        elif e.stopped_by is not None and first is not None:
            entry.failure = (f"{member} {p.place.rank} was still running {timeout_s:g} s after {member} "
                             f"{first.index} failed and was stopped ({e.stopped_by})")
        elif e.returncode in exit_codes.REPORTED_BY_CHILD:
            own = _last_error_line(p.directory / CHILD_LOG)
            entry.failure = f"{member} {p.place.rank}: {own}" if own else entry.failure
    run.finished = True
    run.save(out_dir)
    return run


class LogRelay:
    """Copies a child's log as it grows, whole lines only: cpuprof's lines to stderr, each marked with
    ``label``; with ``program_output``, the others (the program's) to stdout as they are."""

    def __init__(self, path: Path, label: str, program_output: bool = False) -> None:
        self.path = path
        self.label = label
        self.program_output = program_output  # lines not cpuprof's are a program's: to stdout, unmarked
        self.offset = 0
        self.pending = ""

    def poll(self) -> None:
        try:
            with open(self.path, errors="replace") as log:
                log.seek(self.offset)
                text = log.read()
                self.offset = log.tell()
        except OSError:
            return
        lines = (self.pending + text).split("\n")
        self.pending = lines.pop()
        for line in lines:
            if line.startswith("cpuprof: "):
                line = line[len("cpuprof: "):]
            elif self.program_output:
                sys.stdout.write(printable(line) + "\n")
                continue
            if line.strip():
                sys.stderr.write(printable(f"cpuprof: [{self.label}] {line}") + "\n")
        sys.stdout.flush()
        sys.stderr.flush()


def _last_error_line(log: Path) -> str | None:
    """The child's own one-line error (``cpuprof: error: ...``), from its log, if it wrote one."""
    if not log.is_file():
        return None
    lines = [line for line in log.read_text(errors="replace").splitlines() if line.startswith("cpuprof: error: ")]
    return lines[-1][len("cpuprof: error: "):] if lines else None
