"""The decode child: ``python -m cpuprof.launch.child LAUNCH_JSON``.

Started by :mod:`cpuprof.launch.parent` already pinned, memory-bound and with the OpenMP
environment set. It builds the model, reads back the settings actually in force, profiles
prefill and decode, and saves the profile. While decoding it checkpoints every few seconds, and
on SIGINT/SIGTERM it stops the profiler and saves what it has, so an interrupted run is never a
lost run. What it shares with every child (the profiler, settings, saving, endings and their exit
codes) is :class:`cpuprof.launch.child_run.ChildRun`'s.
"""

from __future__ import annotations

if __name__ == "__main__":  # first: a Ctrl-C while the modules below import is held for the run
    from .child_signals import defer

    defer()

import os
import resource
import sys
import time
from pathlib import Path
from typing import Any

from ..model import DecodeWorkload, KvCachePoint, MemoryPoint, ModelInfo, Profile, RankInfo
from ..units import fmt_params
from ..workload.figures import step_figures
from .child_run import ChildRun, child_main
from .options import ChildConfig


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def rss_bytes() -> int:
    """Resident memory now (statm's second field, in pages)."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * resource.getpagesize()


MAX_MEMORY_POINTS = 4096  # the RSS timeline keeps the first this many points (one per decode step)


class DecodeRun(ChildRun):
    """A decode: the model built, the settings read back, the roofs measured, prefill and decode
    profiled (the base, :class:`~cpuprof.launch.child_run.ChildRun`, saves and ends it)."""

    work = "decoding"

    def __init__(self, config: ChildConfig) -> None:
        super().__init__(config.out, config.options.profile, config.requested, config.cpu_set, config.topology,
                         checkpoint_s=config.options.checkpoint_s)
        self.config = config
        self.options = config.options
        self.wl = config.options.workload
        self.latencies: list[float] = []
        self.decoding: Any = None  # the model being decoded, once decoding starts
        self.decoded = False  # the decode ran to its end: its own figures are the workload's
        self.workload: DecodeWorkload | None = None
        self.rss_timeline: list[MemoryPoint] = []
        self.all_reduce: Any = None  # a tensor-parallel rank's AllReduceRecorder

    def steps(self) -> None:
        self.check_events()
        self.mark_memory("start")
        if self.options.calibrate_only:
            self.calibrate()
            self.stage = "reading the settings in force"
            self.read_settings()  # after torch and its OpenMP runtime are loaded
            return
        with self.progress.keep_alive(lambda: self.stage):  # nothing is profiled before decoding starts
            model = self.build()
            self.mark_memory("built")
            self.stage = "reading the settings in force"
            self.read_settings(model.parameter_tensors())
            self.calibrate()
            self.compile(model)
            self.wait_for_ranks()
        self.decode(model)

    # -- steps ----------------------------------------------------------------------------------
    def check_events(self) -> None:
        """A typo in --events fails now, not after minutes of building the model."""
        self.stage = "setting up the profiler"
        # A checkpoint's own model marks no regions: its modules do (named once the model is loaded).
        self.make_profiler(modules=bool(self.wl.hf))

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
            params = model.param_count()  # counted before quantizing: the checkpoint's parameters
            quant = self.wl.weight_quant()
            if quant.quantized:
                self.quantize(model, quant)
            info = ModelInfo(name=model.name, source=str(Path(self.wl.hf).resolve()), architecture=model.architecture,
                             dtype=self.wl.dtype, params=params, weight_bytes=model.weight_bytes(),
                             model_type=model.model_type, quant=quant)
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
            quant = self.wl.weight_quant()
            if quant.quantized:
                self.quantize(model, quant)
            info = ModelInfo(name=cfg.name, source="built-in random weights", architecture="built-in Llama",
                             dtype=self.wl.dtype, params=cfg.param_count(),
                             weight_bytes=cfg.weight_bytes(dtype_bytes(self.wl.dtype), quant), config=cfg,
                             quant=quant)
        build_s = time.perf_counter() - started
        self.workload = DecodeWorkload(model=info, batch=self.wl.batch, prompt_len=self.wl.prompt_len,
                                       new_tokens=self.wl.new_tokens, warmup_steps=self.wl.warmup,
                                       sampling=self.wl.sampling, build_s=build_s)
        rank = self.config.rank
        if rank is not None:
            self.workload.rank = RankInfo(mode=rank.mode, rank=rank.rank, world_size=rank.world_size,
                                          backend=rank.backend, cpus=list(rank.cpus))
        self.progress.done(f"built {info.name} in {build_s:.1f} s" + (" (with its quantization)" if info.quant.quantized
                                                                       else ""))
        return model

    def quantize(self, model: Any, quant: Any) -> None:
        """The built-in model's projections and lm_head, or a checkpoint's nn.Linear layers, quantized."""
        from ..workload.hf import HFModel, quantize_hf
        from ..workload.llama import quantize_model

        self.stage = f"quantizing the model to {quant.mode}"

        def on_layer(done: int, total: int) -> None:
            self.progress.show(f"quantizing the projections to {quant.mode}: layer {done}/{total}", phase="build")

        started = time.perf_counter()
        if isinstance(model, HFModel):
            self.progress.show(f"quantizing the checkpoint's nn.Linear layers to {quant.mode} ...", phase="build")
            what = f"the checkpoint's {quantize_hf(model, quant)} nn.Linear layers"
        else:
            quantize_model(model, quant, progress=on_layer)
            what = "the projections and lm_head"
        self.progress.done(f"quantized {what} to {quant.mode} ({quant.describe()}) in "
                           f"{time.perf_counter() - started:.1f} s")

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

    def mark_memory(self, phase: str) -> None:
        """One point of the RSS timeline; cheap (one /proc read) and never inside a timed step."""
        if len(self.rss_timeline) < MAX_MEMORY_POINTS:
            elapsed = round(time.monotonic() - self.started, 4)
            self.rss_timeline.append(MemoryPoint(time_s=elapsed, rss_bytes=rss_bytes(), phase=phase))

    def calibrate(self) -> None:
        """The machine's roofs at this run's threads and CPUs, from the cache or measured now, before
        the profiler starts (the measurement is not part of the profile)."""
        from ..machine import roofs
        from ..model.workload import QUANT_WEIGHT_CODES, ROOF_DTYPES

        mode = self.options.roofs
        # A decode without its profile shows no roof, judges no GEMM and gives no ceiling: it neither
        # measures nor probes them (a calibration is a run without a profile that is nothing but them).
        if mode == "off" or not (self.options.profile.enabled or self.options.calibrate_only):
            return
        self.stage = "measuring the machine's roofs"
        # The run's CPU set, not this thread's affinity: bound runs pin each thread to one CPU.
        cpus = sorted(self.config.requested.cpus or os.sched_getaffinity(0))
        quant = self.wl.weight_quant()
        kernels = [] if not quant.quantized or self.options.calibrate_only else [
            roofs.QuantKernel(ROOF_DTYPES[self.wl.dtype], QUANT_WEIGHT_CODES[quant.mode], quant.groups)]
        measured, notes = roofs.ensure(self.config.threads, cpus, force=mode == "remeasure",
                                       progress=lambda line: self.progress.show(line, phase="calibrate"),
                                       quant_kernels=kernels, keep_cached=mode == "cached",
                                       # The ranks of a group start together: each probe would read the others'.
                                       probe_memory=self.config.rank is None)
        for note in notes:
            self.progress.done(f"note: {note}")
        # Kept for the report, but for why the roofs were not cached: the report says that from the roofs.
        measured.errors.extend(note for note in notes if note != roofs.not_cached_because(measured)
                               and not note.startswith(roofs.PROBE_NOTE))
        self.roofs = measured
        if measured.from_cache:
            checked = measured.probe
            probed = (f"; a probe of the memory now read {checked.gb_per_s:.1f} GB/s: {checked.outcome}"
                      if checked is not None else "")
            self.progress.done(f"machine roofs from the cache (measured {measured.measured[:10]}, "
                               f"{measured.seconds:.1f} s{probed}; re-measure with: python -m cpuprof calibrate)")
        else:
            refused = any("not cached" in note or "cannot write" in note for note in notes)
            kept = "not cached: see the note above" if refused else "cached for the next runs"
            self.progress.done(f"measured the machine's roofs in {measured.seconds:.1f} s ({kept})")

    def decode(self, model: Any) -> None:
        from ..workload import run_decode
        from ..workload.hf import run_hf_decode

        assert self.workload is not None
        wl = self.workload
        total = self.wl.new_tokens
        self.decoding = model

        def on_step(index: int, latency_s: float, steps: int) -> None:
            self.latencies.append(latency_s)
            self.mark_memory(f"step {index + 1}")
            wl.steps_done = len(self.latencies)
            recent = self.latencies[-5:]
            rate = self.wl.batch * len(recent) / sum(recent)
            self.progress.show(f"decoding: step {index + 1}/{steps}, {rate:.2f} tokens/s (last {len(recent)} steps)",
                               phase="decode")
            self.checkpoint_if_due()

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
        self.probe_memory_at_end(result.decode_wall_s)
        wl.steps_done = len(result.step_latencies_s)
        wl.step_latencies_s = list(result.step_latencies_s)
        wl.ttft_s = result.ttft_s
        wl.decode_wall_s = result.decode_wall_s
        wl.figures = result.figures
        self.decoded = True
        wl.bytes_read_per_token = result.bytes_read_per_token
        wl.bytes_read_method = result.bytes_read_method
        wl.prompt_ids = result.prompt_ids
        wl.output_ids = result.generated_ids
        wl.peak_rss_bytes = peak_rss_bytes()
        wl.kv_cache = [KvCachePoint(position=p, bytes=b) for p, b in result.kv_cache]
        self.progress.done(f"decoded {total} tokens: {result.tokens_per_s:.2f} tokens/s after "
                           f"{self.wl.warmup} warm-up steps")

    def probe_memory_at_end(self, decode_s: float) -> None:
        """After a long decode, whether the memory is still in the state its roof was measured or
        probed in: a change during the run is said, with both figures (shares of the roof are then
        uncertain by the difference)."""
        from ..machine import roofs

        if self.roofs is None or self.config.rank is not None or decode_s < roofs.end_probe_after_s():
            return
        checked = roofs.probe_at_end(self.roofs, lambda line: self.progress.show(line, phase="calibrate"))
        self.roofs.end_probe = checked
        if checked is not None and checked.outcome == "changed":
            self.progress.done(f"note: at the end of the decode the memory read {checked.gb_per_s:.1f} GB/s, "
                               f"{checked.ratio:.0%} of the {checked.cached_gb_per_s:.1f} GB/s roof it was judged "
                               "against: it changed state during the run")

    # -- output ---------------------------------------------------------------------------------
    def contribute(self, profile: Profile, complete: bool) -> None:
        if self.workload is not None:
            if not complete:
                self.workload.steps_done = len(self.latencies)
                self.workload.step_latencies_s = list(self.latencies)
                self.workload.figures = step_figures(self.latencies, self.wl.warmup, self.wl.batch)
                self.count_bytes_of_a_cut_short_decode()
            self.workload.peak_rss_bytes = peak_rss_bytes()
            self.workload.rss_timeline = list(self.rss_timeline)
            if self.all_reduce is not None:
                self.workload.collectives = self.all_reduce.record
        profile.workload = self.workload

    def count_bytes_of_a_cut_short_decode(self) -> None:
        """The bytes a token read over the steps a cut-short decode measured, as its end would have
        counted them, so its figures and its ceiling agree; the built-in model's only (an HF model's
        are counted from its KV cache, which generate() returns only at its end)."""
        assert self.workload is not None
        model = self.decoding
        if model is None or self.wl.hf or self.decoded:
            return
        from ..workload.decode_loop import bytes_read_method, measured_bytes_per_token

        # Counted again at every save: the KV cache each step reads grows with the steps measured.
        self.workload.bytes_read_per_token = measured_bytes_per_token(
            model, model.cfg, self.wl.prompt_len, self.wl.warmup, len(self.latencies), self.wl.batch)
        if self.workload.bytes_read_per_token:
            self.workload.bytes_read_method = bytes_read_method(model)

    def where(self) -> str:
        if self.stage == "decoding":
            return f"after {len(self.latencies)} of {self.wl.new_tokens} decode steps"
        return super().where()

    def close(self) -> None:
        # Never an import: an interrupt inside torch's import leaves torch.distributed loaded in
        # sys.modules (torch imports it on the way) but torch not, and importing torch again fails
        # ("partially initialized module 'torch'"). Only a torch that finished importing has a group
        # (joined in join_tensor_parallel).
        dist = sys.modules.get("torch.distributed")
        if "torch" in sys.modules and dist is not None and dist.is_initialized():
            dist.destroy_process_group()


def main(argv: list[str]) -> int:
    return child_main(argv, ChildConfig, DecodeRun)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
