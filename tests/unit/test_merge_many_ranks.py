"""``merge`` of many ranks on several hosts (launch.merge_hosts), on saved profiles whose clocks are
known by construction: host h's clock runs h × 1000 s ahead, every rank leaves each all-reduce at the
same true instant (plus a few µs of its own), so each host's offset is exactly -h × 1000 s. Merging
64 ranks reads one profile at a time: its memory peak stays near one profile's load, far from 64
profiles held (a mutation that keeps each profile read fails it)."""

from __future__ import annotations

import copy
import gc
import tracemalloc
from pathlib import Path

from profiles import make_profile

from cpuprof.launch.merge_hosts import merge_runs
from cpuprof.model import DistributedRank, OpStat, Profile, Spans
from cpuprof.model.merged import MergedRun
from cpuprof.model.run_layout import process_dir

HOSTS, RANKS_PER_HOST, CALLS, OTHER_SPANS = 4, 16, 60, 1_000
AHEAD_NS = 1000 * 10**9
STEP_NS = 5_000_000


def rank_profile(template: Profile, host: int, rank: int) -> Profile:
    p = copy.deepcopy(template)
    p.meta.hostname, p.meta.pid, p.meta.role = f"node{host}", 1000 + rank, f"rank{rank}"
    p.distributed = DistributedRank(rank=rank, world_size=HOSTS * RANKS_PER_HOST, backend="gloo",
                                    store="tcp 10.0.0.1:29500")
    p.ops.append(OpStat(id=9, kind="op", name="gloo:all_reduce", region=[], calls=CALLS, incl_ns=CALLS * 1000,
                        self_ns=CALLS * 1000, max_ns=1000, counters_self={}, counters_incl={}))
    shift = host * AHEAD_NS
    enters = [shift + k * STEP_NS + (rank % 7) * 100_000 for k in range(CALLS)]
    exits = [shift + k * STEP_NS + 1_000_000 + (rank % 3) * 1_000 for k in range(CALLS)]
    others = [shift + k * 200 for k in range(OTHER_SPANS)]
    n = CALLS + OTHER_SPANS
    p.spans = Spans(op=[9] * CALLS + [5] * OTHER_SPANS, thread=[1] * CALLS + [0] * OTHER_SPANS, depth=[0] * n,
                    start_ns=enters + others, dur_ns=[b - a for a, b in zip(enters, exits, strict=True)]
                    + [100] * OTHER_SPANS, counters=[[1, 0, 0, 0]] * n)
    p.limits.spans_dropped = 0
    return p


def test_64_ranks_on_4_hosts_merge_with_each_clock_found_and_memory_bounded(tmp_path: Path):
    template = make_profile()
    dirs = []
    for host in range(HOSTS):
        root = tmp_path / f"host{host}"
        launcher = copy.deepcopy(template)
        launcher.meta.hostname, launcher.spans = f"node{host}", None
        launcher.save(root)
        for local in range(RANKS_PER_HOST):
            rank = host * RANKS_PER_HOST + local
            rank_profile(template, host, rank).save(process_dir(root, 1000 + rank))
        dirs.append(str(root))

    merge_runs(dirs[:1], tmp_path / "warm")  # the modules a merge imports, imported before measuring
    gc.collect()
    tracemalloc.start()
    kept = Profile.load(process_dir(dirs[0], 1000))
    retained, one = tracemalloc.get_traced_memory()  # one profile held; the peak of loading it
    tracemalloc.stop()
    del kept
    gc.collect()
    tracemalloc.start()
    merged = merge_runs(dirs, tmp_path / "merged")
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()

    assert [h.hostname for h in merged.hosts] == [f"node{h}" for h in range(HOSTS)]
    assert merged.hosts[0].reference and not merged.problems, merged.problems
    for h, host in enumerate(merged.hosts):
        assert host.offset_ns is not None and abs(host.offset_ns + h * AHEAD_NS) <= 2_000, host  # ranks: a few µs
        assert host.residual_ns is not None and host.residual_ns <= 2_000  # the ranks' own few µs
        assert h == 0 or host.matched == RANKS_PER_HOST * CALLS
    assert MergedRun.load(tmp_path / "merged").hosts == merged.hosts
    # One profile loaded at a time: the peak is one load's, plus the 64 ranks' collectives (a small
    # part of a profile each). Held at once, the 64 profiles would add 64 times one's retained size.
    assert peak < one + 8 * retained, (peak, one, retained)


def test_the_commands_that_read_a_run_read_a_merged_one(tmp_path: Path, capsys):
    import json

    from cpuprof.cli import main

    template = make_profile()
    dirs = []
    for host in range(2):
        root = tmp_path / f"host{host}"
        launcher = copy.deepcopy(template)
        launcher.meta.hostname, launcher.spans, launcher.ops = f"node{host}", None, []  # torchrun: no op
        launcher.save(root)
        for local in range(2):
            rank = host * 2 + local
            p = rank_profile(template, host, rank)
            p.distributed.world_size = 4  # type: ignore[union-attr]
            p.save(process_dir(root, 1000 + rank))
        dirs.append(str(root))
    merged = tmp_path / "merged"
    assert main(["merge", *dirs, "--out", str(merged)]) == 0
    capsys.readouterr()
    assert main(["report", str(merged)]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "Merged from 2 hosts' runs" in text and "host node1: its clock is 1000.000000 s ahead of node0's" in text
    assert "A torch.distributed job of 4 ranks" in text and "node1: rank3" in text
    trace = tmp_path / "trace.json"
    assert main(["trace", str(merged), "-o", str(trace)]) == 0
    names = sorted(e["args"]["name"] for e in json.loads(trace.read_text())["traceEvents"]
                   if e.get("name") == "process_name")
    assert names == [f"rank {r} (node{r // 2}, pid {1000 + r})" for r in range(4)]
    assert main(["diff", str(merged), str(merged)]) == 0
    assert "the process that ran the most op time" in capsys.readouterr().err
