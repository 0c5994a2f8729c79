"""What was profiled: the decode workload's model, its options and its measured figures.

The built-in model's shape (:class:`ModelConfig`) and the region names the decode loop opens live
here, not in ``cpuprof.workload`` (which needs torch), so reports read them without torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

#: How the built-in model may store its projection matrices (``decode --quant``).
QUANT_MODES: tuple[str, ...] = ("none", "int8", "int4")
#: The group sizes torch's CPU int4 kernel (aten::_weight_int4pack_mm_for_cpu) accepts.
INT4_GROUP_SIZES: tuple[int, ...] = (32, 64, 128, 256)
DEFAULT_GROUP_SIZE = 128
#: torch's CPU int4 packing (aten::_convert_weight_to_int4pack_for_cpu) needs the rows in multiples of this.
INT4_ROW_MULTIPLE = 16
#: The codes the GEMM table and the kernel roofs give a quantized weight's storage.
QUANT_WEIGHT_CODES: dict[str, str] = {"int8": "i8", "int4": "i4"}
#: The roofs' names of the decode's dtypes (the profile's op inputs name them so).
ROOF_DTYPES: dict[str, str] = {"bf16": "bf16", "fp32": "f32"}


@dataclass(frozen=True)
class WeightQuant:
    """How the projection matrices are stored: as built (``none``), or weight-only ``int8`` (one
    scale per output row) or ``int4`` (a scale and a zero point per ``group_size`` inputs of each
    row, two weights to a byte). The scales are in the model's dtype, as torch's kernels take them;
    the embedding table (one row read per token) and the norms stay in the model's dtype."""

    mode: str = "none"
    group_size: int = DEFAULT_GROUP_SIZE  # int4 only

    @property
    def quantized(self) -> bool:
        return self.mode != "none"

    @property
    def groups(self) -> int:
        """int4's inputs per scale; 0 for a storage without groups."""
        return self.group_size if self.mode == "int4" else 0

    def matrix_bytes(self, rows: int, cols: int, dtype_bytes: int) -> int:
        """Bytes a [rows, cols] weight occupies (and a GEMV reads): weights plus their scales."""
        if self.mode == "int8":
            return rows * cols + rows * dtype_bytes
        if self.mode == "int4":
            return rows * cols // 2 + (cols // self.group_size) * rows * 2 * dtype_bytes
        return rows * cols * dtype_bytes

    def describe(self) -> str:
        if self.mode == "int8":
            return "int8 weights, one scale per output channel"
        if self.mode == "int4":
            return f"int4 weights, a scale and zero point per group of {self.group_size}"
        return "not quantized"


NO_QUANT = WeightQuant()


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

    def layer_matrices(self, shards: int = 1) -> list[tuple[int, int]]:
        """(rows, cols) of one layer's projections q, k, v, o, gate, up, down, as torch stores them
        ([out, in]); a tensor-parallel rank's slices with ``shards``: q/k/v and gate/up by rows,
        o and down by columns."""
        q, kv, h, f = self.heads * self.head_dim // shards, self.kv_dim // shards, self.hidden, self.ffn // shards
        return [(q, h), (kv, h), (kv, h), (h, q), (f, h), (f, h), (h, f)]

    def weight_bytes(self, dtype_bytes: int, quant: WeightQuant = NO_QUANT, shards: int = 1) -> int:
        """Bytes the weights occupy in memory (a rank's share with ``shards``). Quantized, the
        lm_head is a quantized copy of a tied embedding, which stays whole for its lookups."""
        layer = sum(quant.matrix_bytes(rows, cols, dtype_bytes) for rows, cols in self.layer_matrices(shards))
        lm_head = 0 if self.tied_embeddings and not quant.quantized else quant.matrix_bytes(self.vocab, self.hidden,
                                                                                              dtype_bytes)
        return (self.vocab * self.hidden * dtype_bytes + self.layers * (layer + 2 * self.hidden * dtype_bytes)
                + self.hidden * dtype_bytes + lm_head)

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

    def bytes_read_per_token(self, dtype_bytes: int, context_len: int, batch: int, shards: int = 1,
                             quant: WeightQuant = NO_QUANT) -> int:
        """Bytes one decode step reads from memory, divided by the tokens it produces.

        This is the analytic floor that makes decoding memory-bound: every matrix is streamed
        once per step whatever the batch, while the KV cache and the embedding rows are read
        per sequence.  A tied embedding/lm_head matrix is counted once, as read by lm_head;
        the embedding lookup reads one row per sequence.  Dividing by ``batch`` makes the
        figure comparable with tokens/s: bandwidth / bytes_read_per_token = the ceiling.

        With ``shards`` (one tensor-parallel rank of that many): the rank's slice of every layer's
        matrices and KV cache, with the norms, embedding and lm_head whole (they are replicated).
        With ``quant``: the projections and lm_head at their stored size, scales included.
        """
        matrices = sum(quant.matrix_bytes(rows, cols, dtype_bytes) for rows, cols in self.layer_matrices(shards))
        streamed = (self.layers * (matrices + 2 * self.hidden * dtype_bytes) + self.hidden * dtype_bytes
                    + quant.matrix_bytes(self.vocab, self.hidden, dtype_bytes))
        per_sequence = (self.hidden + self.kv_cache_bytes(1, context_len, 1) // shards) * dtype_bytes
        return (streamed + batch * per_sequence) // batch

    def int4_group_size(self, shards: tuple[int, ...] = (1,)) -> int:
        """The int4 group size to use when none is given: DEFAULT_GROUP_SIZE where it divides every
        projection's input width (of each rank's slices, for each of ``shards``), else the largest
        size the kernel takes that does (DEFAULT_GROUP_SIZE when none does: quant_problem says why)."""
        inputs = {cols for n in shards for _, cols in self.layer_matrices(n)}
        fits = [size for size in INT4_GROUP_SIZES if all(k % size == 0 for k in inputs)]
        return DEFAULT_GROUP_SIZE if DEFAULT_GROUP_SIZE in fits or not fits else max(fits)

    def quant_problem(self, quant: WeightQuant, shards: int = 1) -> str | None:
        """Why ``quant`` cannot store this shape's projections (with ``shards``), or None if it can."""
        if quant.mode not in QUANT_MODES:
            return f"unknown quantization {quant.mode!r}; choose one of: {', '.join(QUANT_MODES)}"
        if quant.mode != "int4":
            return None
        g = quant.group_size
        if g not in INT4_GROUP_SIZES:
            return (f"--group-size {g} is not one torch's CPU int4 kernel takes; choose one of: "
                    f"{', '.join(map(str, INT4_GROUP_SIZES))}")
        rows = sorted({r for r, _ in self.layer_matrices(shards)} | {self.vocab})
        odd_rows = [n for n in rows if n % INT4_ROW_MULTIPLE]
        if odd_rows:
            rank = " per tensor-parallel rank" if shards > 1 else ""
            what = (f"lm_head has {odd_rows[0]} rows (the vocabulary)" if odd_rows[0] == self.vocab
                    else f"projections have {odd_rows[0]} output rows{rank}")
            return (f"--quant int4: {self.name}'s {what}, which torch's int4 packing cannot take (it needs a "
                    f"multiple of {INT4_ROW_MULTIPLE}); --quant int8 can")
        inputs = sorted({cols for _, cols in self.layer_matrices(shards)})
        bad = [k for k in inputs if k % g]
        if bad:
            fits = [size for size in INT4_GROUP_SIZES if all(k % size == 0 for k in inputs)]
            rank = " per tensor-parallel rank" if shards > 1 else ""
            advice = f"; choose {' or '.join(map(str, fits))}" if fits else ""
            return (f"--group-size {g} does not divide the input width {bad[0]} of {self.name}'s projections"
                    f"{rank} (each row is quantized in groups of that many inputs){advice}")
        return None


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
    weight_bytes: int  # bytes the weights occupy (tied matrices once), quantized ones at their stored size
    quant: WeightQuant = NO_QUANT  # the built-in model's projections, decode --quant
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
