"""cpuprof's versioned files: written atomically, read back with one-line errors.

Four kinds of file go through here: the profile (``profile.json``), a sweep (``compare.json``),
a group of processes (``ranks.json``) and what the launcher tells its child (``launch.json``).
Each starts with a header, ``{"format": "cpuprof-<kind>", "version": N, ...}``, so a reader knows
what it holds and how old it is. Files of older versions are migrated on load; a truncated,
foreign, damaged or newer file raises :class:`~cpuprof.errors.FileFormatError`, whose one line
names the file and the problem, never a misreading.

The profile's format is described by ``profile.schema.json`` (generated from the model by
``schema.py`` and checked by the tests); its migrations are in ``migrate.py``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from ..errors import FileFormatError
from . import codec
from .migrate import MIGRATIONS
from .profile import Profile

T = TypeVar("T")
Migration = Callable[[dict[str, Any]], dict[str, Any]]
HEADER = ("format", "version")


@dataclass(frozen=True)
class FileKind:
    """One kind of versioned file: its header, the versions it reads, and how it is named to a user."""

    name: str  # as a message names it: "profile", "comparison"
    format: str  # the header's format name
    version: int  # the version written
    filename: str  # its name in a run's directory
    written_by: str  # what writes one, for the message about a missing file
    # version -> the step from it to the next; versions below the lowest step are not read.
    migrations: Mapping[int, Migration] = field(default_factory=dict)
    # Files written before the kind had a header are read as this version (None: a header is required).
    headerless_version: int | None = None
    indent: int | None = 1  # None: compact (a profile is large and read by programs)

    @property
    def oldest(self) -> int:
        return min(self.migrations, default=self.version)

    def versions(self) -> str:
        """The versions read, as a message says them: "version 1", "versions 1 to 2"."""
        return f"version {self.version}" if self.oldest == self.version else f"versions {self.oldest} to {self.version}"


PROFILE = FileKind(name="profile", format="cpuprof-profile", version=2, filename="profile.json",
                   written_by="cpuprof decode or run", migrations=MIGRATIONS, indent=None)
FORMAT = PROFILE.format
VERSION = PROFILE.version
PROFILE_FILENAME = PROFILE.filename


# -- writing --------------------------------------------------------------------------------------
def write_versioned(path: str | os.PathLike[str], kind: FileKind, body: Any) -> Path:
    """Writes ``{"format", "version", **body}`` atomically (temp file + rename): a crash mid-write
    never leaves half a file, and a reader never sees one. ``body``: a dataclass or a JSON object;
    a dataclass's own ``format``/``version`` fields are replaced by the kind's."""
    data = codec.to_json(body)
    if not isinstance(data, dict):
        raise TypeError(f"a {kind.name} file holds an object, not {type(data).__name__}")
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    document = {"format": kind.format, "version": kind.version,
                **{k: v for k, v in data.items() if k not in HEADER}}
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.stem}-", suffix=".tmp")
    try:
        # mkstemp creates the file 0600; cpuprof's files are as readable as any file the user writes.
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)
        with os.fdopen(fd, "w") as out:
            if kind.indent is None:
                json.dump(document, out, separators=(",", ":"))
            else:
                json.dump(document, out, indent=kind.indent)
        os.replace(tmp, target)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return target


# -- reading --------------------------------------------------------------------------------------
def file_in(path: str | os.PathLike[str], kind: FileKind) -> Path:
    """``path`` itself, or the kind's file inside it when it is a directory."""
    source = Path(path)
    return source / kind.filename if source.is_dir() else source


def read_json(path: str | os.PathLike[str], kind: FileKind) -> Any:
    """The JSON in ``path`` (or in the kind's file inside the directory ``path``)."""
    source = file_in(path, kind)
    try:
        text = source.read_text()
    except FileNotFoundError as exc:
        raise FileFormatError(f"{source}: no such {kind.name} (expected a directory written by {kind.written_by}, "
                              f"or its {kind.filename})") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise FileFormatError(f"{source}: cannot read ({exc})") from exc
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise FileFormatError(f"{source}: not valid JSON at line {exc.lineno} column {exc.colno} "
                              f"(truncated or not a {kind.name})") from exc


def upgrade(data: Any, kind: FileKind, source: str) -> dict[str, Any]:
    """Checks the header and brings the document to the current version; FileFormatError otherwise."""
    if not isinstance(data, dict):
        raise FileFormatError(f"{source} is not a cpuprof {kind.name} (a JSON {type(data).__name__}, not an object)")
    found = data.get("format")
    if found is None and "version" not in data and kind.headerless_version is not None:
        data = {"format": kind.format, "version": kind.headerless_version, **data}
    elif found != kind.format:
        if isinstance(found, str) and found.startswith("cpuprof-"):
            raise FileFormatError(f"{source} is not a cpuprof {kind.name}: it is a {found} file")
        raise FileFormatError(f"{source} is not a cpuprof {kind.name} (no '{kind.format}' header)")
    version = data.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise FileFormatError(f"{source} has no valid format version ({version!r})")
    if version > kind.version:
        raise FileFormatError(f"{source} was written by a newer cpuprof ({kind.name} format version {version}); "
                              f"this cpuprof reads {kind.versions()}: upgrade cpuprof to read it")
    if version < kind.oldest:
        raise FileFormatError(f"{source} is a {kind.name} of format version {version}, older than this cpuprof "
                              f"reads ({kind.versions()})")
    try:
        while version < kind.version:
            data = kind.migrations[version](data)
            version += 1
            data["version"] = version
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise FileFormatError(f"{source} is a damaged cpuprof {kind.name} ({_what(exc)})") from exc
    return data


def decode(data: dict[str, Any], kind: FileKind, cls: type[T], source: str) -> T:
    """``cls`` from an upgraded document; a dataclass with ``format``/``version`` fields keeps the header."""
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    body = {k: v for k, v in data.items() if k not in HEADER or k in names}
    try:
        return codec.from_json(cls, body, kind.name)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise FileFormatError(f"{source} is a damaged cpuprof {kind.name} ({_what(exc)})") from exc


def read_versioned(path: str | os.PathLike[str], kind: FileKind, cls: type[T]) -> T:
    """Reads one of cpuprof's files (or the kind's file inside the directory ``path``) as ``cls``:
    header checked, older versions migrated; FileFormatError, naming the file, for anything else."""
    source = file_in(path, kind)
    data = read_json(source, kind)
    headerless = isinstance(data, dict) and not any(key in data for key in HEADER)
    try:
        return decode(upgrade(data, kind, str(source)), kind, cls, str(source))
    except FileFormatError as exc:
        if not headerless or exc.__cause__ is None:
            raise
        # Read as a file from before the kind had a header, and not one of those either.
        raise FileFormatError(f"{source} is not a cpuprof {kind.name} (no '{kind.format}' header, and not one "
                              f"written before it had one: {_what(exc.__cause__)})") from exc.__cause__


def _what(exc: BaseException) -> str:
    return exc.args[0] if isinstance(exc, codec.DecodeError) else f"{type(exc).__name__}: {exc}"


# -- the profile ------------------------------------------------------------------------------------
def profile_to_dict(profile: Profile) -> dict[str, Any]:
    return {"format": FORMAT, "version": VERSION, **codec.to_json(profile)}


def profile_from_dict(data: Any, source: str = "profile") -> Profile:
    profile = decode(upgrade(data, PROFILE, source), PROFILE, Profile, source)
    profile.validate()
    return profile


def save(profile: Profile, path: str | os.PathLike[str]) -> Path:
    """Writes the profile atomically. ``path`` may be a directory (the file is ``profile.json`` in
    it) or a file name."""
    target = Path(path)
    if target.suffix != ".json":
        target = target / PROFILE_FILENAME
    return write_versioned(target, PROFILE, profile)


def load(path: str | os.PathLike[str]) -> Profile:
    """Reads a profile file, or ``profile.json`` inside a directory; one-line errors only."""
    source = file_in(path, PROFILE)
    return profile_from_dict(read_json(source, PROFILE), source=str(source))
