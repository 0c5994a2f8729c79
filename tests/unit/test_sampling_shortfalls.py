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


def test_a_shrunk_ring_that_lost_samples_is_warned_and_every_shrunk_ring_noted():
    p = make_sampled_profile()
    first, second = p.threads[0], p.threads[1]
    first.sample_ring_pages, first.sample_ring_pages_asked, first.samples_lost = 8, 64, 10
    second.sample_ring_pages, second.sample_ring_pages_asked, second.samples_lost = 32, 64, 0
    warnings = [w for w in sampling_warnings(p) if "mapped smaller than asked" in w]
    # the ring that lost nothing fell short of nothing: noted, not warned
    assert warnings == [warnings[0]] and warnings[0].startswith("T0: sample ring mapped") and \
        warnings[0].endswith("it lost 10 samples"), warnings
    notes = [n for n in limit_notes(p) if "mapped smaller than asked" in n]
    assert len(notes) == 1 and "T0 8 of 64 pages (10 samples lost); T1 32 of 64 pages (0 samples lost)" in notes[0]
    assert "perf_event_mlock_kb" in notes[0] and "RLIMIT_MEMLOCK" in notes[0], notes


def test_a_ring_as_large_as_asked_or_never_mapped_is_not_called_shrunk():
    p = make_sampled_profile()
    full, refused = p.threads[0], p.threads[1]
    full.sample_ring_pages = full.sample_ring_pages_asked = 64
    refused.sample_ring_pages, refused.sample_ring_pages_asked = 0, 64  # not sampled: its error says so
    full.samples_lost = refused.samples_lost = 3
    said = sampling_warnings(p) + limit_notes(p)
    assert not [line for line in said if "mapped smaller" in line], said
    assert not full.sample_ring_shrunk and not refused.sample_ring_shrunk


def test_a_profile_saved_before_ring_sizes_were_kept_loads_with_none_shrunk(tmp_path):
    import json

    from cpuprof.model import Profile

    path = make_sampled_profile().save(tmp_path)
    data = json.loads(path.read_text())
    for thread in data["threads"]:
        thread.pop("sample_ring_pages"), thread.pop("sample_ring_pages_asked")
    path.write_text(json.dumps(data))
    loaded = Profile.load(tmp_path)
    assert all(t.sample_ring_pages == t.sample_ring_pages_asked == 0 and not t.sample_ring_shrunk
               for t in loaded.threads)
