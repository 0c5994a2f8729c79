"""The decode child: ``python -m cpuprof._decode_child LAUNCH_JSON``.

Started by :mod:`cpuprof.decode` already pinned, memory-bound and with the OpenMP environment
set. It builds the model, reads back the settings actually in force, profiles prefill and decode,
and saves the profile. While decoding it checkpoints every few seconds, and on SIGINT/SIGTERM it
stops the profiler and saves what it has, so an interrupted run is never a lost run.
Exit codes: 0 done, 2 bad configuration (one line on stderr), 130 interrupted.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import sys
import time
from pathlib import Path
from typing import Any

from .errors import CpuprofError

EXIT_INTERRUPTED = 130


class Interrupted(Exception):
    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _raise_interrupted(signum: int, _frame: object) -> None:
    # Once is enough: further signals while the profile is being saved are ignored.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise Interrupted(signum)


class Progress:
    """One status line on a terminal (stderr), nothing when stderr is not a terminal."""

    def __init__(self) -> None:
        self.tty = sys.stderr.isatty()

    def show(self, text: str) -> None:
        if self.tty:
            sys.stderr.write(f"\r\033[K{text}")
            sys.stderr.flush()

    def done(self, text: str) -> None:
        if self.tty:
            sys.stderr.write(f"\r\033[K{text}\n")
            sys.stderr.flush()


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class DecodeRun:
    """State of one run, so that any exit path can save a consistent profile."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self.options = config["options"]
        self.out = Path(config["out"])
        self.progress = Progress()
        self.prof: Any = None
        self.latencies: list[float] = []
        self.workload: dict[str, Any] = {"kind": "decode", "steps_done": 0,
                                         "new_tokens": self.options["new_tokens"]}
        self.settings: dict[str, Any] = {"requested": config["requested"], "cpu_set": config["cpu_set"],
                                         "topology": config["topology"]}
        self.last_checkpoint = time.monotonic()

    # -- steps ----------------------------------------------------------------------------------
    def check_events(self) -> None:
        """A typo in --events fails now, not after minutes of building the model."""
        if not self.options["profile"]:
            return
        from . import events, native, profile

        events.validate_names(events.resolve(self.options["events"]), native.load())
        self.prof = profile(self.options["events"], mode=self.options["mode"],
                            record_shapes=self.options["record_shapes"],
                            sample_interval_us=self.options["sample_interval_us"],
                            timeline=self.options["timeline"],
                            # A checkpoint's own model marks no regions: its modules do.
                            modules=bool(self.options["hf"]))

    def build(self) -> tuple[Any, Any]:
        import torch

        from . import region
        from .workload import build_model, load_hf
        from .workload.presets import ModelConfig

        torch.set_num_threads(self.config["threads"])
        dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[self.options["dtype"]]
        started = time.perf_counter()
        if self.options["hf"]:
            self.progress.show(f"loading {self.options['hf']} ...")
            model = load_hf(self.options["hf"], dtype)
            cfg = model.config
        else:
            cfg = ModelConfig(**self.config["model"])

            def on_layer(done: int, total: int) -> None:
                self.progress.show(f"building {cfg.name} ({cfg.param_count() / 1e9:.2f} B params, "
                                   f"{self.options['dtype']}): layer {done}/{total}")

            region_factory = region if self.options["profile"] else None
            model = build_model(cfg, dtype, seed=self.options["seed"], progress=on_layer, region=region_factory)
        build_s = time.perf_counter() - started
        dtype_bytes = 2 if self.options["dtype"] == "bf16" else 4
        self.workload.update({
            "model": cfg.name, "config": _asdict(cfg), "source": self.options["hf"] or "built-in random weights",
            "dtype": self.options["dtype"], "params": cfg.param_count(), "weight_bytes": cfg.weight_bytes(dtype_bytes),
            "batch": self.options["batch"], "prompt_len": self.options["prompt_len"],
            "warmup_steps": self.options["warmup"], "sampling": self.options["sampling"],
            "build_s": build_s,
        })
        self.progress.done(f"built {cfg.name} in {build_s:.1f} s")
        return model, cfg

    def read_settings(self, model: Any) -> None:
        from .in_force import compare, read_in_force

        in_force = read_in_force(model.parameter_tensors())
        self.settings["in_force"] = in_force
        self.settings["warnings"] = compare(self.config["requested"], in_force)

    def decode(self, model: Any, cfg: Any) -> None:
        from .workload import run_decode

        total = self.options["new_tokens"]

        def on_step(index: int, latency_s: float, steps: int) -> None:
            self.latencies.append(latency_s)
            self.workload["steps_done"] = len(self.latencies)
            recent = self.latencies[-5:]
            self.progress.show(f"decoding: step {index + 1}/{steps}, {1.0 / (sum(recent) / len(recent)):.2f} "
                               f"tokens/s (last {len(recent)} steps)")
            if time.monotonic() - self.last_checkpoint >= self.options["checkpoint_s"]:
                self.save(complete=False, reason="checkpoint: the run was still going")
                self.last_checkpoint = time.monotonic()

        if self.prof is not None:
            self.prof.start()
        self.progress.show(f"prefill of {self.options['prompt_len']} tokens ...")
        result = run_decode(model, cfg, prompt_len=self.options["prompt_len"], new_tokens=total,
                            batch=self.options["batch"], warmup=self.options["warmup"],
                            sampling=self.options["sampling"], top_k=self.options["top_k"],
                            seed=self.options["seed"], on_step=on_step)
        if self.prof is not None:
            self.prof.stop()
        data = result.to_dict()
        data.pop("generated_ids")
        self.workload.update(data)
        self.workload["peak_rss_bytes"] = peak_rss_bytes()
        self.progress.done(f"decoded {total} tokens: {result.tokens_per_s:.2f} tokens/s after "
                           f"{self.options['warmup']} warm-up steps")

    def stop_profiler(self) -> None:
        if self.prof is not None and self.prof.running:
            self.prof.stop()

    # -- output ---------------------------------------------------------------------------------
    def save(self, complete: bool, reason: str | None = None) -> None:
        from .model import Profile

        if self.prof is not None and self.prof.started:
            profile = self.prof.profile or self.prof.snapshot()
        else:
            profile = Profile.unprofiled()
        if not complete:
            self.workload.update(_partial_figures(self.latencies, self.options["warmup"]))
        self.workload["peak_rss_bytes"] = peak_rss_bytes()
        profile.workload = dict(self.workload)
        profile.settings = dict(self.settings)
        profile.status = {"complete": complete} if complete else {"complete": False, "reason": reason}
        profile.save(self.out)


def _asdict(cfg: Any) -> dict[str, Any]:
    import dataclasses

    return dataclasses.asdict(cfg)


def _partial_figures(latencies: list[float], warmup: int) -> dict[str, Any]:
    measured = latencies[warmup:]
    if not measured:
        return {"step_latencies_s": list(latencies)}
    ordered = sorted(measured)

    def pct(q: float) -> float:
        return 1e3 * ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]

    return {"step_latencies_s": list(latencies), "tokens_per_s": len(measured) / sum(measured),
            "p50_ms": pct(0.5), "p90_ms": pct(0.9), "p99_ms": pct(0.99)}


def main(argv: list[str]) -> int:
    config = json.loads(Path(argv[1]).read_text())
    signal.signal(signal.SIGTERM, _raise_interrupted)
    signal.signal(signal.SIGINT, _raise_interrupted)
    run = DecodeRun(config)
    try:
        run.check_events()
        model, cfg = run.build()
        run.read_settings(model)
        run.decode(model, cfg)
        run.save(complete=True)
        return 0
    except CpuprofError as exc:
        run.progress.done("")
        print(f"cpuprof: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except (Interrupted, KeyboardInterrupt) as exc:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        name = exc.args[0] if isinstance(exc, Interrupted) else "SIGINT"
        run.progress.done("")
        run.stop_profiler()
        run.save(complete=False, reason=f"interrupted by {name} after {len(run.latencies)} of "
                                        f"{run.options['new_tokens']} decode steps")
        return EXIT_INTERRUPTED
    except Exception as exc:
        if os.environ.get("CPUPROF_DEBUG"):
            raise
        run.progress.done("")
        saved = ""
        try:
            run.stop_profiler()
            run.save(complete=False, reason=f"failed after {len(run.latencies)} decode steps: "
                                            f"{type(exc).__name__}: {exc}")
        except Exception as save_exc:  # keep the first failure the one reported
            saved = f"; saving the profile failed too ({type(save_exc).__name__}: {save_exc})"
        print(f"cpuprof: error: decoding failed: {type(exc).__name__}: {exc}{saved} "
              "(set CPUPROF_DEBUG=1 for the traceback)", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
