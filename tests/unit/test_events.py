"""Event names: presets, and parsing every perf syntax (PMU events from a fake sysfs tree)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cpuprof import events, native
from cpuprof.errors import UsageError

nat = native.load()

PERF_TYPE_HARDWARE, PERF_TYPE_SOFTWARE, PERF_TYPE_TRACEPOINT, PERF_TYPE_HW_CACHE, PERF_TYPE_RAW = 0, 1, 2, 3, 4


@pytest.fixture
def fake_sysfs(tmp_path: Path) -> Path:
    """A recorded-shape PMU tree: an Intel-style core PMU with event/umask/cmask fields."""
    pmu = tmp_path / "bus/event_source/devices/cpu"
    (pmu / "format").mkdir(parents=True)
    (pmu / "events").mkdir()
    (pmu / "type").write_text("4\n")
    (pmu / "format/event").write_text("config:0-7\n")
    (pmu / "format/umask").write_text("config:8-15\n")
    (pmu / "format/cmask").write_text("config:24-31\n")
    (pmu / "format/ldlat").write_text("config1:0-15\n")
    (pmu / "format/split").write_text("config:0-3,32-35\n")
    (pmu / "events/mem-loads").write_text("event=0xcd,umask=0x1,ldlat=3\n")
    tp = tmp_path / "kernel/tracing/events/sched/sched_switch"
    tp.mkdir(parents=True)
    (tp / "id").write_text("321\n")
    return tmp_path


def test_presets_expand_and_keep_task_clock_first():
    names = events.resolve("sched,page-faults")
    assert names[0] == "task-clock"
    assert "sched:sched_switch" in names and names[-1] == "page-faults"
    assert len(names) == len(set(names))
    assert events.resolve(None)[:2] == ["task-clock", "context-switches"]


def test_too_many_events_and_empty_are_usage_errors():
    with pytest.raises(UsageError, match="at most 16"):
        events.resolve([f"r{i:x}" for i in range(20)])
    with pytest.raises(UsageError, match="--events is empty"):
        events.resolve(" , ")


def test_validate_names_names_the_typo():
    with pytest.raises(UsageError, match="unknown event 'task-clok'.*presets: default"):
        events.validate_names(["task-clok"], nat)


@pytest.mark.parametrize("name, type_, config", [
    ("cycles", PERF_TYPE_HARDWARE, 0),
    ("instructions", PERF_TYPE_HARDWARE, 1),
    ("branch-misses", PERF_TYPE_HARDWARE, 5),
    ("task-clock", PERF_TYPE_SOFTWARE, 1),
    ("page-faults", PERF_TYPE_SOFTWARE, 2),
    ("major-faults", PERF_TYPE_SOFTWARE, 6),
    # cache id | op << 8 | result << 16, as perf encodes them
    ("L1-dcache-load-misses", PERF_TYPE_HW_CACHE, 0 | 0 << 8 | 1 << 16),
    ("LLC-loads", PERF_TYPE_HW_CACHE, 2 | 0 << 8 | 0 << 16),
    ("dTLB-store-misses", PERF_TYPE_HW_CACHE, 3 | 1 << 8 | 1 << 16),
    ("r01c2", PERF_TYPE_RAW, 0x1C2),
])
def test_generic_names(name, type_, config):
    parsed = nat.parse_event(name)
    assert parsed.ok, parsed.error
    assert (parsed.type, parsed.config) == (type_, config)


def test_modifiers_restrict_mode():
    user = nat.parse_event("cycles:u")
    assert user.ok and user.exclude_kernel and not user.exclude_user
    kernel = nat.parse_event("instructions:k")
    assert kernel.exclude_user and not kernel.exclude_kernel


def test_pmu_terms_placed_by_sysfs_format(fake_sysfs):
    parsed = nat.parse_event("cpu/event=0x3c,umask=0x01,cmask=2/", str(fake_sysfs))
    assert parsed.ok, parsed.error
    assert parsed.type == 4
    assert parsed.config == 0x3C | 0x01 << 8 | 2 << 24


def test_pmu_alias_and_split_bit_ranges(fake_sysfs):
    alias = nat.parse_event("cpu/mem-loads/", str(fake_sysfs))
    assert alias.ok, alias.error
    assert alias.config == 0xCD | 0x1 << 8 and alias.config1 == 3
    split = nat.parse_event("cpu/split=0xab/", str(fake_sysfs))
    assert split.config == 0xB | 0xA << 32  # low nibble to bits 0-3, high nibble to 32-35


@pytest.mark.parametrize("name, message", [
    ("nopmu/event=1/", "no PMU named 'nopmu'"),
    ("cpu/bogus=1/", "has no format term 'bogus'"),
    ("cpu/no-such-alias/", "has no event named 'no-such-alias'"),
    ("cpu/event=zz/", "bad value in 'event=zz'"),
    ("sched:no_such", "no tracepoint 'sched:no_such'"),
    ("rxyz", "unknown event 'rxyz'"),
    ("", "empty event name"),
])
def test_bad_event_names_say_why(fake_sysfs, name, message):
    parsed = nat.parse_event(name, str(fake_sysfs))
    assert not parsed.ok
    assert message in parsed.error


def test_tracepoint_id_from_tracefs(fake_sysfs):
    parsed = nat.parse_event("sched:sched_switch", str(fake_sysfs))
    assert parsed.ok and parsed.type == PERF_TYPE_TRACEPOINT and parsed.config == 321
