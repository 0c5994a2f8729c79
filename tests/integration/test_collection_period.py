"""The collector's period (a test hook, for the benches that measure what the collector costs) and the
sample rings sized to it: a collector that wakes five times less often must find rings that hold
what the kernel wrote meanwhile."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

import cpuprof
from cpuprof import _test_utils, native

nat = native.load()
SPIN_S = 1.0
HZ = 1000


def spin_profile(interval_us: int) -> tuple[cpuprof.Profile, float]:
    nat.testing.inject_collect_interval_us(interval_us)
    try:
        with cpuprof.profile("software", sample_hz=HZ, warn=False) as prof:
            start = time.perf_counter()
            _test_utils.spin_for_ns(int(SPIN_S * 1e9))
            wall = time.perf_counter() - start
    finally:
        nat.testing.inject_collect_interval_us(0)
    assert prof.profile is not None
    return prof.profile, wall


def mlock_kib() -> int | None:
    try:
        return int(Path("/proc/sys/kernel/perf_event_mlock_kb").read_text())
    except (OSError, ValueError):
        return None


@pytest.mark.skipif(os.geteuid() != 0 and (mlock_kib() or 0) < 8 * 4096,
                    reason="rings for 200 ms at 1 kHz (4 MiB a thread) exceed perf_event_mlock_kb for this user")
def test_the_collectors_period_sets_its_passes_and_the_rings_hold_a_period_of_samples():
    assert nat.collect_interval_us() == nat.limits["kCollectIntervalUs"]
    default, default_wall = spin_profile(0)
    slow, slow_wall = spin_profile(200_000)
    assert nat.collect_interval_us() == nat.limits["kCollectIntervalUs"]  # the hook cleared
    # Discovery passes (counted by the profile): one per period of the run (the default period is
    # longer than kDiscoveryIntervalUs, so every pass discovers), plus the baseline and the final
    # one. A loaded machine wakes the collector late (fewer passes), never early: the default's
    # lower bound leaves it 40% of its passes, still above the 200 ms period's most.
    period_s = nat.limits["kCollectIntervalUs"] / 1e6
    assert period_s >= nat.limits["kDiscoveryIntervalUs"] / 1e6
    assert 0.4 * default_wall / period_s <= default.overhead.discovery_ticks <= default_wall / period_s + 3
    assert 2 <= slow.overhead.discovery_ticks <= slow_wall / 0.2 + 3, slow.overhead.discovery_ticks
    # At 1 kHz a 200 ms period is about 200 samples of 9 KiB per pass: rings sized for the default
    # period (100 ms of samples at 1 kHz) would drop about half of them; sized to the period, none
    # is lost.
    for profile in (default, slow):
        assert profile.sampling is not None
        assert profile.sampling.lost == 0, profile.sampling
        cpu_s = sum(t.counters.get("task-clock", 0) for t in profile.threads) / 1e9
        assert profile.sampling.samples >= 0.7 * cpu_s * HZ, (profile.sampling.samples, cpu_s)
