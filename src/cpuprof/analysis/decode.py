"""Decode figures (throughput, latency, memory traffic) and the settings they were measured under."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from ..model import DecodeWorkload, FrontEndGivenBack, InForce, MemPolicy, Settings, format_cpulist
from ..units import fmt_bytes, fmt_params, fmt_percent, fmt_rate


@dataclass
class DecodeFigures:
    tokens_per_s: float | None
    effective_gb_per_s: float | None  # bytes_read_per_token x tokens/s: the bandwidth decoding implies


def decode_figures(wl: DecodeWorkload) -> DecodeFigures:
    tps = wl.figures.tokens_per_s if wl.figures else None
    # bytes_read_per_token is already per token (a step's bytes divided by the batch) and tokens/s
    # already counts every sequence: their product is bytes per second, with no batch left over.
    gbs = wl.bytes_read_per_token * tps / 1e9 if tps and wl.bytes_read_per_token else None
    return DecodeFigures(tokens_per_s=tps, effective_gb_per_s=gbs)


def decode_lines(wl: DecodeWorkload) -> list[str]:
    m = wl.model
    stored = (f", projections and lm_head quantized weight-only ({m.quant.describe()}; the embedding and norms in "
              f"{m.dtype})" if m.quant.quantized else "")
    lines = [f"{m.name}: {m.architecture}, {fmt_params(m.params)} parameters in {m.dtype}{stored} "
             f"({fmt_bytes(m.weight_bytes)} of weights), {m.source}",
             f"batch {wl.batch}, prompt {wl.prompt_len} tokens, {wl.new_tokens} decode steps "
             f"({wl.steps_done} done, the first {wl.warmup_steps} not measured)"]
    if wl.rank is not None:
        r = wl.rank
        if r.mode == "tp":
            lines.append(f"tensor-parallel rank {r.rank} of {r.world_size} ({r.backend}): this process holds 1/"
                         f"{r.world_size} of every layer's heads and MLP width, and the figures below are its own; "
                         "the group's report, with the all-reduces and the wait for the other ranks, is the report "
                         "of the directory above this one's")
        else:
            lines.append(f"instance {r.rank} of {r.world_size} decoding side by side; the group's report is the report "
                         "of the directory above this one's")
    f = wl.figures
    figures = decode_figures(wl)
    if f is not None:
        lines.append(f"throughput {fmt_rate(f.tokens_per_s)} tokens/s over {f.measured_steps} measured steps "
                     f"(x{wl.batch} sequences); step latency p50 {f.p50_ms:.1f} ms, p90 {f.p90_ms:.1f} ms, "
                     f"p99 {f.p99_ms:.1f} ms" + (f"; time to first token {wl.ttft_s * 1e3:.1f} ms"
                                                 if wl.ttft_s is not None else ""))
    else:
        lines.append("throughput: no decode step was measured")
    if wl.bytes_read_per_token and figures.effective_gb_per_s is not None:
        lines.append(f"memory traffic: {fmt_bytes(wl.bytes_read_per_token)} read per token x "
                     f"{fmt_rate(figures.tokens_per_s or 0)} tokens/s = {figures.effective_gb_per_s:.1f} GB/s "
                     f"effective ({wl.bytes_read_method})")
    extra = []
    if wl.peak_rss_bytes:
        extra.append(f"peak RSS {fmt_bytes(wl.peak_rss_bytes)}")
    if wl.build_s is not None:
        extra.append(f"model built in {wl.build_s:.1f} s")
    if wl.compile_s is not None:
        extra.append(f"compiled with torch.compile (inductor, frozen weights) in {wl.compile_s:.1f} s, before the "
                     "profile; ops fused into compiled kernels are not ATen ops and show as time between ops")
    if extra:
        lines.append("; ".join(extra))
    return lines


def settings_lines(settings: Settings) -> list[str]:
    r = settings.requested
    force = settings.in_force
    if force is None:
        return [f"asked: {r.threads} threads on CPUs {format_cpulist(r.cpus)} ({settings.cpu_set}), OpenMP {r.omp}, "
                f"memory policy {r.mempolicy.mode}; not read back (the run ended before that)"]
    n = force.torch.num_threads if force.torch else None
    torch_threads = f"{n} torch thread{'s' if n != 1 else ''}" if n is not None else "torch threads unknown"
    policy = _policy_text(force.mempolicy)
    omp = force.openmp.active.runtime if force.openmp.active else "unknown"
    allocators = ", ".join(a.allocator for a in force.allocators) or "glibc malloc"
    lines = [f"{torch_threads}; CPU set {settings.cpu_set}; OpenMP {omp}; memory policy {policy}; "
             f"allocator {allocators}"]
    env = {k: v for k, v in force.env.items() if k != "LD_PRELOAD"}
    if env:
        lines.append("env: " + " ".join(f"{k}={v}" for k, v in env.items()))
    if force.env.get("LD_PRELOAD"):
        lines.append(f"preloaded: {force.env['LD_PRELOAD']}")
    pages = force.weight_pages
    if pages and pages.nodes:
        total = sum(pages.nodes.values())
        share = ", ".join(f"node {n}: {fmt_percent(c / total)}" for n, c in sorted(pages.nodes.items()))
        absent = f"; {pages.not_present:,} not yet touched" if pages.not_present else ""
        lines.append(f"weight pages: {share} (of {pages.pages_queried:,} pages sampled{absent})")
    by_affinity: dict[str, list[int]] = defaultdict(list)
    for t in force.threads:
        by_affinity[format_cpulist(t.affinity)].append(t.tid)
    placement = "; ".join(f"{len(tids)} on CPUs {cpus}" for cpus, tids in sorted(by_affinity.items()))
    lines.append(f"thread affinity when read back ({len(force.threads)} threads): {placement}")
    if settings.from_program:
        lines.append("set for it by its program (a process the program starts gets the environment it would have "
                     "had without cpuprof, the launch's variables being the program's process's): "
                     + "; ".join(settings.from_program))
    if settings.given_back:
        lines.append("CPU sets cpuprof gave back, the launch's binding having narrowed them: "
                     + "; ".join(settings.given_back))
    changes = changes_since_start(settings.at_start, force, settings.front_end) if settings.at_start else []
    if changes:
        lines.append(f"changed since its import of torch (by the program or a library it loaded): {'; '.join(changes)}")
    return lines


def _policy_text(policy: MemPolicy) -> str:
    return policy.mode + (f" to node(s) {format_cpulist(policy.nodes)}" if policy.nodes else "")


def changes_since_start(start: InForce, end: InForce, front_end: FrontEndGivenBack | None = None) -> list[str]:
    """What a process changed in its threads, their affinity, its memory policy and its OpenMP
    variables between two reads of its settings (at its import of torch and at its end): a program
    that sets its own (vLLM sizes and binds its OpenMP threads) is then seen to have done so. Not
    cpuprof's own change, the launch's CPU set given to a front end (``front_end``), nor the threads
    started since on that set."""
    changes = []
    if start.torch is not None and end.torch is not None:
        if start.torch.num_threads != end.torch.num_threads:
            changes.append(f"torch threads {start.torch.num_threads} → {end.torch.num_threads}")
        if start.torch.num_interop_threads != end.torch.num_interop_threads:
            changes.append(f"inter-op threads {start.torch.num_interop_threads} → {end.torch.num_interop_threads}")
    # A variable changed after the runtimes read theirs does not change this process's threads: it is
    # what the processes it starts will inherit.
    variables = [f"{key} {'unset' if start.env.get(key) is None else start.env[key]} → "
                 f"{'unset' if end.env.get(key) is None else end.env[key]}"
                 for key in sorted(set(start.env) | set(end.env)) if start.env.get(key) != end.env.get(key)]
    if variables:
        changes.append(f"in its environment, for the processes it starts: {', '.join(variables)}")
    if (start.mempolicy.mode, start.mempolicy.nodes) != (end.mempolicy.mode, end.mempolicy.nodes):
        changes.append(f"memory policy {_policy_text(start.mempolicy)} → {_policy_text(end.mempolicy)}")
    began = {t.tid: t for t in start.threads}
    moved: dict[tuple[str, str], int] = defaultdict(int)
    new: dict[str, int] = defaultdict(int)
    for thread in end.threads:
        before_thread = began.get(thread.tid)
        if before_thread is None:
            new[format_cpulist(thread.affinity)] += 1
        elif front_end is not None and (before_thread.affinity, thread.affinity) == (front_end.cpus_from,
                                                                                   front_end.cpus_to):
            continue
        elif before_thread.affinity != thread.affinity:
            moved[(format_cpulist(before_thread.affinity), format_cpulist(thread.affinity))] += 1
    for (before_cpus, after_cpus), count in sorted(moved.items()):
        changes.append(f"{count} thread{'s' if count != 1 else ''} moved from CPUs {before_cpus} to CPUs {after_cpus}")
    process_cpus = {format_cpulist(t.affinity) for t in start.threads if t.tid == start.pid}
    if front_end is not None:
        process_cpus.add(format_cpulist(front_end.cpus_to))
    if new and set(new) - process_cpus:  # threads started since, on CPUs other than the process's at start
        placed = ", ".join(f"{count} on CPUs {cpus}" for cpus, count in sorted(new.items()))
        changes.append(f"threads started since and alive at the end: {placed}")
    if start.openmp.active is not None and end.openmp.active is not None \
            and start.openmp.active.runtime != end.openmp.active.runtime:
        changes.append(f"OpenMP runtime {start.openmp.active.runtime} → {end.openmp.active.runtime}")
    return changes
