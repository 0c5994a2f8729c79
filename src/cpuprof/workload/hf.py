"""Decode a local Hugging Face checkpoint with transformers' own ``generate``.

The model is whatever ``AutoModelForCausalLM`` builds for the checkpoint (Llama, Mistral, Qwen2/3,
Gemma 2/3, Phi-3, ...), and decoding is ``generate`` itself, greedy or top-k, with the model's own
KV cache: what a user serving the model runs, not a re-implementation of it. Each step is timed
through a streamer, which ``generate`` hands every new token to as soon as it is chosen, so a
step's latency is forward, logits processing and token selection, as in real serving.

transformers is an optional extra that must never pull in another torch, and loading is strictly
local (``local_files_only``): a profiler run does not download gigabytes behind the user's back.
"""

from __future__ import annotations

import contextlib
import os
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ..errors import CpuprofError, UsageError
from ..model.workload import NO_QUANT, PREFILL_REGION, WeightQuant
from .checkpoints import read_config
from .decode_loop import SAMPLING_MODES, DecodeResult
from .dtypes import dtype_name_of
from .figures import step_figures
from .llama import RegionFactory, no_region


def check_architecture(path: str | os.PathLike[str]) -> str:
    """The checkpoint's model type, once transformers is known to build a causal LM for it."""
    config = read_config(path)
    model_type = config.get("model_type")
    try:
        import transformers
    except ImportError as exc:
        raise UsageError("--hf needs transformers, which is not installed: pip install 'cpuprof[hf]'") from exc
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    architectures = ", ".join(config.get("architectures") or []) or "no architecture named"
    if not model_type:
        raise UsageError(f"--hf {path}: config.json has no model_type ({architectures}); transformers cannot load it")
    if model_type not in CONFIG_MAPPING:
        raise UsageError(f"--hf {path}: model type {model_type!r} ({architectures}) is not known to transformers "
                         f"{transformers.__version__}")
    if model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise UsageError(f"--hf {path}: model type {model_type!r} ({architectures}) is not a causal language model "
                         "(transformers has no AutoModelForCausalLM class for it), so it cannot be decoded")
    return str(model_type)


@dataclass
class HFModel:
    """A loaded transformers causal LM and what the profiler reads from it."""

    model: Any
    name: str
    model_type: str
    dtype: torch.dtype
    quant: WeightQuant = NO_QUANT  # decode --quant: its nn.Linear projections and output head, stored so

    @property
    def architecture(self) -> str:
        return type(self.model).__name__

    @property
    def vocab_size(self) -> int:
        return int(self.model.get_output_embeddings().weight.shape[0])

    def parameter_tensors(self) -> list[Tensor]:
        return [p.detach() for p in self.model.parameters()]

    def unique_storages(self) -> dict[int, int]:
        """data pointer -> bytes of every weight storage, tied weights counted once. Buffers
        (rotary tables and the like) are derived state, not weights."""
        storages: dict[int, int] = {}
        for tensor in self.model.parameters():
            storage = tensor.untyped_storage()
            storages[storage.data_ptr()] = max(storages.get(storage.data_ptr(), 0), storage.nbytes())
        return storages

    def param_count(self) -> int:
        seen: set[int] = set()
        total = 0
        for p in self.model.parameters():
            if p.data_ptr() not in seen:
                seen.add(p.data_ptr())
                total += p.numel()
        return total

    def weight_bytes(self) -> int:
        return sum(self.unique_storages().values())

    def streamed_bytes_per_step(self, batch: int) -> int:
        """Weights one decode step reads: every matrix once, except that the input embedding
        table gives only one row per sequence; a tied table is read whole by the output head."""
        storages = self.unique_storages()
        embedding = self.model.get_input_embeddings().weight
        head = self.model.get_output_embeddings().weight
        embed_ptr = embedding.untyped_storage().data_ptr()
        tied = head.untyped_storage().data_ptr() == embed_ptr
        streamed = sum(nbytes for ptr, nbytes in storages.items() if ptr != embed_ptr or tied)
        row = embedding.shape[1] * embedding.element_size()
        return streamed + batch * row



def quantize_hf(hf: HFModel, quant: WeightQuant) -> int:
    """The checkpoint's nn.Linear projections and output head stored as ``quant`` says (a tied output
    head becomes a quantized copy; the input embedding stays); how many were converted."""
    from .quantize import quantize_linears

    converted = quantize_linears(hf.model, quant)
    hf.quant = quant
    return converted


@contextlib.contextmanager
def transformers_deprecations_quiet() -> Iterator[None]:
    """transformers' own deprecation warnings (of arguments cpuprof passes, of its internals) are not
    the user's to act on, and would land among the progress lines; its other warnings still show."""
    with warnings.catch_warnings():
        for category in (FutureWarning, DeprecationWarning, PendingDeprecationWarning):
            warnings.filterwarnings("ignore", category=category, module=r"transformers(\.|$)")
        yield


def load_hf(path: str | os.PathLike[str], dtype: torch.dtype) -> HFModel:
    """Loads the checkpoint directory ``path`` in ``dtype`` through transformers, offline."""
    model_type = check_architecture(path)
    import transformers

    # A log is not a terminal: no progress bar redrawn with carriage returns into it.
    transformers.utils.logging.disable_progress_bar()
    try:
        # transformers picks the attention: SDPA where the architecture supports it, else eager
        # (Gemma 2's soft-capping, for one), as it would for the user.
        with transformers_deprecations_quiet():
            model = transformers.AutoModelForCausalLM.from_pretrained(Path(path), dtype=dtype, local_files_only=True)
    except (OSError, ValueError, KeyError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CpuprofError(f"--hf {path}: transformers cannot load the checkpoint: {first}") from exc
    model.eval()
    return HFModel(model=model, name=Path(path).resolve().name, model_type=model_type, dtype=dtype)


class _StepClock:
    """A generate() streamer that times each token: the first put is the prompt, the next ones
    the tokens, one per step, as soon as they are chosen."""

    def __init__(self, on_token: Callable[[int, float], None], phase: RegionFactory | None = None) -> None:
        self.on_token = on_token
        # The prefill runs between the prompt's put and the first token's: its region opens and
        # closes there, on the thread that runs generate().
        self._prefill = (phase or no_region)(PREFILL_REGION)
        self.marks: list[int] = []  # when prefill started, then when each token came
        self.latencies_ns: list[int] = []
        self.callback_ns = 0
        self._last = 0

    def put(self, value: Tensor) -> None:
        now = time.perf_counter_ns()
        if not self.marks:
            self.marks.append(now)
            self._last = now
            self._prefill.__enter__()
            return
        if len(self.marks) == 1:
            self._prefill.__exit__(None, None, None)
        self.latencies_ns.append(now - self._last)
        self.marks.append(now)
        self.on_token(len(self.latencies_ns) - 1, self.latencies_ns[-1] / 1e9)
        done = time.perf_counter_ns()
        self.callback_ns += done - now
        self._last = done  # the callback's time is not the next step's

    def end(self) -> None:
        pass


def kv_bytes_per_step(cache: Any, context: int) -> int:
    """Bytes of keys and values one step reads at ``context`` positions, from the cache's own
    tensors: per layer, its bytes per position times the positions it keeps (a sliding-window
    layer keeps at most its window)."""
    total = 0
    for layer in getattr(cache, "layers", []):
        keys, values = getattr(layer, "keys", None), getattr(layer, "values", None)
        if keys is None or values is None or keys.dim() < 2 or keys.shape[-2] == 0:
            continue
        per_position = (keys.nbytes + values.nbytes) / keys.shape[-2]
        window = getattr(layer, "sliding_window", None)
        kept = min(context, window) if window else context
        total += int(per_position * kept)
    return total


def run_hf_decode(
    hf: HFModel,
    *,
    prompt_len: int,
    new_tokens: int,
    batch: int = 1,
    warmup: int = 2,
    sampling: str = "greedy",
    top_k: int = 50,
    seed: int = 0,
    on_step: Callable[[int, float, int], None] | None = None,
    phase: RegionFactory | None = None,
) -> DecodeResult:
    """Prefills a seeded random prompt and generates ``new_tokens`` more tokens with generate().

    As with the built-in model, the first token comes from the prefill (time to first token) and
    each of the ``new_tokens`` decode steps is timed; end-of-sequence never stops a run early, so
    every run does the same work.
    """
    # Checked at the door (options_spec, launch.parent.prepare): a library call's preconditions here.
    assert sampling in SAMPLING_MODES and 0 <= warmup < new_tokens, (sampling, warmup, new_tokens)
    generator = torch.Generator().manual_seed(seed)
    prompt = torch.randint(0, hf.vocab_size, (batch, prompt_len), generator=generator)
    total = new_tokens + 1  # the prefill's token, then one per decode step

    def on_token(index: int, latency_s: float) -> None:
        # index 0 is the prefill's token: time to first token, not a decode step
        if index > 0 and on_step is not None:
            on_step(index - 1, latency_s, new_tokens)

    clock = _StepClock(on_token, phase)
    sampling_args: dict[str, Any] = (
        {"do_sample": False} if sampling == "greedy" else {"do_sample": True, "top_k": top_k, "top_p": 1.0,
                                                            "temperature": 1.0}
    )
    torch.manual_seed(seed)  # generate() samples from torch's global generator
    with torch.inference_mode(), transformers_deprecations_quiet():
        out = hf.model.generate(
            prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=total, min_new_tokens=total,
            streamer=clock, return_dict_in_generate=True, pad_token_id=0, **sampling_args,
        )
    latencies_ns = clock.latencies_ns
    ttft_s = latencies_ns[0] / 1e9
    steps_s = [ns / 1e9 for ns in latencies_ns[1:]]
    figures = step_figures(steps_s, warmup, batch)
    assert figures is not None
    # Each step is timed from the end of the previous token's callback: the measured steps' wall
    # time without the progress callbacks in between is the sum of their latencies.
    contexts = range(prompt_len + warmup + 1, prompt_len + new_tokens + 1)
    weights = hf.streamed_bytes_per_step(batch)
    step_bytes = [weights + kv_bytes_per_step(out.past_key_values, c) for c in contexts]
    return DecodeResult(
        batch=batch, prompt_len=prompt_len, ttft_s=ttft_s, step_latencies_s=steps_s, warmup_steps=warmup,
        figures=figures, decode_wall_s=sum(steps_s[warmup:]),
        generated_ids=out.sequences[:, prompt_len:].tolist(), prompt_ids=prompt.tolist(),
        bytes_read_per_token=sum(step_bytes) // len(step_bytes) // batch,
        kv_cache=[(c, kv_bytes_per_step(out.past_key_values, c)) for c in (prompt_len, prompt_len + new_tokens)],
        bytes_read_method=(f"from the loaded weights ({dtype_name_of(hf.dtype)}"
                           + (f"; projections and output head {hf.quant.describe()}, at their stored size"
                              if hf.quant.quantized else "")
                           + "; every matrix once per step, tied embeddings once, one embedding row per sequence) "
                           "and the KV cache's own tensors at the measured steps' mean context; divided by the "
                           "batch"),
    )
