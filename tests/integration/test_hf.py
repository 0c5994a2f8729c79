"""`decode --hf` on real transformers checkpoints of the families people run on CPUs.

Each checkpoint is a tiny random model written by ``save_pretrained`` at test time (a few hundred
kB; nothing shipped or downloaded). cpuprof decodes it in its child process; the test then
decodes the same prompt with transformers' own ``generate`` here and requires the same tokens.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

transformers = pytest.importorskip("transformers", reason="transformers is not installed (pip install transformers)")
torch = pytest.importorskip("torch")

from cpuprof.model import Profile  # noqa: E402

SMALL = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=256)
FAMILIES = {
    # family: (config class, model class, what differs from SMALL)
    "llama": ("LlamaConfig", "LlamaForCausalLM", dict(tie_word_embeddings=True)),
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(sliding_window=8)),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(tie_word_embeddings=True)),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(head_dim=32)),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", dict(head_dim=16, sliding_window=8)),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", dict(head_dim=16, sliding_window=8)),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", dict(pad_token_id=0)),
}
# (family, dtype, batch, sampling): every family once, both dtypes, batch 1 and 2, top-k once.
CASES = [
    ("llama", "bf16", 1, "greedy"),
    ("mistral", "fp32", 2, "greedy"),
    ("qwen2", "bf16", 2, "greedy"),
    ("qwen3", "fp32", 1, "greedy"),
    ("gemma2", "fp32", 1, "greedy"),
    ("gemma3", "bf16", 1, "greedy"),
    ("phi3", "fp32", 2, "greedy"),
    ("llama", "fp32", 2, "topk"),
]
PROMPT, NEW, WARMUP = 12, 10, 2  # past the sliding windows of 8


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hf")
    paths = {}
    for family, (config_name, model_name, extra) in FAMILIES.items():
        torch.manual_seed(0)
        config = getattr(transformers, config_name)(**SMALL, **extra)
        model = getattr(transformers, model_name)(config)
        model.save_pretrained(root / family)
        paths[family] = root / family
    return paths


def decode(path: Path, out: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "cpuprof", "decode", "--hf", str(path), "--threads", "1", "--prompt-len", str(PROMPT),
         "--new-tokens", str(NEW), "--warmup", str(WARMUP), "--out", str(out), *args],
        capture_output=True, text=True, timeout=600)


def reference_tokens(path: Path, dtype: str, prompt: list[list[int]], sampling: str, seed: int = 0) -> list[list[int]]:
    """What transformers' own generate() makes of the same prompt, on one thread like the child."""
    model = transformers.AutoModelForCausalLM.from_pretrained(
        path, dtype={"bf16": torch.bfloat16, "fp32": torch.float32}[dtype], local_files_only=True)
    ids = torch.tensor(prompt)
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch.manual_seed(seed)
        kwargs = {"do_sample": False} if sampling == "greedy" else {"do_sample": True, "top_k": 50, "top_p": 1.0,
                                                                       "temperature": 1.0}
        with torch.inference_mode():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW + 1,
                                 min_new_tokens=NEW + 1, pad_token_id=0, **kwargs)
    finally:
        torch.set_num_threads(previous)
    return out[:, PROMPT:].tolist()


@pytest.mark.parametrize("family, dtype, batch, sampling", CASES, ids=[f"{c[0]}-{c[1]}-b{c[2]}-{c[3]}" for c in CASES])
def test_hf_decode_matches_generate(checkpoints, tmp_path: Path, family, dtype, batch, sampling):
    result = decode(checkpoints[family], tmp_path, "--dtype", dtype, "--batch", str(batch), "--sampling", sampling,
                    "--format", "json")
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr and "\r" not in result.stderr
    profile = Profile.load(tmp_path)
    wl = profile.workload
    assert wl.model.model_type == family.rstrip("0123456789") or wl.model.model_type.startswith(family[:4])
    assert wl.model.architecture == FAMILIES[family][1] and wl.model.dtype == dtype
    assert len(wl.prompt_ids) == batch and all(len(p) == PROMPT for p in wl.prompt_ids)
    assert wl.output_ids == reference_tokens(checkpoints[family], dtype, wl.prompt_ids, sampling)
    # the same sections as the built-in model's report, keyed by the model's own module names
    report = json.loads(result.stdout)
    assert [s["id"] for s in report["sections"]][:8] == ["decode", "settings", "ceiling", "roofs", "profile",
                                                         "threads", "ops", "regions"]
    regions = {r["region"] for r in next(s for s in report["sections"] if s["id"] == "regions")["tables"][0]["rows"]}
    assert any(r.endswith("lm_head") for r in regions), regions
    assert any("layers.*" in r for r in regions), regions
    ops = next(s for s in report["sections"] if s["id"] == "ops")["tables"][0]["rows"]
    assert any("layers.*/" in row["region"] for row in ops)


def test_bytes_per_token_counted_from_the_loaded_weights(checkpoints, tmp_path: Path):
    """Tied embeddings once (read whole by lm_head), one embedding row per sequence, plus the KV
    cache: for the tied Llama of known shape, by hand."""
    result = decode(checkpoints["llama"], tmp_path, "--dtype", "fp32", "--no-profile")
    assert result.returncode == 0, result.stderr
    wl = Profile.load(tmp_path).workload
    model = transformers.AutoModelForCausalLM.from_pretrained(checkpoints["llama"], dtype=torch.float32)
    params = sum(p.numel() for p in model.parameters())  # parameters() yields the tied matrix once
    weights = params * 4 + 64 * 4  # every matrix once + one embedding row (hidden 64, fp32)
    contexts = range(PROMPT + WARMUP + 1, PROMPT + NEW + 1)
    kv = sum(2 * 2 * 2 * 16 * c * 4 for c in contexts) // len(contexts)  # K and V, 2 layers, 2 kv heads of 16
    assert wl.bytes_read_per_token == pytest.approx(weights + kv, rel=0.01)
    assert wl.model.weight_bytes == params * 4


@pytest.mark.parametrize("config, words", [
    ({"model_type": "t5", "architectures": ["T5ForConditionalGeneration"]},
     "model type 't5' (T5ForConditionalGeneration) is not a causal language model"),
    ({"model_type": "not-a-model", "architectures": ["Mystery"]}, "model type 'not-a-model' (Mystery) is not known"),
    ({"architectures": ["Mystery"]}, "config.json names no model_type"),
])
def test_unloadable_architectures_get_one_line(tmp_path: Path, config, words):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(json.dumps(config))
    result = decode(ckpt, tmp_path / "out")
    assert result.returncode == 2, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("cpuprof: error:")]
    assert len(errors) == 1 and words in errors[0], result.stderr
    assert "Traceback" not in result.stderr


def test_failure_before_profiling_says_so(checkpoints, tmp_path: Path):
    """A checkpoint whose weights are damaged fails while loading: the report must say that nothing
    was profiled because of it, not that profiling was switched off."""
    broken = tmp_path / "broken"
    broken.mkdir()
    for f in checkpoints["llama"].iterdir():
        (broken / f.name).write_bytes(f.read_bytes())
    (broken / "model.safetensors").write_bytes(b"not safetensors")
    result = decode(broken, tmp_path / "out")
    assert result.returncode != 0
    assert "nothing was profiled because of it" in result.stderr
    assert "--no-profile" not in result.stdout + result.stderr


@pytest.mark.parametrize("family, quant, extra, kernel, weight_bytes_per_row", [
    ("llama", "int8", [], "aten::_weight_int8pack_mm", lambda n_in: n_in + 2),  # int8 weights + a bf16 scale
    ("qwen3", "int4", ["--group-size", "32"], "aten::_weight_int4pack_mm_for_cpu",
     lambda n_in: n_in // 2 + n_in // 32 * 2 * 2),  # two weights a byte + a bf16 scale and zero per 32
], ids=["llama-int8", "qwen3-int4"])
def test_a_checkpoint_decodes_with_its_linear_layers_quantized(checkpoints, tmp_path: Path, family, quant, extra,
                                                                kernel, weight_bytes_per_row):
    """Every nn.Linear (projections and output head) runs through torch's weight-only kernel, once
    per layer per forward; the bytes a token reads count them at their stored size (the tied
    Llama's head becomes an int8 copy, its embedding stays bf16 and gives one row per sequence)."""
    result = decode(checkpoints[family], tmp_path, "--dtype", "bf16", "--quant", quant, *extra)
    assert result.returncode == 0, result.stderr
    profile = Profile.load(tmp_path)
    wl = profile.workload
    model = transformers.AutoModelForCausalLM.from_pretrained(checkpoints[family], dtype=torch.bfloat16)
    linears = [m for m in model.modules() if type(m) is torch.nn.Linear]
    forwards = NEW + 1  # generate() runs the prefill, then one forward per further token
    calls = sum(op.calls for op in profile.ops if op.kind == "op" and op.name == kernel)
    assert calls == len(linears) * forwards
    assert not any(op.name == "aten::linear" for op in profile.ops if op.kind == "op")
    matrices = sum(m.out_features * weight_bytes_per_row(m.in_features) for m in linears)
    linear_ids = {id(m.weight) for m in linears}
    embedding = model.get_input_embeddings().weight
    others = sum(p.numel() * 2 for p in model.parameters() if id(p) not in linear_ids and p is not embedding)
    contexts = range(PROMPT + WARMUP + 1, PROMPT + NEW + 1)
    kv_heads, head_dim = 2, FAMILIES[family][2].get("head_dim", 16)
    kv = sum(2 * 2 * kv_heads * head_dim * c * 2 for c in contexts) // len(contexts)
    assert wl.bytes_read_per_token == pytest.approx(matrices + others + 64 * 2 + kv, rel=0.01)
    assert wl.model.quant.mode == quant
    assert wl.model.params == sum(p.numel() for p in model.parameters())  # the checkpoint's, not the stored
    assert f"quantized the checkpoint's {len(linears)} nn.Linear layers to {quant}" in result.stderr


@pytest.mark.parametrize("config, args, words", [
    ({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}, ["--quant", "int8"],
     "is a gpt2 model, whose projections are transformers' Conv1D, not nn.Linear"),
    ({"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 128},
     ["--quant", "int4"], "--group-size 128 does not divide the checkpoint's hidden_size 64"),
], ids=["conv1d", "group"])
def test_quantizing_a_checkpoint_the_kernels_cannot_take_is_one_line_before_it_loads(tmp_path: Path, config, args,
                                                                                      words):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(json.dumps(config))
    result = decode(ckpt, tmp_path / "out", *args)
    assert result.returncode == 2, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("cpuprof: error:")]
    assert len(errors) == 1 and words in errors[0], result.stderr
    assert "loading" not in result.stderr and "Traceback" not in result.stderr
