"""vLLM's CPU backend, unchanged, under ``cpuprof run``: offline ``LLM.generate`` in vLLM's default
(multi-process) mode. The engine core and the worker it spawns are followed; the worker, which runs
the model, has the most op time and its report has vLLM's own GEMMs (``_C::onednn_mm``,
``_C::weight_packed_linear``) with N and K equal to the checkpoint's projection sizes and 2·M·N·K
FLOPs per call: the known answers, from the config the test writes.

One engine start is about 25 s here (more under cpuprof), so there is one test. Skipped where vLLM is
not installed (README command 2 installs it)."""

from __future__ import annotations

import importlib.util
import os
import textwrap
from pathlib import Path

import pytest
from tests.cli_runs import cpuprof

from cpuprof.analysis.gemm import gemm_work
from cpuprof.analysis.processes import busiest, load_processes

pytestmark = pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                reason="vLLM's CPU backend is not installed here (README command 2 installs it)")

HIDDEN, HEADS, KV_HEADS, FFN, VOCAB, LAYERS = 512, 8, 4, 1536, 4096, 4
HEAD_DIM = HIDDEN // HEADS
PROMPTS, NEW_TOKENS = 4, 16

GENERATE = f"""
import sys

from vllm import LLM, SamplingParams


def main():
    llm = LLM(model=sys.argv[1], dtype="bfloat16", max_model_len=256, enforce_eager=True)
    prompts = [" ".join(f"w{{(i * 7 + j) % 4000 + 3}}" for j in range(16)) for i in range({PROMPTS})]
    outputs = llm.generate(prompts, SamplingParams(max_tokens={NEW_TOKENS}, ignore_eos=True, temperature=0))
    print("generated", sum(len(o.outputs[0].token_ids) for o in outputs))


if __name__ == "__main__":
    main()
"""


def write_checkpoint(directory: Path) -> None:
    """A random 4-layer Llama in bf16 and a word-level tokenizer: offline, a few MB."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    vocab = {f"w{i}": i for i in range(VOCAB)} | {"<unk>": 0, "<s>": 1, "</s>": 2}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="<unk>", bos_token="<s>",
                            eos_token="</s>").save_pretrained(directory)
    config = LlamaConfig(hidden_size=HIDDEN, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
                         intermediate_size=FFN, num_hidden_layers=LAYERS, vocab_size=VOCAB,
                         max_position_embeddings=1024, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(directory)


def test_offline_generate_is_profiled_in_the_worker_with_vllms_gemms(tmp_path: Path):
    model = tmp_path / "model"
    write_checkpoint(model)
    program = tmp_path / "generate.py"
    program.write_text(textwrap.dedent(GENERATE))
    out = tmp_path / "out"
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1"}
    result = cpuprof("run", "--threads", "2", "--out", str(out), "--", "python", str(program), str(model),
                     timeout=900, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"generated {PROMPTS * NEW_TOKENS}" in result.stdout

    processes = load_processes(out)
    roles = {p.profile.meta.role for p in processes if p.followed}
    assert "EngineCore" in roles and any(r and r.startswith("VllmWorker") for r in roles), roles
    worker = busiest(processes)
    assert worker is not None and worker.profile.meta.role.startswith("VllmWorker")

    # The projections by their (N, K), from the config: gate and up fused, down, lm_head; q, k and v fused, o.
    expected = {(2 * FFN, HIDDEN), (HIDDEN, FFN), (VOCAB, HIDDEN), (HIDDEN + 2 * KV_HEADS * HEAD_DIM, HIDDEN),
                (HIDDEN, HIDDEN)}
    seen = set()
    for op in worker.profile.ops:
        if op.kind != "op" or op.name not in ("_C::onednn_mm", "_C::weight_packed_linear"):
            continue
        work = gemm_work(op)
        assert work is not None, op
        assert (work.n, work.k) in expected, (op.name, work)
        assert work.flops == 2 * work.m * work.n * work.k
        seen.add((work.n, work.k))
    assert any(n == 2 * FFN for n, _ in seen) and (HIDDEN, FFN) in seen, seen
    assert "GEMMs against the roofs" in result.stdout and "_C::onednn_mm" in result.stdout
