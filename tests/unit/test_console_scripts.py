"""`cpuprof run -- torchrun ...`: a Python console script on PATH runs as the Python script it is
(launch.program.script_target), under cpuprof's own Python; anything else is refused in one line."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from cpuprof.errors import UsageError
from cpuprof.launch.program import script_target


def _script(directory: Path, name: str, first_line: str) -> Path:
    path = directory / name
    path.write_text(f"{first_line}\nimport sys\nsys.exit(0)\n")
    path.chmod(0o755)
    return path


def test_a_console_script_of_this_python_on_path_runs_as_a_script(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    _script(tmp_path, "torchrun", f"#!{sys.executable}")
    _script(tmp_path, "envrun", "#!/usr/bin/env python3")
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ.get('PATH', '')}")
    target = script_target(["--", "torchrun", "--nproc-per-node", "2", "job.py"])
    assert (target.path, target.module, target.args) == (str(tmp_path / "torchrun"), None,
                                                          ["--nproc-per-node", "2", "job.py"])
    assert script_target(["--", "envrun"]).path == str(tmp_path / "envrun")
    # pip's launcher for an interpreter path too long for a shebang line
    quotes = "'" * 3
    _script(tmp_path, "longrun", f'#!/bin/sh\n{quotes}exec\' "{sys.executable}" "$0" "$@"\n\' {quotes}')
    assert script_target(["--", "longrun"]).path == str(tmp_path / "longrun")
    assert script_target(["--", str(tmp_path / "torchrun"), "x"]).args == ["x"]  # a path, not a name on PATH


def test_another_pythons_script_and_non_python_programs_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    _script(tmp_path, "othertool", "#!/opt/elsewhere/bin/python3.9")
    _script(tmp_path, "shelltool", "#!/bin/sh")
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ.get('PATH', '')}")
    with pytest.raises(UsageError, match=r"othertool: a script of another Python \(/opt/elsewhere/bin/python3.9\)"):
        script_target(["--", "othertool"])
    for refused in ("shelltool", "no-such-program-anywhere"):
        with pytest.raises(UsageError, match=rf"^{refused}: cpuprof runs Python programs: .*console script"):
            script_target(["--", refused])
