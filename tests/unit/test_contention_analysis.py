"""Known answers for the contention analysis on hand-built profiles: the OMPT method's exact waits
and the samples method's spin and sleep."""

from __future__ import annotations

import dataclasses

import pytest
from profiles import MS, make_profile

from cpuprof.analysis.contention import analyse, contention_section, summarize_contention
from cpuprof.analysis.report import build_report
from cpuprof.model import (
    NativeFrame,
    OmptInfo,
    OmpWait,
    OmpWork,
    OpenMPWaits,
    Profile,
    Sampling,
    StackCount,
    Stacks,
)


def ompt_profile() -> Profile:
    """aten::mm (id 5): 600 ms of self time in 100 regions of 2 threads; T1 waits 200 ms at the
    implicit barrier (150 ms of it on a CPU), T0 20 ms at explicit ones; T0 waits 30 ms on a lock
    over 400 acquisitions; the regions cover 550 ms of the op, so 50 ms ran serial."""
    p = make_profile("exact")
    p.openmp = OpenMPWaits(
        info=OmptInfo(active=True, runtime="Intel(R) OMP test", library="/x/libcpuprof_ompt.so"),
        waits=[OmpWait(thread=1, op=5, kind="barrier-implicit", count=100, wall_ns=200 * MS, cpu_ns=150 * MS),
               OmpWait(thread=0, op=5, kind="barrier-explicit", count=100, wall_ns=20 * MS, cpu_ns=20 * MS),
               OmpWait(thread=0, op=5, kind="lock", count=400, wall_ns=30 * MS, cpu_ns=10 * MS)],
        work=[OmpWork(thread=0, op=5, parallel_regions=100, team_threads=200, parallel_ns=550 * MS,
                      implicit_tasks=100, implicit_task_ns=540 * MS, lock_acquisitions=400),
              OmpWork(thread=1, op=5, implicit_tasks=100, implicit_task_ns=540 * MS)])
    return p


def test_ompt_waits_give_vtune_figures() -> None:
    c = analyse(ompt_profile())
    assert c is not None and c.method == "ompt"
    mm = next(o for o in c.ops if o.op.id == 5)
    t0, t1 = mm.threads
    assert t1.barrier_ns == {"barrier-implicit": 200 * MS} and t1.spin_ns == 150 * MS and t1.sleep_ns == 50 * MS
    assert t0.lock_ns == 30 * MS and t0.acquisitions == 400
    assert t0.spin_ns == (20 + 10) * MS and t0.sleep_ns == 20 * MS  # the lock wait's 20 ms off CPU
    assert mm.imbalance_ns == pytest.approx((200 + 20) * MS / 2)  # barrier waits / team size
    assert mm.serial_ns == 50 * MS and mm.parallel_regions == 100
    # exact waits: no run-queue estimate taken from them, whatever schedstat said of the threads
    assert all(t.queued_ns is None for t in mm.threads) and c.queued_ns == 0
    # effective utilisation: CPU not spinning / (wall x team) = (590 - 30 + 580 - 150) / (600 x 2)
    assert mm.effective_utilisation == pytest.approx((590 - 30 + 580 - 150) / 1200)


def test_ompt_findings_rank_imbalance_lock_and_serial_time() -> None:
    section = contention_section(summarize_contention(ompt_profile()))
    assert section is not None
    text = "\n".join(section.lines)
    assert "method: OMPT" in text
    findings = [line for line in section.lines if line.startswith("finding:")]
    assert "T1 waits 33% of aten::mm" in findings[0] and "at the implicit barrier" in findings[0]
    assert "75% of it spinning" in findings[0]
    assert any("waiting on locks" in f and "400 acquisitions" in f for f in findings)
    assert any("runs serial for 50.0 ms" in f for f in findings)
    row = next(r for r in section.tables[0].rows if r["thread"] == "T1")
    assert row["barrier"] == 200 * MS and row["kinds"] == "implicit"


def sampled_profile() -> Profile:
    """aten::mm, 600 ms self: T0 590 ms of CPU, none of it in the runtime; T1 580 ms of CPU, half
    of its samples' CPU in the OpenMP runtime: it spins 290 ms and is off CPU 20 ms."""
    p = make_profile("sampled")
    p.sampling = Sampling(hz=1000, stack_bytes=8192, samples=1170, lost=0)
    frames = [NativeFrame("gemm_kernel", "libdnnl.so", "compute"), NativeFrame("gomp_barrier_wait", "libgomp.so",
                                                                                "openmp")]
    p.stacks = Stacks(frames=frames, stacks=[[], [0], [1]], counts=[
        StackCount(stack=1, path=0, thread=0, op=5, samples=590, cpu_ns=590 * MS),
        StackCount(stack=1, path=0, thread=1, op=5, samples=290, cpu_ns=290 * MS),
        StackCount(stack=2, path=0, thread=1, op=5, samples=290, cpu_ns=290 * MS)])
    return p


def test_samples_give_spin_from_the_runtime_and_sleep_from_cpu_time() -> None:
    c = analyse(sampled_profile())
    assert c is not None and c.method == "samples"
    mm = next(o for o in c.ops if o.op.id == 5)
    t0, t1 = mm.threads
    assert t0.spin_ns == 0 and t0.sleep_ns == 10 * MS  # 600 - 590
    assert t1.spin_ns == pytest.approx(290 * MS) and t1.sleep_ns == 20 * MS
    # Of their time off CPU, the share each thread was runnable (schedstat delay / (1000 ms profiled -
    # its CPU)) is not a wait for the other: T0 5 / 100 of its 10 ms, T1 1 / 200 of its 20 ms.
    assert t0.queued_ns == pytest.approx(0.5 * MS) and t1.queued_ns == pytest.approx(0.1 * MS)
    assert mm.imbalance_ns == pytest.approx((10 - 0.5 + 290 + 20 - 0.1) * MS / 2)
    section = contention_section(summarize_contention(sampled_profile()))
    assert section is not None
    assert "`decode --omp intel` gives exact" in section.lines[0]
    assert "barrier kinds and lock waits (no OMPT)" in section.lines[1]


def test_every_report_has_the_contention_section() -> None:
    ids = [s.id for s in build_report(sampled_profile()).sections]
    assert "contention" in ids


def test_a_communication_backend_thread_is_not_a_team_member() -> None:
    """A tensor-parallel rank's gloo thread waits on its socket through the ops: counted in the
    team it would read as a member idle 595 of 600 ms, doubling the team's sleep. And the scope
    gloo's run loop opens on its own thread (300 ms, none of the team's CPU) is not team time."""
    from cpuprof.analysis.compare import run_metrics
    from cpuprof.model import OpStat, ThreadStat

    plain = sampled_profile()
    p = sampled_profile()
    p.threads.append(ThreadStat(tid=13, name="gloo_tcp_loop", role="worker",
                                counters={"task-clock": 5 * MS, "context-switches": 900}, run_delay_ns=0))
    for op in p.ops:
        for values in (*op.counters_self.values(), *op.counters_incl.values()):
            values.append(5 * MS if op.id == 5 else 0)
    p.ops.append(OpStat(id=40, kind="region", name="gloo:all_reduce", region=[], calls=10, incl_ns=300 * MS,
                        self_ns=300 * MS, max_ns=30 * MS, counters_self={"task-clock": [0, 0, 20 * MS]},
                        counters_incl={"task-clock": [0, 0, 20 * MS]}))
    # The team's own wait for the other ranks: communication, neither imbalance nor spinning.
    for op_id, kind, name, region in ((41, "region", "all_reduce", ["mlp"]),
                                      (42, "op", "c10d::allreduce_", ["mlp", "all_reduce"])):
        p.ops.append(OpStat(id=op_id, kind=kind, name=name, region=region, calls=10, incl_ns=100 * MS,
                            self_ns=100 * MS, max_ns=10 * MS, counters_self={"task-clock": [5 * MS, 0, 1 * MS]},
                            counters_incl={"task-clock": [5 * MS, 0, 1 * MS]}))
    c = analyse(p)
    assert c is not None and c.team == 2 and c.members == [0, 1]
    assert not {40, 41, 42} & {o.op.id for o in c.ops}
    mm = next(o for o in c.ops if o.op.id == 5)
    assert [t.thread for t in mm.threads] == [0, 1]
    assert mm.imbalance_ns == pytest.approx(analyse(plain).ops[0].imbalance_ns)  # as without it
    with_gloo, without = run_metrics(p), run_metrics(plain)
    assert with_gloo is not None and without is not None
    assert with_gloo.sleep_share == pytest.approx(without.sleep_share)
    assert with_gloo.run_delay_share == pytest.approx(without.run_delay_share)


def test_waiting_for_a_cpu_is_not_imbalance_and_a_team_of_one_has_none() -> None:
    """Both threads off CPU 400 ms of a 1000 ms op, all of it runnable (another process held their
    CPUs: schedstat says so): no wait for each other, so no imbalance and no potential gain; the
    finding names the run queue. Then the same, asleep instead (no run-queue delay): imbalance
    (400 + 400) / 2. A team of one has no imbalance, whatever its waits."""
    from cpuprof.model import ThreadStat

    def profile(run_delay_ms: int, threads: int = 2) -> Profile:
        p = make_profile("sampled")
        p.threads = [ThreadStat(tid=10 + k, name="python", role="dispatch" if k == 0 else "worker",
                                counters={"task-clock": 600 * MS}, run_delay_ns=run_delay_ms * MS)
                     for k in range(threads)]
        mm = p.ops[0]
        mm.self_ns = mm.incl_ns = 1000 * MS
        mm.counters_self = {"task-clock": [600 * MS] * threads}
        mm.counters_incl = {"task-clock": [600 * MS] * threads}
        p.ops = [mm]
        return p

    queued = analyse(profile(400))
    assert queued is not None
    (op,) = queued.ops
    assert [t.queued_ns for t in op.threads] == [pytest.approx(400 * MS)] * 2 and op.imbalance_ns == 0
    section = contention_section(summarize_contention(profile(400)))
    assert section is not None
    text = "\n".join(section.lines)
    assert "was off CPU 800.0 ms (800.0 ms of it runnable, waiting for a CPU" in text
    assert "potential gain 0 ns" in text
    assert not any("imbalance, potential gain" in line for line in section.lines)
    assert any("waited 400.0 ms for a CPU while runnable" in line for line in section.lines)
    asleep = analyse(profile(0))
    assert asleep is not None and asleep.ops[0].imbalance_ns == pytest.approx(400 * MS)
    alone = analyse(profile(0, threads=1))
    assert alone is not None and alone.ops[0].imbalance_ns == 0
    lone = contention_section(summarize_contention(profile(0, threads=1)))
    assert lone is not None and any("a team of one thread has no imbalance" in line for line in lone.lines)


def test_exact_mode_says_its_own_method_not_the_samples_one() -> None:
    p = make_profile("exact")
    assert p.sampling is None and p.openmp is None
    section = contention_section(summarize_contention(p))
    assert section is not None
    assert section.lines[0].startswith("method: counters (exact mode): sleep = ")
    assert "samples:" not in section.lines[0] and "spin is not measured" in section.lines[0]


def test_a_thread_found_late_did_not_wait_before_it_existed() -> None:
    """Known answer: T1 was found 500 ms into a 1000 ms profile and waited 10 ms for a CPU (schedstat).
    aten::normal_ ran before it existed (no CPU of T1's in it): T1's off-CPU time and run-queue wait
    there are not known, not the op's wall time. In aten::mm it ran 100 of 200 ms: its 100 ms off CPU
    hold its run-queue estimate, and over the ops that never exceeds the 10 ms it waited."""
    from cpuprof.model import ThreadStat

    p = make_profile("sampled")
    p.threads = [ThreadStat(tid=10, name="python", role="dispatch", counters={"task-clock": 900 * MS},
                            run_delay_ns=0),
                 ThreadStat(tid=11, name="python", role="worker", counters={"task-clock": 100 * MS},
                            run_delay_ns=10 * MS, opened_ns=500 * MS)]
    mm = p.ops[0]
    before = {"task-clock": [300 * MS, 0]}
    normal = dataclasses.replace(mm, id=99, name="aten::normal_", self_ns=300 * MS, incl_ns=300 * MS,
                                 counters_self=before, counters_incl=dict(before))
    mm.self_ns = mm.incl_ns = 200 * MS
    mm.counters_self = {"task-clock": [200 * MS, 100 * MS]}
    mm.counters_incl = {"task-clock": [200 * MS, 100 * MS]}
    p.ops = [normal, mm]
    c = analyse(p)
    assert c is not None
    by_name = {o.op.name: o for o in c.ops}
    late = by_name["aten::normal_"].threads[1]
    assert late.sleep_ns is None and late.queued_ns is None
    ran = by_name["aten::mm"].threads[1]
    assert ran.sleep_ns == 100 * MS
    # its share: 10 ms delay over its 500 ms of life less its 100 ms of CPU
    assert ran.queued_ns == pytest.approx(100 * MS * 10 / 400)
    assert c.queued_ns <= 10 * MS
