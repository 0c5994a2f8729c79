"""Hand-built profiles with known figures, shared by the model, analysis and report tests."""

from __future__ import annotations

from pathlib import Path

from cpuprof.model import (
    Capabilities,
    Collection,
    Cpu,
    DecodeWorkload,
    EventInfo,
    IdleThread,
    InForce,
    Limits,
    MemPolicy,
    Meta,
    ModelInfo,
    Node,
    OpenMPInfo,
    OpenMPRuntime,
    OpInput,
    OpStat,
    Overhead,
    Profile,
    Requested,
    Settings,
    Spans,
    StepFigures,
    ThreadPlacement,
    ThreadStat,
    Topology,
    TorchThreads,
)
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
