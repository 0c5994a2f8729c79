"""A configuration sweep's report: the figures each run measured, the ranking, whether the best
beats the baseline beyond the noise, and which measured differences explain it.

``run_metrics`` reduces one run's profile to the figures a sweep keeps (``group_metrics`` the
profiles of a run of several processes); ``comparison_report``
turns a whole :class:`~cpuprof.model.compare.Comparison` into a report any renderer lays out.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ..model import CPU_EVENT, SAMPLED, Profile
from ..model.compare import Comparison, RunMetrics, SweepConfig
from ..model.ranks import MultiRun
from ..safe_text import cpuprof_command
from ..units import fmt_percent
from .report_model import Column, Report, Section, Table
from .stats import SIGNIFICANCE, Summary, WelchResult, summarize, welch_test

# A metric must change by this much (relative) between two configurations to be named as a cause.
MIN_EXPLAINING_CHANGE = 0.25
MAX_EXPLANATIONS = 4
# Spin and sleep shares come from samples: below this many samples in ops (a run of a fraction of
# a second) their noise is larger than the differences between configurations, so none is given.
MIN_SAMPLES_FOR_SHARES = 300


def run_metrics(profile: Profile) -> RunMetrics | None:
    """The figures one decode run contributes to a sweep; None when it measured no decode step."""
    wl = profile.workload
    if wl is None or wl.figures is None:
        return None
    measured = [s * 1e3 for s in wl.step_latencies_s[wl.warmup_steps:]]
    m = RunMetrics(tokens_per_s=wl.figures.tokens_per_s, step_ms=measured, ttft_s=wl.ttft_s,
                   p50_ms=wl.figures.p50_ms, p99_ms=wl.figures.p99_ms, profiled=profile.profiled)
    if wl.collectives is None:
        m.all_reduce_share = 0.0  # one process, or an independent instance: nothing to reduce
    if wl.bytes_read_per_token:
        m.bytes_per_token = wl.bytes_read_per_token
        m.gb_per_s = wl.bytes_read_per_token * wl.figures.tokens_per_s / 1e9
    in_force = profile.settings.in_force if profile.settings else None
    if in_force is not None and in_force.torch is not None:
        m.threads = in_force.torch.num_threads
    roofs = profile.roofs
    if roofs is not None:
        m.memory_roof_gb_per_s, m.roofs_from_cache = roofs.memory_gb_per_s(), roofs.from_cache
        # A probe recorded with roofs this run measured anew is this run's only where it made them remeasure.
        if roofs.probe is not None and (roofs.from_cache or roofs.probe.outcome == "remeasured"):
            m.probe_gb_per_s, m.probe_outcome = roofs.probe.gb_per_s, roofs.probe.outcome
        if roofs.end_probe is not None:
            m.end_probe_gb_per_s, m.end_probe_outcome = roofs.end_probe.gb_per_s, roofs.end_probe.outcome
    if not profile.profiled or profile.collection is None:
        return m
    tokens = wl.steps_done * wl.batch
    wall = profile.collection.wall_ns
    from .threads import compute_team

    team = compute_team(profile)  # not a communication backend's threads, which wait by design
    working = [profile.threads[i] for i in team]
    if tokens:
        for event, attr in (("context-switches", "switches_per_token"), ("cpu-migrations", "migrations_per_token")):
            if profile.has_event(event):
                setattr(m, attr, sum(t.counters.get(event, 0) for t in profile.threads) / tokens)
    delays = [t.run_delay_ns for t in working if t.run_delay_ns is not None]
    if delays and wall:
        m.run_delay_share = sum(delays) / (wall * len(delays))
    from .contention import analyse

    contention = analyse(profile)
    sampled_enough = (profile.collection.mode != SAMPLED
                      or sum(op.samples for op in profile.ops) >= MIN_SAMPLES_FOR_SHARES)
    if contention is not None and contention.ops and contention.team and sampled_enough:
        team_time = sum(o.wall_ns for o in contention.ops) * contention.team
        if team_time:
            m.spin_share = contention.spin_ns / team_time
        # Off CPU from the totals: summing each op's max(0, wall - sampled CPU) keeps every op's
        # sampling noise on one side only (a one-thread decode of short ops showed 17% "sleep" for
        # 3% run-queue delay); the difference of the sums carries no such bias.
        counted = [o for o in contention.ops if CPU_EVENT in o.op.counters_self]
        counted_time = sum(o.wall_ns for o in counted) * contention.team
        if counted_time:
            cpu = sum(o.op.counters_self[CPU_EVENT][k] for o in counted for k in team
                      if k < len(o.op.counters_self[CPU_EVENT]))
            m.sleep_share = max(0.0, counted_time - cpu) / counted_time
    from .ceiling import decode_ceiling

    ceiling = decode_ceiling(profile)
    if ceiling is not None:
        m.bandwidth_share = ceiling.share
    return m


def group_metrics(run: MultiRun, profiles: list[Profile | None]) -> RunMetrics | None:
    """The figures of one run of several processes (``decode --tp N`` / ``--instances N``); None
    when a rank measured no decode step.

    Tensor-parallel ranks decode the same tokens in lockstep: the group's speed, latencies and
    time to first token are its slowest rank's (as in the merged report), its switches and
    migrations per token add up over the ranks, and its all-reduce share is the ranks' mean.
    Instances decode on their own: the group's tokens/s is their sum, its step latencies every
    instance's steps pooled (the latency one stream sees), its time to first token their mean.
    Spin, sleep and run-queue shares are the mean over ranks (their teams are one size). The
    share of the bandwidth roof is left out: each rank's roof was measured on its own CPUs alone,
    so the group's traffic has no measured roof to be a share of.
    """
    per_rank = [run_metrics(p) if p is not None else None for p in profiles]
    ranks = [m for m in per_rank if m is not None]
    if not ranks or len(ranks) != len(per_rank):
        return None
    lead = ranks[0]
    if run.mode == "tp":
        from .ranks import group_figures

        lead = min(ranks, key=lambda r: r.tokens_per_s)
        m = RunMetrics(tokens_per_s=lead.tokens_per_s, step_ms=list(lead.step_ms), ttft_s=lead.ttft_s,
                       p50_ms=lead.p50_ms, p99_ms=lead.p99_ms)
        per_token = _sum  # every rank's switches happen for the same tokens
        splits = [f.split for f in group_figures(run, profiles).ranks]
        m.all_reduce_share = _all_or_none([s.all_reduce_ns / s.step_ns if s is not None and s.step_ns else None
                                           for s in splits], _mean)
    else:
        steps = [s for r in ranks for s in r.step_ms]
        p50, p99 = (float(v) for v in np.percentile(np.asarray(steps), [50, 99])) if steps else (0.0, 0.0)
        m = RunMetrics(tokens_per_s=sum(r.tokens_per_s for r in ranks), step_ms=steps,
                       ttft_s=_mean([r.ttft_s for r in ranks]), p50_ms=p50, p99_ms=p99)
        per_token = _mean  # each instance's per its own tokens; every instance makes as many
        m.all_reduce_share = 0.0
    m.profiled = all(r.profiled for r in ranks)
    m.threads = lead.threads
    # Every rank reads its own bytes: a tensor-parallel token reads all ranks' shards, an instance's its own.
    m.bytes_per_token = _all_or_none([r.bytes_per_token for r in ranks], _sum if run.mode == "tp" else _mean)
    m.gb_per_s = _all_or_none([r.gb_per_s for r in ranks], _sum)
    for key in ("spin_share", "sleep_share", "run_delay_share"):
        setattr(m, key, _all_or_none([getattr(r, key) for r in ranks], _mean))
    for key in ("switches_per_token", "migrations_per_token"):
        setattr(m, key, _all_or_none([getattr(r, key) for r in ranks], per_token))
    return m


def _sum(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return sum(present) if present else None


def _all_or_none(values: list[float | None], combine: Callable[[list[float | None]], float | None]) -> float | None:
    """A group figure only from every rank's: a rank without it would bias the sum or the mean."""
    return None if any(v is None for v in values) else combine(values)


@dataclass
class ConfigSummary:
    index: int
    config: SweepConfig
    tokens_per_s: Summary
    p50_ms: float | None  # over every measured step of every run of the configuration
    p99_ms: float | None
    ttft_s: float | None  # mean
    failed: int
    errors: list[str]
    metrics: dict[str, float | None]  # the explaining metrics, mean over runs

    @property
    def ok(self) -> bool:
        return self.tokens_per_s.n > 0


# The metrics that explain a difference: key, what it is, whether it is a share (else a rate), and
# the least absolute change that can explain anything (0.03 against 0 migrations per token does not).
EXPLAINING = (
    ("spin_share", "spin (threads on CPU waiting in the OpenMP runtime, of the team's op time)", True, 0.02),
    ("sleep_share", "sleep (threads off CPU while an op ran, of the team's op time)", True, 0.02),
    ("run_delay_share", "run-queue delay (runnable threads waiting for a CPU, of threads × wall)", True, 0.02),
    ("switches_per_token", "context switches per token", False, 2.0),
    ("migrations_per_token", "CPU migrations per token", False, 0.5),
    ("bandwidth_share", "share of the memory-bandwidth ceiling reached", True, 0.02),
    ("all_reduce_share", "all-reduces (tensor-parallel ranks summing partial results, waiting for the slowest "
                         "included), of each step", True, 0.02),
)


# Figures a swept axis's mechanism is shown by, never named as a cause on their own.
MECHANISM_ONLY = ("bytes_per_token", "gb_per_s")


def _mean(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return sum(present) / len(present) if present else None


def summarize_configs(comparison: Comparison) -> list[ConfigSummary]:
    out = []
    for i, config in enumerate(comparison.configs):
        runs = comparison.done_runs(i)
        metrics = [r.metrics for r in runs if r.metrics is not None]
        steps = [s for m in metrics for s in m.step_ms]
        p50 = p99 = None
        if steps:
            p50, p99 = (float(v) for v in np.percentile(np.asarray(steps), [50, 99]))
        failed = [r for r in comparison.runs if r.config == i and r.status == "failed"]
        out.append(ConfigSummary(
            index=i, config=config, tokens_per_s=summarize([m.tokens_per_s for m in metrics]),
            p50_ms=p50, p99_ms=p99, ttft_s=_mean([m.ttft_s for m in metrics]),
            failed=len(failed), errors=sorted({r.error or "failed" for r in failed}),
            metrics={key: _mean([getattr(m, key) for m in metrics]) for key in (*(k for k, *_ in EXPLAINING),
                                                                                 *MECHANISM_ONLY)},
        ))
    return out


@dataclass
class Verdict:
    best: ConfigSummary
    baseline: ConfigSummary
    other: ConfigSummary  # what the best is tested against: the baseline, or the runner-up when they are one
    change: float  # relative tokens/s change of the best against ``other``
    test: WelchResult | None  # None: too few repetitions to test
    explanations: list[str]
    causes: list[str] = field(default_factory=list)  # what the two configurations differ in, and its mechanism
    small: list[str] = field(default_factory=list)  # figures that differ, but by too little to explain anything

    @property
    def line(self) -> str:
        best, other = self.best, self.other
        if best.index == other.index:
            return f"{best.config.label} is the only configuration that finished"
        figures = f"{best.tokens_per_s.mean:.2f} against {other.tokens_per_s.mean:.2f} tokens/s"
        if best.index == self.baseline.index:
            head = (f"the baseline ({best.config.label}) is the fastest configuration, {fmt_percent(self.change)} "
                    f"ahead of the runner-up ({other.config.label}): {figures}")
        else:
            head = (f"{best.config.label} is {fmt_percent(abs(self.change))} faster than the baseline "
                    f"({other.config.label}): {figures}")
        return head + "; " + significance_text(self.test, best, other)


def significance_text(test: WelchResult | None, a: ConfigSummary, b: ConfigSummary) -> str:
    if test is None:
        return (f"not tested for noise: Welch's t-test needs at least 2 runs of each ({a.tokens_per_s.n} and "
                f"{b.tokens_per_s.n}); use -r 3 or more")
    words = "beyond the noise" if test.significant else "within the noise"
    return (f"{words} (Welch's t-test over {a.tokens_per_s.n} and {b.tokens_per_s.n} runs: p = {test.p:.3g}, "
            f"{'<' if test.significant else '>='} {SIGNIFICANCE})")


def explain(best: ConfigSummary, other: ConfigSummary, cited: set[str] | frozenset[str] = frozenset()) -> list[str]:
    """The explaining metrics that differ most between two configurations, biggest change first; with
    them the bytes a token reads and the memory traffic where they differ and no swept axis's line
    (``cited``) quotes them already, so "no other figure differs" is never said of a figure that does."""
    changes = []
    for key, what, _share, least in EXPLAINING:
        a, b = best.metrics.get(key), other.metrics.get(key)
        if a is None or b is None or abs(a - b) < least:
            continue
        base = max(abs(a), abs(b))
        if base == 0 or abs(a - b) / base < MIN_EXPLAINING_CHANGE:
            continue
        changes.append((abs(a - b) / base, f"{what}: {_figure(key, b)} in {other.config.label}, "
                                           f"{_figure(key, a)} in {best.config.label}"))
    for key in MECHANISM_ONLY:
        a, b = best.metrics.get(key), other.metrics.get(key)
        if key in cited or a is None or b is None or not max(a, b):
            continue
        change = abs(a - b) / max(abs(a), abs(b))
        if change >= MIN_EXPLAINING_CHANGE:
            changes.append((change, f"{_label(key)}: {_value(key, b)} in {other.config.label}, "
                                    f"{_value(key, a)} in {best.config.label}"))
    changes.sort(key=lambda c: c[0], reverse=True)
    return [text for _, text in changes[:MAX_EXPLANATIONS]]


def small_differences(best: ConfigSummary, other: ConfigSummary, base: dict[str, str] | None = None) -> list[str]:
    """The metrics that changed by MIN_EXPLAINING_CHANGE or more but by less than the least change that
    can explain anything, and that no swept axis's line gives already: named, so "nothing differs
    enough" is not read as "nothing differs"."""
    cited = _cited(best, other, base or {})
    out = []
    for key, what, _share, least in EXPLAINING:
        a, b = best.metrics.get(key), other.metrics.get(key)
        if key in cited or a is None or b is None or abs(a - b) >= least:
            continue
        larger = max(abs(a), abs(b))
        if larger and abs(a - b) / larger >= MIN_EXPLAINING_CHANGE:
            out.append(f"{what} {_figure(key, b)} against {_figure(key, a)} (a difference below {_figure(key, least)})")
    return out


def _figure(key: str, value: float) -> str:
    share = next(s for k, _what, s, _least in EXPLAINING if k == key)
    return fmt_percent(value) if share else f"{value:,.1f}"


# What each swept axis changes in a decode, and the measured figures that show that mechanism at work.
# Decoding one token reads every weight once, so an axis that changes the bytes a token reads changes
# tokens/s by about as much where memory binds; the others change how the cores share that work.
MECHANISMS: dict[str, tuple[str, tuple[str, ...]]] = {
    "threads": ("each GEMV's rows are split over that many cores, which together reach more memory bandwidth "
                "until it saturates, and wait for each other at every op's barrier", ("gb_per_s", "spin_share",
                                                                                      "run_delay_share")),
    "omp": ("the OpenMP runtime: how its threads wait at the barrier that ends each op (spinning on CPU, or "
            "asleep)", ("spin_share", "sleep_share", "switches_per_token")),
    "blocktime": ("how long an idle OpenMP thread spins before it sleeps", ("spin_share", "sleep_share",
                                                                            "switches_per_token")),
    "bind": ("where the threads run: pinned to cores or left to the scheduler", ("migrations_per_token",
                                                                               "run_delay_share", "gb_per_s")),
    "numa": ("which node's cores and memory the decode uses", ("gb_per_s", "bandwidth_share")),
    "allocator": ("the memory allocator, which cpuprof measures no figure of its own for", ("switches_per_token",)),
    "dtype": ("the bytes of each weight, which every token reads once", ("bytes_per_token", "gb_per_s")),
    "quant": ("the bytes of each weight, which every token reads once (and the work of unpacking them)",
              ("bytes_per_token", "gb_per_s")),
    "batch": ("the tokens one read of the weights serves", ("bytes_per_token", "gb_per_s")),
    "compile": ("torch.compile: fused kernels and prepacked weights, fewer ops between them", ("gb_per_s",
                                                                                              "spin_share")),
    "tp": ("the weights split over ranks, each reading its share, with an all-reduce each layer",
           ("all_reduce_share", "gb_per_s")),
    "instances": ("independent copies decoding at once, sharing the memory bandwidth", ("gb_per_s",
                                                                                       "run_delay_share")),
}


def _label(key: str) -> str:
    if key == "bytes_per_token":
        return "bytes read per token"
    if key == "gb_per_s":
        return "memory traffic"
    return next(w for k, w, _s, _least in EXPLAINING if k == key).split(" (")[0]


def _value(key: str, value: float) -> str:
    if key == "bytes_per_token":
        return f"{value / 1e9:.2f} GB"
    if key == "gb_per_s":
        return f"{value:.1f} GB/s"
    return _figure(key, value)


# An axis's value where a configuration left it as the profile had it and the text of that value is
# not known (a runtime's own default).
AS_PROFILED = "as profiled"


def causes(best: ConfigSummary, other: ConfigSummary, base: dict[str, str] | None = None) -> list[str]:
    """What the two configurations differ in, each with the mechanism it changes and the figures that
    measure that mechanism in both: the cause of a difference, before any figure that merely differs.
    ``base``: the baseline configuration's values, for an axis one of them leaves as it was (compare
    --from: each proposal changes one setting of the profile's own)."""
    lines = []
    base = base or {}
    for axis in dict.fromkeys([*best.config.values, *other.config.values]):
        value = best.config.values.get(axis, base.get(axis, AS_PROFILED))
        was = other.config.values.get(axis, base.get(axis, AS_PROFILED))
        if was == value:
            continue
        mechanism, keys = MECHANISMS.get(axis, (f"the {axis}", ("gb_per_s",)))
        measured = []
        for key in keys:
            a, b = best.metrics.get(key), other.metrics.get(key)
            if a is not None and b is not None:
                measured.append(f"{_label(key)} {_value(key, b)} → {_value(key, a)}")
        line = f"{axis} {was} → {value}: {mechanism}"
        predicted = _bytes_prediction(best, other) if "bytes_per_token" in keys else None
        if measured:
            line += "; measured: " + ", ".join(measured)
        if predicted:
            line += f"; {predicted}"
        lines.append(line)
    return lines


def _bytes_prediction(best: ConfigSummary, other: ConfigSummary) -> str | None:
    """Where the bytes a token reads changed: the tokens/s change they predict for a memory-bound decode,
    beside the measured one."""
    a, b = best.metrics.get("bytes_per_token"), other.metrics.get("bytes_per_token")
    if not a or not b or not other.tokens_per_s.mean:
        return None
    measured = best.tokens_per_s.mean / other.tokens_per_s.mean
    return (f"reading {b / a:.2f}x {'fewer' if a < b else 'more'} bytes per token predicts {b / a:.2f}x the tokens/s "
            f"where memory binds; measured {measured:.2f}x")


def verdict(comparison: Comparison, summaries: list[ConfigSummary] | None = None) -> Verdict | None:
    """The best configuration against the baseline (or, when the baseline wins, against the runner-up)."""
    summaries = summaries if summaries is not None else summarize_configs(comparison)
    ranked = sorted((s for s in summaries if s.ok), key=lambda s: s.tokens_per_s.mean, reverse=True)
    if not ranked:
        return None
    best = ranked[0]
    baseline = summaries[comparison.baseline]
    other = baseline if baseline.ok and baseline.index != best.index else (ranked[1] if len(ranked) > 1 else best)
    test = welch_test(_values(comparison, best.index), _values(comparison, other.index)) if other is not best else None
    change = best.tokens_per_s.mean / other.tokens_per_s.mean - 1.0 if other.tokens_per_s.mean else 0.0
    if other is best:
        return Verdict(best, baseline, other, change, test, [])
    base = baseline.config.values
    found = causes(best, other, base)
    return Verdict(best, baseline, other, change, test, explain(best, other, _cited(best, other, base)), found,
                   small_differences(best, other, base))


def _cited(best: ConfigSummary, other: ConfigSummary, base: dict[str, str]) -> set[str]:
    """The figures the lines of ``causes`` quote: those of every axis the two configurations differ in."""
    out: set[str] = set()
    for axis in dict.fromkeys([*best.config.values, *other.config.values]):
        if best.config.values.get(axis, base.get(axis)) != other.config.values.get(axis, base.get(axis)):
            out.update(MECHANISMS.get(axis, ("", ("gb_per_s",)))[1])
    return out


def _values(comparison: Comparison, config: int) -> list[float]:
    return [r.metrics.tokens_per_s for r in comparison.done_runs(config) if r.metrics is not None]


RANKING_COLUMNS = [
    Column("rank", "#", "int", "rank by mean tokens/s (configurations that never finished last)"),
    Column("config", "configuration", "text", "the swept settings; the rest as in the base options"),
    Column("runs", "runs", "int", "repetitions that finished (each a fresh process)"),
    Column("tokens_per_s", "tok/s", "ratio", "decode tokens per second, mean over the runs (with instances=N, "
                                              "the N instances' together)"),
    Column("tokens_per_s_std", "± sd", "ratio", "sample standard deviation of tokens/s over the runs (n - 1)"),
    Column("vs_baseline", "vs base", "text", "mean tokens/s against the baseline configuration's"),
    Column("p50_ns", "p50 step", "ns", "median decode step latency, over every measured step of every run "
                                       "(with instances=N, of every instance: the latency one stream sees)"),
    Column("p99_ns", "p99 step", "ns", "99th-percentile decode step latency, same steps"),
    Column("ttft_ns", "TTFT", "ns", "time to first token (prefill), mean over the runs"),
    Column("spin_share", "spin", "share", "threads on CPU waiting in the OpenMP runtime, of the team's op time"),
    Column("sleep_share", "sleep", "share", "threads off CPU while an op ran, of the team's op time"),
    Column("run_delay_share", "runq", "share", "runnable threads waiting for a CPU (schedstat), of threads × wall"),
    Column("switches_per_token", "cs/tok", "ratio", "context switches of every thread per token"),
    Column("migrations_per_token", "mig/tok", "ratio", "CPU migrations of every thread per token"),
    Column("bandwidth_share", "of BW roof", "share", "tokens/s against the memory-bandwidth ceiling (roofline); "
                                                     "none for several processes (no roof measured for the group)"),
    Column("all_reduce_share", "allreduce", "share", "of each decode step, the time inside all-reduces (tp=N: "
                                                    "the ranks summing partial results, waiting for the slowest "
                                                    "included); 0 for one process"),
    Column("bytes_per_token", "B/tok", "bytes", "the bytes a token reads (weights and KV cache, counted by the "
                                                 "decode), mean over the runs"),
    Column("status", "status", "text", "ok, or how many runs failed (the reasons are listed below the table)"),
]


def ranking_rows(comparison: Comparison, summaries: list[ConfigSummary]) -> list[dict]:
    baseline = summaries[comparison.baseline]
    ranked = sorted(summaries, key=lambda s: (not s.ok, -(s.tokens_per_s.mean if s.ok else 0.0)))
    rows = []
    for rank, s in enumerate(ranked, 1):
        tps = s.tokens_per_s
        vs = None
        if s.ok and baseline.ok and baseline.tokens_per_s.mean:
            vs = "base" if s.index == baseline.index else f"{(tps.mean / baseline.tokens_per_s.mean - 1) * 100:+.1f}%"
        attempted = sum(1 for r in comparison.runs if r.config == s.index and r.status in ("done", "failed"))
        status = "ok" if not s.failed else f"{s.failed} of {attempted} failed"
        if not attempted:
            status = "not run"
        rows.append({
            "rank": rank, "config": s.config.label, "runs": tps.n,
            "tokens_per_s": tps.mean if s.ok else None,
            "tokens_per_s_std": tps.std if s.ok and tps.n > 1 else None,
            "vs_baseline": vs,
            "p50_ns": None if s.p50_ms is None else s.p50_ms * 1e6,
            "p99_ns": None if s.p99_ms is None else s.p99_ms * 1e6,
            "ttft_ns": None if s.ttft_s is None else s.ttft_s * 1e9,
            **{key: s.metrics[key] for key, *_ in EXPLAINING},
            "bytes_per_token": s.metrics.get("bytes_per_token"),
            "status": status,
        })
    return rows


@dataclass
class StepDistribution:
    """Every measured decode step of one configuration, pooled over its finished runs (warm-up left
    out): percentiles by linear interpolation, in milliseconds."""

    config: int  # index into Comparison.configs
    label: str
    steps: int
    fastest_ms: float
    p25_ms: float
    p50_ms: float
    p75_ms: float
    p99_ms: float
    slowest_ms: float


def step_distributions(comparison: Comparison) -> list[StepDistribution]:
    """One per configuration with a measured step, in the sweep's order."""
    out = []
    for i, config in enumerate(comparison.configs):
        steps = [v for r in comparison.done_runs(i) if r.metrics is not None for v in r.metrics.step_ms]
        if steps:
            lo, q1, p50, q3, p99, hi = (float(v) for v in np.percentile(np.asarray(steps), [0, 25, 50, 75, 99, 100]))
            out.append(StepDistribution(i, config.label, len(steps), lo, q1, p50, q3, p99, hi))
    return out


@dataclass
class SweepFigures:
    """What a sweep's charts draw, beside its report's tables (and in the JSON report)."""

    step_distributions: list[StepDistribution]


def roofs_lines(comparison: Comparison) -> list[str]:
    """The memory roofs the runs' ceilings divided by: their range, how each run got its roof (a probe
    before each use of a cached one), and the runs during which the memory changed state (a probe at
    their end), whose shares of the ceiling are then not comparable with the others'."""
    runs = [(comparison.configs[r.config].label, r.repetition, r.metrics) for r in comparison.runs
            if r.status == "done" and r.metrics is not None and r.metrics.memory_roof_gb_per_s]
    if not runs:
        return []
    roofs = [m.memory_roof_gb_per_s for _, _, m in runs if m.memory_roof_gb_per_s]
    outcomes = {"agrees": 0, "remeasured": 0, "kept": 0}
    for _, _, m in runs:
        if m.probe_outcome in outcomes:
            outcomes[m.probe_outcome] += 1
    fresh = sum(1 for _, _, m in runs if m.roofs_from_cache is False and m.probe_outcome is None)
    unprobed = sum(1 for _, _, m in runs if m.roofs_from_cache and m.probe_outcome is None)
    how = [f"{n} from the cache after a probe of the memory agreed" for n in [outcomes["agrees"]] if n]
    how += [f"{n} from the cache unprobed (the probe could not run)" for n in [unprobed] if n]
    how += [f"{n} measured again because the probe disagreed (the memory was in another state)"
            for n in [outcomes["remeasured"]] if n]
    how += [f"{n} measured for the run" for n in [fresh] if n]
    how += [f"{n} kept from the cache although the probe disagreed (--roofs cached)" for n in [outcomes["kept"]] if n]
    spans = []
    for label in dict.fromkeys(label for label, _, _ in runs):
        own = [m.memory_roof_gb_per_s for lab, _, m in runs if lab == label and m.memory_roof_gb_per_s]
        spans.append(f"{label} {_span(own)}")
    # Each configuration's roof is measured under its own launch (threads, CPUs, binding): named apart
    # only where they are not all one figure.
    each = "" if len(set(spans)) < 2 or _span(roofs) == _span(roofs[:1]) else \
        " (by configuration: " + "; ".join(spans) + ")"
    lines = [f"Memory roofs of the {len(runs)} runs: {_span(roofs)}{each}" + (f"; {', '.join(how)}" if how else "")
             + "."]
    changed = [f"{label} run {rep} ({m.end_probe_gb_per_s:.1f} against {m.memory_roof_gb_per_s:.1f} GB/s)"
               for label, rep, m in runs if m.end_probe_outcome == "changed" and m.end_probe_gb_per_s is not None
               and m.memory_roof_gb_per_s is not None]
    if changed:
        lines.append("The memory changed state during " + "; ".join(changed) + ", a probe at its end found: that "
                     "run's share of the ceiling is uncertain by as much, and its tokens/s may be too.")
    # Configurations of other threads or binding have roofs of their own; one configuration's runs do not.
    moved = []
    for label in dict.fromkeys(label for label, _, _ in runs):
        own = [m.memory_roof_gb_per_s for lab, _, m in runs if lab == label and m.memory_roof_gb_per_s]
        if len(own) > 1 and max(own) > min(own) * ROOFS_MOVED:
            moved.append(f"{label} ({min(own):.1f} to {max(own):.1f} GB/s)")
    if moved:
        lines.append("The runs of one configuration had memory roofs more than "
                     f"{fmt_percent(ROOFS_MOVED - 1)} apart, so the memory moved between states during the sweep: "
                     + "; ".join(moved) + ". Compare their shares of the ceiling only between runs of alike roofs.")
    return lines


def _span(values: list[float]) -> str:
    return f"{min(values):.1f} GB/s" if max(values) - min(values) < 0.05 else \
        f"{min(values):.1f} to {max(values):.1f} GB/s"


# Memory roofs of one configuration's runs further apart than this: the memory changed state between them
# (a probe reads within about 15% of its roof run to run here).
ROOFS_MOVED = 1.25


def comparison_report(comparison: Comparison, directory: str | None = None) -> Report:
    summaries = summarize_configs(comparison)
    planned = len(comparison.order)
    finished = sum(1 for c, r in comparison.order if comparison.finished(c, r))
    axes = ", ".join(f"{axis} {','.join(values)}" for axis, values in comparison.axes.items())
    report = Report(title=f"cpuprof compare: {axes or 'one configuration'}, {comparison.repetitions} run(s) each",
                    figures=SweepFigures(step_distributions(comparison)))
    if finished < planned:
        resume = (cpuprof_command("compare", "--resume", directory) if directory else
                  "python -m cpuprof compare --resume, given the sweep's directory")
        report.warnings.append(f"PARTIAL: {finished} of {planned} runs finished; resume with {resume}")
    if any(r.metrics is not None and not r.metrics.profiled for r in comparison.runs):
        report.warnings.append("runs made with --no-profile carry no spin, sleep, switch or roofline figures")
    lines = []
    v = verdict(comparison, summaries)
    if v is not None:
        lines.append(v.line + ".")
        noise = "" if v.test is None or v.test.significant else " (though their throughput does not, beyond the noise)"
        if v.causes:
            lines.append(f"What the configurations differ in, and what it changes{noise}:")
            lines.extend(f"  - {c}" for c in v.causes)
        if v.explanations:
            lines.append("Other figures that differ:" if v.causes else f"What differs between them{noise}:")
            lines.extend(f"  - {e}" for e in v.explanations)
        elif v.best.index != v.other.index:
            text = (f"No other measured figure differs by {fmt_percent(MIN_EXPLAINING_CHANGE)} or more"
                    if not v.small else "No other measured figure differs enough to explain it")
            lines.append(text + (": " + "; ".join(v.small) if v.small else "") + ".")
    over = [s.config.label for s in summaries if (s.metrics.get("bandwidth_share") or 0) > 1]
    if over:
        from .ceiling import above_the_roof

        lines.append("Each configuration's share of the memory-bandwidth ceiling is against its own launch's roof "
                     f"(measured under its threads and binding). {', '.join(over)}: "
                     + above_the_roof("a share"))
    lines.extend(roofs_lines(comparison))
    order = "interleaved: every round runs each configuration once, starting one later each round"
    lines.append(f"Runs: {planned} planned, {finished} finished, in rotated rounds ({order}), each a fresh process.")
    # The all-reduce column only where a configuration has tensor-parallel ranks: elsewhere it is 0 throughout.
    tensor_parallel = any(int(c.values.get("tp", "1")) > 1 for c in comparison.configs)
    ranking = Table(columns=[c for c in RANKING_COLUMNS if tensor_parallel or c.key != "all_reduce_share"],
                    rows=ranking_rows(comparison, summaries),
                    caption="configurations, fastest first (baseline: "
                            f"{comparison.configs[comparison.baseline].label})")
    section = Section(id="ranking", title="Configurations", lines=lines, tables=[ranking])
    failures = [s for s in summaries if s.errors]
    if failures:
        section.notes.extend(f"{s.config.label} failed {s.failed} time(s): {'; '.join(s.errors)}" for s in failures)
    report.sections.append(section)
    proposed = [s for s in summaries if s.config.proposal]
    if proposed and comparison.source:
        report.sections.append(proposals_section(comparison, summaries))
    return report


def proposals_section(comparison: Comparison, summaries: list[ConfigSummary]) -> Section:
    """compare --from: each verdict's proposal, measured against the profile's own settings."""
    baseline = summaries[comparison.baseline]
    rows = []
    for s in summaries:
        if not s.config.proposal:
            continue
        test = welch_test(_values(comparison, s.index), _values(comparison, baseline.index)) if s.ok else None
        if not s.ok or not baseline.ok:
            held = "failed" if s.failed else "not run"
            change = None
        else:
            change = s.tokens_per_s.mean / baseline.tokens_per_s.mean - 1.0
            if test is None:
                held = "untested (needs -r 2 or more)"
            elif test.significant:
                held = "held" if change > 0 else "made it slower"
            else:
                held = f"not beyond the noise of {min(s.tokens_per_s.n, baseline.tokens_per_s.n)} runs (more: -r 5)"
        rows.append({"config": s.config.label, "proposal": s.config.proposal,
                     "change": None if change is None else f"{change * 100:+.1f}%",
                     "p": None if test is None else f"{test.p:.3g}", "held": held})
    table = Table(columns=[
        Column("config", "configuration", "text", "the profile's settings with one proposal applied"),
        Column("proposal", "why it was proposed", "text", "the profile's verdict that suggested it"),
        Column("change", "tok/s change", "text", "mean tokens/s against the profile's own settings, re-measured"),
        Column("p", "p", "text", f"Welch's t-test p-value; below {SIGNIFICANCE} the change is beyond the noise"),
        Column("held", "verdict", "text", "held: faster beyond the noise; made it slower: slower beyond it; "
                                          "otherwise the difference is within the runs' noise"),
    ], rows=rows, caption=f"proposals from {comparison.source}, each measured against its own settings")
    return Section(id="proposals", title="Proposals, measured", tables=[table])
