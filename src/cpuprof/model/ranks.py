"""A multi-process decode (``decode --tp N`` or ``--instances N``): which ranks ran where, how each ended.

Saved as ``ranks.json`` beside one directory per rank (``rank-0/``, ...), each holding that rank's
own profile. Written before the ranks start and again when they have all ended, so even a run
whose parent was killed says which ranks there were and where their profiles are.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import CpuprofError
from .codec import DecodeError, from_json, to_json

RANKS_FORMAT = "cpuprof-ranks"
RANKS_VERSION = 1
RANKS_FILENAME = "ranks.json"


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


@dataclass
class MultiRun:
    mode: str  # "tp" or "instances"
    world_size: int
    backend: str | None
    argv: list[str]
    timeout_s: float
    ranks: list[RankOutcome] = field(default_factory=list)
    finished: bool = False  # every rank has ended (successfully or not)
    interrupted: bool = False  # a SIGINT/SIGTERM to the launcher was passed on to the ranks
    format: str = RANKS_FORMAT
    version: int = RANKS_VERSION

    @property
    def failures(self) -> list[str]:
        """How each failed rank ended, the first to fail first (the others usually followed it)."""
        failed = [r for r in self.ranks if r.failure]
        failed.sort(key=lambda r: (r.ended_s is None, r.ended_s or 0.0))
        return [r.failure for r in failed if r.failure]

    def save(self, directory: Path) -> None:
        path = directory / RANKS_FILENAME
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(to_json(self), indent=1))
        tmp.replace(path)

    @staticmethod
    def load(path: str | Path) -> MultiRun:
        p = Path(path)
        if p.is_dir():
            p = p / RANKS_FILENAME
        try:
            data = json.loads(p.read_text())
        except FileNotFoundError:
            raise CpuprofError(f"{p}: no such file") from None
        except (OSError, ValueError) as exc:
            raise CpuprofError(f"{p}: not a readable ranks file ({exc})") from None
        if not isinstance(data, dict) or data.get("format") != RANKS_FORMAT:
            raise CpuprofError(f"{p}: not a cpuprof ranks file")
        try:
            return from_json(MultiRun, data, "ranks")
        except DecodeError as exc:
            raise CpuprofError(f"{p}: malformed ranks file ({exc})") from None
