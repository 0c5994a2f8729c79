"""Weight-only quantization of the built-in model (decode --quant): what the quantized model
computes, what it holds, and the bytes a token reads, each against an independent count."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from cpuprof.errors import UsageError
from cpuprof.model.workload import WeightQuant
from cpuprof.workload.decode_loop import measured_bytes_per_token
from cpuprof.workload.llama import build_model, quantize_model
from cpuprof.workload.presets import PRESETS, estimate_memory_bytes

TINY = PRESETS["tiny"]
INT8, INT4 = WeightQuant("int8"), WeightQuant("int4", 32)
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _logits(quant: WeightQuant, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    model = build_model(TINY, dtype, seed=3)
    quantize_model(model, quant)
    model.reset_cache(1, 16)
    prompt = torch.randint(0, TINY.vocab, (1, 12), generator=torch.Generator().manual_seed(5))
    with torch.inference_mode():
        return model(prompt, 0)


@pytest.mark.parametrize("quant, min_cosine, max_error", [(INT8, 0.999, 0.02), (INT4, 0.98, 0.15)],
                         ids=["int8", "int4-g32"])
def test_quantized_logits_stay_close_to_those_of_the_model_they_came_from(quant: WeightQuant, min_cosine: float,
                                                                          max_error: float):
    """The same random model (same seed) before and after: int8 (127 steps per row) keeps the
    logits within 2% of their largest magnitude, int4 (15 steps per group of 32) within 15%."""
    reference, logits = _logits(WeightQuant()), _logits(quant)
    assert F.cosine_similarity(logits.flatten(), reference.flatten(), dim=0) >= min_cosine
    assert (logits - reference).abs().max() <= max_error * reference.abs().max()
    assert not torch.equal(logits, reference)  # the kernels did run on other weights


def test_every_projection_and_the_lm_head_run_through_the_quantized_kernels():
    model = build_model(TINY, torch.bfloat16, seed=0)
    quantize_model(model, INT8)
    model.reset_cache(1, 8)
    ops: list[str] = []
    with torch.profiler.profile() as prof, torch.inference_mode():
        model(torch.zeros(1, 1, dtype=torch.long), 0)
    ops = [e.name for e in prof.events()]
    assert ops.count("aten::_weight_int8pack_mm") == TINY.layers * len(PROJECTIONS) + 1
    assert "aten::linear" not in ops
    assert model.embed.dtype == torch.bfloat16  # looked up, one row a token: left as it was


@pytest.mark.parametrize("quant", [WeightQuant(), INT8, INT4], ids=["none", "int8", "int4-g32"])
def test_weight_bytes_are_what_the_model_holds(quant: WeightQuant):
    model = build_model(TINY, torch.bfloat16, seed=0)
    quantize_model(model, quant)
    held = sum(p.nbytes for p in model.parameters())  # tied weights once: parameters() dedupes
    assert TINY.weight_bytes(2, quant) == held


@pytest.mark.parametrize("quant", [WeightQuant(), INT8, INT4], ids=["none", "int8", "int4-g32"])
def test_bytes_per_token_are_the_stored_bytes_a_step_reads(quant: WeightQuant):
    """Counted from the built model's own tensors: every layer's projections (weights and scales)
    and norms, the final norm and the lm_head once per step; an embedding row and the KV cache
    so far per sequence."""
    model = build_model(TINY, torch.bfloat16, seed=0)
    quantize_model(model, quant)
    per_step = sum(p.nbytes for layer in model.decoder_layers() for p in layer.parameters())
    per_step += model.final_norm.weight.nbytes
    lm_head = model.lm_head
    per_step += lm_head.nbytes if isinstance(lm_head, torch.Tensor) else sum(p.nbytes for p in lm_head.parameters())
    prompt, warmup, steps = 8, 2, 6
    contexts = range(prompt + warmup + 1, prompt + steps + 1)
    kv_per_position = 2 * TINY.layers * TINY.kv_dim * 2
    expected = sum(per_step + TINY.hidden * 2 + c * kv_per_position for c in contexts) // len(contexts)
    assert measured_bytes_per_token(model, TINY, prompt, warmup, steps, batch=1) == expected


def test_one_billion_parameters_in_int8_and_int4_read_about_a_half_and_a_quarter_of_bf16():
    """llama-3.2-1b's matrices: 1.24 G weights of 2 bytes; int8 adds a 2-byte scale per row,
    int4 at group 128 a 4-byte scale and zero per 128 weights (1/32 of a byte each)."""
    cfg = PRESETS["llama-3.2-1b"]
    bf16 = cfg.bytes_read_per_token(2, 1, 1)
    int8 = cfg.bytes_read_per_token(2, 1, 1, quant=INT8)
    int4 = cfg.bytes_read_per_token(2, 1, 1, quant=WeightQuant("int4", 128))
    assert int8 / bf16 == pytest.approx(0.5, abs=0.005)
    assert int4 / bf16 == pytest.approx(0.25 + 1 / 64, abs=0.005)
    # Built in bf16, then quantized a matrix at a time: the peak is the bf16 model and the quantized lm_head.
    assert (estimate_memory_bytes(cfg, 2, 1, 64, quant=INT8) - estimate_memory_bytes(cfg, 2, 1, 64)
            == cfg.vocab * cfg.hidden + cfg.vocab * 2)


@pytest.mark.parametrize("overrides, words", [
    ({"vocab": 1000}, "--quant int4: tiny's lm_head has 1000 rows (the vocabulary), which torch's int4 packing "
                      "cannot take (it needs a multiple of 16); --quant int8 can"),
    ({"heads": 8, "kv_heads": 1}, "tiny's projections have 8 output rows"),  # k and v: one head of 8
])
def test_int4_refuses_matrices_whose_rows_its_packing_cannot_take(overrides: dict[str, int], words: str):
    import dataclasses

    cfg = dataclasses.replace(TINY, **overrides)
    problem = cfg.quant_problem(INT4)
    assert problem is not None and words in problem
    assert cfg.quant_problem(INT8) is None
    with pytest.raises(RuntimeError, match="dividable by 16"):  # what torch itself would have said, mid-build
        torch._convert_weight_to_int4pack_for_cpu(torch.zeros(overrides.get("vocab", 8), 64, dtype=torch.int32), 2)


@pytest.mark.parametrize("quant, shards, words", [
    (WeightQuant("int3"), 1, "unknown quantization 'int3'; choose one of: none, int8, int4"),
    (WeightQuant("int4", 100), 1, "--group-size 100 is not one torch's CPU int4 kernel takes"),
    (WeightQuant("int4", 128), 1, "does not divide the input width 64 of tiny's projections (each row is quantized "
                                  "in groups of that many inputs); choose 32 or 64"),
    (WeightQuant("int4", 64), 2, "does not divide the input width 32 of tiny's projections per tensor-parallel rank"),
])
def test_shapes_the_kernels_cannot_take_are_refused_with_what_would_fit(quant: WeightQuant, shards: int, words: str):
    problem = TINY.quant_problem(quant, shards)
    assert problem is not None and words in problem
    model = build_model(TINY, torch.bfloat16, seed=0)
    if shards == 1:
        with pytest.raises(UsageError, match="group-size|quantization"):
            quantize_model(model, quant)
    assert TINY.quant_problem(INT8, 2) is None and TINY.quant_problem(WeightQuant("int4", 32), 2) is None


@pytest.mark.parametrize("preset, shards, expected", [("llama-3.2-1b", (1,), 128), ("tiny", (1,), 64),
                                                     ("tiny", (2,), 32), ("tiny", (1, 2), 32)])
def test_the_default_int4_group_is_the_largest_that_divides_every_width(preset: str, shards: tuple[int, ...],
                                                                        expected: int):
    from cpuprof.workload.presets import PRESETS

    cfg = PRESETS[preset]
    assert cfg.int4_group_size(shards) == expected
    for n in shards:
        assert cfg.quant_problem(WeightQuant("int4", expected), n) is None
