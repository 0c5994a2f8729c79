"""The small random Llama checkpoint vLLM's tests and bench load: offline, a few MB. Apart from the
tests so that a bench imports it without pytest (README command 1's environment has none)."""

from __future__ import annotations

from pathlib import Path

HIDDEN, HEADS, KV_HEADS, FFN, VOCAB, LAYERS = 512, 8, 4, 1536, 4096, 4
HEAD_DIM = HIDDEN // HEADS


def write_checkpoint(directory: Path) -> None:
    """A random 4-layer Llama in bf16 and a word-level tokenizer."""
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
