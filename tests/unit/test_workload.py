"""The built-in decode workload: shapes arithmetic, the Llama model's correctness, the loop's timings.

Real torch, the ``tiny`` preset only, so the whole file runs in a few seconds.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from cpuprof.errors import CpuprofError, UsageError
from cpuprof.workload import (
    PRESETS,
    REGIONS,
    build_model,
    check_memory,
    checkpoints,
    estimate_memory_bytes,
    load_hf,
    resolve_config,
    run_decode,
)
from cpuprof.workload.llama import no_region

TINY = PRESETS["tiny"]


@pytest.fixture(scope="module")
def tiny_fp32():
    return build_model(TINY, torch.float32, seed=0)


# --- presets -------------------------------------------------------------------------------


def test_llama_3_2_1b_param_count_matches_published_size():
    assert PRESETS["llama-3.2-1b"].param_count() == pytest.approx(1.236e9, rel=0.01)


def test_llama_3_1_8b_param_count_matches_published_size():
    assert PRESETS["llama-3.1-8b"].param_count() == pytest.approx(8.03e9, rel=0.01)


def test_bytes_read_per_token_counts_tied_matrix_once():
    tied = PRESETS["llama-3.2-1b"]
    untied = dataclasses.replace(tied, tied_embeddings=False)
    # About 2.5 GB per token in bf16, as the spec measured.
    assert tied.bytes_read_per_token(2, 1, 1) == pytest.approx(2.47e9, rel=0.01)
    # An untied model stores one more matrix but reads the same: lm_head, plus embedding rows.
    assert untied.weight_bytes(2) - tied.weight_bytes(2) == tied.vocab * tied.hidden * 2
    assert untied.bytes_read_per_token(2, 100, 1) == tied.bytes_read_per_token(2, 100, 1)


def test_bytes_read_per_token_grows_with_context_and_amortises_over_batch():
    cfg = PRESETS["llama-3.2-1b"]
    kv_per_position = 2 * cfg.layers * cfg.kv_heads * cfg.head_dim * 2
    assert cfg.bytes_read_per_token(2, 1001, 1) - cfg.bytes_read_per_token(2, 1, 1) == 1000 * kv_per_position
    assert cfg.bytes_read_per_token(2, 16, 4) < cfg.bytes_read_per_token(2, 16, 1) / 3


def test_resolve_config_applies_overrides():
    cfg = resolve_config("llama-3.2-1b", {"layers": 2, "ffn": 1024})
    assert (cfg.layers, cfg.ffn, cfg.hidden) == (2, 1024, 2048)


@pytest.mark.parametrize(
    ("preset", "overrides", "fragment"),
    [
        ("llama-9", {}, "llama-3.2-1b, llama-3.1-8b, tiny"),
        ("tiny", {"heads": 5}, "not divisible by heads 5"),
        ("tiny", {"kv_heads": 3}, "not divisible by kv-heads 3"),
        ("tiny", {"rope": 1}, "overridable fields: layers, hidden"),
    ],
)
def test_resolve_config_rejects_bad_input_naming_choices(preset, overrides, fragment):
    with pytest.raises(UsageError, match=fragment):
        resolve_config(preset, overrides)


def test_an_override_out_of_range_is_the_options_to_refuse():
    """--layers 0 is refused by its option's type (test_options_spec); here it is a precondition."""
    with pytest.raises(AssertionError):
        resolve_config("tiny", {"layers": 0})


def test_check_memory_refuses_with_remedies():
    cfg = PRESETS["llama-3.1-8b"]
    with pytest.raises(UsageError) as excinfo:
        check_memory(cfg, 4, 1, 2048, available_bytes=int(9.8e9))
    message = str(excinfo.value)
    assert message.startswith("preset llama-3.1-8b needs about 3")
    assert "in fp32 but only 9.8 GB is available" in message
    assert "--dtype bf16" in message and "llama-3.2-1b preset" in message


def test_check_memory_passes_when_it_fits_and_reads_meminfo():
    needed = estimate_memory_bytes(TINY, 4, 1, 64)
    assert check_memory(TINY, 4, 1, 64, available_bytes=needed) == needed
    assert check_memory(TINY, 4, 1, 64) == needed  # MemAvailable from /proc/meminfo


def test_estimate_memory_is_dominated_by_weights_for_real_presets():
    cfg = PRESETS["llama-3.1-8b"]
    estimate = estimate_memory_bytes(cfg, 2, 1, 2048)
    assert cfg.weight_bytes(2) < estimate < 1.15 * cfg.weight_bytes(2)


# --- model ---------------------------------------------------------------------------------


def test_forward_shapes_and_dtypes():
    model = build_model(TINY, torch.bfloat16, seed=0)
    assert all(p.dtype == torch.bfloat16 for p in model.parameter_tensors())
    assert sum(p.numel() for p in model.parameter_tensors()) == TINY.param_count()
    logits = model(torch.randint(0, TINY.vocab, (3, 7)), 0)
    assert logits.shape == (3, TINY.vocab) and logits.dtype == torch.float32
    assert model(torch.randint(0, TINY.vocab, (3, 1)), 7).shape == (3, TINY.vocab)


def test_build_is_deterministic_per_seed_and_reports_progress():
    calls: list[tuple[int, int]] = []
    a = build_model(TINY, torch.float32, seed=1, progress=lambda done, total: calls.append((done, total)))
    b = build_model(TINY, torch.float32, seed=1)
    c = build_model(TINY, torch.float32, seed=2)
    assert calls == [(1, 2), (2, 2)]
    assert all(torch.equal(x, y) for x, y in zip(a.parameter_tensors(), b.parameter_tensors(), strict=True))
    assert not torch.equal(a.layers[0].mlp.up_proj, c.layers[0].mlp.up_proj)


def test_build_rejects_unsupported_dtype():
    with pytest.raises(UsageError, match="choose one of: bf16, fp32"):
        build_model(TINY, torch.float16)


def test_kv_cached_decode_matches_full_forward(tiny_fp32):
    """Each cached step must equal recomputing the whole sequence: checks cache writes and RoPE."""
    model = tiny_fp32
    ids = torch.randint(0, TINY.vocab, (2, 12), generator=torch.Generator().manual_seed(3))
    model.reset_cache(2, 12)
    cached = [model(ids[:, :5], 0)]
    cached += [model(ids[:, pos : pos + 1], pos) for pos in range(5, 12)]
    for end, logits in zip(range(5, 13), cached, strict=True):
        model.reset_cache(2, 12)
        torch.testing.assert_close(logits, model(ids[:, :end], 0), rtol=1e-4, atol=1e-4)
    # A multi-token chunk after cached positions needs the explicit causal mask.
    model.reset_cache(2, 12)
    model(ids[:, :5], 0)
    chunked = model(ids[:, 5:12], 5)
    torch.testing.assert_close(chunked, cached[-1], rtol=1e-4, atol=1e-4)


def test_regions_cover_the_named_blocks(tiny_fp32):
    seen: list[str] = []

    @contextlib.contextmanager
    def region(name: str) -> Iterator[None]:
        seen.append(name)
        yield

    model = tiny_fp32
    model.region = region
    try:
        model(torch.randint(0, TINY.vocab, (1, 3)), 0)
    finally:
        model.region = no_region
    assert set(seen) == set(REGIONS)
    assert seen.count("attention") == TINY.layers and seen.count("norm") == 2 * TINY.layers + 1


def test_forward_refuses_positions_past_the_cache(tiny_fp32):
    tiny_fp32.reset_cache(1, 4)
    with pytest.raises(ValueError, match="reset_cache"):
        tiny_fp32(torch.tensor([[1, 2]]), 3)


# --- decode loop ---------------------------------------------------------------------------


def test_greedy_decode_is_deterministic(tiny_fp32):
    a = run_decode(tiny_fp32, TINY, prompt_len=6, new_tokens=5, batch=2, seed=7)
    b = run_decode(tiny_fp32, TINY, prompt_len=6, new_tokens=5, batch=2, seed=7)
    assert a.generated_ids == b.generated_ids
    assert len(a.generated_ids) == 2 and len(a.generated_ids[0]) == 6


def test_topk_sampling_is_seeded(tiny_fp32):
    def sample(seed: int) -> list[list[int]]:
        kwargs = dict(prompt_len=4, new_tokens=12, sampling="topk", top_k=50, seed=seed)
        return run_decode(tiny_fp32, TINY, **kwargs).generated_ids

    assert sample(1) == sample(1)
    assert sample(1) != sample(2)


def test_throughput_agrees_with_latencies_and_wall_time(tiny_fp32):
    steps: list[tuple[int, float, int]] = []
    result = run_decode(
        tiny_fp32, TINY, prompt_len=8, new_tokens=40, batch=2, warmup=3,
        on_step=lambda i, latency, total: steps.append((i, latency, total)),
    )
    measured = result.step_latencies_s[3:]
    assert len(result.step_latencies_s) == 40 and result.warmup_steps == 3
    assert result.tokens_per_s == pytest.approx(2 * len(measured) / sum(measured), rel=1e-9)
    assert result.decode_wall_s == pytest.approx(sum(measured), rel=0.10)
    assert result.ttft_s > 0
    f = result.figures
    assert f.measured_steps == 37 and f.p50_ms <= f.p90_ms <= f.p99_ms <= max(measured) * 1e3
    assert [s[0] for s in steps] == list(range(40)) and {s[2] for s in steps} == {40}
    assert [s[1] for s in steps] == result.step_latencies_s
    # Averaged over the contexts of the measured steps, per token of the batch of 2.
    first, last = TINY.bytes_read_per_token(4, 8 + 4, 2), TINY.bytes_read_per_token(4, 8 + 40, 2)
    assert first < result.bytes_read_per_token < last


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(prompt_len=0, new_tokens=4),
        dict(prompt_len=4, new_tokens=2, warmup=2),
        dict(prompt_len=200, new_tokens=100),
        dict(prompt_len=4, new_tokens=4, batch=0),
        dict(prompt_len=4, new_tokens=4, sampling="beam"),
        dict(prompt_len=4, new_tokens=4, sampling="topk", top_k=0),
    ],
)
def test_run_decode_asserts_what_the_command_line_checks_at_the_door(tiny_fp32, kwargs):
    """The flags' checks are options_spec's and launch.parent.prepare's (test_options_spec); a library
    call that breaks them is a programming error, not a second message for the same mistake."""
    with pytest.raises(AssertionError):
        run_decode(tiny_fp32, TINY, **kwargs)


# --- Hugging Face checkpoints ----------------------------------------------------------------


def test_hf_missing_path_is_a_usage_error(tmp_path: Path):
    with pytest.raises(UsageError, match="not a readable directory with a config.json"):
        load_hf(tmp_path / "absent", torch.bfloat16)
    with pytest.raises(UsageError, match="not a readable directory with a config.json"):
        load_hf(tmp_path, torch.bfloat16)  # a directory, but no config.json


def test_hf_without_transformers_says_how_to_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    (tmp_path / "config.json").write_text('{"model_type": "llama"}')
    monkeypatch.setitem(sys.modules, "transformers", None)  # makes the import fail
    with pytest.raises(CpuprofError, match=r"pip install 'cpuprof\[hf\]'"):
        load_hf(tmp_path, torch.bfloat16)


def test_checkpoint_memory_estimate_scales_the_stored_weights(tmp_path: Path):
    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "llama", "torch_dtype": "float32", "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "hidden_size": 64}))
    (tmp_path / "model.safetensors").write_bytes(b"\0" * 4000)
    assert checkpoints.checkpoint_weight_bytes(tmp_path, "bf16") == 2000  # fp32 on disk, bf16 in memory
    kv = 2 * 2 * 2 * 16 * 100 * 3 * 2  # K and V, 2 layers, 2 kv heads of 16, 100 positions, batch 3, bf16
    assert checkpoints.estimate_memory_bytes(tmp_path, "bf16", batch=3, max_seq=100) == 2000 + kv + 600 * 1024 * 1024


def test_reset_cache_reuses_same_shape_tensors_zeroed():
    """A compiled model guards on the KV cache's identity: a same-shape reset must not replace it."""
    model = build_model(PRESETS["tiny"], torch.float32, seed=0)
    model.reset_cache(1, 16)
    attention = model.decoder_layers()[0].attention
    first = attention.k_cache
    assert first is not None
    first.fill_(1.0)
    model.reset_cache(1, 16)
    assert attention.k_cache is first and not first.any()
    model.reset_cache(1, 32)
    assert attention.k_cache is not first and attention.k_cache.shape[2] == 32


def test_no_grad_decode_gives_the_tokens_of_inference_mode():
    cfg = PRESETS["tiny"]
    model = build_model(cfg, torch.float32, seed=0)
    a = run_decode(model, cfg, prompt_len=4, new_tokens=6, warmup=1)
    b = run_decode(model, cfg, prompt_len=4, new_tokens=6, warmup=1, inference_mode=False, cache_len=11)
    assert a.generated_ids == b.generated_ids


def test_a_tensor_parallel_shard_reads_its_slice_and_the_replicated_rest_whole():
    from cpuprof.workload.presets import PRESETS

    tiny = PRESETS["tiny"]
    whole = tiny.bytes_read_per_token(2, 40, 1)
    half = tiny.bytes_read_per_token(2, 40, 1, shards=2)
    # two halves read the whole model plus, twice, what every rank holds whole: per layer its two
    # norms, the final norm, the tied embedding/lm_head matrix, and the embedding row it looks up
    replicated = tiny.layers * 2 * tiny.hidden + tiny.hidden + tiny.vocab * tiny.hidden + tiny.hidden
    assert 2 * half - whole == replicated * 2


def test_several_processes_must_fit_together():
    from cpuprof.workload.presets import PRESETS, check_memory, estimate_memory_bytes

    tiny = PRESETS["tiny"]
    one = estimate_memory_bytes(tiny, 2, 1, 64)
    assert check_memory(tiny, 2, 1, 64, available_bytes=one) == one
    expected = ("2 processes of preset tiny need about 0.8 GB in bf16 but only 0.4 GB is available; "
                "try .*fewer processes")
    with pytest.raises(UsageError, match=expected):
        check_memory(tiny, 2, 1, 64, available_bytes=one, processes=2)
    # two shards of a model need less than two copies of it
    assert estimate_memory_bytes(tiny, 2, 1, 64, shards=2) < one
