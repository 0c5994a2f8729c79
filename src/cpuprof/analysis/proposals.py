"""What a profile's verdicts propose to try, as configurations ``compare --from`` can measure.

Advice from a profile is a hypothesis: "libgomp's threads spin 40% of the time, try Intel's
runtime" is only worth taking once the change has been run, repeatedly, against the profile's own
settings. Each proposal here changes one setting, with the measured figure that suggested it.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..model import Profile
from ..units import fmt_percent
from .compare import run_metrics
from .steps import DECODE, Steps

# Spin (of the team's op time) above which a runtime that sleeps sooner is worth trying.
SPIN_PROPOSAL_SHARE = 0.10
# Run-queue delay (of threads × wall) above which one thread fewer is worth trying.
RUN_DELAY_PROPOSAL_SHARE = 0.05
# CPU migrations per token above which binding threads to CPUs is worth trying.
MIGRATIONS_PROPOSAL_PER_TOKEN = 0.5
# Share of the GEMMs' sampled CPU spent repacking weights above which compiling (weights frozen and
# packed once) is worth trying.
REPACK_PROPOSAL_SHARE = 0.10
MIN_REPACK_SAMPLES = 100
# Share of the op time in memory-bound GEMVs over weights stored at 2 bytes or more above which
# weight-only int8 (half the bytes, or less) is worth trying.
GEMV_PROPOSAL_SHARE = 0.5
# Without roofs, the intensity (flop/B) below which a GEMM is taken as memory-bound: a bf16 GEMV's
# is about 1, and no CPU's ridge point is below 5.
MEMORY_BOUND_INTENSITY = 4.0
#: Said of every proposal that changes what the model computes, not only how fast.
NUMERICS_CHANGE = "changes the model's numerics: check its accuracy before adopting it"


@dataclass
class Proposal:
    values: dict[str, str]  # axis -> value, as compare sweeps them
    reason: str  # the measured figure behind it


def proposals(profile: Profile, intel_openmp: bool = False) -> list[Proposal]:
    """One-setting changes the profile's figures suggest; empty when nothing stands out.
    ``intel_openmp``: Intel's runtime is installed here (the caller looks; analysis reads no files),
    so switching to it can be proposed."""
    if profile.settings is None or profile.workload is None:
        return []
    requested = profile.settings.requested
    metrics = run_metrics(profile)
    out: list[Proposal] = []
    spin = metrics.spin_share if metrics else None
    if spin is not None and spin >= SPIN_PROPOSAL_SHARE:
        if requested.omp == "gnu" and intel_openmp:
            out.append(Proposal({"omp": "intel"},
                                f"threads spin {fmt_percent(spin)} of the op time in libgomp: Intel's runtime "
                                "waits differently (and sleeps after KMP_BLOCKTIME)"))
        out.append(Proposal({"blocktime": "0"},
                            f"threads spin {fmt_percent(spin)} of the op time: sleep at once instead "
                            "(frees the CPU for the thread that has work)"))
    delay = metrics.run_delay_share if metrics else None
    if delay is not None and delay >= RUN_DELAY_PROPOSAL_SHARE and requested.threads > 1:
        out.append(Proposal({"threads": str(requested.threads - 1)},
                            f"threads waited {fmt_percent(delay)} of the time for a CPU: one thread fewer "
                            "leaves a CPU for whatever else runs"))
    migrations = metrics.migrations_per_token if metrics else None
    if requested.bind == "none" or (migrations is not None and migrations >= MIGRATIONS_PROPOSAL_PER_TOKEN):
        why = (f"{migrations:.1f} CPU migrations per token" if migrations is not None and migrations > 0
               else "threads were not bound to CPUs")
        if requested.bind != "close":
            out.append(Proposal({"bind": "close"}, f"{why}: pin each thread to its own CPU"))
    cpus = len(requested.cpus)
    if requested.threads < cpus and (delay is None or delay < RUN_DELAY_PROPOSAL_SHARE):
        out.append(Proposal({"threads": str(cpus)},
                            f"{requested.threads} thread(s) on {cpus} CPUs, and no thread waited for one: "
                            "use them all"))
    repack = _repack_share(profile)
    if repack is not None and repack >= REPACK_PROPOSAL_SHARE and profile.workload.compile_s is None \
            and profile.workload.model.config is not None:
        out.append(Proposal({"compile": "on"},
                            f"the GEMMs spend {fmt_percent(repack)} of their CPU repacking weights on every call: "
                            "torch.compile with frozen weights packs them once"))
    gemv = _weight_bound_gemv_share(profile)
    model = profile.workload.model
    if gemv is not None and gemv >= GEMV_PROPOSAL_SHARE and not model.quant.quantized and model.config is not None:
        fraction = {"bf16": "half", "fp32": "a quarter"}.get(model.dtype, "fewer")
        out.append(Proposal({"quant": "int8"},
                            f"memory-bound GEMVs over {model.dtype} weights take {fmt_percent(gemv)} of the op time: "
                            f"int8 weights are {fraction} the bytes to read ({NUMERICS_CHANGE})"))
    seen: set[tuple[tuple[str, str], ...]] = set()
    unique = []
    for p in out:
        key = tuple(sorted(p.values.items()))
        if key not in seen:
            seen.add(key)
            unique.append(p)
    return unique


def _repack_share(profile: Profile) -> float | None:
    """The share of all GEMMs' sampled CPU time under weight-repacking code; None without stacks."""
    from .roofline import gemm_groups

    splits = [g.native for g in gemm_groups(profile) if g.native is not None]
    cpu = sum(s.cpu_ns for s in splits)
    if not splits or sum(s.samples for s in splits) < MIN_REPACK_SAMPLES or not cpu:
        return None
    return sum(s.by_part.get("repack", 0) for s in splits) / cpu


def _weight_bound_gemv_share(profile: Profile) -> float | None:
    """The share of the op time in memory-bound matrix products whose weight is stored at two
    bytes an element or more (not quantized); None without ops."""
    from .roofline import gemm_groups

    total = sum(op.self_ns for op in profile.ops if op.kind == "op")
    if not total:
        return None
    bound = 0
    for g in gemm_groups(profile):
        if g.work.kind != "gemm" or (g.work.weight_element_bytes or 2) < 2:
            continue
        if (g.bound == "memory") if g.bound is not None else g.intensity < MEMORY_BOUND_INTENSITY:
            bound += g.time_ns
    return bound / total


# Share of the decode steps' wall time outside any ATen op above which the program's own per-step
# work (Python, the framework between ops) is worth cutting.
OUTSIDE_OPS_ADVICE_SHARE = 0.30


def program_advice(profile: Profile, whole: Profile, steps: Steps, over_steps: bool = True) -> list[str]:
    """What a program's user can change in the program or its launch, each with the measured share it
    addresses: ``profile`` is over the decode ``steps`` where they could be split from the start-up,
    ``whole`` the whole run (the threads' counters and waits are kept for the whole run only). The
    built-in decoder's proposals (``decode --compile``, ``compare --from``) are not theirs to run."""
    from .contention import analyse
    from .roofline import PROGRAM_PREPACK
    from .threads import compute_team

    advice = []
    decode = steps.of_kind(DECODE)
    which = "decode steps'" if decode else "steps'"
    decode = decode or steps.steps
    wall = sum(s.wall_ns for s in decode)
    outside = sum(s.outside_ops_ns for s in decode) / wall if wall else 0.0
    if outside >= OUTSIDE_OPS_ADVICE_SHARE:
        advice.append(f"{fmt_percent(outside)} of the {which} time is outside ATen ops (Python and the "
                      "framework between ops: the generation loop, logits processing, cache bookkeeping): "
                      "torch.compile of the model's forward (a serving engine's compiled mode: vLLM without "
                      "enforce_eager) runs it as one graph, with far less Python per op")
    repack = _repack_share(profile)
    if repack is not None and repack >= REPACK_PROPOSAL_SHARE:
        advice.append(f"the GEMMs spend {fmt_percent(repack)} of their CPU repacking weights on every call: "
                      f"{PROGRAM_PREPACK}")
    gemv = _weight_bound_gemv_share(profile)
    if gemv is not None and gemv >= GEMV_PROPOSAL_SHARE:
        where = "in the steps" if over_steps else "of the run"
        advice.append(f"memory-bound GEMVs over weights of 2 bytes or more take {fmt_percent(gemv)} of the op time "
                      f"{where}: weight-only int8 (torchao's quantize_(model, Int8WeightOnlyConfig())) reads half the "
                      f"bytes of bf16, a quarter of f32 ({NUMERICS_CHANGE})")
    c = whole.collection
    team = [whole.threads[i] for i in compute_team(whole)]
    delays = [t.run_delay_ns for t in team if t.run_delay_ns is not None]
    if c is not None and c.wall_ns and delays:
        # The threads' counters are the whole run's: so is the profile's wall time they are read against.
        delay = sum(delays) / (len(delays) * c.wall_ns)
        in_force = whole.settings.in_force if whole.settings is not None else None
        threads = in_force.torch.num_threads if in_force is not None and in_force.torch is not None else None
        if delay >= RUN_DELAY_PROPOSAL_SHARE and threads is not None and threads > 1:
            advice.append(f"its threads waited {fmt_percent(delay)} of the run for a CPU: one torch thread fewer "
                          f"({threads - 1}: torch.set_num_threads({threads - 1}), or run --threads {threads - 1} "
                          "where the program keeps the launch's count) leaves a CPU for what else runs")
        elif delay >= RUN_DELAY_PROPOSAL_SHARE and threads == 1:
            advice.append(f"its threads waited {fmt_percent(delay)} of the run for a CPU, with one torch thread: "
                          "other threads or processes (the program's own, or another's) ran on its CPUs; give it "
                          "CPUs of its own (run --cpus, or the engine's own CPU binding)")
    contention = analyse(whole)
    if contention is not None and contention.ops and contention.team:
        team_time = sum(o.wall_ns for o in contention.ops) * contention.team
        spin = contention.spin_ns / team_time if team_time else 0.0
        if spin >= SPIN_PROPOSAL_SHARE:
            advice.append(f"threads spin {fmt_percent(spin)} of the run's op time waiting for work: let them sleep at "
                          "once (run --blocktime 0, or OMP_WAIT_POLICY=passive / KMP_BLOCKTIME=0)")
    return advice
