"""Every file cpuprof writes goes through :func:`write_file`: what is at the path decides how.

Saving to a temporary file and renaming it over the target is right for a regular file (a reader
never sees half of one, a crash leaves the old one whole) and wrong for everything else: renamed
over ``/dev/null`` it turns the device into a regular file, over a FIFO it takes the pipe away from
its reader, over a symbolic link it replaces the link and leaves the file the user meant untouched.
So, as a shell's ``>`` would, but keeping the atomicity where it can:

- a regular file, or nothing yet: written beside the target and renamed over it, keeping an
  existing file's permission bits (and its owner, where we may set it);
- a symbolic link: the same rules applied to what it points to (a dangling link makes its target);
- a character device or a FIFO: opened and written into, never created or replaced;
- a directory, a block device, a socket: refused, as is a path that cannot be written (a missing
  permission, a read-only mount, a full disk), in one line naming the path and the reason.

Where a rename is not possible (a file bind-mounted over, a directory we may not create in while
the file itself is writable) the file is written in place, as ``>`` would write it.
"""

from __future__ import annotations

import errno
import os
import re
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from . import exit_codes
from .errors import CpuprofError

T = TypeVar("T")

# Errors that say the rename, not the write, is impossible here: fall back to writing in place.
_NO_RENAME = (errno.EBUSY, errno.EXDEV, errno.EPERM)
# Errors of the path (the user's to fix) rather than of the machine's state.
_PATH_ERRORS = (errno.EACCES, errno.EPERM, errno.EROFS, errno.EISDIR, errno.ENOTDIR, errno.ENOENT,
                errno.ENAMETOOLONG, errno.ELOOP)


class OutputError(CpuprofError, OSError):
    """A file cpuprof was asked to write could not be written; the message names it and why.
    A bad path (a directory, a read-only mount, no permission) is a usage error; a machine that
    could not take the bytes (a full disk, an I/O error) is a failure. An OSError too, so that a
    caller that keeps going when a save fails (a checkpoint, a chart) catches it as before."""

    def __init__(self, message: str, reason: str = "", exit_code: int = exit_codes.USAGE,
                 errno_: int | None = None) -> None:
        super().__init__(message)
        self.exit_code = exit_code
        # The reason alone, where OSError keeps it: a caller's `exc.strerror or exc` names it as before.
        self.strerror = reason or message
        if errno_ is not None:
            self.errno = errno_

    def __str__(self) -> str:  # the message alone, not OSError's "[Errno N] reason"
        return str(self.args[0]) if self.args else ""

    def __reduce__(self) -> tuple:  # pickled whole (a Pool worker's failed export reaches its parent)
        return (OutputError, (str(self), self.strerror, self.exit_code, self.errno))


def _refusal(path: Path, what: str) -> OutputError:
    return OutputError(f"cannot write {path}: it is {what}; give a file name", f"it is {what}")


def _failure(path: Path | str, exc: OSError) -> OutputError:
    reason = exc.strerror or str(exc) or "failed"
    code = exit_codes.USAGE if exc.errno in _PATH_ERRORS else exit_codes.FAILED
    return OutputError(f"cannot write {path}: {reason[:1].lower()}{reason[1:]}", reason, code, exc.errno)


def _kind_of(mode: int) -> str | None:
    """What a non-writable kind of file is called, or None for the kinds written (regular, device, FIFO)."""
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISBLK(mode):
        return "a block device (cpuprof never writes a disk directly)"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISREG(mode) or stat.S_ISCHR(mode) or stat.S_ISFIFO(mode):
        return None
    return "not a regular file"


def write_file(path: str | os.PathLike[str], write: Callable[[Any], T], *, binary: bool = False,
               make_parents: bool = False) -> T:
    """Runs ``write`` on a file object for ``path`` and returns what it returned, by the rules
    above. ``binary``: the file object takes bytes. ``make_parents``: directories missing above a
    new file are made. Raises :class:`OutputError` (one line) for a path that cannot be written;
    an exception from ``write`` itself passes through, and leaves the target as it was (a regular
    file) or partly written (a device, a FIFO)."""
    given = Path(path)
    own = _own_descriptor(given)
    if own is not None:
        return _write_descriptor(given, own, write, binary)
    target = Path(os.path.realpath(given)) if given.is_symlink() else given
    try:
        info: os.stat_result | None = os.stat(target)
    except FileNotFoundError:
        info = None
    except OSError as exc:
        raise _failure(given, exc) from None
    if info is not None:
        refused = _kind_of(info.st_mode)
        if refused is not None:
            raise _refusal(given, refused)
        if not stat.S_ISREG(info.st_mode):  # a device or FIFO: written into, as `>` would
            return _write_in_place(given, target, write, binary, truncate=False)
    if make_parents:
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise _failure(given, exc) from None
    return _write_replacing(given, target, info, write, binary)


_FD_PATH = re.compile(r"/(?:dev/fd|proc/(?:self|thread-self|\d+)/fd)/(\d+)")
_STD_PATHS = {"/dev/stdout": 1, "/dev/stderr": 2}


def _own_descriptor(path: Path) -> int | None:
    """The descriptor of this process that ``path`` names (``/dev/stdout``, ``/dev/fd/3``,
    ``/proc/self/fd/3``): written through itself, so that a pipe stays a pipe and a file opened
    for appending (``>> log``) is appended to, where its resolved path would be replaced."""
    text = os.path.abspath(path)
    if text in _STD_PATHS:
        return _STD_PATHS[text]
    match = _FD_PATH.fullmatch(text)
    if match is None:
        return None
    pid = text.split("/")[2]
    if text.startswith("/proc/") and pid.isdigit() and int(pid) != os.getpid():
        return None  # another process's descriptor: opened by its path like any file
    return int(match.group(1))


def _write_descriptor(given: Path, fd: int, write: Callable[[Any], T], binary: bool) -> T:
    try:
        copy = os.dup(fd)
    except OSError as exc:
        raise _failure(given, exc) from None
    try:
        with os.fdopen(copy, _open_mode(binary)) as out:
            return write(out)
    except OSError as exc:
        raise _failure(given, exc) from None


def _open_mode(binary: bool) -> str:
    return "wb" if binary else "w"


def _write_in_place(given: Path, target: Path, write: Callable[[Any], T], binary: bool, truncate: bool) -> T:
    flags = os.O_WRONLY | os.O_CLOEXEC | os.O_NOCTTY | (os.O_TRUNC | os.O_CREAT if truncate else 0)
    try:
        fd = os.open(target, flags, 0o666)
    except OSError as exc:
        raise _failure(given, exc) from None
    try:
        with os.fdopen(fd, _open_mode(binary)) as out:
            result = write(out)
    except OSError as exc:
        raise _failure(given, exc) from None
    return result


def _write_replacing(given: Path, target: Path, existing: os.stat_result | None,
                     write: Callable[[Any], T], binary: bool) -> T:
    try:
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}-", suffix=".tmp")
    except OSError as exc:
        if existing is not None and exc.errno in (errno.EACCES, errno.EPERM) and os.access(target, os.W_OK):
            return _write_in_place(given, target, write, binary, truncate=True)
        raise _failure(given, exc) from None
    try:
        try:
            out_file = os.fdopen(fd, _open_mode(binary))
        except BaseException:
            os.close(fd)
            raise
        try:
            with out_file as out:
                _give_mode(out.fileno(), existing)
                result = write(out)
        except OSError as exc:
            raise _failure(given, exc) from None
        try:
            os.replace(tmp, target)
        except OSError as exc:
            if exc.errno not in _NO_RENAME or existing is None:
                raise _failure(given, exc) from None
            return _write_in_place(given, target, write, binary, truncate=True)
        tmp = ""
        return result
    finally:
        if tmp:
            try:
                os.unlink(tmp)
            except OSError:
                pass


def _give_mode(fd: int, existing: os.stat_result | None) -> None:
    """A replaced file keeps its permission bits and owner; a new one gets what the umask allows
    (mkstemp makes it 0600, narrower than any file the user would write). Best effort: a file
    system without modes (vfat) keeps what it has."""
    try:
        if existing is not None:
            os.fchmod(fd, stat.S_IMODE(existing.st_mode))
            try:
                os.fchown(fd, existing.st_uid, existing.st_gid)
            except OSError:  # not ours to give away: the file becomes the writer's, as any rewrite would
                pass
            return
        os.fchmod(fd, 0o666 & ~_umask())
    except OSError:
        pass


def _umask() -> int:
    """The process's umask, read without setting it (os.umask would change it for every thread of a
    profiled program for a moment)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return 0o022


def write_text(path: str | os.PathLike[str], text: str, *, make_parents: bool = False) -> Path:
    """``text`` into ``path`` by :func:`write_file`'s rules; returns the path."""
    write_file(path, lambda out: out.write(text), make_parents=make_parents)
    return Path(path)
