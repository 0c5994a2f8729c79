"""The layout of a run's directory, and its loading: the one module that knows where each file of a
run lives. Launchers write through these names, readers find through them, and analysis never
opens a file (it is given what is loaded here).

    DIR/profile.json                 the program's (or decode's) profile      io.PROFILE_FILENAME
    DIR/processes/PID/profile.json   each process the program started          process_dir
    DIR/front_end.json               the program's threads given the launch's CPUs, by one it started
    DIR/window-N/...                 each window of an --on-demand run          window_dir
    DIR/rank-R/profile.json          each rank of decode --tp/--instances, run --nproc   rank_dir
    DIR/ranks.json, DIR/compare.json the group's and the sweep's own files      model.ranks, model.compare
    DIR/merge.json, DIR/hosts/H/...  a run merged from several hosts' runs      model.merged

A window holds what a whole run does (the program's profile and its processes/).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ..safe_text import say
from .io import PROFILE_FILENAME, present
from .merged import HOSTS_DIRNAME, MERGE_FILENAME, MergedRun
from .profile import Profile

PROCESSES_DIRNAME = "processes"
FRONT_END_FILENAME = "front_end.json"
WINDOW_PREFIX = "window-"
RANK_PREFIX = "rank-"

Where = str | os.PathLike[str]


def processes_dir(root: Where) -> Path:
    return Path(root) / PROCESSES_DIRNAME


def process_dir(root: Where, pid: int) -> Path:
    return processes_dir(root) / str(pid)


def process_place(pid: int) -> str:
    """A followed process's directory relative to its run's (or window's): ``processes/PID``."""
    return f"{PROCESSES_DIRNAME}/{pid}"


def window_dir(root: Where, window: int) -> Path:
    return Path(root) / f"{WINDOW_PREFIX}{window}"


def windows_of(root: Where) -> list[Path]:
    """The window directories of an --on-demand run, in window order."""
    found = [p for p in Path(root).glob(f"{WINDOW_PREFIX}*")
             if p.is_dir() and p.name.removeprefix(WINDOW_PREFIX).isdigit()]
    return sorted(found, key=lambda p: int(p.name.removeprefix(WINDOW_PREFIX)))


LOST_FILENAME = "lost.txt"  # beside where a window's profile would be: why it could not be saved


def lost_windows(root: Where) -> list[tuple[int, str]]:
    """(window, why) for every process's window that could not be saved (a full disk, say), as its
    process said in LOST_FILENAME once it could."""
    found = []
    for window in windows_of(root):
        for marker in sorted(window.rglob(LOST_FILENAME)):
            try:
                why = marker.read_text(errors="replace")[:500].strip()
            except OSError:
                why = "(unreadable)"
            found.append((int(window.name.removeprefix(WINDOW_PREFIX)), why))
    return found


def rank_dirname(rank: int | str) -> str:
    """``rank-R``; R may be a placeholder ("N") in what a report says."""
    return f"{RANK_PREFIX}{rank}"


def rank_dir(root: Where, rank: int) -> Path:
    return Path(root) / rank_dirname(rank)


def window_requests_dir(root: Where) -> Path:
    """Where ``cpuprof signal`` leaves each start or stop it asks of an --on-demand launcher, in order."""
    return Path(root) / ".window-requests"


def run_trees(root: Where) -> list[Path]:
    """The directories under a run that hold profiles of their own: processes/, every window, and a
    merged run's hosts/ (only a merged run's: a directory named hosts is someone else's otherwise)."""
    return [processes_dir(root), *windows_of(root), *([Path(root) / HOSTS_DIRNAME] if is_merged(root) else [])]


# -- the processes a program started ------------------------------------------------------------------
@dataclass
class ProcessProfile:
    """One process's saved profile and where it is: the program's own (``directory`` is the run's)
    or a followed one's (``processes/<pid>``)."""

    directory: Path
    profile: Profile
    followed: bool
    host: str | None = None  # in a merged run: the host's label
    # In a merged run: added to its times, they are the reference host's (None: its host not aligned).
    clock_offset_ns: int | None = 0
    clock_residual_ns: int = 0  # in a merged run: how well that offset is known


def _process_entries(root: Where) -> Iterator[Path]:
    base = processes_dir(root)
    if base.is_dir():
        yield from sorted((e for e in base.iterdir() if e.name.isdigit()), key=lambda e: int(e.name))


def has_followed(root: Where) -> bool:
    """Whether a run directory holds profiles of processes its program started (a merged run's:
    always, each host's program and processes being those of one run)."""
    if is_merged(root):
        return True
    return any((entry / PROFILE_FILENAME).is_file() for entry in _process_entries(root))


def is_merged(root: Where) -> bool:
    return present(Path(root) / MERGE_FILENAME)


def unsaved_processes(root: Where) -> list[int]:
    """The followed processes that started a profile (their directory exists) but saved none."""
    return [int(e.name) for e in _process_entries(root) if not (e / PROFILE_FILENAME).exists()]


def iter_processes(root: Where, warn: bool = True) -> Iterator[ProcessProfile]:
    """The program's profile (if it saved one) and every followed process's, in pid order, one at
    a time (a run may hold thousands). A followed profile that cannot be read is one warning line;
    the others still count. A merged run's: each host's in turn, labelled, with its clock offset."""
    if is_merged(root):
        merged = MergedRun.load(root)
        for host in merged.hosts:
            where = merged.host_dir(root, host)
            if where.is_symlink() or not where.is_dir() or is_merged(where):
                if warn:  # a merged run's hosts are copies it made: a link, or a merge inside, is not one
                    say(f"cpuprof: warning: {where} is not a host's copied run: left out")
                continue
            for p in iter_processes(where, warn):
                p.host, p.clock_offset_ns, p.clock_residual_ns = host.label, host.offset_ns, host.residual_ns or 0
                yield p
        return
    if (Path(root) / PROFILE_FILENAME).exists():
        yield ProcessProfile(Path(root), Profile.load(root), followed=False)
    for entry in _process_entries(root):
        if not (entry / PROFILE_FILENAME).exists():
            continue
        try:
            profile = Profile.load(entry)
        except Exception as exc:
            if warn:
                say(f"cpuprof: warning: process {entry.name}'s profile is left out: {exc}")
            continue
        yield ProcessProfile(entry, profile, followed=True)


def load_processes(root: Where, warn: bool = True) -> list[ProcessProfile]:
    """:func:`iter_processes`, all in memory: for a handful of processes."""
    return list(iter_processes(root, warn))


# -- the ranks of a group -----------------------------------------------------------------------------
def load_rank_profiles(rank_dirs: list[str], root: Where) -> list[Profile | None]:
    """Each rank's profile (``rank_dirs``: as ranks.json names them, relative to ``root``), None for a
    rank that saved none."""
    profiles: list[Profile | None] = []
    for name in rank_dirs:
        path = Path(root) / name / PROFILE_FILENAME
        profiles.append(Profile.load(path) if present(path) else None)
    return profiles
