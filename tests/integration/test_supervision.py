"""The launcher's supervision of its children, on real processes and real signals."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from cpuprof.launch.parent import Supervision

SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]


def test_a_signal_that_arrives_before_the_child_is_added_is_passed_to_it():
    """The window CI once hit: Ctrl-C after the child's exec but before the launcher waited on it
    killed the launcher and left the child running."""
    with Supervision() as group:
        os.kill(os.getpid(), signal.SIGINT)  # handled by the group: no KeyboardInterrupt here
        group.add(subprocess.Popen(SLEEPER))
        (ended,) = group.wait(timeout_s=30)
    assert ended.interrupted
    assert ended.returncode in (-signal.SIGINT, 1)  # the signal, or Python's KeyboardInterrupt


def test_a_signal_while_waiting_reaches_every_child_and_the_handlers_are_restored_after():
    before = signal.getsignal(signal.SIGTERM)
    with Supervision() as group:
        for _ in range(2):
            group.add(subprocess.Popen(SLEEPER))
        os.kill(os.getpid(), signal.SIGTERM)
        ended = group.wait(timeout_s=30)
    assert [e.returncode for e in ended] == [-signal.SIGTERM, -signal.SIGTERM]
    assert all(e.interrupted for e in ended)
    assert signal.getsignal(signal.SIGTERM) is before


def test_children_left_running_after_one_fails_are_stopped_after_the_timeout():
    with Supervision() as group:
        group.add(subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"]))
        group.add(subprocess.Popen(SLEEPER))
        failed, stopped = group.wait(timeout_s=0.5)
    assert failed.returncode == 3 and failed.stopped_by is None and not failed.interrupted
    assert stopped.stopped_by == "SIGINT" and stopped.returncode in (-signal.SIGINT, 1)
    assert stopped.ended_s > failed.ended_s + 0.5



def test_a_signal_after_every_child_ended_is_not_lost():
    """Ctrl-C between the last child's end and the handlers' restoration: no child's outcome can
    carry it, so it reaches this process as if never caught (compare must stop, not go on)."""
    with pytest.raises(KeyboardInterrupt):  # noqa: PT012 (the signal is raised as the block ends)
        with Supervision() as group:
            group.add(subprocess.Popen([sys.executable, "-c", "pass"]))
            (ended,) = group.wait(timeout_s=30)
            assert ended.returncode == 0 and not ended.interrupted
            os.kill(os.getpid(), signal.SIGINT)


def test_a_signal_no_child_outcome_carries_is_raised_when_the_block_ends():
    """The child took the signal as it was finishing and exited 0 anyway: nothing says the run was
    interrupted, so the launcher's own caller must hear of it (SIGTERM too, as KeyboardInterrupt)."""
    code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(0.5)"
    with pytest.raises(KeyboardInterrupt):  # noqa: PT012 (raised as the block ends)
        with Supervision() as group:
            group.add(subprocess.Popen([sys.executable, "-c", code]))
            time.sleep(0.3)  # its handler is in place
            os.kill(os.getpid(), signal.SIGTERM)
            (ended,) = group.wait(timeout_s=30)
            assert ended.returncode == 0 and ended.interrupted


def test_an_error_in_the_block_leaves_no_child_running():
    with pytest.raises(RuntimeError, match="rank 1 could not start"):  # noqa: PT012
        with Supervision() as group:
            group.add(subprocess.Popen(SLEEPER))
            raise RuntimeError("rank 1 could not start")
    (child,) = group.children
    assert child.returncode in (-signal.SIGINT, 1)  # interrupted, not left behind


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM])
def test_the_launchers_death_ends_its_program_and_followed_processes_which_save_their_profiles(tmp_path, signum):
    """`kill -9` of `cpuprof run` once left the program and its followed processes running under
    init, unprofiled and unsupervised: both end within seconds, whatever ended the launcher."""
    from cpuprof.model import Profile
    from cpuprof.model.run_layout import processes_dir

    loop = "import torch, time\nwhile True:\n    torch.mm(torch.ones(8, 8), torch.ones(8, 8)); time.sleep(0.01)\n"
    (tmp_path / "child.py").write_text(loop)
    (tmp_path / "main.py").write_text(f"import subprocess, sys\nsubprocess.Popen([sys.executable, "
                                      f"{str(tmp_path / 'child.py')!r}])\n" + loop)
    out = tmp_path / "out"
    launcher = subprocess.Popen([sys.executable, "-m", "cpuprof", "run", "--out", str(out), "--", "python",
                                 str(tmp_path / "main.py")], stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
    program: list[int] = []
    followed = 0
    try:
        assert launcher.stderr is not None
        for line in launcher.stderr:  # the followed child has started its profile
            if "following process" in line:
                break
        program = [int(p) for p in subprocess.run(["pgrep", "-P", str(launcher.pid)], capture_output=True,
                                                   text=True).stdout.split()]
        (followed,) = [int(p.name) for p in processes_dir(out).iterdir()]
        assert program and all(_alive(p) for p in (*program, followed))
        os.kill(launcher.pid, signum)
        launcher.wait(timeout=30)
        deadline = time.monotonic() + 20
        while any(_alive(p) for p in (*program, followed)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(_alive(p) for p in (*program, followed))
        assert Profile.load(out).profiled and Profile.load(processes_dir(out) / str(followed)).profiled
    finally:  # nothing left behind, whatever failed above
        if launcher.poll() is None:
            launcher.kill()
        for pid in (*program, followed):
            if pid and _alive(pid):
                os.kill(pid, signal.SIGKILL)
