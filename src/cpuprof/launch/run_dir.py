"""A run's output directory: one run per directory, claimed before anything starts.

Two runs writing one directory mix their files: the second's launch.json is read by the first's
child (A decodes B's settings) and one profile overwrites the other. So every command that writes
a run's results (decode, run, calibrate, compare) claims its directory first:

- a default directory (``cpuprof-out/<command>-<time>``) is created with ``os.mkdir``, which fails
  when the name exists, and takes a suffix (``-2``, ``-3``, ...) until one is new: two runs started
  in the same second get two directories;
- the directory is locked (``flock`` on ``.cpuprof.lock`` inside it) for the command's life: a
  second run on it is refused while the first lives; the kernel drops the lock when its process
  ends, however it ends, so a crashed run never blocks the next;
- an ``--out`` that holds another run's files is refused, unless the command was asked to replace
  them (``--overwrite``), and then those files are removed first, so nothing of the old run sits
  beside the new one's results. ``compare --resume`` claims its own directory without that check:
  continuing what is there is its purpose.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import fcntl
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

from ..errors import UsageError
from ..model.run_layout import run_trees

DEFAULT_ROOT = Path("cpuprof-out")
LOCK_FILENAME = ".cpuprof.lock"
OVERWRITE_FLAG = "--overwrite"
# What makes a directory hold a run: the files cpuprof reads back from it.
RUN_FILES = ("profile.json", "launch.json", "ranks.json", "compare.json", "merge.json")
# What a run writes beside them: removed with them, so no old page or chart describes the new run.
DERIVED_FILES = ("crash.txt", "child.log", "roofline.svg", "report.html", "flame.svg", "trace.json", "follow.json",
                 "window.json")
_MAX_SUFFIX = 1000  # same-second runs of one command; beyond this something else is wrong


def new_default_dir(command: str, root: Path = DEFAULT_ROOT) -> Path:
    """Creates and returns ``root/<command>-<time>``, or the first ``-N`` variant of it that did not
    exist: the mkdir itself decides, so two processes never get the same directory."""
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    base = f"{command}-{stamp}"
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot create {root}: {exc.strerror or exc}; give --out DIR") from exc
    for n in range(1, _MAX_SUFFIX + 1):
        candidate = root / (base if n == 1 else f"{base}-{n}")
        try:
            os.mkdir(candidate)
            return candidate
        except FileExistsError:
            continue
        except OSError as exc:
            raise UsageError(f"cannot create {candidate}: {exc.strerror or exc}; give --out DIR") from exc
    raise UsageError(f"{root}: {_MAX_SUFFIX} directories named {base}[-N] exist already; give --out DIR")


# The directories this process claimed, last last: where an interrupt's line says to look.
_CLAIMED: list[Path] = []


def saved_in() -> Path | None:
    """The last directory this process claimed, where it holds what a report reads; None otherwise."""
    for directory in reversed(_CLAIMED):
        if any(name != "launch.json" for name in previous_run_files(directory)):
            return directory
    return None


def _lock(directory: Path, flag: str) -> int:
    """Locks ``directory`` for this process (the returned descriptor holds the lock), or refuses in
    one line, naming the process that holds it. The lock file is removed when the run ends (see
    claimed), so a lock taken on a file another run has just removed is taken again on the new one."""
    for _attempt in range(8):
        fd = _lock_once(directory, flag)
        try:
            if os.fstat(fd).st_ino == os.stat(directory / LOCK_FILENAME).st_ino:
                return fd
        except OSError:
            pass
        os.close(fd)
    raise UsageError(f"{flag} {directory}: other cpuprof runs keep taking and releasing this directory; "
                     "choose another")


def _lock_once(directory: Path, flag: str) -> int:
    lock_path = directory / LOCK_FILENAME
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
    except OSError as exc:
        raise UsageError(f"{flag} {directory}: cannot create {LOCK_FILENAME} there ({exc.strerror or exc})") from exc
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
        os.close(fd)
        if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
            raise UsageError(f"{flag} {directory}: cannot lock it ({exc.strerror or exc})") from exc
        by = f" (process {holder})" if holder.isdigit() else ""
        raise UsageError(f"{flag} {directory}: another cpuprof run{by} is using this directory; "
                         "wait for it or choose another") from exc
    try:
        # Who holds it, for the next run's refusal; a full disk only loses the pid in that line.
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    except OSError:
        pass
    return fd


def previous_run_files(directory: Path) -> list[str]:
    """The files of an earlier run in ``directory``, by name."""
    return [name for name in RUN_FILES if os.path.lexists(directory / name)]


def _remove_previous_run(directory: Path, flag: str) -> None:
    # What `run` leaves beside its profile: the followed processes' profiles and the windows.
    for tree in run_trees(directory):
        if tree.is_dir() and not tree.is_symlink():
            shutil.rmtree(tree, ignore_errors=True)
    for name in (*RUN_FILES, *DERIVED_FILES):
        try:
            (directory / name).unlink(missing_ok=True)
        except OSError as exc:
            raise UsageError(f"{flag} {directory}: cannot remove the earlier run's {name} "
                             f"({exc.strerror or exc})") from exc


@contextlib.contextmanager
def claimed(out: str | os.PathLike[str] | None, command: str, overwrite: bool = False, resume: bool = False,
            flag: str = "--out") -> Iterator[Path]:
    """The run's directory, locked for the block: ``out`` (created if missing), or a new default
    one for ``command``. UsageError, one line, before anything starts, when another live run uses
    it, or when it holds an earlier run's files and neither ``overwrite`` nor ``resume`` was given
    (``overwrite`` removes them). A directory created here and left empty (the command was refused
    after the claim) is removed again."""
    from .parent import check_out_dir

    if out is None:
        directory = new_default_dir(command)
        created = True
    else:
        directory = Path(out)
        created = not os.path.lexists(directory)
        check_out_dir(directory, flag)
    fd = _lock(directory, flag)
    _CLAIMED.append(directory)
    try:
        if not resume:
            found = previous_run_files(directory)
            if found and not overwrite:
                raise UsageError(f"{flag} {directory}: holds another run's files ({', '.join(found)}); choose "
                                 f"another directory, or add {OVERWRITE_FLAG} to replace them")
            if found:
                _remove_previous_run(directory, flag)
        yield directory
    finally:
        # Removed while still held: a run that opened it meanwhile finds it gone and locks a new one.
        with contextlib.suppress(OSError):
            (directory / LOCK_FILENAME).unlink()
        if created:
            with contextlib.suppress(OSError):  # nobody else knows a directory this run made and wrote nothing in
                if not any(os.scandir(directory)):
                    directory.rmdir()
        os.close(fd)


