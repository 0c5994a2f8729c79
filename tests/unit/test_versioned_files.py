"""cpuprof's four versioned files (profile.json, compare.json, ranks.json, launch.json) read through
one helper: every way a file can be wrong is one FileFormatError naming the file and the problem,
with the usage exit code; the CLI prints it as one line."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from tests.profiles import make_profile, settings

from cpuprof import exit_codes
from cpuprof.errors import FileFormatError, ProfileFormatError
from cpuprof.launch.child_run import LAUNCH_FILE, read_launch_file, write_launch_file
from cpuprof.launch.environment import LaunchSettings
from cpuprof.launch.options import ProfileOptions
from cpuprof.launch.script_child import ScriptConfig, ScriptTarget
from cpuprof.model import Profile
from cpuprof.model.codec import to_json
from cpuprof.model.compare import COMPARE_FILE, Comparison, SweepConfig
from cpuprof.model.io import PROFILE, FileKind
from cpuprof.model.ranks import RANKS_FILE, MultiRun, RankOutcome


def script_config(out: str) -> ScriptConfig:
    s = settings()
    return ScriptConfig(target=ScriptTarget(path="/tmp/x.py", module=None, args=["--n", "3"]),
                        profile=ProfileOptions(), launch=LaunchSettings(threads=2), requested=s.requested,
                        cpu_set=s.cpu_set, topology=s.topology, out=out)


def comparison() -> Comparison:
    return Comparison(format=COMPARE_FILE.format, version=COMPARE_FILE.version, created="2026-11-21T00:00:00+00:00",
                      cpuprof_version="test", argv=["cpuprof", "compare"], base={}, axes={"threads": ["1", "2"]},
                      configs=[SweepConfig(label="threads=1", values={"threads": "1"}),
                               SweepConfig(label="threads=2", values={"threads": "2"})],
                      repetitions=1, order=[[0, 1], [1, 1]], baseline=0)


def multi_run() -> MultiRun:
    return MultiRun(mode="tp", world_size=1, backend="gloo", argv=["x"], timeout_s=5.0, finished=True,
                    ranks=[RankOutcome(rank=0, dir="rank-0", cpus=[0], node=None, threads=1, returncode=0)])


# Each kind: how a good file of it is written into a directory, and how it is read back.
KINDS: dict[str, tuple[FileKind, Callable[[Path], object], Callable[[Path], object]]] = {
    "profile": (PROFILE, lambda d: make_profile().save(d), Profile.load),
    "comparison": (COMPARE_FILE, lambda d: comparison().save(d), Comparison.load),
    "ranks file": (RANKS_FILE, lambda d: multi_run().save(d), MultiRun.load),
    "launch file": (LAUNCH_FILE, lambda d: write_launch_file(d, script_config(str(d))),
                    lambda p: read_launch_file(p, ScriptConfig)),
}


def _error(read: Callable[[Path], object], path: Path) -> FileFormatError:
    with pytest.raises(FileFormatError) as caught:
        read(path)
    assert caught.value.exit_code == exit_codes.USAGE
    assert str(path) in str(caught.value)  # the message names the file
    return caught.value


@pytest.mark.parametrize("kind", KINDS)
def test_each_kind_round_trips_with_its_header(tmp_path: Path, kind: str):
    file_kind, write, read = KINDS[kind]
    write(tmp_path)
    path = tmp_path / file_kind.filename
    data = json.loads(path.read_text())
    assert (data["format"], data["version"]) == (file_kind.format, file_kind.version)
    assert read(path) == read(tmp_path)  # the file, or the directory holding it


@pytest.mark.parametrize("kind", KINDS)
def test_a_truncated_file_is_one_error(tmp_path: Path, kind: str):
    file_kind, write, read = KINDS[kind]
    write(tmp_path)
    path = tmp_path / file_kind.filename
    text = path.read_text()
    path.write_text(text[: len(text) // 2])
    message = str(_error(read, path))
    assert "not valid JSON at line" in message and f"(truncated or not a {kind})" in message


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("garbage, problem", [
    ("\x7fELF\x02\x01\x01 not json", "not valid JSON at line 1 column 1"),
    ("[1, 2, 3]", "(a JSON list, not an object)"),
    ('{"traceEvents": []}', "(no 'cpuprof-"),
    ('{"format": "cpuprof-KIND", "version": "2"}', "has no valid format version ('2')"),
])
def test_garbage_is_one_error(tmp_path: Path, kind: str, garbage: str, problem: str):
    file_kind, _write, read = KINDS[kind]
    path = tmp_path / file_kind.filename
    path.write_text(garbage.replace("cpuprof-KIND", file_kind.format))
    if kind == "launch file" and garbage.startswith('{"traceEvents"'):
        # launch.json had no header before version 1: a file without one is read as one of those.
        problem = ("is not a cpuprof launch file (no 'cpuprof-launch' header, and not one written before it had "
                   "one: launch file: unknown field(s) traceEvents)")
    assert problem in str(_error(read, path))


@pytest.mark.parametrize("kind", KINDS)
def test_a_file_of_another_kind_says_which_it_is(tmp_path: Path, kind: str):
    file_kind, _write, read = KINDS[kind]
    other_name = "ranks file" if kind != "ranks file" else "profile"
    other_kind, write_other, _read = KINDS[other_name]
    write_other(tmp_path)
    path = tmp_path / file_kind.filename
    (tmp_path / other_kind.filename).rename(path)
    assert f"is not a cpuprof {kind}: it is a {other_kind.format} file" in str(_error(read, path))


@pytest.mark.parametrize("kind", KINDS)
def test_a_file_from_a_newer_cpuprof_asks_for_an_upgrade(tmp_path: Path, kind: str):
    file_kind, write, read = KINDS[kind]
    write(tmp_path)
    path = tmp_path / file_kind.filename
    data = json.loads(path.read_text())
    data["version"] = file_kind.version + 1
    path.write_text(json.dumps(data))
    message = str(_error(read, path))
    assert (f"was written by a newer cpuprof ({kind} format version {file_kind.version + 1}); this cpuprof reads "
            f"{file_kind.versions()}: upgrade cpuprof") in message


@pytest.mark.parametrize("kind", KINDS)
def test_a_damaged_file_names_the_bad_field(tmp_path: Path, kind: str):
    file_kind, _write, read = KINDS[kind]
    path = tmp_path / file_kind.filename
    path.write_text(json.dumps({"format": file_kind.format, "version": file_kind.version}))
    message = str(_error(read, path))
    assert f"is a damaged cpuprof {kind} ({kind}: missing field '" in message


@pytest.mark.parametrize("kind", KINDS)
def test_a_missing_file_is_one_error(tmp_path: Path, kind: str):
    file_kind, _write, read = KINDS[kind]
    message = str(_error(read, tmp_path / file_kind.filename))
    assert f"no such {kind} (expected a directory written by {file_kind.written_by}" in message


def test_profile_errors_keep_their_old_name():
    assert ProfileFormatError is FileFormatError


def test_a_launch_file_written_before_it_had_a_header_still_reads(tmp_path: Path):
    config = script_config(str(tmp_path))
    path = tmp_path / "launch.json"
    path.write_text(json.dumps(to_json(config), indent=1))
    assert read_launch_file(path, ScriptConfig) == config


def test_a_version_1_comparison_is_read_as_the_current_version(tmp_path: Path):
    data = to_json(comparison())
    data["version"] = 1
    (tmp_path / "compare.json").write_text(json.dumps(data))
    loaded = Comparison.load(tmp_path)
    assert loaded.version == COMPARE_FILE.version and loaded.configs == comparison().configs


def test_the_cli_prints_a_bad_file_as_one_line(tmp_path: Path):
    (tmp_path / "ranks.json").write_text('{"format": "cpuprof-ranks", "version": 7}')
    result = subprocess.run([sys.executable, "-m", "cpuprof", "report", str(tmp_path)], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == exit_codes.USAGE
    assert result.stderr.splitlines() == [
        f"cpuprof: error: {tmp_path / 'ranks.json'} was written by a newer cpuprof (ranks file format version 7); "
        "this cpuprof reads version 1: upgrade cpuprof to read it"]
