"""The merged report's figures from known all-reduce timings: who waited for whom, and for how long."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from tests.profiles import MS, make_profile

from cpuprof.analysis.ranks import arrival_waits, group_figures, ranks_report
from cpuprof.model import Collectives, DecodeWorkload, ModelInfo, StepFigures
from cpuprof.model.ranks import MultiRun, RankOutcome

US = 1000


def collectives(enters: list[int], exits: list[int], steps: list[int]) -> Collectives:
    return Collectives(kind="all_reduce", payload_bytes=[256] * len(enters), enter_ns=enters, exit_ns=exits, step=steps)


def rank_profile(c: Collectives, step_ms: list[float], tokens_per_s: float):
    p = make_profile()
    p.workload = DecodeWorkload(
        model=ModelInfo(name="tiny", source="built-in", architecture="built-in Llama", dtype="fp32", params=1,
                        weight_bytes=4),
        batch=1, prompt_len=8, new_tokens=len(step_ms), warmup_steps=1, sampling="greedy",
        steps_done=len(step_ms), step_latencies_s=[ms / 1e3 for ms in step_ms],
        figures=StepFigures(measured_steps=len(step_ms) - 1, tokens_per_s=tokens_per_s, p50_ms=1, p90_ms=1, p99_ms=1),
        collectives=c)
    return p


def test_the_last_rank_to_arrive_waits_for_nobody():
    # call 0: rank 1 arrives 300 µs late; call 1: rank 0 arrives 50 µs late
    r0 = collectives([0, 1000 * US], [400 * US, 1100 * US], [0, 0])
    r1 = collectives([300 * US, 950 * US], [400 * US, 1100 * US], [0, 0])
    assert arrival_waits([r0, r1]) == [[300 * US, 0], [0, 50 * US]]


def test_calls_only_one_rank_made_have_no_wait():
    r0 = collectives([0, 10, 20], [5, 15, 25], [0, 0, 1])
    r1 = collectives([2], [5], [0])  # it stopped after one call
    assert arrival_waits([r0, r1, None]) == [[2, 0, 0], [0], []]


def test_a_step_splits_into_compute_transfer_and_waiting(tmp_path: Path):
    # two decode steps of 2 ms each; step 0 is warm-up. In step 1, two all-reduces of 500 µs on rank 0,
    # of which the first waited 200 µs for rank 1, which itself waited for nothing.
    steps = [-1, 0, 1, 1]
    r0 = collectives([0, 10, 5000 * US, 5600 * US], [5, 15, 5500 * US, 6100 * US], steps)
    r1 = collectives([0, 10, 5200 * US, 5600 * US], [5, 15, 5500 * US, 6100 * US], steps)
    run = MultiRun(mode="tp", world_size=2, backend="gloo", argv=[], timeout_s=60, finished=True,
                   ranks=[RankOutcome(rank=r, dir=f"rank-{r}", cpus=[r], node=None, threads=1, returncode=0)
                          for r in range(2)])
    g = group_figures(run, [rank_profile(r0, [2, 2], 500.0), rank_profile(r1, [2, 2], 480.0)])
    s0, s1 = g.ranks[0].split, g.ranks[1].split
    assert s0.step_ns == pytest.approx(2e6)
    assert s0.all_reduce_ns == pytest.approx(1000 * US)
    assert s0.wait_ns == pytest.approx(200 * US)
    assert s0.transfer_ns == pytest.approx(800 * US)
    assert s0.compute_ns == pytest.approx(1000 * US)
    assert s0.calls_per_step == 2 and s0.payload_bytes_per_step == 512
    assert s1.wait_ns == 0 and s1.all_reduce_ns == pytest.approx(800 * US)
    assert g.tokens_per_s == 480.0  # lockstep: the slowest rank's rate

    instances = MultiRun(mode="instances", world_size=2, backend=None, argv=[], timeout_s=60, finished=True,
                         ranks=run.ranks)
    assert group_figures(instances, [rank_profile(r0, [2, 2], 500.0), rank_profile(r1, [2, 2], 480.0)]
                         ).tokens_per_s == 980.0


def test_a_rank_without_a_profile_leaves_the_group_figure_unknown(tmp_path: Path):
    run = MultiRun(mode="instances", world_size=2, backend=None, argv=[], timeout_s=60, finished=True,
                   ranks=[RankOutcome(rank=r, dir=f"rank-{r}", cpus=[r], node=None, threads=1,
                                      returncode=0 if r == 0 else -9, failure=None if r == 0 else "rank 1 was killed")
                          for r in range(2)])
    report = ranks_report(run, run.profiles(tmp_path), tmp_path)  # nothing on disk: every rank's profile is missing
    assert report.warnings == ["PARTIAL: rank 1 was killed"]
    rows = report.section("ranks").tables[0].rows
    assert [row["status"] for row in rows] == ["ok", "failed"]
    assert all(row["tokens_per_s"] is None for row in rows)
    assert not report.section("ranks").lines  # no group figure without every rank's


def test_ranks_file_round_trips(tmp_path: Path):
    run = MultiRun(mode="tp", world_size=2, backend="gloo", argv=["x"], timeout_s=5.0, finished=True,
                   ranks=[RankOutcome(rank=0, dir="rank-0", cpus=[0], node=None, threads=1, returncode=0, ended_s=1.5)])
    run.save(tmp_path)
    assert MultiRun.load(tmp_path / "ranks.json") == run


def _saved_group(tmp_path: Path, mode: str) -> MultiRun:
    steps = [-1, 0, 1, 1]
    r0 = collectives([0, 10, 5000 * US, 5600 * US], [5, 15, 5500 * US, 6100 * US], steps)
    r1 = collectives([0, 10, 5200 * US, 5600 * US], [5, 15, 5500 * US, 6100 * US], steps)
    run = MultiRun(mode=mode, world_size=2, backend="gloo", argv=["cpuprof", "decode", "--tp", "2"], timeout_s=60,
                   finished=True, ranks=[RankOutcome(rank=r, dir=f"rank-{r}", cpus=[r], node=None, threads=1,
                                                     returncode=0) for r in range(2)])
    for r, c in enumerate((r0, r1)):
        (tmp_path / f"rank-{r}").mkdir()
        p = rank_profile(c if mode == "tp" else None, [2, 2], 500.0)
        p.save(tmp_path / f"rank-{r}")
    run.save(tmp_path)
    return run


def test_the_html_page_draws_each_ranks_step_from_its_parts(tmp_path: Path):
    from cpuprof.cli import main

    _saved_group(tmp_path, "tp")
    page = tmp_path / "group.html"
    assert main(["report", str(tmp_path), "--format", "html", "-o", str(page)]) == 0
    html = page.read_text()
    marks = re.findall(r'<rect class="mark" data-rank="(\d)" data-part="([^"]+)" data-ns="(\d+)"', html)
    assert marks == [("0", "compute", "1000000"), ("0", "reduce, after the last rank arrived", "800000"),
                     ("0", "waiting for the slowest rank", "200000"),
                     ("1", "compute", "1200000"), ("1", "reduce, after the last rank arrived", "800000"),
                     ("1", "waiting for the slowest rank", "0")]
    assert "Where a decode step goes" in html and "<script src" not in html


def test_the_html_page_of_instances_draws_their_median_step(tmp_path: Path):
    from cpuprof.reports.html_ranks import ranks_page

    run = _saved_group(tmp_path, "instances")
    html = ranks_page(run, tmp_path)
    assert re.findall(r'data-rank="(\d)" data-part="median step" data-ns="(\d+)"', html) == [("0", "1000000"),
                                                                                          ("1", "1000000")]


def test_the_backends_threads_and_the_main_threads_wait_are_shares_of_the_profiled_wall_time(tmp_path: Path):
    steps = [-1, 0, 1, 1]
    c = collectives([0, 10, 5000 * US, 5600 * US], [5, 15, 5500 * US, 6100 * US], steps)
    profiles = [rank_profile(c, [2, 2], 500.0) for _ in range(2)]
    for p in profiles:  # 1000 ms profiled: the main thread (tid 10) and gloo's TCP loop (800 ms of CPU)
        p.meta.pid = 10
        p.threads[1].name = "gloo_tcp_loop"
        p.threads[0].run_delay_ns = 50 * MS
    profiles[1].threads[0].run_delay_ns = 10 * MS  # below the 2% that makes a rank crowded
    run = MultiRun(mode="tp", world_size=2, backend="gloo", argv=[], timeout_s=60, finished=True,
                   ranks=[RankOutcome(rank=r, dir=f"rank-{r}", cpus=[r], node=None, threads=1, returncode=0)
                          for r in range(2)])
    g = group_figures(run, profiles)
    assert [f.backend_cpu_ns for f in g.ranks] == [800 * MS, 800 * MS]
    assert [f.main_run_delay_ns for f in g.ranks] == [50 * MS, 10 * MS]
    assert [f.wall_ns for f in g.ranks] == [1000 * MS, 1000 * MS]
    from cpuprof.analysis.ranks import _tp_lines

    crowded = [line for line in _tp_lines(g) if "the main thread waited" in line]
    assert crowded == ["Rank(s) 0: the main thread waited 5.0% of the time for a CPU while the backend's own threads "
                       "used 80% of one; they share the rank's CPUs with the compute threads, so they take turns "
                       "(--threads below a rank's CPU count leaves the backend a CPU of its own)."]
