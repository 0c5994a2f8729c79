"""The built-in decoder against transformers' LlamaForCausalLM at the same shapes, dtype and threads.

The built-in model stands in for real checkpoints in every report, so its decode must run what
theirs runs (nn.Linear-shaped [out, in] weights through F.linear, RMSNorm in fp32, SDPA with GQA)
at the same speed. Both decode greedily from the same prompt length, in one process, interleaved
in an order rotated every round; the figure is the per-round ratio of tokens/s (median and
min-max over rounds).

Target (issue 9): the built-in decoder's tokens/s within 10% of transformers'.

    python benches/bench_builtin_vs_transformers.py                 # Llama-3.2-1B layers x 4, 12 rounds
    python benches/bench_builtin_vs_transformers.py --dtype f32 --rounds 10
"""

from __future__ import annotations

import argparse
import gc
import sys
import time

from _common import machine_line, median, render_table, rotated, span

VARIANTS = ("transformers", "built-in")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--warmup-rounds", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dtype", default="bf16", choices=("bf16", "f32"))
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=24)
    ap.add_argument("--warmup", type=int, default=2, help="decode steps left out of tokens/s")
    args = ap.parse_args(argv)
    if args.rounds < 10:
        print("note: fewer than 10 rounds; the spread will not mean much", file=sys.stderr)

    import torch
    import transformers

    from cpuprof.workload import build_model, run_decode
    from cpuprof.workload.dtypes import torch_dtype
    from cpuprof.workload.hf import HFModel, run_hf_decode
    from cpuprof.workload.presets import resolve_config

    torch.set_num_threads(args.threads)
    dtype = torch_dtype(args.dtype)
    cfg = resolve_config("llama-3.2-1b", {"layers": args.layers})
    hf_config = transformers.LlamaConfig(
        hidden_size=cfg.hidden, intermediate_size=cfg.ffn, num_hidden_layers=cfg.layers,
        num_attention_heads=cfg.heads, num_key_value_heads=cfg.kv_heads, vocab_size=cfg.vocab,
        max_position_embeddings=cfg.max_seq, rms_norm_eps=cfg.norm_eps, rope_theta=cfg.rope_theta,
        tie_word_embeddings=cfg.tied_embeddings, head_dim=cfg.head_dim)
    torch.manual_seed(0)
    hf = HFModel(model=transformers.LlamaForCausalLM(hf_config).to(dtype).eval(), name="llama (random)",
                 model_type="llama", dtype=dtype)
    builtin = build_model(cfg, dtype)
    print(machine_line())
    print(f"Llama-3.2-1B shapes, {cfg.layers} layers (hidden {cfg.hidden}, ffn {cfg.ffn}, {cfg.heads} heads, "
          f"{cfg.kv_heads} kv heads, vocab {cfg.vocab}), {args.dtype}, {args.threads} threads; prompt "
          f"{args.prompt_len}, {args.new_tokens} new tokens ({args.warmup} warm-up), greedy; transformers "
          f"{transformers.__version__}")

    def one(name: str) -> float:
        gc.collect()
        if name == "transformers":
            out = run_hf_decode(hf, prompt_len=args.prompt_len, new_tokens=args.new_tokens, warmup=args.warmup)
        else:
            out = run_decode(builtin, cfg, prompt_len=args.prompt_len, new_tokens=args.new_tokens,
                             warmup=args.warmup)
        return out.figures.tokens_per_s

    tps: dict[str, list[float]] = {n: [] for n in VARIANTS}
    ratios: list[float] = []
    total = args.warmup_rounds + args.rounds
    started = time.monotonic()
    for r in range(total):
        got = {n: one(n) for n in rotated(VARIANTS, r)}
        if r >= args.warmup_rounds:
            for n in VARIANTS:
                tps[n].append(got[n])
            ratios.append(got["built-in"] / got["transformers"])
        print(f"  round {r + 1}/{total}{'' if r >= args.warmup_rounds else ' (warm-up)'}: "
              + "  ".join(f"{n} {got[n]:.2f}" for n in VARIANTS) + f" tokens/s [{time.monotonic() - started:.0f} s]",
              file=sys.stderr, flush=True)
    print()
    print(render_table(["decoder", "tokens/s", "min–max"],
                       [[n, f"{median(tps[n]):.2f}", span(tps[n])] for n in VARIANTS]))
    ratio = median(ratios)
    print(f"built-in / transformers tokens/s: median {ratio:.3f} over {len(ratios)} rounds "
          f"(min–max {span(ratios, '{:.3f}')})")
    print(f"target: within 10% of transformers: {100 * (ratio - 1):+.1f}% -> "
          f"{'met' if abs(ratio - 1) <= 0.10 else 'MISSED'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
