"""What one read of the Python stacks costs, beside a decode whose GEMVs empty the caches.

A thread wakes every 10 ms, as the in-process sampler does, and in each period measures, in
an order alternated every period: the native read (cpuprof's PythonFrameReader, what the sampler uses on CPython
3.11 to 3.13) and the same stacks read from Python (``sys._current_frames()``, the ``f_back``
walk, ``f_lineno`` of each frame: the fallback). Each is timed by the thread's own CPU clock, with
the GIL held. The period's remaining CPU (sleeping, waking, taking the GIL back) is timed too.
Meanwhile a transformers Llama (4 layers of Llama-3.2-1B shapes, bf16, random weights) decodes
with ``generate()``. The figures are medians over the periods, with their spread.

    python benches/bench_python_read.py                 # 3 decodes of 24 tokens, ~30 s
    python benches/bench_python_read.py --decodes 5 --threads 2
"""

from __future__ import annotations

import argparse
import sys
import threading
import time

from _common import machine_line, median, render_table, span


def python_read(me: int) -> int:
    """The fallback's read: every other thread's frames as (name, file, line); how many."""
    read = []
    for ident, frame in sys._current_frames().items():
        if ident == me:
            continue
        f = frame
        while f is not None:
            code = f.f_code
            read.append((code.co_qualname, code.co_filename, f.f_lineno))
            f = f.f_back
    return len(read)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--decodes", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--new-tokens", type=int, default=24)
    args = ap.parse_args(argv)

    import torch
    import transformers

    from cpuprof import native

    nat = native.load()
    if not nat.python_stacks_supported():
        raise SystemExit(f"no native Python frame reader for Python {sys.version.split()[0]}")
    torch.set_num_threads(args.threads)
    config = transformers.LlamaConfig(hidden_size=2048, intermediate_size=8192, num_hidden_layers=4,
                                      num_attention_heads=32, num_key_value_heads=8, vocab_size=32000)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).to(torch.bfloat16).eval()
    prompt = torch.randint(0, 32000, (1, 32))
    print(machine_line())
    print(f"transformers {transformers.__version__}, {args.threads} threads, {args.decodes} decodes of "
          f"{args.new_tokens} tokens, a read every 10 ms")

    times: dict[str, list[float]] = {"native": [], "python": [], "sleep, wake, GIL": []}
    depth: list[int] = []
    stopping = False

    def reader() -> None:
        me = threading.get_ident()
        frames = nat.PythonFrameReader()
        wake = time.monotonic() + 0.01
        while True:
            before = time.thread_time_ns()
            time.sleep(max(0.0, wake - time.monotonic()))
            woken = time.thread_time_ns()
            if stopping:
                return
            # The two reads alternate which goes first: the second finds caches the first warmed.
            for name in ("native", "python") if len(depth) % 2 == 0 else ("python", "native"):
                start = time.thread_time_ns()
                if name == "native":
                    frames.read(me)
                else:
                    count = python_read(me)
                times[name].append((time.thread_time_ns() - start) / 1e3)
            depth.append(count)
            times["sleep, wake, GIL"].append((woken - before) / 1e3)
            wake += 0.01

    with torch.inference_mode():
        model.generate(prompt, max_new_tokens=2, do_sample=False)  # warm-up, unmeasured
        thread = threading.Thread(target=reader, name="read-bench")
        thread.start()
        for _ in range(args.decodes):
            model.generate(prompt, max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens, do_sample=False)
        stopping = True
        thread.join()
    rows = [[name, f"{median(v):.1f}", span(v, "{:.1f}")] for name, v in times.items()]
    print(render_table(["CPU per period", "µs, median", "min–max"], rows))
    print(f"({len(depth)} periods; {median(depth):.0f} frames read per period, median; the two reads alternate "
          "which goes first)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
