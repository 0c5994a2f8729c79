"""What a profiling window costs a serving vLLM: its OpenAI server under ``cpuprof run --on-demand``,
three clients sending completions without pause, and windows opened and closed with ``cpuprof
signal`` while they do.

Each round has a phase without a window (the processes run unprofiled) and a phase with one
(start, profile, stop and save), so the two are measured side by side, interleaved, on the same
server; the order of the two phases is rotated every round. Printed: completions per second and
the median request latency in each phase (median and min-max over the rounds, and their ratio per
round), requests that failed (none may), and what opening and closing a window cost each profiled
process, from its own progress lines (starting the profile; stopping it and saving its profile).

Needs vLLM's CPU backend (README command 2 installs it); the checkpoint is the tests' random 4-layer
Llama, written into a temporary directory:

    python benches/bench_vllm_window.py                 # 10 rounds of 2 x 6 s, ~5 min here
    python benches/bench_vllm_window.py --rounds 3 --phase 4
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import machine_line, median, render_table, rotated, span

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.gloo_jobs import free_port  # noqa: E402 (the tests' server driver and checkpoint, without pytest)
from tests.vllm_checkpoint import write_checkpoint  # noqa: E402
from tests.vllm_server import ENV, Client, interrupt, on_demand_server, wait_until_serving  # noqa: E402

WINDOW_SAVED_TIMEOUT_S = 300


def cpuprof(*args: str) -> None:
    result = subprocess.run([sys.executable, "-m", "cpuprof", *args], capture_output=True, text=True, timeout=60)
    if result.returncode != 0:
        raise SystemExit(f"cpuprof {' '.join(args)} failed: {result.stderr.strip()}")


def phase_figures(client: Client, begin: float, end: float) -> tuple[float, float | None]:
    """Completions per second answered in [begin, end), and the median latency of those sent in it."""
    answered = [done for _, done, outcome in client.outcomes if outcome == "ok" and begin <= done < end]
    latencies = [done - sent for sent, done, outcome in client.outcomes if outcome == "ok" and begin <= sent < end]
    return len(answered) / (end - begin), (median(latencies) if latencies else None)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--phase", type=float, default=6.0, help="seconds each phase lasts (a window's length)")
    args = parser.parse_args()
    print(machine_line())
    with tempfile.TemporaryDirectory(prefix="cpuprof-bench-window-") as tmp:
        work = Path(tmp)
        model, out, log = work / "model", work / "out", work / "server.log"
        write_checkpoint(model)
        port = free_port()
        with log.open("w") as sink:
            proc = subprocess.Popen(on_demand_server(model, port, out), stdout=sink, stderr=subprocess.STDOUT,
                                    env=ENV)
        client = Client(port, model)
        phases: dict[str, list[tuple[float, float]]] = {"no window": [], "window": []}
        try:
            wait_until_serving(port, proc, log)
            client.start()
            time.sleep(args.phase)  # the first requests warm the server up
            window = 0
            for k in range(args.rounds):
                for name in rotated(list(phases), k):
                    began = time.monotonic()
                    if name == "window":
                        window += 1
                        cpuprof("signal", str(proc.pid), "start")
                        time.sleep(args.phase)
                        cpuprof("signal", str(proc.pid), "stop")
                        saved = out / f"window-{window}" / "profile.json"
                        while not saved.exists():
                            if time.monotonic() - began > WINDOW_SAVED_TIMEOUT_S:
                                raise SystemExit(f"window {window} was not saved:\n{log.read_text()[-2000:]}")
                            time.sleep(0.2)
                    else:
                        time.sleep(args.phase)
                    phases[name].append((began, time.monotonic()))
                print(f"round {k + 1}/{args.rounds}: {len(client.outcomes)} requests so far", flush=True)
        finally:
            client.stop()
            interrupt(proc)
        text = log.read_text()
    figures = {name: [phase_figures(client, b, e) for b, e in spans] for name, spans in phases.items()}
    rows = []
    for name in phases:
        rates = [r for r, _ in figures[name]]
        latencies = [lat * 1e3 for _, lat in figures[name] if lat is not None]
        rate_ratio = [r / base for (r, _), (base, _) in zip(figures[name], figures["no window"], strict=True) if base]
        rows.append([name, f"{median(rates):.2f}", span(rates), f"{median(rate_ratio):.2f}", span(rate_ratio),
                     f"{median(latencies):.0f}", span(latencies, "{:.0f}")])
    print(render_table(["phase", "completions/s", "min-max", "ratio to no window", "min-max", "latency ms (median)",
                        "min-max"], rows))
    failed = [outcome for _, _, outcome in client.outcomes if outcome != "ok"]
    print(f"requests: {len(client.outcomes)}, failed: {len(failed)}" + (f" (first: {failed[0]})" if failed else ""))
    starts = [int(ms) for ms in re.findall(r"window \d+ open: .*\(starting the profile took (\d+) ms\)", text)]
    stops = [int(ms) for ms in re.findall(r"window \d+ closed: .*\(stopping and saving took (\d+) ms\)", text)]
    for what, values in (("starting a window's profile", starts), ("stopping and saving it", stops)):
        if values:
            print(f"{what}, per process and window: median {median(values):.0f} ms, {span(values, '{:.0f}')} ms "
                  f"({len(values)} of them)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
