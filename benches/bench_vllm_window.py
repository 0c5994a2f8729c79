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
    python benches/bench_vllm_window.py --flags=--no-shapes    # a lever, against the figures of the default
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
# The window's phase runs from its start signal until its profile is saved; this row is the same
# windows from start to stop signal, without the save (what profiling costs, apart from saving).
WHILE_OPEN = "window, start to stop (no save)"


def cpuprof(*args: str) -> None:
    result = subprocess.run([sys.executable, "-m", "cpuprof", *args], capture_output=True, text=True, timeout=60)
    if result.returncode != 0:
        raise SystemExit(f"cpuprof {' '.join(args)} failed: {result.stderr.strip()}")


def ops_per_second(out: Path) -> dict[str, list[float]]:
    """Each window's ATen ops per second of its profile, per profiled process's role: what a per-op
    cost is multiplied by."""
    from cpuprof.model.profile import Profile

    rates: dict[str, list[float]] = {}
    for path in sorted(out.glob("window-*/**/profile.json")):
        profile = Profile.load(path)
        if profile.collection is None or profile.overhead is None:  # a process not profiled in the window
            continue
        span_ns = profile.collection.stopped_ns - profile.collection.started_ns
        if span_ns > 0:
            role = profile.meta.role or "the program"
            rates.setdefault(role, []).append(profile.overhead.ops / (span_ns / 1e9))
    return rates


def phase_figures(client: Client, begin: float, end: float) -> tuple[float, float | None]:
    """Completions per second answered in [begin, end), and the median latency of those sent in it."""
    answered = [done for _, done, outcome in client.outcomes if outcome == "ok" and begin <= done < end]
    latencies = [done - sent for sent, done, outcome in client.outcomes if outcome == "ok" and begin <= sent < end]
    return len(answered) / (end - begin), (median(latencies) if latencies else None)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--phase", type=float, default=6.0, help="seconds each phase lasts (a window's length)")
    parser.add_argument("--flags", default="", help="more `cpuprof run` options for the server's launch, a lever "
                                                    "measured against the default (--flags=--no-shapes)")
    args = parser.parse_args()
    print(machine_line())
    if args.flags:
        print(f"cpuprof run flags added: {args.flags}")
    with tempfile.TemporaryDirectory(prefix="cpuprof-bench-window-") as tmp:
        work = Path(tmp)
        model, out, log = work / "model", work / "out", work / "server.log"
        write_checkpoint(model)
        port = free_port()
        with log.open("w") as sink:
            proc = subprocess.Popen(on_demand_server(model, port, out, args.flags.split()), stdout=sink,
                                    stderr=subprocess.STDOUT, env=ENV)
        client = Client(port, model)
        phases: dict[str, list[tuple[float, float]]] = {"no window": [], "window": []}
        open_spans: list[tuple[float, float]] = []  # each window from its start signal to its stop signal
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
                        open_spans.append((began, time.monotonic()))
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
        op_rates = ops_per_second(out)
    phases[WHILE_OPEN] = open_spans
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
    for role, rates in sorted(op_rates.items()):
        print(f"ATen ops per second in {role} while a window was open: median {median(rates):,.0f} "
              f"({span(rates, '{:,.0f}')}, {len(rates)} windows)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
