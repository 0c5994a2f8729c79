"""The small random Llama checkpoint vLLM's tests and bench load: offline, a few MB. Apart from the
tests so that a bench imports it without pytest (README command 1's environment has none)."""

from __future__ import annotations

from pathlib import Path

HIDDEN, HEADS, KV_HEADS, FFN, VOCAB, LAYERS = 512, 8, 4, 1536, 4096, 4
HEAD_DIM = HIDDEN // HEADS
# Llama-3.2-1B's layer shapes (hidden, heads, KV heads, FFN): ops long enough that a profiler's
# per-op cost shows only beyond torch's own floor.
LLAMA_1B_SHAPES = (2048, 32, 8, 8192)


def write_checkpoint(directory: Path, shapes: tuple[int, int, int, int] = (HIDDEN, HEADS, KV_HEADS, FFN)) -> None:
    """A random 4-layer Llama in bf16 of ``shapes`` (hidden, heads, KV heads, FFN) and a word-level
    tokenizer."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    vocab = {f"w{i}": i for i in range(VOCAB)} | {"<unk>": 0, "<s>": 1, "</s>": 2}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="<unk>", bos_token="<s>",
                            eos_token="</s>").save_pretrained(directory)
    hidden, heads, kv_heads, ffn = shapes
    config = LlamaConfig(hidden_size=hidden, num_attention_heads=heads, num_key_value_heads=kv_heads,
                         intermediate_size=ffn, num_hidden_layers=LAYERS, vocab_size=VOCAB,
                         max_position_embeddings=1024, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(directory)
