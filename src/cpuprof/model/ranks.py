"""A multi-process decode (``decode --tp N`` or ``--instances N``): which ranks ran where, how each ended.

Saved as ``ranks.json`` beside one directory per rank (``rank-0/``, ...), each holding that rank's
own profile. Written before the ranks start and again when they have all ended, so even a run
whose parent was killed says which ranks there were and where their profiles are.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import FileFormatError
from .io import FileKind, read_versioned, write_versioned
from .profile import Profile

RANKS_FILE = FileKind(name="ranks file", format="cpuprof-ranks", version=1, filename="ranks.json",
                      written_by="cpuprof decode --tp/--instances or run --nproc")
RANKS_FORMAT = RANKS_FILE.format
RANKS_VERSION = RANKS_FILE.version
RANKS_FILENAME = RANKS_FILE.filename


@dataclass
class RankOutcome:
    rank: int
    dir: str  # the rank's directory, relative to ranks.json's
    cpus: list[int]
    node: int | None  # the NUMA node its memory was bound to; None: not bound
    threads: int
    returncode: int | None = None  # None: still running, or the launcher never saw it end
    ended_s: float | None = None  # when it ended, seconds after the ranks started
    failure: str | None = None  # one line: how it failed and what it saved


# decode --tp, decode --instances, run --nproc
GROUP_MODES = ("tp", "instances", "nproc")


@dataclass
class MultiRun:
    mode: str  # one of GROUP_MODES
    world_size: int
    backend: str | None
    argv: list[str]
    timeout_s: float
    ranks: list[RankOutcome] = field(default_factory=list)
    finished: bool = False  # every rank has ended (successfully or not)
    interrupted: bool = False  # a SIGINT/SIGTERM to the launcher was passed on to the ranks
    format: str = RANKS_FORMAT
    version: int = RANKS_VERSION

    def validate(self) -> None:
        """Counts positive, ranks within the group, and each rank's directory inside the group's (a
        report reads its profile there); raises FileFormatError naming the first that is not."""
        if self.mode not in GROUP_MODES:
            raise FileFormatError(f"mode {self.mode!r} is not one of {', '.join(GROUP_MODES)}")
        if self.world_size < 1:
            raise FileFormatError(f"world_size is {self.world_size}, not a positive count")
        for r in self.ranks:
            if not 0 <= r.rank < self.world_size:
                raise FileFormatError(f"rank {r.rank} is not one of the {self.world_size} ranks")
            if any(cpu < 0 for cpu in r.cpus):
                raise FileFormatError(f"rank {r.rank} has a negative CPU number")
            if Path(r.dir).is_absolute() or ".." in Path(r.dir).parts or not r.dir:
                raise FileFormatError(f"rank {r.rank}'s directory {r.dir!r} is not inside the group's")

    def failed(self) -> list[RankOutcome]:
        """The ranks that failed, the first to fail first (the others usually followed it)."""
        failed = [r for r in self.ranks if r.failure]
        failed.sort(key=lambda r: (r.ended_s is None, r.ended_s or 0.0))
        return failed

    @property
    def failures(self) -> list[str]:
        """How each failed rank ended, the first to fail first."""
        return [r.failure for r in self.failed() if r.failure]

    def profiles(self, directory: str | os.PathLike[str]) -> list[Profile | None]:
        """Each rank's saved profile, in ``ranks`` order (None: the rank saved none)."""
        from .run_layout import load_rank_profiles

        return load_rank_profiles([r.dir for r in self.ranks], directory)

    def save(self, directory: str | os.PathLike[str]) -> Path:
        """``directory/ranks.json``, atomically."""
        return write_versioned(Path(directory) / RANKS_FILENAME, RANKS_FILE, self)

    @staticmethod
    def load(path: str | os.PathLike[str]) -> MultiRun:
        """A ranks file, or ranks.json in a directory; FileFormatError (one line) otherwise."""
        return read_versioned(path, RANKS_FILE, MultiRun)
