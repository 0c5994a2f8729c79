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
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from .. import defaults
from ..errors import FileFormatError
from ..output_file import write_text
from . import codec
from .migrate import MIGRATIONS

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
    """Writes ``{"format", "version", **body}`` by :func:`~cpuprof.output_file.write_file`'s rules
    (a regular file atomically: a crash mid-write never leaves half a file, and a reader never sees
    one). ``body``: a dataclass or a JSON object; a dataclass's own ``format``/``version`` fields
    are replaced by the kind's."""
    data = codec.to_json(body)
    if not isinstance(data, dict):
        raise TypeError(f"a {kind.name} file holds an object, not {type(data).__name__}")
    document = {"format": kind.format, "version": kind.version,
                **{k: v for k, v in data.items() if k not in HEADER}}
    # dumps, not dump: json.dump streams through the pure-Python encoder, several times slower,
    # and a running decode saves its profile every few seconds on its own thread.
    text = (json.dumps(document, separators=(",", ":")) if kind.indent is None
            else json.dumps(document, indent=kind.indent))
    return write_text(path, text, make_parents=True)


# -- reading --------------------------------------------------------------------------------------
_FILE_TYPES = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
               (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def _not_regular(path: Path, mode: int) -> FileFormatError:
    what = next((name for test, name in _FILE_TYPES if test(mode)), "not a regular file")
    try:
        if os.path.islink(path):
            what = f"a symbolic link to {os.readlink(path)}, {what}"
    except OSError:
        pass
    return FileFormatError(f"{path} is not a regular file: it is {what}; cpuprof reads only regular files")


def _check_regular(path: Path, info: os.stat_result, limit: int) -> None:
    if not stat.S_ISREG(info.st_mode):
        raise _not_regular(path, info.st_mode)
    if info.st_size > limit:
        raise _too_large(path, f"{info.st_size:,} bytes", limit)


def _too_large(path: Path, size: str, limit: int) -> FileFormatError:
    return FileFormatError(f"{path} is {size}, more than the {limit / 1024**3:g} GiB ({limit:,} bytes) cpuprof "
                           "reads back (not a file cpuprof wrote)")


def _denied(path: Path, exc: OSError) -> FileFormatError:
    return FileFormatError(f"{path}: cannot read ({exc.strerror or exc}: {exc.filename or path})")


def read_regular_file(path: str | os.PathLike[str], limit: int | None = None) -> bytes:
    """The bytes of the regular file ``path`` (a link to one included), at most ``limit`` bytes
    (``defaults.MAX_READ_BYTES``). Anything else, a FIFO, a device, a directory, a file too large,
    is a FileFormatError saying what it is, and never blocks or fills memory: the type is checked
    before opening, and again on the opened descriptor (opened non-blocking), so a FIFO swapped in
    between cannot hang the reader. FileNotFoundError and NotADirectoryError pass through: a
    missing file means something different to each caller."""
    limit = defaults.MAX_READ_BYTES if limit is None else limit
    source = Path(path)
    try:
        _check_regular(source, os.stat(source), limit)
        fd = os.open(source, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except PermissionError as exc:
        raise _denied(source, exc) from exc
    try:
        _check_regular(source, os.fstat(fd), limit)
        chunks, size = [], 0
        while chunk := os.read(fd, min(1 << 24, limit + 1 - size)):
            chunks.append(chunk)
            size += len(chunk)
            if size > limit:  # grew while being read
                raise FileFormatError(f"{source} grew past the {limit / 1024**3:g} GiB cpuprof reads back while "
                                      "being read (not a file cpuprof wrote)")
        return b"".join(chunks)
    except OSError as exc:
        raise FileFormatError(f"{source}: cannot read ({exc.strerror or exc})") from exc
    finally:
        os.close(fd)


class _NotFinite(ValueError):
    pass


def _reject_constant(name: str) -> Any:
    raise _NotFinite(f"{name} is not a number cpuprof writes")


def parse_json(data: bytes, source: str | os.PathLike[str], what: str) -> Any:
    """``data`` as JSON; FileFormatError naming ``source`` for anything that is not JSON cpuprof
    could have written: not UTF-8, invalid, NaN or Infinity, nested too deep for Python (a
    RecursionError), a number of thousands of digits."""
    try:
        return json.loads(data.decode(), parse_constant=_reject_constant)
    except json.JSONDecodeError as exc:
        raise FileFormatError(f"{source}: not valid JSON at line {exc.lineno} column {exc.colno} "
                              f"(truncated or not a {what})") from exc
    except RecursionError as exc:
        raise FileFormatError(f"{source}: JSON nested too deep to read (not a {what})") from exc
    except UnicodeDecodeError as exc:
        raise FileFormatError(f"{source}: not UTF-8 text at byte {exc.start} (not a {what})") from exc
    except _NotFinite as exc:
        raise FileFormatError(f"{source}: {exc} (not a {what})") from exc
    except ValueError as exc:  # a whole number past Python's limit of digits
        raise FileFormatError(f"{source}: a number too long to read (not a {what})") from exc


def is_directory(path: str | os.PathLike[str]) -> bool:
    """``Path.is_dir()``, with a directory that cannot be searched a FileFormatError, not a traceback."""
    try:
        return stat.S_ISDIR(os.stat(path).st_mode)
    except (FileNotFoundError, NotADirectoryError):
        return False
    except PermissionError as exc:
        raise _denied(Path(path), exc) from exc


def present(path: str | os.PathLike[str]) -> bool:
    """Whether anything, of any type, is at ``path``: a reader then says what is wrong with it (a FIFO
    that ``is_file()`` would skip), instead of looking elsewhere. A directory that cannot be searched
    is a FileFormatError, not a PermissionError traceback."""
    try:
        os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return False
    except PermissionError as exc:
        raise _denied(Path(path), exc) from exc
    return True


def file_in(path: str | os.PathLike[str], kind: FileKind) -> Path:
    """``path`` itself, or the kind's file inside it when it is a directory."""
    source = Path(path)
    return source / kind.filename if is_directory(source) else source


def read_json_file(source: Path, kind: FileKind) -> Any:
    """The JSON in the file ``source`` (already resolved by ``file_in``: a directory there is an error)."""
    try:
        data = read_regular_file(source)
    except FileNotFoundError as exc:
        raise FileFormatError(f"{source}: no such {kind.name} (expected a directory written by {kind.written_by}, "
                              f"or its {kind.filename})") from exc
    except OSError as exc:
        raise FileFormatError(f"{source}: cannot read ({exc.strerror or exc})") from exc
    return parse_json(data, source, kind.name)


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
        decoded = codec.from_json(cls, body, kind.name)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise FileFormatError(f"{source} is a damaged cpuprof {kind.name} ({_what(exc)})") from exc
    except RecursionError as exc:  # values nested within each other (OpInput.items) past Python's stack
        raise FileFormatError(f"{source} is a damaged cpuprof {kind.name} (nested too deep to read)") from exc
    # The model's own invariants (indices that must point at something, counts that must be positive):
    # checked here, so every reader, report and resume alike, gets one line instead of an IndexError.
    validate = getattr(decoded, "validate", None)
    if callable(validate):
        try:
            validate()
        except FileFormatError as exc:
            raise FileFormatError(f"{source} is a damaged cpuprof {kind.name} ({exc})") from exc
    return decoded


def read_versioned(path: str | os.PathLike[str], kind: FileKind, cls: type[T]) -> T:
    """Reads one of cpuprof's files (or the kind's file inside the directory ``path``) as ``cls``:
    header checked, older versions migrated; FileFormatError, naming the file, for anything else."""
    source = file_in(path, kind)
    data = read_json_file(source, kind)
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
