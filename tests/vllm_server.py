"""vLLM's OpenAI server under ``cpuprof run --on-demand`` and a client that keeps it busy: shared by the
tests and benches/bench_vllm_window.py, without pytest (README command 1's environment has none)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path

ENV = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1"}


class Client:
    """Threads sending completions one after another, each request's outcome kept."""

    def __init__(self, port: int, model: Path, threads: int = 3) -> None:
        self.url = f"http://127.0.0.1:{port}/v1/completions"
        self.body = json.dumps({"model": str(model), "prompt": "w5 w6 w7 w8", "max_tokens": 16,
                                "ignore_eos": True, "temperature": 0}).encode()
        self.outcomes: list[tuple[float, float, str]] = []  # (sent, answered, "ok" or what failed)
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._loop, daemon=True) for _ in range(threads)]

    def _loop(self) -> None:
        while not self._stop.is_set():
            sent = time.monotonic()
            try:
                request = urllib.request.Request(self.url, data=self.body, headers={"Content-Type": "application/json"})
                with urllib.request.urlopen(request, timeout=120) as answer:
                    reply = json.load(answer)
                outcome = "ok" if reply["usage"]["completion_tokens"] == 16 else f"short: {reply['usage']}"
            except Exception as exc:
                outcome = f"{type(exc).__name__}: {exc}"
            self.outcomes.append((sent, time.monotonic(), outcome))

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=150)

    def answered_between(self, begin: float, end: float) -> int:
        return sum(1 for sent, _, outcome in self.outcomes if outcome == "ok" and begin <= sent and sent <= end)


def wait_until_serving(port: int, proc: subprocess.Popen, log: Path, timeout_s: float = 600) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"the server ended before it served:\n{log.read_text()[-3000:]}"
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=5) as answer:
                if answer.status == 200:
                    return
        except OSError:
            pass
        time.sleep(1)
    raise AssertionError(f"the server did not serve in {timeout_s} s:\n{log.read_text()[-3000:]}")


def on_demand_server(model: Path, port: int, out: Path, flags: Sequence[str] = ()) -> list[str]:
    """vLLM's OpenAI server under ``cpuprof run --on-demand``: started unprofiled, windows on signals;
    ``flags``: more options of ``cpuprof run`` (a benchmark's lever)."""
    return [sys.executable, "-m", "cpuprof", "run", "--on-demand", "--threads", "2", *flags, "--out", str(out), "--",
            "python", "-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--port", str(port),
            "--host", "127.0.0.1", "--dtype", "bfloat16", "--max-model-len", "256", "--enforce-eager"]


def interrupt(proc: subprocess.Popen) -> None:
    """Ends a launcher as Ctrl-C does (it passes the signal on, and ends the followed processes)."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
