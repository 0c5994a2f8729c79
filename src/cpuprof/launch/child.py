"""The decode child: ``python -m cpuprof.launch.child LAUNCH_JSON``.

Started by :mod:`cpuprof.launch.parent` already pinned, memory-bound and with the OpenMP
environment set. It builds the model, reads back the settings actually in force, profiles
prefill and decode, and saves the profile. While decoding it checkpoints every few seconds, and
on SIGINT/SIGTERM it stops the profiler and saves what it has, so an interrupted run is never a
lost run. Exit codes: 0 done, 2 bad configuration (one line on stderr), 130 interrupted.
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

from ..errors import CpuprofError
from ..model import (
    DecodeWorkload,
    KvCachePoint,
    MachineRoofs,
    MemoryPoint,
    Meta,
    ModelInfo,
    Profile,
    RankInfo,
    Settings,
    Status,
)
from ..model.codec import from_json
from ..units import fmt_params
from ..workload.figures import step_figures
from .child_setup import record_crashes, remove_perf_map
from .options import ChildConfig
from .progress import Progress

# Exit codes the parent tells apart (see cpuprof.launch.parent).
EXIT_FAILED = 1  # this process reported the failure itself, in one line
EXIT_USAGE = 2
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


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def rss_bytes() -> int:
    """Resident memory now (statm's second field, in pages)."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * resource.getpagesize()


ROOFLINE_FILENAME = "roofline.svg"  # beside profile.json: the GEMMs on the roofline chart
MAX_MEMORY_POINTS = 4096  # the RSS timeline keeps the first this many points (one per decode step)


def _meta() -> Meta:
    import datetime
    import socket

    from .. import __version__

    torch = sys.modules.get("torch")
    return Meta(created=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                cpuprof_version=__version__, torch_version=getattr(torch, "__version__", None),
                python=sys.version.split()[0], hostname=socket.gethostname(), pid=os.getpid(), argv=list(sys.argv))


class DecodeRun:
    """State of one run, so that any exit path can save a consistent profile."""

    def __init__(self, config: ChildConfig) -> None:
        self.config = config
        self.options = config.options
        self.wl = config.options.workload
        self.out = Path(config.out)
        self.progress = Progress()
        self.prof: Any = None
        self.stage = "starting"
        self.latencies: list[float] = []
        self.workload: DecodeWorkload | None = None
        self.settings = Settings(requested=config.requested, cpu_set=config.cpu_set, topology=config.topology)
        self.last_checkpoint = time.monotonic()
        self.started = time.monotonic()
        self.roofs: MachineRoofs | None = None
        self.rss_timeline: list[MemoryPoint] = []
        self.all_reduce: Any = None  # a tensor-parallel rank's AllReduceRecorder

    # -- steps ----------------------------------------------------------------------------------
    def check_events(self) -> None:
        """A typo in --events fails now, not after minutes of building the model."""
        popts = self.options.profile
        if not popts.enabled:
            return
        from .. import events, native, profile

        self.stage = "setting up the profiler"
        events.validate_names(events.resolve(popts.events), native.load())
        self.prof = profile(popts.events, mode=popts.mode, record_shapes=popts.record_shapes,
                            sample_hz=popts.sample_hz, stack_bytes=popts.stack_bytes, timeline=popts.timeline,
                            python_stacks=popts.python_hz > 0, python_hz=popts.python_hz or 1,
                            # A checkpoint's own model marks no regions: its modules do (named once
                            # the model is loaded).
                            modules=bool(self.wl.hf))

    def build(self) -> Any:
        import torch

        from .. import region
        from ..workload import build_model, load_hf
        from ..workload.dtypes import dtype_bytes, torch_dtype

        self.stage = "building the model"
        torch.set_num_threads(self.config.threads)
        dtype = torch_dtype(self.wl.dtype)
        started = time.perf_counter()
        if self.wl.hf:
            self.progress.show(f"loading {self.wl.hf} ...", phase="build")
            model = load_hf(self.wl.hf, dtype)
            info = ModelInfo(name=model.name, source=str(Path(self.wl.hf).resolve()), architecture=model.architecture,
                             dtype=self.wl.dtype, params=model.param_count(), weight_bytes=model.weight_bytes(),
                             model_type=model.model_type)
            if self.prof is not None:
                self.prof.modules = model.model  # regions named as the model names its modules
        else:
            cfg = self.config.model
            assert cfg is not None

            def on_layer(done: int, total: int) -> None:
                self.progress.show(f"building {cfg.name} ({fmt_params(cfg.param_count())} parameters, "
                                   f"{self.wl.dtype}): layer {done}/{total}", phase="build")

            # A compiled model runs as one graph: its per-layer regions would break it into pieces.
            region_factory = region if self.options.profile.enabled and not self.wl.compile else None
            shard, reduce = self.join_tensor_parallel(region_factory)
            model = build_model(cfg, dtype, seed=self.wl.seed, progress=on_layer, region=region_factory,
                                shard=shard, reduce=reduce)
            info = ModelInfo(name=cfg.name, source="built-in random weights", architecture="built-in Llama",
                             dtype=self.wl.dtype, params=cfg.param_count(),
                             weight_bytes=cfg.weight_bytes(dtype_bytes(self.wl.dtype)), config=cfg)
        build_s = time.perf_counter() - started
        self.workload = DecodeWorkload(model=info, batch=self.wl.batch, prompt_len=self.wl.prompt_len,
                                       new_tokens=self.wl.new_tokens, warmup_steps=self.wl.warmup,
                                       sampling=self.wl.sampling, build_s=build_s)
        rank = self.config.rank
        if rank is not None:
            self.workload.rank = RankInfo(mode=rank.mode, rank=rank.rank, world_size=rank.world_size,
                                          backend=rank.backend, cpus=list(rank.cpus))
        self.progress.done(f"built {info.name} in {build_s:.1f} s")
        return model

    def join_tensor_parallel(self, region_factory: Any) -> tuple[Any, Any]:
        """A tensor-parallel rank joins its group before building its shard; otherwise the whole model."""
        from ..workload.llama import Shard, no_reduce

        rank = self.config.rank
        if rank is None or rank.mode != "tp":
            return Shard(), no_reduce
        from ..workload.tensor_parallel import AllReduceRecorder, join_group

        self.stage = f"joining the {rank.backend} process group of {rank.world_size} ranks"
        self.progress.show(f"rank {rank.rank}: joining the {rank.backend} group of {rank.world_size} ranks ...",
                           phase="build")
        assert rank.backend is not None and self.config.model is not None
        group = join_group(rank.backend, rank.timeout_s)
        self.stage = "building the model"
        self.all_reduce = AllReduceRecorder(region_factory, calls_per_forward=2 * self.config.model.layers,
                                            group=group)
        return Shard(rank.rank, rank.world_size), self.all_reduce

    def wait_for_ranks(self) -> None:
        """Ranks build at their own pace; the prefill's first all-reduce is not the place to wait.
        Instances wait for each other too: their tokens/s are added up, which is the machine's
        throughput only if they decode at the same time, not one after the other."""
        rank = self.config.rank
        if rank is not None and rank.mode == "instances" and rank.world_size > 1:
            from ..defaults import RANK_STARTUP_TIMEOUT_S
            from .ranks import start_barrier

            self.stage = "waiting for the other instances"
            start_barrier(Path(self.config.out).parent, rank.rank, rank.world_size,
                          max(rank.timeout_s, RANK_STARTUP_TIMEOUT_S))
        if self.all_reduce is None:
            return
        import torch.distributed as dist

        self.stage = "waiting for the other ranks"
        dist.barrier()  # the default group's: the startup timeout, not the rank timeout

    def compile(self, model: Any) -> None:
        """torch.compile before the profile starts: compilation is in neither the figures nor the ops."""
        if not self.wl.compile:
            return
        import torch._inductor.config as inductor_config

        from ..workload import run_decode

        assert self.workload is not None
        self.stage = "compiling the model"
        # Frozen weights are constants to inductor, so oneDNN packs each weight once, at compile
        # time, instead of on every call (the repacking the GEMM verdicts point at).
        inductor_config.freezing = True
        # dynamic: the KV length grows every step; one graph serves them all instead of one per length.
        model.compile(dynamic=True)
        started = time.perf_counter()
        self.progress.show("compiling the model with torch.compile (inductor, frozen weights) ...", phase="compile")
        # Compiled for the prefill and a decode step at the measured run's cache size: the compiler
        # guards on the cache's shape and identity, so the measured run reuses these graphs.
        run_decode(model, model.cfg, prompt_len=self.wl.prompt_len, new_tokens=3, batch=self.wl.batch, warmup=0,
                   seed=self.wl.seed, inference_mode=False, cache_len=self.compiled_cache_len())
        self.workload.compile_s = time.perf_counter() - started
        self.progress.done(f"compiled in {self.workload.compile_s:.1f} s (before the profile, outside the figures)")

    def compiled_cache_len(self) -> int | None:
        """A compiled model's KV cache has a spare position: reading the cache to its very end
        would be a new shape case, and a recompilation of seconds inside the last measured step."""
        return self.wl.prompt_len + self.wl.new_tokens + 1 if self.wl.compile else None

    def read_settings(self, model: Any) -> None:
        from .in_force import compare, read_in_force

        self.stage = "reading the settings in force"
        in_force = read_in_force(model.parameter_tensors() if model is not None else None)
        self.settings.in_force = in_force
        self.settings.warnings = compare(self.config.requested, in_force)

    def mark_memory(self, phase: str) -> None:
        """One point of the RSS timeline; cheap (one /proc read) and never inside a timed step."""
        if len(self.rss_timeline) < MAX_MEMORY_POINTS:
            elapsed = round(time.monotonic() - self.started, 4)
            self.rss_timeline.append(MemoryPoint(time_s=elapsed, rss_bytes=rss_bytes(), phase=phase))

    def calibrate(self) -> None:
        """The machine's roofs at this run's threads and CPUs, from the cache or measured now, before
        the profiler starts (the measurement is not part of the profile)."""
        from ..machine import roofs

        mode = self.options.roofs
        if mode == "off":
            return
        self.stage = "measuring the machine's roofs"
        # The run's CPU set, not this thread's affinity: bound runs pin each thread to one CPU.
        cpus = sorted(self.config.requested.cpus or os.sched_getaffinity(0))
        measured, notes = roofs.ensure(self.config.threads, cpus, force=mode == "remeasure",
                                       progress=lambda line: self.progress.show(line, phase="calibrate"))
        for note in notes:
            self.progress.done(f"note: {note}")
        measured.errors.extend(notes)
        self.roofs = measured
        if measured.from_cache:
            self.progress.done(f"machine roofs from the cache (measured {measured.measured[:10]}, "
                               f"{measured.seconds:.1f} s; re-measure with: python -m cpuprof calibrate)")
        else:
            self.progress.done(f"measured the machine's roofs in {measured.seconds:.1f} s (cached for the next runs)")

    def decode(self, model: Any) -> None:
        from ..workload import run_decode
        from ..workload.hf import run_hf_decode

        assert self.workload is not None
        wl = self.workload
        total = self.wl.new_tokens

        def on_step(index: int, latency_s: float, steps: int) -> None:
            self.latencies.append(latency_s)
            self.mark_memory(f"step {index + 1}")
            wl.steps_done = len(self.latencies)
            recent = self.latencies[-5:]
            rate = self.wl.batch * len(recent) / sum(recent)
            self.progress.show(f"decoding: step {index + 1}/{steps}, {rate:.2f} tokens/s (last {len(recent)} steps)",
                               phase="decode")
            if time.monotonic() - self.last_checkpoint >= self.options.checkpoint_s:
                self.save(complete=False, reason="checkpoint: the run was still going")
                self.last_checkpoint = time.monotonic()

        self.stage = "decoding"
        self.last_checkpoint = time.monotonic()  # the first checkpoint a full interval into decoding
        if self.prof is not None:
            self.prof.start()
        self.progress.show(f"prefill of {self.wl.prompt_len} tokens ...", phase="prefill")
        w = self.wl
        from .. import region

        phase = region if self.prof is not None else None
        if w.hf:
            result = run_hf_decode(model, prompt_len=w.prompt_len, new_tokens=total, batch=w.batch, warmup=w.warmup,
                                   sampling=w.sampling, top_k=w.top_k, seed=w.seed, on_step=on_step, phase=phase)
        else:
            result = run_decode(model, model.cfg, prompt_len=w.prompt_len, new_tokens=total, batch=w.batch,
                                warmup=w.warmup, sampling=w.sampling, top_k=w.top_k, seed=w.seed, on_step=on_step,
                                phase=phase, inference_mode=not w.compile, cache_len=self.compiled_cache_len())
        if self.prof is not None:
            self.prof.stop()
        wl.steps_done = len(result.step_latencies_s)
        wl.step_latencies_s = list(result.step_latencies_s)
        wl.ttft_s = result.ttft_s
        wl.decode_wall_s = result.decode_wall_s
        wl.figures = result.figures
        wl.bytes_read_per_token = result.bytes_read_per_token
        wl.bytes_read_method = result.bytes_read_method
        wl.prompt_ids = result.prompt_ids
        wl.output_ids = result.generated_ids
        wl.peak_rss_bytes = peak_rss_bytes()
        wl.kv_cache = [KvCachePoint(position=p, bytes=b) for p, b in result.kv_cache]
        self.progress.done(f"decoded {total} tokens: {result.tokens_per_s:.2f} tokens/s after "
                           f"{self.wl.warmup} warm-up steps")

    def stop_profiler(self) -> None:
        if self.prof is not None and self.prof.running:
            self.prof.stop()

    # -- output ---------------------------------------------------------------------------------
    def save(self, complete: bool, reason: str | None = None) -> None:
        if self.prof is not None and self.prof.started:
            profile = self.prof.profile or self.prof.snapshot()
        else:
            profile = Profile(meta=_meta())
        if self.workload is not None:
            if not complete:
                self.workload.steps_done = len(self.latencies)
                self.workload.step_latencies_s = list(self.latencies)
                self.workload.figures = step_figures(self.latencies, self.wl.warmup, self.wl.batch)
            self.workload.peak_rss_bytes = peak_rss_bytes()
            self.workload.rss_timeline = list(self.rss_timeline)
            if self.all_reduce is not None:
                self.workload.collectives = self.all_reduce.record
        profile.workload = self.workload
        profile.settings = self.settings
        profile.roofs = self.roofs
        profile.status = Status(complete=complete, reason=reason)
        profile.save(self.out)
        if profile.profiled and profile.roofs is not None:
            from ..analysis.roofline import gemm_groups
            from ..exports import roofline_svg

            svg = roofline_svg.render(gemm_groups(profile), profile.roofs,
                                      title=f"{profile.workload.model.name if profile.workload else 'GEMMs'}: "
                                            "GEMMs against the roofs")
            (self.out / ROOFLINE_FILENAME).write_text(svg)

    def fail(self, what: str, debug_hint: bool = False) -> int:
        """Saves what was measured and says, in the one error line, what failed and where that is."""
        first = what.strip().splitlines()[0] if what.strip() else what
        try:
            self.stop_profiler()
            self.save(complete=False, reason=self.failed_reason(f"failed: {first}"))
            kept = f"; what was measured is in {self.out / 'profile.json'}"
        except Exception as save_exc:  # keep the first failure the one reported
            kept = f"; saving the profile failed too ({type(save_exc).__name__}: {save_exc})"
        hint = " (set CPUPROF_DEBUG=1 for the traceback)" if debug_hint else ""
        print(f"cpuprof: error: {self.failed_reason(f'decoding failed: {first}')}{kept}{hint}", file=sys.stderr)
        return EXIT_FAILED

    def failed_reason(self, what: str) -> str:
        profiled = self.prof is not None and self.prof.started
        tail = "" if profiled else "; nothing was profiled because of it"
        if self.stage == "decoding":
            return f"{what} after {len(self.latencies)} of {self.wl.new_tokens} decode steps{tail}"
        return f"{what} while {self.stage}{tail}"


def main(argv: list[str]) -> int:
    try:
        return _main(argv)
    finally:
        remove_perf_map()
        if "torch.distributed" in sys.modules:
            from ..workload.tensor_parallel import leave_group

            leave_group()


def _main(argv: list[str]) -> int:
    config = from_json(ChildConfig, json.loads(Path(argv[1]).read_text()), "launch")
    record_crashes(config.out)
    signal.signal(signal.SIGTERM, _raise_interrupted)
    signal.signal(signal.SIGINT, _raise_interrupted)
    run = DecodeRun(config)
    try:
        run.check_events()
        run.mark_memory("start")
        if config.options.calibrate_only:
            run.calibrate()
            run.read_settings(None)  # after torch and its OpenMP runtime are loaded
            run.save(complete=True)
            return 0
        model = run.build()
        run.mark_memory("built")
        run.read_settings(model)
        run.calibrate()
        run.compile(model)
        run.wait_for_ranks()
        run.decode(model)
        run.save(complete=True)
        return 0
    except CpuprofError as exc:
        run.progress.done("")
        if exc.exit_code == EXIT_USAGE:  # bad input found here: one line, nothing ran
            print(f"cpuprof: error: {exc}", file=sys.stderr)
            return EXIT_USAGE
        return run.fail(str(exc))
    except (Interrupted, KeyboardInterrupt) as exc:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        name = exc.args[0] if isinstance(exc, Interrupted) else "SIGINT"
        run.progress.done("")
        run.stop_profiler()
        run.save(complete=False, reason=run.failed_reason(f"interrupted by {name}"))
        return EXIT_INTERRUPTED
    except Exception as exc:
        if os.environ.get("CPUPROF_DEBUG"):
            raise
        run.progress.done("")
        return run.fail(f"{type(exc).__name__}: {exc}", debug_hint=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
