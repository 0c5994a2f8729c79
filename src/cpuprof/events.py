"""Event presets and the resolution of ``--events`` into names the core can open.

A preset names what a question needs, hardware events included; what this machine cannot count
is dropped by the core's probe with one warning each, so the same preset works on a laptop with
a PMU and on a VM without one.
"""

from __future__ import annotations

from .defaults import MAX_EVENTS
from .errors import UsageError

# task-clock comes first everywhere: it is the CPU time every report is built on, and it is a
# software event that any kernel with perf_event_open can count.
PRESETS: dict[str, tuple[str, ...]] = {
    "default": (
        "task-clock", "context-switches", "cpu-migrations", "page-faults",
        "cycles", "instructions", "cache-references", "cache-misses",
    ),
    "software": ("task-clock", "context-switches", "cpu-migrations", "page-faults"),
    "memory": (
        "task-clock", "page-faults", "cycles", "instructions",
        "LLC-loads", "LLC-load-misses", "dTLB-loads", "dTLB-load-misses",
    ),
    "sched": (
        "task-clock", "context-switches", "cpu-migrations",
        "sched:sched_switch", "sched:sched_migrate_task", "syscalls:sys_enter_futex",
    ),
    "branches": ("task-clock", "cycles", "instructions", "branch-instructions", "branch-misses"),
}


def resolve(spec: str | list[str] | tuple[str, ...] | None) -> list[str]:
    """Expands a comma list of preset names and event names, keeping order, dropping repeats.

    ``task-clock`` is always added: without CPU time no report can say anything per thread.
    """
    if spec is None:
        items: list[str] = ["default"]
    elif isinstance(spec, str):
        items = [part.strip() for part in spec.split(",") if part.strip()]
    else:
        items = [part.strip() for part in spec if part.strip()]
    if not items:
        raise UsageError(f"--events is empty; give event names or one of the presets: {', '.join(PRESETS)}")
    names: list[str] = ["task-clock"]
    for item in items:
        for name in PRESETS.get(item, (item,)):
            if name not in names:
                names.append(name)
    if len(names) > MAX_EVENTS:
        raise UsageError(f"--events names {len(names)} events; at most {MAX_EVENTS} fit in one session")
    return names


def validate_names(names: list[str], native) -> None:
    """Raises UsageError naming the first event that is not an event at all (a typo).

    An event that exists but cannot be counted here is not an error: the core drops it with a
    warning. A name that parses as nothing is almost always a typo, and a silent drop would hide it.
    """
    for name in names:
        parsed = native.parse_event(name)
        if not parsed.ok:
            raise UsageError(f"{parsed.error}; presets: {', '.join(PRESETS)}")
