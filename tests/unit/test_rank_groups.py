"""Matching the ranks of a job at their collectives (analysis.rank_groups), on timelines whose waits
are known by construction: rank r enters the k-th call at base(k) + delay[r] and every rank leaves
it together, 100 µs after the last arrives."""

from __future__ import annotations

from cpuprof.analysis.rank_groups import RankTimeline, _intersection, _union, jobs, ranks_section

MS = 1_000_000
KIND = "gloo:all_reduce"


def timeline(rank: int, delays: list[int], *, world: int = 2, store: str = "tcp 127.0.0.1:1", pid: int | None = None,
             all_delays: list[list[int]] | None = None, dropped: int = 0, complete: bool = True,
             skip_first: int = 0) -> RankTimeline:
    """Calls at 10 ms intervals; ``all_delays``: every rank's delays, so the exits are shared."""
    everyone = all_delays or [delays]
    enters, exits = [], []
    for k in range(skip_first, len(delays)):
        base = k * 10 * MS
        enters.append(base + delays[k])
        exits.append(base + max(d[k] for d in everyone if k < len(d)) + MS // 10)
    return RankTimeline(rank=rank, world_size=world, backend="gloo", store=store, pid=pid or 100 + rank,
                        role=f"rank{rank}", hostname="h", calls={KIND: (enters, exits)},
                        in_collectives_ns=sum(b - a for a, b in zip(enters, exits, strict=True)),
                        first_ns=enters[0] if enters else None, last_ns=exits[-1] if exits else None,
                        spans_dropped=dropped, complete=complete)


def test_the_late_rank_makes_the_other_wait_its_lateness_at_every_call():
    late = [3 * MS] * 5
    on_time = [0] * 5
    every = [on_time, late]
    (job,) = jobs([timeline(1, late, all_delays=every), timeline(0, on_time, all_delays=every)])
    first, second = job.ranks
    assert (first.timeline.rank, second.timeline.rank) == (0, 1)
    assert job.kinds == {KIND: 5} and not job.problems
    assert first.wait_ns == 5 * 3 * MS and second.wait_ns == 0
    assert first.transfer_ns == second.transfer_ns == 5 * MS // 10
    assert second.arrived_last == 5 and second.made_wait_ns == 15 * MS and first.arrived_last == 0
    section = ranks_section([job])
    assert section is not None
    text = " ".join(section.lines)
    assert "Straggler: rank 1 (rank1, pid 101) entered 5 of 5 collectives last" in text
    assert "the other 1 rank(s) waited 15.0 ms for it, summed over them (3.0 ms a call)" in text


def test_arrivals_closer_than_the_noise_name_no_straggler():
    a, b = [0] * 4, [10_000] * 4  # 10 µs apart
    (job,) = jobs([timeline(0, a, all_delays=[a, b]), timeline(1, b, all_delays=[a, b])])
    assert all(f.arrived_last == 0 for f in job.ranks)
    section = ranks_section([job])
    assert section is not None and not any(line.startswith("Straggler") for line in section.lines)


def test_a_rank_that_ended_early_is_matched_over_the_calls_both_made():
    short, full = [2 * MS] * 3, [0] * 6
    (job,) = jobs([timeline(0, full, all_delays=[full, short]), timeline(1, short, all_delays=[full, short])])
    assert job.kinds == {KIND: 3}
    assert job.ranks[0].wait_ns == 3 * 2 * MS
    assert any("3 to 6 calls" in p for p in job.problems)


def test_a_rank_that_kept_only_its_latest_spans_is_matched_by_time():
    # Rank 1's timeline lost its first 2 calls: matched from the start, every pair would be off by two.
    delays0, delays1 = [0] * 6, [0, 0, 4 * MS, 4 * MS, 4 * MS, 4 * MS]
    every = [delays0, delays1]
    (job,) = jobs([timeline(0, delays0, all_delays=every, complete=False),
                   timeline(1, delays1, all_delays=every, dropped=2, skip_first=2)])
    assert job.kinds == {KIND: 4} and job.ranks[0].wait_ns == 4 * 4 * MS and job.ranks[1].wait_ns == 0


def test_a_host_whose_clock_was_not_aligned_is_left_out_of_the_waits():
    d = [0] * 4
    aligned, unaligned, third = timeline(0, d, world=3), timeline(1, d, world=3), timeline(2, d, world=3)
    unaligned.on_common_clock, unaligned.host = False, "b"
    # Its raw clock 5000 s ahead: compared as it is, it would seem to enter every call last.
    unaligned.calls = {KIND: tuple([x + 5000 * 10**9 for x in xs] for xs in unaligned.calls[KIND])}
    (job,) = jobs([aligned, unaligned, third])
    assert job.kinds == {KIND: 4}
    assert [f.matched for f in job.ranks] == [4, 0, 4] and all(f.arrived_last == 0 for f in job.ranks)
    assert any(p.startswith("host(s) b: clock not aligned") and "rank(s) 1 are left out" in p for p in job.problems)


def test_a_kind_one_rank_never_made_is_named_and_the_rest_still_matched():
    d = [0] * 3
    a, b = timeline(0, d), timeline(1, d)
    a.calls = {**a.calls, "gloo:broadcast": a.calls[KIND]}
    (job,) = jobs([a, b])
    assert job.kinds == {KIND: 3}
    assert any(p.startswith("gloo:broadcast: rank(s) 1 made none") for p in job.problems), job.problems


def test_a_late_arrival_within_the_hosts_clock_residual_is_not_late():
    a, b = [0] * 4, [300_000] * 4  # 0.3 ms apart, clocks known to 0.5 ms
    ta, tb = timeline(0, a, all_delays=[a, b]), timeline(1, b, all_delays=[a, b])
    tb.clock_residual_ns = 500_000
    (job,) = jobs([ta, tb])
    assert all(f.arrived_last == 0 for f in job.ranks) and job.ranks[0].wait_ns == 4 * 300_000


def test_windows_opened_at_different_calls_are_matched_by_time():
    # Rank 0's window opened 3 calls before rank 1's and closed 1 call after: by order, every pair
    # would be 3 calls apart (30 ms) and rank 0 would seem to wait 30 ms at each.
    delays = [MS] * 10
    every = [[0] * 10, delays]
    early = timeline(0, [0] * 10, all_delays=every)
    late = timeline(1, delays, all_delays=every, skip_first=3)
    enters, exits = late.calls[KIND]
    late.calls = {KIND: (enters[:-1], exits[:-1])}
    (job,) = jobs([early, late])
    assert job.kinds == {KIND: 6}
    assert job.ranks[0].wait_ns == 6 * MS and job.ranks[1].wait_ns == 0
    assert any("6 to 10 calls" in p and "by their times" in p for p in job.problems), job.problems


def test_jobs_are_told_apart_by_their_store_and_missing_ranks_are_said():
    d = [0, 0]
    found = jobs([timeline(0, d, store="tcp a:1"), timeline(1, d, store="tcp a:1"),
                  timeline(0, d, store="tcp b:2", world=4)])
    assert [(j.store, len(j.ranks)) for j in found] == [("tcp a:1", 2), ("tcp b:2", 1)]
    assert any("rank(s) 1, 2, 3 of 4 saved no profile here" in p for p in found[1].problems)
    (twice,) = jobs([timeline(0, d, pid=5), timeline(0, d, pid=6), timeline(1, d)])
    assert [f.timeline.pid for f in twice.ranks] == [6, 101]
    assert any("rank 0 twice (pids 5 and 6)" in p for p in twice.problems)


def test_overlap_is_the_intersection_of_two_unions():
    merged = _union([(0, 10), (5, 20), (30, 40)])
    assert merged == [(0, 20), (30, 40)]
    assert _intersection(merged, _union([(15, 35)])) == 5 + 5
    assert _intersection(merged, []) == 0


def test_a_hosts_clock_offset_is_the_median_difference_of_the_ends_it_shares_with_the_reference():
    from cpuprof.analysis.rank_groups import align_hosts

    d = [0] * 9
    ref = timeline(0, d, all_delays=[d])
    ref.host = "a"
    other = timeline(1, d, all_delays=[d])
    other.host = "b"
    shift = 5000 * 10**9
    jitter = [0, 30_000, -20_000, 10_000, 0, 0, 500_000, 0, -10_000]  # one end late by 0.5 ms
    enters, exits = other.calls[KIND]
    other.calls = {KIND: ([e + shift for e in enters], [e + shift + j for e, j in zip(exits, jitter, strict=True)])}
    reference, clocks, problems = align_hosts([other, ref])
    assert reference == "a" and not problems
    assert clocks["b"].offset_ns == -shift and clocks["b"].matched == 9
    assert clocks["b"].residual_ns == 500_000  # the 90th percentile of 9 deviations: the largest


def test_hosts_of_another_job_or_with_no_shared_end_are_not_aligned():
    from cpuprof.analysis.rank_groups import align_hosts

    d = [0, 0]
    a0, a1, other_job = timeline(0, d), timeline(1, d), timeline(0, d, store="tcp elsewhere:9")
    a0.host, a1.host, other_job.host = "a", "b", "c"
    broadcast_only = timeline(1, d)
    broadcast_only.host, broadcast_only.calls = "d", {"gloo:broadcast": broadcast_only.calls[KIND]}
    _, clocks, problems = align_hosts([a0, a1, other_job, broadcast_only])
    assert set(clocks) == {"b"}
    assert any(p.startswith("host(s) c: ranks of another job (store tcp elsewhere:9)") for p in problems), problems
    assert any(p.startswith("host d: its ranks made no collective with rank 0 on a that ends on every rank at once")
               for p in problems), problems


def _rank_profile(spans: list[tuple[int, int, int, int, int]], ops: dict[int, tuple[str, str]]):
    """A profile of rank 0 of 2 whose timeline is ``spans``: (op id, thread, depth, start, end)."""
    from profiles import make_profile

    from cpuprof.model import DistributedRank, OpStat, Spans

    p = make_profile()
    p.distributed = DistributedRank(rank=0, world_size=2, backend="gloo", store="tcp 127.0.0.1:1")
    p.ops = [OpStat(id=i, kind=kind, name=name, region=[], calls=1, incl_ns=1, self_ns=1, max_ns=1,
                    counters_self={}, counters_incl={}) for i, (name, kind) in ops.items()]
    p.spans = Spans(op=[s[0] for s in spans], thread=[s[1] for s in spans], depth=[s[2] for s in spans],
                    start_ns=[s[3] for s in spans], dur_ns=[s[4] - s[3] for s in spans], counters=[[]] * len(spans))
    return p


def test_a_ranks_collectives_and_overlap_from_its_timeline():
    from cpuprof.analysis.rank_groups import rank_timeline

    ops = {1: ("step", "region"), 2: ("aten::mm", "op"), 3: ("c10d::allreduce_", "op"), 4: ("aten::empty", "op"),
           5: ("aten::add", "op"), 6: ("gloo:all_reduce", "op")}
    # Thread 0 dispatches (a region around the step, an allreduce_ inside it with an op of its own
    # inside); thread 1 is a worker. No backend span: the c10d op is the collective, at any depth.
    c10d_only = [(1, 0, 0, 0, 100), (2, 0, 1, 10, 40), (3, 0, 1, 40, 45), (4, 0, 2, 41, 42), (5, 0, 1, 50, 55)]
    t = rank_timeline(_rank_profile(c10d_only, ops), "r0")
    assert t is not None and t.calls == {"c10d::allreduce_": ([40], [45])}
    assert t.overlapped_ns == 0  # the region is no compute, the collective's own op none either
    # gloo's span on its thread: the collective's whole flight, while thread 0 ran aten::add.
    with_gloo = [*c10d_only, (6, 1, 0, 42, 60)]
    t = rank_timeline(_rank_profile(with_gloo, ops), "r0", offset_ns=1000)
    assert t is not None and t.calls == {"gloo:all_reduce": ([1042], [1060])}
    assert t.in_collectives_ns == 18 and t.overlapped_ns == 5
    assert rank_timeline(_rank_profile(with_gloo, ops), "r0", offset_ns=None).on_common_clock is False


def test_each_forward_pass_names_the_rank_that_held_it_back():
    # Steps of 10 ms, one collective each: rank 1 late by 3 ms in steps 0-2, rank 0 by 2 ms in step 3.
    d0, d1 = [0, 0, 0, 2 * MS], [3 * MS, 3 * MS, 3 * MS, 0]
    first, second = timeline(0, d0, all_delays=[d0, d1]), timeline(1, d1, all_delays=[d0, d1])
    first.steps = [(k * 10 * MS - MS // 2, (k + 1) * 10 * MS - MS // 2, "decode") for k in range(4)]
    (job,) = jobs([first, second])
    assert [(s.index, s.calls, s.straggler) for s in job.steps] == [(0, 1, 1), (1, 1, 1), (2, 1, 1), (3, 1, 0)]
    assert job.steps[3].waits == {0: 0, 1: 2 * MS}
    section = ranks_section([job])
    assert section is not None
    text = " ".join(section.lines)
    assert "Per forward pass (4 found in rank 0's op stream, with collectives): rank 1 entered most of the late " \
           "collectives last in 3 of them; rank 0 entered most of the late collectives last in 1 of them" in text
    assert "step 0 (decode, 1 collectives): rank 1 last; waits rank 0 3.0 ms, rank 1 0 ns" in text
