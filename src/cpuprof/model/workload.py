"""What was profiled: the decode workload's model, its options and its measured figures."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..workload.presets import ModelConfig


@dataclass
class StepFigures:
    """Throughput and latency over the measured decode steps (warm-up steps left out).

    One function computes these for finished and interrupted runs alike
    (:func:`cpuprof.workload.figures.step_figures`): tokens/s counts every sequence of the batch,
    percentiles are numpy's linear interpolation.
    """

    measured_steps: int
    tokens_per_s: float
    p50_ms: float
    p90_ms: float
    p99_ms: float


@dataclass
class ModelInfo:
    name: str
    source: str  # "built-in random weights" or the checkpoint directory
    architecture: str  # e.g. LlamaForCausalLM; "built-in Llama" for the built-in model
    dtype: str  # bf16, fp32
    params: int
    weight_bytes: int  # bytes the weights occupy (tied matrices once)
    config: ModelConfig | None = None  # the built-in model's shape
    model_type: str | None = None  # a checkpoint's transformers model type: llama, qwen3, gemma2, ...


@dataclass
class MemoryPoint:
    """The process's resident memory at one moment of the run (for an RSS-over-time chart)."""

    time_s: float  # since the decode child started
    rss_bytes: int
    phase: str  # "start", "built", "prefill", "step 3", ...


@dataclass
class KvCachePoint:
    """Bytes the KV cache holds (all layers, every sequence of the batch) at one context length."""

    position: int
    bytes: int


@dataclass
class RankInfo:
    """This process's place in a multi-process decode (``decode --tp N`` or ``--instances N``)."""

    mode: str  # "tp": one tensor-parallel rank of one model; "instances": one of N independent decoders
    rank: int
    world_size: int
    backend: str | None = None  # torch.distributed's backend (gloo, ccl); None for independent instances
    cpus: list[int] = field(default_factory=list)  # the CPUs this rank was given


#: The region every all-reduce of a tensor-parallel decode runs in, inside the block that needs it.
ALL_REDUCE_REGION = "all_reduce"


@dataclass
class Collectives:
    """Every all-reduce this rank made, timed where the model calls it (the wait for the other
    ranks included, which the dispatcher's ``c10d::allreduce_`` op leaves out: it only enqueues).

    Times are CLOCK_MONOTONIC nanoseconds, one clock for every process of the machine, so the
    ranks' entries can be set side by side: the last rank to enter a collective is the one every
    other rank waited for.
    """

    kind: str  # "all_reduce"
    payload_bytes: list[int] = field(default_factory=list)  # the tensor reduced, per call
    enter_ns: list[int] = field(default_factory=list)
    exit_ns: list[int] = field(default_factory=list)
    step: list[int] = field(default_factory=list)  # -1: prefill; k: decode step k (0-based, warm-up included)


@dataclass
class DecodeWorkload:
    model: ModelInfo
    batch: int
    prompt_len: int
    new_tokens: int
    warmup_steps: int
    sampling: str  # greedy, topk
    steps_done: int = 0
    step_latencies_s: list[float] = field(default_factory=list)
    ttft_s: float | None = None  # prefill, to the first token
    decode_wall_s: float | None = None  # the measured steps' wall time, progress callbacks excluded
    figures: StepFigures | None = None
    bytes_read_per_token: int | None = None  # minimum bytes one token costs (weights + KV cache) / batch
    bytes_read_method: str = ""  # how bytes_read_per_token was obtained
    build_s: float | None = None
    compile_s: float | None = None  # torch.compile of the built-in model, before the profile; None: not compiled
    peak_rss_bytes: int | None = None
    rss_timeline: list[MemoryPoint] = field(default_factory=list)
    kv_cache: list[KvCachePoint] = field(default_factory=list)  # at the prompt's end and the last step
    # The tokens, so runs can be checked against each other and against other implementations.
    prompt_ids: list[list[int]] = field(default_factory=list)  # per sequence
    output_ids: list[list[int]] = field(default_factory=list)  # per sequence: prefill's token, then each step's
    rank: RankInfo | None = None  # one rank or instance of a multi-process decode; None: a single process
    collectives: Collectives | None = None  # a tensor-parallel rank's all-reduces
