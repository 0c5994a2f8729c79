"""The child-run base every launched child subclasses, the exit codes of endings, and a group's one error."""

from __future__ import annotations

import errno
import faulthandler
import json
import os
import signal
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from tests.profiles import settings

from cpuprof import exit_codes
from cpuprof.errors import CpuprofError, UsageError
from cpuprof.launch import child_signals
from cpuprof.launch.child_run import CHECKPOINT_REASON, ChildRun, SignalReceived, child_main, write_launch_file
from cpuprof.launch.options import ProfileOptions
from cpuprof.launch.ranks import group_failure
from cpuprof.model import Profile
from cpuprof.model.ranks import MultiRun, RankOutcome


@pytest.fixture(autouse=True)
def keep_process_state() -> Iterator[None]:
    """execute() sets the SIGINT/SIGTERM handlers and child_main points faulthandler at crash.txt, as a
    child does: pytest's come back after."""
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    crashes_enabled = faulthandler.is_enabled()
    unraisable = sys.unraisablehook
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)
    sys.unraisablehook = unraisable
    child_signals.take_pending()  # a signal a test held is that test's
    if crashes_enabled:
        faulthandler.enable(sys.__stderr__, all_threads=True)
    else:
        faulthandler.disable()


class CountingRun(ChildRun):
    """A kind of child as small as one can be: it counts to ``steps_to_run`` and fails as told."""

    work = "counting"

    def __init__(self, out: Path, steps_to_run: int = 3, fail_with: BaseException | None = None,
                 checkpoint_s: float = float("inf")) -> None:
        s = settings()
        super().__init__(out, ProfileOptions(enabled=False), s.requested, s.cpu_set, s.topology,
                         checkpoint_s=checkpoint_s)
        self.steps_to_run = steps_to_run
        self.fail_with = fail_with
        self.counted = 0
        self.closed = False

    def steps(self) -> None:
        self.stage = "counting"
        assert self.make_profiler() is None  # profiling off: no profiler, nothing to check
        for _ in range(self.steps_to_run):
            self.counted += 1
            self.checkpoint_if_due()
        if self.fail_with is not None:
            raise self.fail_with

    def where(self) -> str:
        return f"after {self.counted} of {self.steps_to_run} counts" if self.stage == "counting" else super().where()

    def close(self) -> None:
        self.closed = True


def test_a_run_that_ends_well_saves_a_complete_profile(tmp_path: Path):
    run = CountingRun(tmp_path)
    assert run.execute() == exit_codes.OK
    profile = Profile.load(tmp_path)
    assert profile.status.complete and not profile.profiled
    assert profile.settings is not None and profile.settings.cpu_set == settings().cpu_set
    assert not (tmp_path / "roofline.svg").exists()  # no GEMMs measured, no roofs: no chart


def test_a_failure_saves_what_was_measured_and_says_where_in_one_line(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]):
    run = CountingRun(tmp_path, fail_with=RuntimeError("the abacus broke\nsecond line"))
    assert run.execute() == exit_codes.FAILED
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"cpuprof: error: counting failed: RuntimeError: the abacus broke after 3 of 3 counts; nothing was "
                   f"profiled because of it; what was measured is in {tmp_path / 'profile.json'} "
                   "(set CPUPROF_DEBUG=1 for the traceback)"]
    status = Profile.load(tmp_path).status
    assert not status.complete and status.reason == ("failed: RuntimeError: the abacus broke after 3 of 3 counts; "
                                                     "nothing was profiled because of it")


def test_bad_input_found_in_the_child_is_one_line_and_the_usage_code(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]):
    assert CountingRun(tmp_path, fail_with=UsageError("--count 0: expected 1 or more")).execute() == exit_codes.USAGE
    assert capsys.readouterr().err == "cpuprof: error: --count 0: expected 1 or more\n"
    assert not (tmp_path / "profile.json").exists()  # nothing ran: nothing to keep


def test_a_cpuprof_error_is_a_failure_without_the_debug_hint(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    assert CountingRun(tmp_path, fail_with=CpuprofError("no abacus here")).execute() == exit_codes.FAILED
    assert "counting failed: no abacus here after 3 of 3 counts" in capsys.readouterr().err
    assert "CPUPROF_DEBUG" not in capsys.readouterr().err


@pytest.mark.parametrize("checkpointed", [False, True])
def test_a_complete_run_whose_profile_cannot_be_written_says_so_and_prints_its_figures(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], checkpointed: bool):
    """A full disk as the finished run saves: not "counting failed", but what failed and why, and the
    figures still in memory (a checkpoint written earlier, while there was space, is named as such)."""
    save = Profile.save

    def disk_full_at_the_end(profile: Profile, out: Path) -> Path:
        if profile.status.complete:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return save(profile, out)

    monkeypatch.setattr(Profile, "save", disk_full_at_the_end)
    run = CountingRun(tmp_path, checkpoint_s=0.0 if checkpointed else float("inf"))
    assert run.execute() == exit_codes.FAILED
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("cpuprof: error: ")]
    checkpoint = f"; {tmp_path / 'profile.json'} is an earlier checkpoint, not this result" if checkpointed else ""
    assert errors == [f"cpuprof: error: counting finished after 3 of 3 counts, but its profile could not be written "
                      f"to {tmp_path / 'profile.json'}: No space left on device{checkpoint}"]
    assert err.index("Settings in force") < err.index("cpuprof: error: ")  # the report of what is in memory
    assert (tmp_path / "profile.json").exists() == checkpointed


@pytest.mark.parametrize("interrupt, name", [(SignalReceived(signal.SIGTERM), "SIGTERM"),
                                             (KeyboardInterrupt(), "SIGINT")])
def test_a_signal_saves_what_was_measured_as_interrupted(tmp_path: Path, interrupt: BaseException, name: str):
    assert CountingRun(tmp_path, steps_to_run=2, fail_with=interrupt).execute() == exit_codes.INTERRUPTED
    status = Profile.load(tmp_path).status
    assert not status.complete
    assert status.reason == f"interrupted by {name} after 2 of 2 counts; nothing was profiled because of it"


def test_checkpoints_are_saved_as_the_run_goes(tmp_path: Path):
    run = CountingRun(tmp_path, checkpoint_s=0.0)  # due at every step
    run.stage = "counting"
    run.checkpoint_if_due()
    status = Profile.load(tmp_path).status
    assert not status.complete and status.reason == CHECKPOINT_REASON


@dataclass
class CountConfig:
    steps: int


def test_child_main_reads_the_launch_file_runs_and_closes(tmp_path: Path):
    made: list[CountingRun] = []

    def make(config: CountConfig) -> CountingRun:
        made.append(CountingRun(tmp_path, steps_to_run=config.steps))
        return made[0]

    launch = tmp_path / "launch.json"
    launch.write_text(json.dumps({"format": "cpuprof-launch", "version": 1, "steps": 4}))
    assert child_main(["child", str(launch)], CountConfig, make) == exit_codes.OK
    assert made[0].counted == 4 and made[0].closed
    assert (tmp_path / "crash.txt").exists()  # faulthandler's file, held open for the child's life


def test_child_main_refuses_a_bad_launch_file_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    launch = tmp_path / "launch.json"
    launch.write_text('{"format": "cpuprof-launch", "version": 1, "steps": 4')
    assert child_main(["child", str(launch)], CountConfig, lambda c: CountingRun(tmp_path)) == exit_codes.USAGE
    assert capsys.readouterr().err.startswith(f"cpuprof: error: {launch}: not valid JSON at line 1")


def test_the_parent_writes_the_launch_file_with_its_header(tmp_path: Path):
    written = write_launch_file(tmp_path, ProfileOptions())
    data = json.loads(written.read_text())
    assert (data["format"], data["version"], data["mode"]) == ("cpuprof-launch", 1, ProfileOptions().mode)


@pytest.mark.parametrize("returncode, interrupted, code", [
    (2, False, exit_codes.USAGE),  # the child said what it refused
    (1, False, exit_codes.FAILED),
    (3, False, 3),  # a program's own status (cpuprof run)
    (-9, False, exit_codes.FAILED),  # killed: no status of its own
    (1, True, exit_codes.INTERRUPTED),  # Ctrl-C while it was still starting Python
    (130, False, exit_codes.INTERRUPTED),
])
def test_a_childs_status_as_the_launchers_exit_code(returncode: int, interrupted: bool, code: int):
    assert exit_codes.of_child(returncode, interrupted) == code


@pytest.mark.parametrize("returncode, interrupted, code", [
    (3, False, 3),
    (-signal.SIGKILL, False, 137),  # as a shell says of a program the kernel's OOM killer ended
    (-signal.SIGSEGV, False, 139),
    (143, False, 143),  # the script child's own SIGTERM ending: 128 + 15
    (-signal.SIGINT, True, exit_codes.INTERRUPTED),  # the launcher passed it the Ctrl-C
])
def test_a_programs_status_as_runs_exit_code_is_what_a_shell_says(returncode: int, interrupted: bool, code: int):
    assert exit_codes.of_program(returncode, interrupted) == code


def _group(returncodes: list[int | None], ended: list[float], interrupted: bool = False) -> MultiRun:
    ranks = [RankOutcome(rank=k, dir=f"rank-{k}", cpus=[k], node=None, threads=1, returncode=rc, ended_s=t,
                         failure=None if rc == 0 else f"rank {k} failed with exit code {rc}")
             for k, (rc, t) in enumerate(zip(returncodes, ended, strict=True))]
    return MultiRun(mode="nproc", world_size=len(ranks), backend=None, argv=[], timeout_s=1.0, ranks=ranks,
                    finished=True, interrupted=interrupted)


def test_a_group_fails_with_the_first_failure_and_its_status(tmp_path: Path):
    error = group_failure(_group([0, -9, 3], ended=[5.0, 2.0, 1.0]), tmp_path, member="process")
    assert error is not None and error.exit_code == 3  # rank 2 failed first, with its own status
    assert str(error) == (f"rank 2 failed with exit code 3 (and 1 more process(es) failed after it); every "
                          f"process's profile so far is in {tmp_path}/rank-*")
    assert group_failure(_group([0, 0], ended=[1.0, 1.0]), tmp_path) is None
    interrupted = group_failure(_group([130, 1], ended=[1.0, 2.0], interrupted=True), tmp_path)
    assert interrupted is not None and interrupted.exit_code == exit_codes.INTERRUPTED
    assert "(and 1 more rank(s) failed after it); every rank's profile" in str(interrupted)


class CatchAllRun(CountingRun):
    """Its work catches every Exception, as the symbol demangler a checkpoint calls does."""

    def steps(self) -> None:
        self.stage = "demangling"
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(30)  # the handler raises here, as soon as the signal is delivered
        except Exception:
            pass
        raise AssertionError("the signal was swallowed by an `except Exception`")


def test_a_real_signal_is_not_swallowed_by_a_catch_all(tmp_path: Path):
    assert CatchAllRun(tmp_path).execute() == exit_codes.INTERRUPTED
    status = Profile.load(tmp_path).status
    assert status.reason == "interrupted by SIGTERM while demangling; nothing was profiled because of it"


class SignalledAtCloseRun(CountingRun):
    """Ends well, then a Ctrl-C comes while it cleans up (the process group it leaves, say)."""

    def close(self) -> None:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.01)  # the handler runs here, were it to raise
        super().close()


def _launch_file(tmp_path: Path, steps: int) -> Path:
    launch = tmp_path / "launch.json"
    launch.write_text(json.dumps({"format": "cpuprof-launch", "version": 1, "steps": steps}))
    return launch


def test_a_signal_during_the_cleanup_is_no_traceback_and_the_run_says_it_was_interrupted(tmp_path: Path):
    made: list[CountingRun] = []

    def make(config: CountConfig) -> CountingRun:
        made.append(SignalledAtCloseRun(tmp_path, steps_to_run=config.steps))
        return made[0]

    assert child_main(["child", str(_launch_file(tmp_path, 2))], CountConfig, make) == exit_codes.INTERRUPTED
    assert made[0].closed  # the cleanup ran to its end
    assert Profile.load(tmp_path).status.complete  # what it measured was all there was to measure


class CloseFailsRun(CountingRun):
    def close(self) -> None:
        raise AttributeError("partially initialized module 'torch' has no attribute 'distributed'")


def test_a_failing_cleanup_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    code = child_main(["child", str(_launch_file(tmp_path, 2))], CountConfig, lambda c: CloseFailsRun(tmp_path))
    assert code == exit_codes.FAILED
    assert capsys.readouterr().err == ("cpuprof: error: counting ended, but leaving what it joined failed "
                                       "(AttributeError: partially initialized module 'torch' has no attribute "
                                       "'distributed')\n")


class SignalledWhileSavingRun(CountingRun):
    """Fails, and a SIGTERM comes while the failure's profile is being saved."""

    def save(self, complete: bool, reason: str | None = None) -> Path:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.01)
        return super().save(complete, reason)


def test_a_signal_while_a_failure_is_saved_leaves_the_failure_the_ending(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]):
    run = SignalledWhileSavingRun(tmp_path, fail_with=RuntimeError("the abacus broke"))
    assert run.execute() == exit_codes.FAILED
    assert "counting failed: RuntimeError: the abacus broke" in capsys.readouterr().err
    assert not Profile.load(tmp_path).status.complete


def test_a_signal_raised_while_a_class_is_created_is_still_the_signal():
    """A SIGINT that lands while a module is imported lazily, inside a class body's __set_name__ (a
    dataclass field), reaches the run wrapped in another error (Python 3.11's RuntimeError "Error
    calling __set_name__"): it is still the interrupt, not a failure of the run."""
    from cpuprof.launch.child_run import signal_within

    class Interrupting:
        def __set_name__(self, owner: type, name: str) -> None:
            raise KeyboardInterrupt

    try:
        type("Created", (), {"field": Interrupting()})
    except BaseException as exc:  # noqa: BLE001 (what the run's ending sees)
        caught = exc
    assert isinstance(signal_within(caught), KeyboardInterrupt)
    assert signal_within(ValueError("a real failure")) is None


SWALLOWED = """
import os, signal, sys, time
from cpuprof.launch import child_signals

child_signals.raise_on_signal()


class Finalized:
    def __del__(self):
        os.kill(os.getpid(), signal.SIGINT)  # the handler runs inside __del__: Python ignores what it raises
        for _ in range(1000):
            pass


try:
    Finalized()  # dropped at once
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        pass
    print("the run went on")
except child_signals.SignalReceived as exc:
    print("interrupted by", exc.args[0])
"""


def test_a_signal_raised_inside_a_finalizer_still_interrupts_the_run(tmp_path: Path):
    """Known answer: SIGINT sent from inside an object's __del__ is raised there, where Python only
    reports and drops it (a decode in CI ran on after its Ctrl-C, every later signal ignored). It is
    delivered again and interrupts the run where it is; nothing of it is printed."""
    import subprocess

    script = tmp_path / "swallowed.py"
    script.write_text(SWALLOWED)
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "interrupted by SIGINT", (result.stdout, result.stderr)
    assert "Exception ignored" not in result.stderr
