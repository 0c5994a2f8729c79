"""What was profiled: the decode workload's model, its options and its measured figures.

The built-in model's shape (:class:`ModelConfig`) and the region names the decode loop opens live
here, not in ``cpuprof.workload`` (which needs torch), so reports read them without torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class ModelConfig:
    """The shape of a Llama-architecture decoder: all that performance depends on."""

    name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    tied_embeddings: bool
    rope_theta: float
    max_seq: int
    norm_eps: float

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def kv_dim(self) -> int:
        """Width of the k (or v) projection output: what grouped-query attention shrinks."""
        return self.kv_heads * self.head_dim

    def layer_param_count(self) -> int:
        """Parameters of one decoder layer (attention, SwiGLU MLP and its two RMSNorms)."""
        attention = 2 * self.hidden * self.hidden + 2 * self.hidden * self.kv_dim  # q, o, k, v
        mlp = 3 * self.hidden * self.ffn  # gate, up, down
        return attention + mlp + 2 * self.hidden

    def param_count(self) -> int:
        """All parameters, counting a tied embedding/lm_head matrix once."""
        embedding = self.vocab * self.hidden
        lm_head = 0 if self.tied_embeddings else self.vocab * self.hidden
        return embedding + self.layers * self.layer_param_count() + self.hidden + lm_head

    def weight_bytes(self, dtype_bytes: int) -> int:
        """Bytes the weights occupy in memory."""
        return self.param_count() * dtype_bytes

    def kv_cache_bytes(self, dtype_bytes: int, seq_len: int, batch: int) -> int:
        """Bytes of k and v for ``seq_len`` positions of ``batch`` sequences, all layers."""
        return 2 * self.layers * batch * seq_len * self.kv_dim * dtype_bytes

    def shard_problem(self, shards: int) -> str | None:
        """Why this shape cannot be split tensor-parallel ``shards`` ways, or None if it can: every
        rank needs whole query and KV heads and an equal slice of the feed-forward width."""
        for name, value in (("heads", self.heads), ("kv_heads", self.kv_heads), ("ffn", self.ffn)):
            if value % shards:
                return f"{self.name}'s {name.replace('_', ' ')} ({value}) do not divide into {shards} equal parts"
        return None

    def bytes_read_per_token(self, dtype_bytes: int, context_len: int, batch: int, shards: int = 1) -> int:
        """Bytes one decode step reads from memory, divided by the tokens it produces.

        This is the analytic floor that makes decoding memory-bound: every matrix is streamed
        once per step whatever the batch, while the KV cache and the embedding rows are read
        per sequence.  A tied embedding/lm_head matrix is counted once, as read by lm_head;
        the embedding lookup reads one row per sequence.  Dividing by ``batch`` makes the
        figure comparable with tokens/s: bandwidth / bytes_read_per_token = the ceiling.

        With ``shards`` (one tensor-parallel rank of that many): the rank's slice of every layer's
        matrices and KV cache, with the norms, embedding and lm_head whole (they are replicated).
        """
        matrices = self.layer_param_count() - 2 * self.hidden
        streamed = (self.layers * (matrices // shards + 2 * self.hidden) + self.hidden
                    + self.vocab * self.hidden)
        per_sequence = self.hidden + self.kv_cache_bytes(1, context_len, 1) // shards
        return (streamed + batch * per_sequence) * dtype_bytes // batch


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


#: The region the prefill runs in when profiled: ops outside it are the decode steps'.
PREFILL_REGION = "prefill"

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
