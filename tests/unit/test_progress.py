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

    def still() -> list[str]:
        return [line for line in out.getvalue().splitlines()
                if line.startswith("cpuprof: still measuring the machine's roofs (")]

    with progress.keep_alive():
        progress.show("measuring the machine's roofs ...", phase="roofs")
        deadline = time.monotonic() + 30  # however slow the machine, the lines come
        while len(still()) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
    said = out.getvalue().splitlines()
    assert said[0] == "cpuprof: measuring the machine's roofs ..." and len(still()) >= 2, said
    time.sleep(0.3)
    assert out.getvalue().splitlines() == said  # the thread ended with the step


def test_what_goes_on_is_the_stage_and_its_time_restarts_with_it():
    """Given what is under way (a run's stage), the line names it, with the time since it began; a
    finished step's line is never repeated as if it went on."""
    out = io.StringIO()
    progress = Progress(out, interval_s=0.05)
    stage = ["building the model"]
    progress.done("built the model in 1.0 s")
    with progress.keep_alive(lambda: stage[0]):
        deadline = time.monotonic() + 30
        while "still building the model" not in out.getvalue() and time.monotonic() < deadline:
            time.sleep(0.02)
        stage[0] = "measuring the machine's roofs"
        while "still measuring the machine's roofs (0 s)" not in out.getvalue() and time.monotonic() < deadline:
            time.sleep(0.02)
    text = out.getvalue()
    assert "still building the model (" in text and "still measuring the machine's roofs (0 s)" in text, text
    assert "still built" not in text
