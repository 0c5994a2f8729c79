"""How long a sweep's runs took on this machine, kept so that the next sweep of the same
configurations can say before its first run roughly how long it will take.

A run's time is most of all its start-up (torch's import, the model's build, the roofs' probe) and
its decode, which nothing measured predicts before one such run has been made here. So the
estimate is only ever made from earlier runs of the same configuration (its whole decode options,
the processes it runs, on a machine of the same name and CPU count); a configuration never run
here is said to be unknown, never guessed. The file sits beside the roofs cache; it is untrusted
input like every file read back (anything damaged in it is ignored), bounded, and written whole.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import hashlib
import json
import os
import socket
import statistics
from collections.abc import Iterator
from pathlib import Path

from ..model.codec import to_json
from ..output_file import write_text
from .options import DecodeOptions

FILE_NAME = "sweep_times.json"
# The newest entries kept: a few sweeps' worth of configurations and repetitions.
MAX_ENTRIES = 512
# The times kept per configuration (the newest), whose median is its estimate.
PER_CONFIG = 5


def history_path() -> Path:
    """Beside the roofs cache: $CPUPROF_CACHE_DIR, else $XDG_CACHE_HOME/cpuprof, else ~/.cache/cpuprof."""
    from ..machine.roofs import cache_path

    return cache_path().with_name(FILE_NAME)


def signature(options: DecodeOptions, values: dict[str, str]) -> str:
    """What decides how long a configuration's run takes: its decode options (where it writes left
    out), the processes it runs (tp/instances are not options but values) and the machine."""
    described = to_json(dataclasses.replace(options, out=None))
    layout = {axis: values[axis] for axis in ("tp", "instances") if axis in values}
    machine = [socket.gethostname(), os.cpu_count()]
    text = json.dumps([described, layout, machine], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def _read(path: Path) -> list[dict]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError, UnicodeDecodeError, RecursionError):
        return []
    entries = data.get("runs") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        return []
    return [e for e in entries if isinstance(e, dict) and isinstance(e.get("config"), str)
            and isinstance(e.get("wall_s"), (int, float)) and not isinstance(e.get("wall_s"), bool)
            and 0 < e["wall_s"] < 1e6]


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    import fcntl

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = open(path.with_name(path.name + ".lock"), "a")  # noqa: SIM115 (held across the yield)
    except OSError:
        yield
        return
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def record(config_signature: str, wall_s: float) -> None:
    """Keeps one finished run's time. Best effort and silent: a sweep never fails for its history."""
    path = history_path()
    try:
        with _locked(path):
            entries = _read(path)
            entries.append({"config": config_signature, "wall_s": round(wall_s, 2),
                            "at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")})
            write_text(path, json.dumps({"format": "cpuprof-sweep-times", "runs": entries[-MAX_ENTRIES:]},
                                        indent=0) + "\n", make_parents=True)
    except OSError:
        return


def estimate_line(todo: list[tuple[str, str]]) -> str:
    """Before a sweep's first run: about how long the runs still to make take, from earlier runs of
    the same configurations here; or which configurations have never run here, so no estimate.
    ``todo``: each run still to make, as its configuration's (label, signature)."""
    times: dict[str, list[float]] = {}
    for entry in _read(history_path()):
        times.setdefault(entry["config"], []).append(float(entry["wall_s"]))
    known_s, unknown = 0.0, []
    for label, config in todo:
        found = times.get(config)
        if found:
            known_s += statistics.median(found[-PER_CONFIG:])
        elif label not in unknown:
            unknown.append(label)
    if not todo:
        return ""
    if not unknown:
        return f"about {_duration(known_s)} in all, from earlier runs of these configurations here"
    if len(unknown) == len({label for label, _ in todo}):
        return ("no run of these configurations was made here before, so no estimate yet: the time left is said "
                "after each run")
    return (f"{len(unknown)} configuration(s) never ran here ({', '.join(unknown[:4])}"
            f"{', ...' if len(unknown) > 4 else ''}); the others' runs take about {_duration(known_s)}; the time "
            "left is said after each run")


def _duration(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds >= 90 else f"{seconds:.0f} s"
