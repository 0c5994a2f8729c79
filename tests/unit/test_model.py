"""The Profile model: save/load, versioning, damaged files, and the terminal report on hand-built data."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from cpuprof.errors import ProfileFormatError
from cpuprof.model import Collection, EventInfo, Limits, OpStat, Overhead, Profile, Spans, ThreadStat
from cpuprof.reports import terminal


def make_profile(mode: str = "exact") -> Profile:
    events = ["task-clock", "context-switches", "cycles", "instructions"]
    return Profile(
        meta={"created": "2026-11-21T00:00:00+00:00"},
        capabilities={"hardware_pmu": "cpu"},
        collection=Collection(mode=mode, events=[EventInfo(e, "software" if i < 2 else "hardware")
                                                 for i, e in enumerate(events)],
                              record_shapes=True, sample_interval_us=1000, started_ns=0, stopped_ns=1_000_000_000),
        threads=[
            ThreadStat(tid=10, name="python", role="dispatch",
                       counters={"task-clock": 900_000_000, "context-switches": 5, "cycles": 3_000_000_000,
                                 "instructions": 6_000_000_000}),
            ThreadStat(tid=11, name="python", role="worker",
                       counters={"task-clock": 800_000_000, "context-switches": 7, "cycles": 2_000_000_000,
                                 "instructions": 1_000_000_000}, scaled=["cycles"]),
            ThreadStat(tid=12, name="idle", role="idle", counters={e: 0 for e in events}),
        ],
        ops=[
            OpStat(id=5, kind="op", name="aten::mm", shapes="[1, 2048] bf16; [2048, 8192] bf16", region="mlp",
                   calls=100, incl_ns=600_000_000, self_ns=600_000_000, max_ns=9_000_000,
                   counters_self={"task-clock": [590_000_000, 580_000_000, 0], "context-switches": [1, 2, 0],
                                  "cycles": [2_000_000_000, 1_000_000_000, 0],
                                  "instructions": [1_500_000_000, 0, 0]},
                   counters_incl={"task-clock": [590_000_000, 580_000_000, 0]}, samples=300),
            OpStat(id=6, kind="region", name="mlp", shapes="", region=None, calls=10, incl_ns=700_000_000,
                   self_ns=100_000_000, max_ns=80_000_000, counters_self={}, counters_incl={}),
        ],
        overhead=Overhead(hook_ns=5_000_000, ops=1000, sampler_cpu_ns=2_000_000, sampler_ticks=1000),
        limits=Limits(op_capacity=2048, ops_overflowed=3, span_capacity=10, spans_dropped=4, too_deep=0,
                      unattributed_ops=0, threads_beyond_limit=0, memory_bytes=1 << 20),
        spans=Spans(op=[5, 5], thread=[0, 0], depth=[1, 1], start_ns=[0, 10], dur_ns=[5, 5],
                    counters=[[1, 0, 0, 0], [1, 0, 0, 0]]),
        workload={"kind": "decode", "model": "tiny", "params": 90_000, "weight_bytes": 180_000, "dtype": "bf16",
                  "batch": 1, "prompt_len": 8, "new_tokens": 4, "steps_done": 4, "tokens_per_s": 100.0,
                  "warmup_steps": 1, "p50_ms": 10.0, "p90_ms": 11.0, "p99_ms": 12.0, "ttft_s": 0.02,
                  "bytes_read_per_token": 200_000},
        settings={"cpu_set": "node 0: 0-1", "warnings": ["asked for 2 threads but torch uses 1"],
                  "in_force": {"torch": {"num_threads": 1}, "mempolicy": {"mode": "bind", "nodes": [0]}}},
    )


def test_round_trip(tmp_path: Path):
    profile = make_profile()
    path = profile.save(tmp_path / "out")
    assert path.name == "profile.json"
    again = Profile.load(tmp_path / "out")
    assert again.to_dict() == profile.to_dict()
    assert json.loads(path.read_text())["version"] == 1


def test_truncated_file_is_one_clear_error(tmp_path: Path):
    path = make_profile().save(tmp_path)
    text = path.read_text()
    path.write_text(text[: len(text) // 2])
    with pytest.raises(ProfileFormatError, match=r"not valid JSON at line 1 column \d+ \(truncated"):
        Profile.load(tmp_path)


@pytest.mark.parametrize("content, message", [
    ({"traceEvents": []}, "not a cpuprof profile"),
    ({"format": "cpuprof-profile", "version": 99}, "format version 99; this cpuprof reads version 1"),
    ({"format": "cpuprof-profile", "version": 1, "meta": {}}, "damaged cpuprof profile"),
])
def test_foreign_or_future_files(tmp_path: Path, content, message):
    (tmp_path / "profile.json").write_text(json.dumps(content))
    with pytest.raises(ProfileFormatError, match=message):
        Profile.load(tmp_path / "profile.json")


def test_missing_profile(tmp_path: Path):
    with pytest.raises(ProfileFormatError, match="no such profile"):
        Profile.load(tmp_path / "nothing")


def test_validate_catches_broken_invariants():
    profile = make_profile()
    profile.ops[0].counters_self["task-clock"] = [1, 2]  # three threads, two values
    with pytest.raises(ProfileFormatError, match="2 per-thread values for 3 threads"):
        profile.validate()
    profile = make_profile()
    profile.ops[0].self_ns = profile.ops[0].incl_ns + 1
    with pytest.raises(ProfileFormatError, match="self time exceeds total"):
        profile.validate()


def test_save_is_atomic(tmp_path: Path, monkeypatch):
    profile = make_profile()
    profile.save(tmp_path)
    before = (tmp_path / "profile.json").read_text()

    def boom(*_a, **_k):
        raise OSError("disk full")

    monkeypatch.setattr(json, "dump", boom)
    with pytest.raises(OSError):
        make_profile("sampled").save(tmp_path)
    assert (tmp_path / "profile.json").read_text() == before
    assert not list(tmp_path.glob(".profile-*"))


def render(profile: Profile) -> str:
    out = io.StringIO()
    terminal.render(profile, out)
    return out.getvalue()


def test_terminal_report_derives_metrics():
    text = render(make_profile())
    assert "WARNING: asked for 2 threads but torch uses 1" in text
    assert "throughput 100.00 tokens/s" in text
    assert "aten::mm @mlp" in text
    assert "1.17" in text  # busy threads: (590+580) ms CPU / 600 ms self
    assert "0.50" in text  # IPC of mm: 1.5 G instructions / 3 G cycles
    assert "multiplexed (scaled by time_enabled/time_running): cycles" in text
    assert "3 op calls fell into '[other ops]'" in text
    assert "T2" not in text.split("Threads")[1].split("Top")[0]  # the idle thread is not listed


def test_terminal_report_hides_unreliable_sampled_ratios():
    profile = make_profile("sampled")
    profile.ops[0].samples = 3
    text = render(profile)
    assert "samples" in text
    row = next(line for line in text.splitlines() if line.strip().startswith("aten::mm"))
    assert " - " in row


def test_unprofiled_profile_renders_workload_only():
    profile = Profile.unprofiled()
    profile.workload = make_profile().workload
    text = render(profile)
    assert "throughput 100.00 tokens/s" in text and "not profiled" in text
