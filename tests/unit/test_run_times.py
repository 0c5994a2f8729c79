"""A sweep's estimate before its first run, from earlier runs of the same configurations here:
known answers from times recorded by hand; nothing guessed for a configuration never run; a damaged
history file ignored; the file bounded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cpuprof.launch import run_times, sweep
from cpuprof.launch.options import DecodeOptions


@pytest.fixture()
def history(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("CPUPROF_CACHE_DIR", str(tmp_path))
    return tmp_path / run_times.FILE_NAME


def _signature(values: dict[str, str]) -> str:
    return run_times.signature(sweep.apply(DecodeOptions(), values), values)


def _todo(plan) -> list[tuple[str, str]]:  # noqa: ANN001
    return [(plan.configs[c].label, _signature(plan.configs[c].values)) for c, _ in plan.order]


def test_the_estimate_comes_only_from_earlier_runs_of_the_same_configurations(history: Path):
    plan = sweep.plan(DecodeOptions(), {"threads": ["1", "2"]}, 2, ["compare"])
    todo = list(plan.order)
    assert len(todo) == 4
    assert run_times.estimate_line(_todo(plan)).startswith(
        "no run of these configurations was made here before, so no estimate yet")
    run_times.record(_signature({"threads": "1"}), 10.0)
    run_times.record(_signature({"threads": "1"}), 12.0)
    # threads=1: two runs to make at the median of 10 and 12 s; threads=2 never ran here.
    assert run_times.estimate_line(_todo(plan)) == (
        "1 configuration(s) never ran here (threads=2); the others' runs take about 22 s; the time left is said "
        "after each run")
    run_times.record(_signature({"threads": "2"}), 30.0)
    assert run_times.estimate_line(_todo(plan)) == (
        "about 82 s in all, from earlier runs of these configurations here")
    run_times.record(_signature({"threads": "2"}), 300.0)  # median of 30 and 300: 165 s a run
    assert run_times.estimate_line(_todo(plan)) == (
        "about 6 min in all, from earlier runs of these configurations here")
    # Only what is left to run counts (a resumed sweep).
    assert run_times.estimate_line(_todo(plan)[:1]).startswith("about ")


def test_a_configuration_is_its_whole_options_and_processes():
    assert _signature({"threads": "1"}) != _signature({"threads": "2"})
    assert _signature({"threads": "1"}) != _signature({"threads": "1", "tp": "2"})
    assert _signature({"threads": "1"}) == _signature({"threads": "1"})
    longer = sweep.apply(DecodeOptions(), {"threads": "1"})
    longer.workload.new_tokens *= 2
    assert run_times.signature(longer, {"threads": "1"}) != _signature({"threads": "1"})


def test_a_damaged_history_is_ignored_and_the_file_stays_bounded(history: Path):
    history.write_text('{"runs": [{"config": "x", "wall_s": "soon"}, 7, {"config": 3, "wall_s": 1}]')
    assert run_times._read(history) == []
    history.write_text('{"runs": [{"config": "a", "wall_s": 5}, {"config": "b", "wall_s": true}, '
                       '{"config": "c", "wall_s": -1}, {"config": "d", "wall_s": 1e300}]}')
    assert [e["config"] for e in run_times._read(history)] == ["a"]
    for k in range(run_times.MAX_ENTRIES + 20):
        run_times.record(f"c{k}", 1.0)
    kept = json.loads(history.read_text())["runs"]
    assert len(kept) == run_times.MAX_ENTRIES and kept[-1]["config"] == f"c{run_times.MAX_ENTRIES + 19}"


def test_a_history_that_cannot_be_written_is_no_failure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("CPUPROF_CACHE_DIR", str(blocker / "below"))  # a directory under a file: cannot be made
    run_times.record("x", 1.0)  # silent
    plan = sweep.plan(DecodeOptions(), {"threads": ["1"]}, 1, ["compare"])
    assert run_times.estimate_line(_todo(plan)).startswith("no run")
