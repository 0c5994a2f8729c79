"""write_file, on what a user can name with -o: regular files (replaced atomically, their mode kept),
links (their target written), a character device and a FIFO (written into, never replaced), and
paths that cannot be written (one OutputError each). Device nodes are made with mknod in the test's
own directory, never the system's; mounts are tmpfs made by the test, skipped where it may not mount."""

from __future__ import annotations

import errno
import os
import stat
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from cpuprof import exit_codes
from cpuprof.output_file import OutputError, write_file, write_text


def test_a_new_file_is_made_with_the_umasks_mode_and_nothing_left_beside_it(tmp_path: Path):
    old = os.umask(0o022)
    try:
        write_text(tmp_path / "out.svg", "<svg/>")
    finally:
        os.umask(old)
    assert (tmp_path / "out.svg").read_text() == "<svg/>"
    assert stat.S_IMODE((tmp_path / "out.svg").stat().st_mode) == 0o644
    assert [p.name for p in tmp_path.iterdir()] == ["out.svg"]


def test_an_existing_file_is_replaced_whole_and_keeps_its_mode(tmp_path: Path):
    target = tmp_path / "report.txt"
    target.write_text("old")
    target.chmod(0o640)
    inode = target.stat().st_ino
    write_text(target, "new")
    assert target.read_text() == "new"
    assert stat.S_IMODE(target.stat().st_mode) == 0o640
    assert target.stat().st_ino != inode  # renamed over, not rewritten: a reader never saw half a file


def test_a_writer_that_fails_leaves_the_old_file_and_no_temporary(tmp_path: Path):
    target = tmp_path / "report.txt"
    target.write_text("old")

    def fail(out: object) -> None:
        raise RuntimeError("renderer bug")

    with pytest.raises(RuntimeError):
        write_file(target, fail)
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["report.txt"]


def test_a_symlink_has_its_target_written_and_stays_a_link(tmp_path: Path):
    real = tmp_path / "real.json"
    real.write_text("old")
    link = tmp_path / "link.json"
    link.symlink_to(real)
    write_text(link, "new")
    assert link.is_symlink() and os.readlink(link) == str(real)
    assert real.read_text() == "new"


def test_a_dangling_symlink_makes_its_target(tmp_path: Path):
    link = tmp_path / "link.json"
    link.symlink_to(tmp_path / "made.json")
    write_text(link, "made")
    assert link.is_symlink() and (tmp_path / "made.json").read_text() == "made"


@pytest.fixture
def null_device(tmp_path: Path) -> Path:
    """A node for the null device (1, 3) in the test's own directory."""
    node = tmp_path / "null"
    try:
        os.mknod(node, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    except PermissionError:
        pytest.skip("mknod is not permitted here (needs CAP_MKNOD)")
    return node


def test_a_character_device_is_written_into_and_stays_a_device(null_device: Path):
    assert write_file(null_device, lambda out: out.write("x" * 10_000)) == 10_000
    assert stat.S_ISCHR(null_device.stat().st_mode)
    assert os.major(null_device.stat().st_rdev) == 1 and os.minor(null_device.stat().st_rdev) == 3
    assert [p.name for p in null_device.parent.iterdir()] == ["null"]


def test_a_link_to_a_device_writes_the_device(null_device: Path):
    link = null_device.parent / "to-null"
    link.symlink_to(null_device)
    write_text(link, "x")
    assert link.is_symlink() and stat.S_ISCHR(null_device.stat().st_mode)


def test_a_fifo_is_written_into_for_its_reader(tmp_path: Path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    received: list[bytes] = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_bytes()))
    reader.start()
    write_text(fifo, "through the pipe")
    reader.join(timeout=30)
    assert received == [b"through the pipe"]
    assert stat.S_ISFIFO(fifo.stat().st_mode)


def _refused(path: Path) -> OutputError:
    with pytest.raises(OutputError) as caught:
        write_text(path, "x")
    message = str(caught.value)
    assert "\n" not in message and str(path) in message
    return caught.value


def test_a_directory_is_refused_in_one_line(tmp_path: Path):
    error = _refused(tmp_path)
    assert "is a directory" in str(error) and error.exit_code == exit_codes.USAGE


def test_a_socket_is_refused(tmp_path: Path):
    import socket

    path = tmp_path / "s"
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(path))
        assert "socket" in str(_refused(path))


def test_a_block_device_is_refused(tmp_path: Path):
    node = tmp_path / "disk"
    try:
        os.mknod(node, 0o600 | stat.S_IFBLK, os.makedev(7, 200))  # a loop device number; never opened
    except PermissionError:
        pytest.skip("mknod is not permitted here (needs CAP_MKNOD)")
    assert "block device" in str(_refused(node))
    assert stat.S_ISBLK(node.stat().st_mode)


def test_a_missing_directory_is_one_line_unless_parents_are_made(tmp_path: Path):
    error = _refused(tmp_path / "no" / "such" / "out.svg")
    assert error.exit_code == exit_codes.USAGE
    write_text(tmp_path / "made" / "out.svg", "x", make_parents=True)
    assert (tmp_path / "made" / "out.svg").read_text() == "x"


@pytest.fixture
def small_mount(tmp_path: Path) -> Iterator[Path]:
    """A 64 KiB tmpfs of the test's own."""
    where = tmp_path / "mnt"
    where.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(where)],
                      capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs CAP_SYS_ADMIN)")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


def test_a_read_only_mount_is_one_line_and_a_usage_error(small_mount: Path):
    (small_mount / "old.txt").write_text("old")
    subprocess.run(["mount", "-o", "remount,ro", str(small_mount)], check=True)
    for path in (small_mount / "new.txt", small_mount / "old.txt"):
        error = _refused(path)
        assert "read-only file system" in str(error) and error.exit_code == exit_codes.USAGE
    assert (small_mount / "old.txt").read_text() == "old"


def test_a_full_disk_is_a_failure_that_keeps_the_old_file(small_mount: Path):
    (small_mount / "old.txt").write_text("old")
    with pytest.raises(OutputError) as caught:
        write_text(small_mount / "old.txt", "x" * 1_000_000)
    assert "no space left on device" in str(caught.value) and caught.value.exit_code == exit_codes.FAILED
    assert isinstance(caught.value, OSError)  # callers that keep going on a failed save catch it as before
    assert (small_mount / "old.txt").read_text() == "old"
    assert sorted(p.name for p in small_mount.iterdir()) == ["old.txt"]


def test_a_file_in_a_directory_we_may_not_create_in_is_written_in_place(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch):
    """A writable file in a directory that refuses new files (EACCES; root never sees one, so the
    refusal is injected): written in place, as `>` would."""
    import tempfile

    target = tmp_path / "kept.txt"
    target.write_text("old")

    def refused(*args: object, **kwargs: object) -> None:
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))

    monkeypatch.setattr(tempfile, "mkstemp", refused)
    write_text(target, "new")
    assert target.read_text() == "new"
    error = _refused(tmp_path / "new.txt")  # nothing to write in place: one line
    assert "permission denied" in str(error) and error.exit_code == exit_codes.USAGE


def test_a_rename_the_filesystem_refuses_falls_back_to_writing_in_place(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch):
    """A file bind-mounted over cannot be renamed over (EBUSY): written in place instead."""
    target = tmp_path / "bound.txt"
    target.write_text("old")

    def busy(src: object, dst: object) -> None:
        raise OSError(errno.EBUSY, os.strerror(errno.EBUSY))

    monkeypatch.setattr(os, "replace", busy)
    write_text(target, "new")
    assert target.read_text() == "new"
    assert [p.name for p in tmp_path.iterdir()] == ["bound.txt"]


def test_the_processs_own_descriptors_are_written_through_keeping_a_pipe_and_an_appended_log(tmp_path: Path):
    """/dev/stdout resolves to pipe:[N] or to the file the shell opened: written through a copy of the
    descriptor, a pipe gets the bytes and a log opened for appending keeps what it had."""
    import pickle
    import sys

    log = tmp_path / "log.txt"
    log.write_text("before\n")
    code = ("from cpuprof.output_file import write_text\n"
            "write_text('/dev/stdout', 'to stdout\\n')\nwrite_text('/dev/fd/1', 'to fd 1\\n')\n")
    with open(log, "a") as appended:
        subprocess.run([sys.executable, "-c", code], stdout=appended, check=True)
    assert log.read_text() == "before\nto stdout\nto fd 1\n"
    piped = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert piped.stdout == "to stdout\nto fd 1\n"
    error = _refused(tmp_path)  # and one that crosses a process boundary whole
    again = pickle.loads(pickle.dumps(error))
    assert str(again) == str(error) and again.exit_code == error.exit_code
