"""What a profile says when its records fell short: lost samples and dropped op events each get a
one-line warning when the session stops and a note in the report, with the count; a profile
without either says nothing of them."""

from __future__ import annotations

from profiles import make_sampled_profile

from cpuprof.analysis.notes import limit_notes
from cpuprof.collect.collectors import sampling_warnings


def test_a_complete_profile_has_no_shortfall_lines():
    p = make_sampled_profile()
    assert p.sampling is not None and p.sampling.lost == 0 and p.sampling.op_events_dropped == 0
    said = sampling_warnings(p) + limit_notes(p)
    assert not [line for line in said if "samples" in line and "lost" in line or "op begins" in line], said


def test_lost_samples_and_dropped_op_events_are_warned_and_noted_with_their_counts():
    p = make_sampled_profile()
    assert p.sampling is not None
    p.sampling.lost = 1234
    p.sampling.op_events_dropped = 5678
    warnings = sampling_warnings(p)
    assert [w for w in warnings if w.startswith("1,234 samples lost")], warnings
    assert [w for w in warnings if w.startswith("5,678 op begins and ends dropped")], warnings
    notes = limit_notes(p)
    lost = [n for n in notes if n.startswith("1,234 samples were lost")]
    assert lost and "perf_event_mlock_kb" in lost[0], notes
    assert [n for n in notes if n.startswith("5,678 op begins and ends were dropped")], notes
