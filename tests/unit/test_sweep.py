"""The compare sweep's heartbeat: what a run's child last said, while it runs."""

from __future__ import annotations

import time
from pathlib import Path

from cpuprof.launch.sweep import Heartbeat, last_progress_line


def test_a_running_configuration_is_never_silent_for_long(tmp_path: Path):
    """While a run's child decodes into its log, the sweep says what the log last said, with the time
    so far, every interval; the program's own lines and cpuprof's warnings are not progress."""
    log = tmp_path / "child.log"
    lines: list[str] = []
    deadline = time.monotonic() + 30  # however slow the machine, the lines come

    def wait_for(words: str) -> None:
        while not any(words in line for line in lines) and time.monotonic() < deadline:
            time.sleep(0.02)

    with Heartbeat("[2/6] threads=2, run 1", tmp_path, lines.append, interval_s=0.05):
        wait_for(": starting (")  # nothing logged yet
        log.write_text("cpuprof: prefill of 8 tokens ...\nprogram output\ncpuprof: decoding: step 40/256, 7.90 "
                       "tokens/s (last 5 steps)\ncpuprof: warning: dropped cycles\ncpuprof: note: x\ncpuprof: half")
        wait_for("decoding: step 40/256")
    assert lines and lines[0].startswith("cpuprof: [2/6] threads=2, run 1: starting (")
    assert lines[-1].startswith("cpuprof: [2/6] threads=2, run 1: decoding: step 40/256, 7.90 tokens/s")
    # a group's run logs in rank-0/; a control character from the log is never echoed raw
    (tmp_path / "group" / "rank-0").mkdir(parents=True)
    (tmp_path / "group" / "rank-0" / "child.log").write_text("cpuprof: decoding\x1b[2J\n")
    said = last_progress_line([tmp_path / "group" / "child.log", tmp_path / "group" / "rank-0" / "child.log"])
    assert said is not None and said.startswith("decoding") and "\x1b" not in said


def test_a_childs_own_clock_is_not_shown_beside_the_runs(tmp_path: Path):
    """The child says "still compiling the model (13 s)" in its log; the sweep's line has one clock, the
    run's, not "still compiling the model (13 s) (30 s)"."""
    (tmp_path / "child.log").write_text("cpuprof: still compiling the model (13 s)\n")
    lines: list[str] = []
    deadline = time.monotonic() + 30
    with Heartbeat("[1/2] compile=on, run 1", tmp_path, lines.append, interval_s=0.05):
        while not lines and time.monotonic() < deadline:
            time.sleep(0.02)
    assert lines[0].startswith("cpuprof: [1/2] compile=on, run 1: compiling the model (")
    assert "(13 s)" not in lines[0] and lines[0].count(" s)") == 1
