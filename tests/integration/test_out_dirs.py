"""One run per output directory, and a full disk: refused in one line before anything starts.

Two runs on one directory mixed their files (one child read the other's launch.json and one
profile overwrote the other); two default directories made in the same second were one; a full
disk ended the launcher in a traceback. Every check here happens before a child starts, so each
test runs the launcher only, in a fraction of a second.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.cli_runs import cpuprof, one_line_error

from cpuprof import exit_codes
from cpuprof.launch import run_dir

TINY_DECODE = ("decode", "--preset", "tiny", "--prompt-len", "4", "--new-tokens", "4")


def script(tmp_path: Path) -> Path:
    """A program that never imports torch: `run` starts it in a fraction of a second."""
    path = tmp_path / "hello.py"
    path.write_text("print('hello')\n")
    return path


def commands(tmp_path: Path, out: Path) -> dict[str, tuple[str, ...]]:
    """Every command that writes a run's directory, as the cheapest run of it."""
    return {
        "decode": (*TINY_DECODE, "--out", str(out)),
        "run": ("run", "--out", str(out), "--", "python", str(script(tmp_path))),
        "calibrate": ("calibrate", "--out", str(out)),
        "compare": ("compare", "--preset", "tiny", "--prompt-len", "4", "--new-tokens", "4", "--threads", "1,2",
                    "--out", str(out)),
    }


@contextlib.contextmanager
def held_as_a_live_run(directory: Path) -> Iterator[None]:
    """``directory`` locked as a running cpuprof holds it (for as long as the block lasts)."""
    directory.mkdir(parents=True, exist_ok=True)
    fd = os.open(directory / run_dir.LOCK_FILENAME, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, b"4242\n")
        yield
    finally:
        os.close(fd)


@pytest.mark.parametrize("command", ["decode", "run", "calibrate", "compare"])
def test_a_directory_a_live_run_uses_is_refused_before_anything_starts(tmp_path: Path, command: str):
    out = tmp_path / "shared"
    with held_as_a_live_run(out):
        for overwrite in ((), ("--overwrite",)):  # never a live run's files, even when asked
            args = commands(tmp_path, out)[command]
            result = cpuprof(*args[:1], *overwrite, *args[1:], timeout=60)
            assert result.returncode == exit_codes.USAGE, result.stderr
            line = one_line_error(result)
            assert "another cpuprof run (process 4242) is using this directory" in line
            assert sorted(p.name for p in out.iterdir()) == [run_dir.LOCK_FILENAME]  # nothing written


def test_a_crashed_runs_lock_does_not_block(tmp_path: Path):
    """The kernel drops a lock with its process, however it ended: the next run may use the directory."""
    out = tmp_path / "after-a-crash"
    out.mkdir()
    holder = subprocess.run([sys.executable, "-c", f"""
import fcntl, os
fd = os.open({str(out / run_dir.LOCK_FILENAME)!r}, os.O_RDWR | os.O_CREAT)
fcntl.flock(fd, fcntl.LOCK_EX)
os.write(fd, b"4242")
os.kill(os.getpid(), 9)
"""], check=False)
    assert holder.returncode == -9
    result = cpuprof(*commands(tmp_path, out)["run"], timeout=60)
    assert "another cpuprof run" not in result.stderr
    assert (out / "launch.json").exists()  # the run started
    assert not (out / run_dir.LOCK_FILENAME).exists()  # a finished run leaves no lock behind


@pytest.mark.parametrize("old_file", ["profile.json", "ranks.json", "compare.json", "launch.json"])
def test_an_out_holding_another_runs_files_is_refused_then_replaced_with_overwrite(tmp_path: Path, old_file: str):
    out = tmp_path / "old"
    out.mkdir()
    (out / old_file).write_text('{"the": "earlier run"}')
    (out / "report.html").write_text("the earlier run's page")
    for command in ("decode", "run"):
        result = cpuprof(*commands(tmp_path, out)[command], timeout=60)
        assert result.returncode == exit_codes.USAGE, result.stderr
        line = one_line_error(result)
        assert f"holds another run's files ({old_file})" in line and "--overwrite" in line
        assert (out / old_file).read_text() == '{"the": "earlier run"}'  # untouched

    # A program without torch: the run starts and ends at once (nothing profiled), on a clean directory.
    run = commands(tmp_path, out)["run"]
    result = cpuprof(run[0], "--overwrite", *run[1:], timeout=60)
    assert "holds another run's files" not in result.stderr and "Traceback" not in result.stderr
    assert "hello" in result.stdout
    assert not (out / "report.html").exists()  # no page of the earlier run beside this one's results
    if old_file != "launch.json":
        assert not (out / old_file).exists()
    assert str(script(tmp_path)) in (out / "launch.json").read_text()  # this run's own


def test_compare_with_an_old_comparison_points_to_resume_or_overwrite(tmp_path: Path):
    out = tmp_path / "sweep"
    out.mkdir()
    (out / "compare.json").write_text("{}")
    result = cpuprof(*commands(tmp_path, out)["compare"], timeout=60)
    assert result.returncode == exit_codes.USAGE
    line = one_line_error(result)
    assert f"--resume {out}" in line and "--overwrite" in line


def test_compare_resume_refuses_a_sweep_another_compare_is_running(tmp_path: Path):
    out = tmp_path / "sweep"
    with held_as_a_live_run(out):
        (out / "compare.json").write_text("{}")
        result = cpuprof("compare", "--resume", str(out), timeout=60)
    assert result.returncode == exit_codes.USAGE
    assert "--resume" in one_line_error(result) and "another cpuprof run" in result.stderr


def test_two_default_directories_made_in_the_same_second_differ(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    class SameSecond(datetime.datetime):
        @classmethod
        def now(cls, tz: datetime.tzinfo | None = None) -> SameSecond:
            return cls(2026, 1, 2, 3, 4, 5)

    monkeypatch.setattr(run_dir.datetime, "datetime", SameSecond)
    made = [run_dir.new_default_dir("decode", root=tmp_path) for _ in range(3)]
    assert [p.name for p in made] == ["decode-20260102-030405", "decode-20260102-030405-2",
                                      "decode-20260102-030405-3"]
    assert all(p.is_dir() for p in made)


def test_a_default_directory_left_empty_by_a_refused_run_is_removed(tmp_path: Path):
    result = cpuprof("decode", "--preset", "tiny", "--prompt-len", "300", "--new-tokens", "4", cwd=tmp_path,
                     timeout=60)
    assert result.returncode == exit_codes.USAGE
    assert "exceeds the model's context" in one_line_error(result)
    assert list((tmp_path / "cpuprof-out").iterdir()) == []


def test_compare_checks_every_configurations_context_before_any_run(tmp_path: Path):
    out = tmp_path / "sweep"
    result = cpuprof("compare", "--preset", "tiny", "--prompt-len", "250", "--new-tokens", "6", "--threads", "1,2",
                     "--compile", "off,on", "--out", str(out), timeout=60)
    assert result.returncode == exit_codes.USAGE, result.stderr
    line = one_line_error(result)
    assert "--prompt-len + --new-tokens + 1 (--compile) = 257 exceeds the model's context of 256" in line
    assert not out.exists()  # refused before the sweep made anything


# -- a full disk ------------------------------------------------------------------------------------
@pytest.fixture
def full_disk(tmp_path: Path) -> Iterator[Path]:
    """A directory on a tiny tmpfs with no space left (mounting needs root: skipped without it)."""
    mount_point = tmp_path / "full"
    mount_point.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount_point)],
                             capture_output=True, check=False)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        fd = os.open(mount_point / "filler", os.O_WRONLY | os.O_CREAT)
        try:
            while os.write(fd, b"x" * 4096):
                pass
        except OSError:
            pass  # full
        finally:
            os.close(fd)
        yield mount_point
    finally:
        subprocess.run(["umount", str(mount_point)], check=True)


@pytest.mark.parametrize("command", ["decode", "run"])
def test_a_full_disk_is_one_line_before_the_child_starts(tmp_path: Path, full_disk: Path, command: str):
    out = full_disk / "out"
    result = cpuprof(*commands(tmp_path, out)[command], timeout=60)
    assert result.returncode == exit_codes.USAGE, result.stderr
    line = one_line_error(result)
    assert f"cannot write {out}/launch.json: No space left on device; the run was not started" in line


def test_directories_made_above_the_out_directory_are_said(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    """A typo in --out (a parent that does not exist) is seen: the directories made for it are named."""
    from cpuprof.launch.parent import check_out_dir

    deep = tmp_path / "typo" / "dir" / "x"
    check_out_dir(deep)
    assert deep.is_dir()
    note = capsys.readouterr().err.strip()
    assert note == (f"cpuprof: note: --out {deep}: made the directories above it that did not exist "
                    f"({tmp_path / 'typo'}, {tmp_path / 'typo' / 'dir'})")
    check_out_dir(tmp_path / "typo" / "dir" / "y")  # its parent exists now: nothing to say
    assert capsys.readouterr().err == ""
