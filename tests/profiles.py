"""Hand-built profiles with known figures, shared by the model, analysis and report tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from cpuprof.model import (
    BandwidthRoof,
    Capabilities,
    Collection,
    ComputeRoof,
    Cpu,
    DecodeWorkload,
    EventInfo,
    IdleThread,
    InForce,
    Limits,
    MachineRoofs,
    MemoryPoint,
    MemPolicy,
    Meta,
    ModelInfo,
    NativeFrame,
    Node,
    OpenMPInfo,
    OpenMPRuntime,
    OpInput,
    OpStat,
    Overhead,
    Profile,
    Repeated,
    Requested,
    SampleTimeline,
    Sampling,
    Settings,
    Spans,
    StackCount,
    Stacks,
    StepFigures,
    ThreadPlacement,
    ThreadStat,
    Topology,
    TorchThreads,
)
from cpuprof.model.compare import COMPARE_FORMAT, COMPARE_VERSION, Comparison, RunMetrics, SweepConfig, SweepRun
from cpuprof.workload.presets import PRESETS

FIXTURES = Path(__file__).parent / "fixtures"
V1_DECODE = FIXTURES / "profile-v1-decode-tiny.json"
V1_UNPROFILED = FIXTURES / "profile-v1-unprofiled.json"

EVENTS = ["task-clock", "context-switches", "cycles", "instructions"]
MS = 1_000_000


def contiguous(sizes: list[int]) -> list[int]:
    """Row-major strides of ``sizes``."""
    strides, step = [], 1
    for size in reversed(sizes):
        strides.append(step)
        step *= max(size, 1)
    return list(reversed(strides))


def tensor(dtype: str, *sizes: int, strides: list[int] | None = None) -> OpInput:
    """A tensor input as the op hook records it (contiguous unless ``strides`` says otherwise)."""
    return OpInput(kind="tensor", dtype=dtype, sizes=list(sizes),
                   strides=strides if strides is not None else contiguous(list(sizes)))


def meta() -> Meta:
    return Meta(created="2026-11-21T00:00:00+00:00", cpuprof_version="test", torch_version="2.13.0+cpu",
                python="3.11.7", hostname="test", pid=1, argv=["test"])


def gemv_inputs() -> list[OpInput]:
    return [OpInput(kind="tensor", dtype="bf16", sizes=[1, 2048], strides=[2048, 1]),
            OpInput(kind="tensor", dtype="bf16", sizes=[2048, 8192], strides=[1, 2048])]


def settings(threads: int = 2) -> Settings:
    topo = Topology(online_cpus=[0, 1], nodes=[Node(id=0, cpus=[0, 1], mem_total_bytes=8 << 30,
                                                     mem_free_bytes=4 << 30, distances={0: 10})],
                    cpus=[Cpu(0, 0, 0, 0, [0]), Cpu(1, 0, 0, 1, [1])], model_name="test CPU", numa_in_sysfs=True)
    gomp = OpenMPRuntime(runtime="libgomp", path="/lib/libgomp.so.1", ompt=False)
    return Settings(
        requested=Requested(threads=threads, cpus=[0, 1], bind="close", places="cores", omp="gnu", omp_library=None,
                            allocator="default", allocator_library=None, mempolicy=MemPolicy(mode="bind", nodes=[0]),
                            env={"OMP_NUM_THREADS": str(threads)}),
        cpu_set="node 0: 0-1", topology=topo,
        in_force=InForce(pid=1, threads=[ThreadPlacement(10, "python", "R", [0], 0),
                                         ThreadPlacement(11, "python", "S", [1], 1)],
                         mempolicy=MemPolicy(mode="bind", nodes=[0]), openmp=OpenMPInfo(loaded=[gomp], active=gomp),
                         torch=TorchThreads(num_threads=1, num_interop_threads=1, parallel_info=""),
                         env={"OMP_NUM_THREADS": str(threads)}),
        warnings=["threads: asked 2 but torch uses 1"],
    )


def decode_workload(batch: int = 1, tokens_per_s: float = 100.0,
                    bytes_per_token: int = 2_000_000_000) -> DecodeWorkload:
    cfg = PRESETS["llama-3.2-1b"]
    return DecodeWorkload(
        model=ModelInfo(name=cfg.name, source="built-in random weights", architecture="built-in Llama",
                        dtype="bf16", params=cfg.param_count(), weight_bytes=cfg.weight_bytes(2), config=cfg),
        batch=batch, prompt_len=8, new_tokens=4, warmup_steps=1, sampling="greedy", steps_done=4,
        step_latencies_s=[0.02, 0.01, 0.01, 0.01], ttft_s=0.02, decode_wall_s=0.03,
        figures=StepFigures(measured_steps=3, tokens_per_s=tokens_per_s, p50_ms=10.0, p90_ms=11.0, p99_ms=12.0),
        bytes_read_per_token=bytes_per_token, bytes_read_method="analytic", build_s=1.0,
        peak_rss_bytes=3_000_000_000,
    )


def make_profile(mode: str = "exact") -> Profile:
    """Two working threads and one idle; aten::mm with 590+580 ms CPU in 600 ms self: 1.95 busy threads."""
    return Profile(
        meta=meta(),
        capabilities=Capabilities(hardware_pmu="cpu", hardware_pmu_reason=None, perf_event_paranoid=2,
                                  openmp=OpenMPInfo(), cpus_online=2),
        collection=Collection(mode=mode, events=[EventInfo(e, "software" if i < 2 else "hardware")
                                                 for i, e in enumerate(EVENTS)],
                              record_shapes=True, started_ns=0, stopped_ns=1000 * MS),
        threads=[
            ThreadStat(tid=10, name="python", role="dispatch",
                       counters={"task-clock": 900 * MS, "context-switches": 5, "cycles": 3_000_000_000,
                                 "instructions": 6_000_000_000}, run_delay_ns=5 * MS, sched_cpu_ns=900 * MS),
            ThreadStat(tid=11, name="python", role="worker",
                       counters={"task-clock": 800 * MS, "context-switches": 7, "cycles": 2_000_000_000,
                                 "instructions": 1_000_000_000}, scaled=["cycles"], run_delay_ns=1 * MS,
                       sched_cpu_ns=800 * MS),
        ],
        idle_threads=[IdleThread(tid=12, name="idle")],
        ops=[
            OpStat(id=5, kind="op", name="aten::mm", region=["mlp"], calls=100, incl_ns=600 * MS, self_ns=600 * MS,
                   max_ns=9 * MS, inputs=gemv_inputs(),
                   counters_self={"task-clock": [590 * MS, 580 * MS], "context-switches": [1, 2],
                                  "cycles": [2_000_000_000, 1_000_000_000], "instructions": [1_500_000_000, 0]},
                   counters_incl={"task-clock": [590 * MS, 580 * MS]}, samples=300),
            OpStat(id=7, kind="op", name="aten::add", region=["mlp"], calls=100, incl_ns=50 * MS, self_ns=50 * MS,
                   max_ns=1 * MS, inputs=[OpInput(kind="tensor", dtype="f32", sizes=[1, 8], strides=[8, 1])],
                   counters_self={"task-clock": [40 * MS, 0], "context-switches": [0, 0], "cycles": [0, 0],
                                  "instructions": [0, 0]},
                   counters_incl={"task-clock": [40 * MS, 0]}, samples=40),
            OpStat(id=6, kind="region", name="mlp", region=[], calls=10, incl_ns=700 * MS, self_ns=50 * MS,
                   max_ns=80 * MS, counters_self={}, counters_incl={"task-clock": [650 * MS, 600 * MS]}),
        ],
        overhead=Overhead(hook_ns=5 * MS, ops=1000, discovery_cpu_ns=2 * MS, discovery_ticks=50),
        limits=Limits(op_capacity=2048, ops_overflowed=3, span_capacity=10, spans_dropped=4, too_deep=0,
                      unattributed_ops=0, max_threads=4096, threads_beyond_limit=0, memory_bytes=1 << 20),
        spans=Spans(op=[5, 5], thread=[0, 0], depth=[1, 1], start_ns=[0, 10], dur_ns=[5, 5],
                    counters=[[1, 0, 0, 0], [1, 0, 0, 0]]),
        workload=decode_workload(),
        settings=settings(),
    )


def sampled_profile() -> Profile:
    """Two threads over the profile's 1 s at 100 Hz of CPU time: T0 busy all the time (a 10 ms sample
    every 10 ms), T1 only in the second half; roofs measured; an RSS timeline of five points."""
    p = make_profile("sampled")
    p.sampling = Sampling(hz=100, stack_bytes=8192, samples=150, lost=0)
    times0 = [(k + 1) * 10 * MS for k in range(100)]
    times1 = [500 * MS + (k + 1) * 10 * MS for k in range(50)]
    rows = sorted([(t, 0) for t in times0] + [(t, 1) for t in times1])
    frames = [NativeFrame("mkl_gemv<float>", "libmkl.so", "compute"), NativeFrame("gomp_barrier_wait", "libgomp.so",
                                                                                    "openmp")]
    p.stacks = Stacks(frames=frames, stacks=[[], [0], [1]], paths=[[], [6, 5]],
                      counts=[StackCount(stack=1, path=1, thread=0, op=5, samples=100, cpu_ns=100 * MS),
                              StackCount(stack=2, path=1, thread=1, op=5, samples=50, cpu_ns=50 * MS)],
                      timeline=SampleTimeline(time_ns=[t for t, _ in rows], thread=[k for _, k in rows],
                                              op=[5] * len(rows), stack=[1] * len(rows), cpu_us=[10_000] * len(rows)))
    p.roofs = MachineRoofs(fingerprint={"cpu": "test"}, key="k", measured="2026-11-21T00:00:00+00:00", seconds=1.0,
                           threads=2, cpus=[0, 1],
                           bandwidth=[BandwidthRoof("triad", Repeated(40.0, 38.0, 0.1, 5), 2, 1 << 27)],
                           compute=[ComputeRoof("bf16", Repeated(500.0, 480.0, 0.05, 5), 2, 2048)])
    assert p.workload is not None
    p.workload.rss_timeline = [MemoryPoint(0.1, 200_000_000, "start"), MemoryPoint(0.5, 250_000_000, "built"),
                               MemoryPoint(1.0, 300_000_000, "step 1"), MemoryPoint(1.1, 301_000_000, "step 2"),
                               MemoryPoint(1.2, 302_000_000, "step 3")]
    p.validate()
    return p


def comparison() -> Comparison:
    """threads=1: 10, 12, 14 tokens/s (mean 12, sample std 2); threads=2: 20 and 20 (std 0);
    threads=3: failed twice."""
    def run(config: int, rep: int, tps: float, steps: list[float]) -> SweepRun:
        return SweepRun(config=config, repetition=rep, status="done", out_dir=f"c{config}/r{rep}", wall_s=1.0,
                        metrics=RunMetrics(tokens_per_s=tps, step_ms=steps, ttft_s=0.01, p50_ms=float(np.median(steps)),
                                           p99_ms=max(steps), threads=config + 1))

    configs = [SweepConfig(label=f"threads={k}", values={"threads": str(k)}) for k in (1, 2, 3)]
    runs = [run(0, 1, 10.0, [100.0, 101.0]), run(0, 2, 12.0, [83.0, 84.0]), run(0, 3, 14.0, [71.0, 72.0]),
            run(1, 1, 20.0, [50.0, 50.0]), run(1, 2, 20.0, [50.0, 52.0])]
    runs += [SweepRun(config=2, repetition=r, status="failed", out_dir=f"c2/r{r}",
                      error="--threads 3: more threads than the 2 CPUs <here>") for r in (1, 2)]
    return Comparison(format=COMPARE_FORMAT, version=COMPARE_VERSION, created="2026-11-21T00:00:00+00:00",
                      cpuprof_version="test", argv=["compare", "--threads", "1,2,3"], base={},
                      axes={"threads": ["1", "2", "3"]}, configs=configs, repetitions=3,
                      order=[[c, r] for r in (1, 2, 3) for c in range(3)], baseline=0, runs=runs)
