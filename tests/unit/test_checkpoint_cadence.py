"""How often a followed process saves a checkpoint: every ``checkpoint_s``, or less often where a save
is slow, so that saving never takes more than 1/CHECKPOINT_SHARE of the process's time (a save's CPU
is the program's: a serving engine followed is to keep 0.95 of its throughput, all costs together)."""

from __future__ import annotations

import itertools
import os
import threading
import time

import pytest

from cpuprof.collect import symbols
from cpuprof.launch.followed_run import CHECKPOINT_SHARE, FollowedRun, next_checkpoint_in


def test_a_slow_save_spaces_the_next_checkpoint_by_the_share():
    assert CHECKPOINT_SHARE >= 50  # at most 2% of the time: 5% alone would take what target 1 allows
    assert next_checkpoint_in(0.4, 5.0) == pytest.approx(0.4 * CHECKPOINT_SHARE)  # vLLM's worker's save
    assert next_checkpoint_in(0.01, 5.0) == 5.0  # a quick save keeps the set interval


class TimedSaves:
    """A followed process's checkpoint thread, with a save that takes a known time."""

    def __init__(self, save_s: float, checkpoint_s: float) -> None:
        run = FollowedRun.__new__(FollowedRun)  # no profile: only the checkpoint loop is under test
        run.checkpoint_s = checkpoint_s
        run.pid = os.getpid()
        run.windows = None
        run._lock = threading.RLock()
        run._stop = threading.Event()
        run._saved_final = False
        run.checkpoints = 0
        run.checkpoint_ns = 0
        self.run = run
        self.saved_at: list[float] = []
        self.began = time.monotonic()

        def save(complete: bool, reason: str | None = None) -> None:
            self.saved_at.append(time.monotonic() - self.began)
            time.sleep(save_s)

        run.save = save  # type: ignore[method-assign]

    def for_seconds(self, seconds: float) -> list[float]:
        thread = threading.Thread(target=self.run._checkpoints)
        thread.start()
        time.sleep(seconds)
        self.run._stop.set()
        thread.join(timeout=10)
        assert not thread.is_alive()
        return self.saved_at


def test_a_save_that_takes_20_ms_is_not_repeated_for_its_share_of_time(monkeypatch):
    monkeypatch.setattr(symbols, "warm_up", lambda: None)
    saves = TimedSaves(save_s=0.02, checkpoint_s=0.05)
    saved_at = saves.for_seconds(1.2)
    # The first at 0.05 s; the next not before 0.07 + 0.02 * CHECKPOINT_SHARE = 2.07 s (at 1/20 of
    # the time: 0.47 s, 0.89 s, three saves in all).
    assert len(saved_at) == 1, saved_at
    assert saves.run.checkpoints == 1
    assert saves.run.checkpoint_ns >= 20_000_000  # the time it took, for the report's cost table


def test_quick_saves_keep_the_set_interval(monkeypatch):
    monkeypatch.setattr(symbols, "warm_up", lambda: None)
    saved_at = TimedSaves(save_s=0.0, checkpoint_s=0.05).for_seconds(1.0)
    assert len(saved_at) >= 8, saved_at  # about 20 on an idle machine; at least 8 on a loaded one
    assert all(b - a >= 0.045 for a, b in itertools.pairwise(saved_at)), saved_at
