"""Per-thread figures, and the scheduler's view of them: time spent waiting for a CPU.

Run-queue delay (the kernel's schedstat: time a thread was runnable but another task held its
CPU) is the sign that something else competed for the CPUs: another process, or more threads
than CPUs. It lowers throughput without any op being slower, so the report warns about it first.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .. import defaults
from ..model import Profile, ThreadStat
from ..units import fmt_ns, fmt_percent
from .labels import team_order, thread_label

# Threads the communication backends start (gloo's TCP loop and run loops, oneCCL's workers), by
# name. They wait on sockets by design: counted in the team, they would read as idle team members.
BACKEND_THREAD_PREFIXES = ("gloo", "pt_gloo", "ccl", "pt_ccl")


def is_backend_thread(thread: ThreadStat) -> bool:
    return thread.name.startswith(BACKEND_THREAD_PREFIXES)


def compute_team(profile: Profile) -> list[int]:
    """Indices into profile.threads of the threads that compute: the dispatching thread and the
    OpenMP workers it fans out to, not a communication backend's."""
    return [i for i, t in enumerate(profile.threads) if not is_backend_thread(t)]


@dataclass
class ThreadRow:
    index: int
    label: str
    thread: ThreadStat
    cpu_ns: int | None
    utilisation: float | None  # CPU time / profiled wall time
    run_delay_ns: int | None
    run_delay_share: float | None  # of the profiled wall time
    allowed_cpus: list[int] | None  # from the settings read back in the child, where known


# A thread under this share of a CPU that is not the dispatching thread is background (a serving
# engine's gloo, ZMQ and tokenizer threads): the threads table gives their kind one row.
BACKGROUND_UTILISATION = 0.01


def thread_kind(name: str) -> str:
    """A thread's name without its instance number: ``gloo_tcp_loop``, ``ZMQbg/IO/``, ``Thread-``."""
    return re.sub(r"[\d_\-./: ]+$", "", name) or name


def split_background(rows: list[ThreadRow]) -> tuple[list[ThreadRow], dict[str, list[ThreadRow]]]:
    """The rows to show one by one, and the background threads by kind: a kind is grouped only when it
    has more than one thread (one alone keeps its own row)."""
    background: dict[str, list[ThreadRow]] = {}
    for r in rows:
        if r.thread.role != "dispatch" and r.utilisation is not None and r.utilisation < BACKGROUND_UTILISATION:
            background.setdefault(thread_kind(r.thread.name), []).append(r)
    grouped = {kind: group for kind, group in background.items() if len(group) > 1}
    hidden = {id(r) for group in grouped.values() for r in group}
    return [r for r in rows if id(r) not in hidden], grouped


def thread_rows(profile: Profile) -> list[ThreadRow]:
    wall = profile.collection.wall_ns if profile.collection else 0
    placement = {}
    if profile.settings and profile.settings.in_force:
        placement = {t.tid: t.affinity for t in profile.settings.in_force.threads}
    rows = []
    for i in team_order(profile):
        t = profile.threads[i]
        cpu = t.cpu_ns
        rows.append(ThreadRow(
            index=i, label=thread_label(i), thread=t, cpu_ns=cpu,
            utilisation=cpu / wall if cpu is not None and wall else None,
            run_delay_ns=t.run_delay_ns,
            run_delay_share=t.run_delay_ns / wall if t.run_delay_ns is not None and wall else None,
            allowed_cpus=placement.get(t.tid),
        ))
    return rows


def run_queue_warning(profile: Profile, threshold: float = defaults.RUN_QUEUE_WARNING_SHARE) -> str | None:
    """One line when any working thread waited for a CPU for more than ``threshold`` of the run,
    beyond what cpuprof's own collector thread can have taken from it: on a run with no spare CPU
    the collector competes with the program, and that wait is the profiler's overhead (reported
    as such, with the in-process Python sampler's), not something else running on the machine."""
    wall = profile.collection.wall_ns if profile.collection else 0
    ours = profile.overhead.discovery_cpu_ns if profile.overhead else 0
    python = profile.sampling.python if profile.sampling is not None else None
    ours += (python.cpu_ns or 0) if python is not None else 0  # the in-process Python sampler's
    rows = [r for r in thread_rows(profile) if r.run_delay_ns is not None and r.run_delay_share is not None]
    waiting = sorted((r for r in rows if wall and ((r.run_delay_ns or 0) - ours) / wall > threshold),
                     key=lambda r: r.run_delay_share or 0.0, reverse=True)
    if not waiting:
        return None
    worst = ", ".join(f"{r.label} (tid {r.thread.tid}) {fmt_percent(r.run_delay_share or 0.0)}"
                      f" = {fmt_ns(r.run_delay_ns or 0)}" for r in waiting[:4])
    more = f" and {len(waiting) - 4} more" if len(waiting) > 4 else ""
    return (f"threads waited for a CPU while runnable (run-queue delay, from the kernel's schedstat): {worst}{more} "
            "of the profiled time. Something else ran on their CPUs (another process, or more threads than CPUs), "
            "so throughput here is below what this machine gives; check `top` or pin the run to idle CPUs.")
