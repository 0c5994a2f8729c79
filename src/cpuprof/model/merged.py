"""A run merged from several hosts' (``cpuprof merge DIR... --out M``): each host's run directory,
copied whole under ``M/hosts/<label>/``, and how its clock relates to the others'.

Saved as ``merge.json``. Clocks are never assumed equal across hosts: each host's offset (added to
its CLOCK_MONOTONIC times, it gives the reference host's) is found from the data, and kept with how
well it holds (the residual), or is absent where nothing tied the host to the others.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import FileFormatError
from .io import FileKind, read_versioned, write_versioned

MERGE_FILE = FileKind(name="merged run", format="cpuprof-merge", version=1, filename="merge.json",
                      written_by="cpuprof merge")
MERGE_FILENAME = MERGE_FILE.filename
HOSTS_DIRNAME = "hosts"


@dataclass
class MergedHost:
    label: str  # its directory under hosts/: the host's name, made unique
    hostname: str  # as its profiles say
    source: str  # the directory it was merged from
    offset_ns: int | None = None  # added to its times, they are the reference host's; None: not aligned
    residual_ns: int | None = None  # after alignment, the 90th percentile of |end - reference end| of matched calls
    matched: int = 0  # collectives its offset was found from
    reference: bool = False  # the host the others are aligned to (the one with the lowest rank)


@dataclass
class MergedRun:
    hosts: list[MergedHost] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # one line each: what could not be merged or aligned
    format: str = MERGE_FILE.format
    version: int = MERGE_FILE.version

    def validate(self) -> None:
        for host in self.hosts:
            if not host.label or host.label in (".", "..") or any(c in host.label for c in ("/", os.sep, "\0")):
                raise FileFormatError(f"host label {host.label!r} is not a directory name")

    def host_dir(self, root: str | os.PathLike[str], host: MergedHost) -> Path:
        return Path(root) / HOSTS_DIRNAME / host.label

    def save(self, root: str | os.PathLike[str]) -> Path:
        return write_versioned(Path(root) / MERGE_FILENAME, MERGE_FILE, self)

    @classmethod
    def load(cls, root: str | os.PathLike[str]) -> MergedRun:
        merged = read_versioned(root, MERGE_FILE, cls)
        try:
            merged.validate()
        except FileFormatError as exc:
            raise FileFormatError(f"{Path(root) / MERGE_FILENAME}: {exc}") from None
        return merged
