"""The built-in decoder's tokens/s with bf16, int8 and int4 weights, side by side in one process.

The three models are built from the same seed (decode --quant's models: the int8 and int4 ones are
the bf16 one quantized), then each round decodes with every model once, in an order rotated every
round; no profiler runs. The figures are tokens/s per model (median, min-max over rounds) and each
quantized model's per-round ratio to bf16, beside the ratio of the bytes a token reads (what a
memory-bound decode would gain): where the measured ratio falls short of it, something other than
memory binds (the int4 kernel's dequantization on CPUs without fast int4 paths).

    python benches/bench_quant_decode.py                         # llama-3.2-1b, 2 threads, 10 rounds
    python benches/bench_quant_decode.py --layers 4 --rounds 20 --new-tokens 16
"""

from __future__ import annotations

import argparse
import dataclasses

from _common import machine_line, median, render_table, rotated, span


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="llama-3.2-1b")
    parser.add_argument("--layers", type=int, default=None, help="override the preset's layers")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=10,
                        help="rotated rounds, at least 10 (single rounds on shared machines move by 20%%; default 10)")
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=24)
    parser.add_argument("--warmup", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=128)
    args = parser.parse_args()
    if args.rounds < 10:
        raise SystemExit("--rounds: at least 10 (single rounds on shared machines move by 20%)")

    import torch

    from cpuprof.model.workload import WeightQuant
    from cpuprof.workload import run_decode
    from cpuprof.workload.llama import build_model, quantize_model
    from cpuprof.workload.presets import PRESETS

    torch.set_num_threads(args.threads)
    cfg = PRESETS[args.preset]
    if args.layers is not None:
        cfg = dataclasses.replace(cfg, layers=args.layers)
    quants = {"bf16": WeightQuant(), "int8": WeightQuant("int8"), "int4": WeightQuant("int4", args.group_size)}
    models = {}
    for name, quant in quants.items():
        model = build_model(cfg, torch.bfloat16, seed=0)
        quantize_model(model, quant)
        models[name] = model
    tps: dict[str, list[float]] = {name: [] for name in models}
    ratio: dict[str, list[float]] = {name: [] for name in models}
    print(machine_line())
    print(f"{cfg.name} ({cfg.layers} layers), {args.threads} threads, prompt {args.prompt_len}, "
          f"{args.new_tokens} new tokens ({args.warmup} warm-up), {args.rounds} rounds rotated")
    for k in range(args.rounds):
        this_round = {}
        for name in rotated(list(models), k):
            result = run_decode(models[name], cfg, prompt_len=args.prompt_len, new_tokens=args.new_tokens,
                                warmup=args.warmup, seed=k)
            this_round[name] = result.tokens_per_s
            tps[name].append(result.tokens_per_s)
        for name in models:
            ratio[name].append(this_round[name] / this_round["bf16"])
        print(f"round {k + 1}: " + ", ".join(f"{name} {this_round[name]:.2f}" for name in models), flush=True)
    context = args.prompt_len + args.new_tokens // 2
    bf16_bytes = cfg.bytes_read_per_token(2, context, 1)
    rows = []
    for name, quant in quants.items():
        bytes_per_token = cfg.bytes_read_per_token(2, context, 1, quant=quant)
        rows.append([name, f"{median(tps[name]):.2f}", span(tps[name]), f"{median(ratio[name]):.3f}",
                     span(ratio[name], "{:.3f}"), f"{bytes_per_token / 1e9:.3f}",
                     f"{bf16_bytes / bytes_per_token:.2f}"])
    print(render_table(["weights", "tokens/s median", "min-max", "vs bf16 median", "min-max", "GB per token",
                        "bytes ratio (memory-bound gain)"], rows))


if __name__ == "__main__":
    main()
