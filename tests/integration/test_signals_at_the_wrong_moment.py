"""Signals at the moments that used to go wrong, made to arrive exactly there: Ctrl-C while a child
imports torch or its own modules, Ctrl-C between a compare run's end and its result line, a program
that sends itself SIGTERM, a child killed with its perf map on disk.

The moment is not guessed with a timer: a ``sitecustomize`` module on the children's PYTHONPATH
(:func:`signal_hook`) watches imports and sends the Ctrl-C itself, as a terminal does, to the whole
process group (the launcher and its child), which each test starts in a session of its own."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_runs import cpuprof, one_line_error

from cpuprof.launch.sweep import load
from cpuprof.model import Profile

TINY = ["--preset", "tiny", "--prompt-len", "8", "--new-tokens", "4", "--warmup", "1", "--roofs", "off"]

SITECUSTOMIZE = '''
"""Test hook (tests/integration/test_signals_at_the_wrong_moment.py): a Ctrl-C at an exact moment."""
import os, signal, sys

_AT = os.environ.get("SIGNAL_HOOK_AT_IMPORT")  # a module name prefix: Ctrl-C as it is imported...
_AFTER = os.environ.get("SIGNAL_HOOK_AFTER")  # ...once this module is imported (torch half imported)
_MARK = os.environ["SIGNAL_HOOK_MARK"]  # written when the hook fired
# The launcher's parent is the test: the hooks fire in the launched children, unless IN_LAUNCHER.
_CHILD = os.getppid() != int(os.environ["SIGNAL_HOOK_TEST_PID"])
_HERE = _CHILD != bool(os.environ.get("SIGNAL_HOOK_IN_LAUNCHER"))
_ONCE_EXISTS = os.environ.get("SIGNAL_HOOK_ONCE_EXISTS")  # and only once this file exists


def _ctrl_c():
    with open(_MARK, "a") as mark:
        mark.write(f"{os.getpid()}\\n")
    os.killpg(0, signal.SIGINT)


def _imported(name):
    """Whether ``name`` finished importing (a module being imported is in sys.modules already)."""
    module = sys.modules.get(name)
    return module is not None and not getattr(getattr(module, "__spec__", None), "_initializing", False)


class _Finder:
    fired = False

    def find_spec(self, fullname, path=None, target=None):
        if (not self.fired and fullname.startswith(_AT) and (not _AFTER or _imported(_AFTER))
                and (not _ONCE_EXISTS or os.path.exists(_ONCE_EXISTS))):
            self.fired = True
            _ctrl_c()
        return None


if _HERE and _AT:
    sys.meta_path.insert(0, _Finder())
if _HERE and os.environ.get("SIGNAL_HOOK_AT_EXIT"):
    import atexit

    atexit.register(_ctrl_c)  # registered first, so it runs last: the child's very end
'''


def signal_hook(tmp_path: Path, **settings: str) -> tuple[dict[str, str], Path]:
    """The environment that makes the launched children send the Ctrl-C where ``settings`` say,
    and the file each child that fired writes its pid in."""
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(SITECUSTOMIZE)
    mark = tmp_path / "fired"
    env = {key: value for key, value in os.environ.items() if not key.startswith("SIGNAL_HOOK_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(hooks), os.environ.get("PYTHONPATH")]))
    env.update({"SIGNAL_HOOK_MARK": str(mark), "SIGNAL_HOOK_TEST_PID": str(os.getpid()),
                **{f"SIGNAL_HOOK_{key.upper()}": value for key, value in settings.items()}})
    return env, mark


def cpuprof_in_own_session(args: list[str], env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess:
    """``python -m cpuprof ARGS`` in a process group of its own, so that a Ctrl-C sent to the group
    reaches it and its children, as a terminal's would, and never this test."""
    return subprocess.run([sys.executable, "-m", "cpuprof", *args], capture_output=True, text=True, env=env,
                          timeout=timeout, start_new_session=True)


def assert_interrupted_in_one_line(result: subprocess.CompletedProcess, mark: Path) -> str:
    assert mark.exists(), f"the hook never fired: {result.stderr}"
    assert result.returncode == 130, result.stderr
    return one_line_error(result)


@pytest.mark.parametrize("at, after", [("cpuprof.model", ""), ("torch.", "torch.distributed")],
                         ids=["while-the-child-imports-cpuprof", "while-the-child-imports-torch"])
def test_ctrl_c_while_the_decode_child_imports_is_the_interrupted_ending(tmp_path: Path, at: str, after: str):
    env, mark = signal_hook(tmp_path, at_import=at, after=after)
    out = tmp_path / "out"
    result = cpuprof_in_own_session(["decode", *TINY, "--out", str(out)], env)
    line = assert_interrupted_in_one_line(result, mark)
    assert line.startswith("cpuprof: error: decoding was interrupted; what was measured so far (not profiled) is in")
    status = Profile.load(out).status
    assert not status.complete and status.reason.startswith("interrupted by SIGINT"), status


@pytest.mark.parametrize("at, after, when", [("cpuprof.model", "", " before it started"),
                                             ("torch.", "torch.distributed", "")],
                         ids=["while-the-child-imports-cpuprof", "while-the-program-imports-torch"])
def test_ctrl_c_while_the_script_child_imports_is_the_interrupted_ending(tmp_path: Path, at: str, after: str,
                                                                         when: str):
    script = tmp_path / "imports_torch.py"
    script.write_text("import torch\nprint('torch imported')\n")
    env, mark = signal_hook(tmp_path, at_import=at, after=after)
    # --roofs off: no roofs child before the program, where the hook would fire first (its own ending,
    # "interrupted while the machine's roofs were measured", is another case).
    result = cpuprof_in_own_session(["run", "--roofs", "off", "--out", str(tmp_path / "out"), "--", "python",
                                     str(script)], env)
    line = assert_interrupted_in_one_line(result, mark)
    assert "torch imported" not in result.stdout
    assert line.startswith("cpuprof: error: nothing was profiled: torch was never imported (the program was "
                           f"interrupted by SIGINT{when};"), line


def test_ctrl_c_at_the_end_of_a_compare_run_stops_the_sweep(tmp_path: Path):
    """The Ctrl-C comes as the run's child exits, its profile saved. The run is interrupted, not
    done, and compare says so."""
    env, mark = signal_hook(tmp_path, at_exit="1")
    out = tmp_path / "sweep"
    result = cpuprof_in_own_session(["compare", *TINY, "--threads", "1,2", "-r", "1", "--out", str(out)], env)
    assert mark.exists(), result.stderr
    assert result.returncode == 130, result.stderr
    assert f"resume with: python -m cpuprof compare --resume {out}" in one_line_error(result)
    assert [r.status for r in load(out).runs] == ["interrupted"]


def ignoring_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.mark.parametrize("preexec", [None, ignoring_sigint], ids=["from-a-terminal", "as-a-background-job"])
def test_ctrl_c_after_a_compare_runs_child_ended_stops_the_sweep(tmp_path: Path, preexec):
    """The signal comes after the run's child saved its profile and exited, before the run's result
    line: in the launcher alone, as it reads the profile (its first import of the threads analysis).
    A background job (``compare ... &`` in a script) starts with SIGINT ignored, so only the
    launcher's own handlers hear it there: the run is interrupted, not done, and compare stops."""
    out = tmp_path / "sweep"
    env, mark = signal_hook(tmp_path, in_launcher="1", at_import="cpuprof.analysis.threads",
                            once_exists=str(out / "config-01" / "run-1" / "profile.json"))
    result = subprocess.run([sys.executable, "-m", "cpuprof", "compare", *TINY, "--threads", "1,2", "-r", "1",
                             "--out", str(out)], capture_output=True, text=True, env=env, timeout=300,
                            start_new_session=True, preexec_fn=preexec)
    assert mark.exists(), result.stderr
    assert result.returncode == 130, result.stderr
    assert f"resume with: python -m cpuprof compare --resume {out}" in one_line_error(result)
    assert [r.status for r in load(out).runs] == ["interrupted"]


MAP_WRITER = """
import os, sys, time
from pathlib import Path

import torch  # profiled from here

Path(f"/tmp/perf-{os.getpid()}.map").write_text("7f0000000000 40 jit_test_kernel\\n")
Path(sys.argv[1]).write_text(str(os.getpid()))
time.sleep(60)
"""


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGINT], ids=["child-killed", "ctrl-c"])
def test_the_perf_map_cpuprof_asked_for_is_removed_however_the_child_ends(tmp_path: Path, signum: int):
    script = tmp_path / "writes_a_perf_map.py"
    script.write_text(MAP_WRITER)
    started = tmp_path / "started"
    env = {key: value for key, value in os.environ.items() if key != "ONEDNN_JIT_PROFILE"}  # cpuprof asks for it
    proc = subprocess.Popen([sys.executable, "-m", "cpuprof", "run", "--out", str(tmp_path / "out"), "--",
                             "python", str(script), str(started)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not started.exists() or not started.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.05)
        child = int(started.read_text())
        perf_map = Path(f"/tmp/perf-{child}.map")
        assert perf_map.exists()
        if signum == signal.SIGKILL:
            os.kill(child, signal.SIGKILL)  # nothing of the child's own runs after this
        else:
            os.killpg(proc.pid, signal.SIGINT)  # a terminal's Ctrl-C
        _, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == (137 if signum == signal.SIGKILL else 130), stderr
    assert not perf_map.exists()


def test_a_program_that_sends_itself_sigterm_exits_as_a_shell_says(tmp_path: Path):
    script = tmp_path / "terminates_itself.py"
    script.write_text("import os, signal\nos.kill(os.getpid(), signal.SIGTERM)\n")
    result = cpuprof("run", "--out", str(tmp_path / "out"), "--", "python", str(script))
    assert result.returncode == 128 + signal.SIGTERM, result.stderr
    assert "interrupted by SIGTERM" in one_line_error(result)
