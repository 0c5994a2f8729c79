"""Progress in a log (CI, `| tee`): every phase change, at most a line per interval within a phase,
and never silent for longer than the interval while a long step that says nothing runs."""

from __future__ import annotations

import io
import time

from cpuprof.launch.progress import Progress


def test_a_log_gets_phase_changes_and_at_most_a_line_per_interval():
    out = io.StringIO()
    progress = Progress(out, interval_s=60)
    for step in range(5):
        progress.show(f"decoding: step {step + 1}/5", phase="decode")
    progress.done("decoded 5 tokens")
    assert out.getvalue().splitlines() == ["cpuprof: decoding: step 1/5", "cpuprof: decoded 5 tokens"]


def test_a_long_silent_step_is_said_to_go_on_every_interval():
    """A measurement that says nothing for 0.5 s with an interval of 0.1 s: lines saying it still runs,
    with its time; none after the step ends."""
    out = io.StringIO()
    progress = Progress(out, interval_s=0.1)
    with progress.keep_alive():
        progress.show("measuring the machine's roofs ...", phase="roofs")
        time.sleep(0.5)
    said = out.getvalue().splitlines()
    assert said[0] == "cpuprof: measuring the machine's roofs ..."
    still = [line for line in said if line.startswith("cpuprof: still measuring the machine's roofs (")]
    assert 2 <= len(still) <= 6, said
    time.sleep(0.3)
    assert out.getvalue().splitlines() == said  # the thread ended with the step
