"""The machine's measured roofs, as a report section: what every GEMM and the decode ceiling are
judged against, with the spread that says how much to trust them."""

from __future__ import annotations

from .. import defaults
from ..model import BandwidthRoof, MachineRoofs, Profile, RoofProbe, format_cpulist
from ..units import fmt_bytes, fmt_percent
from .report_model import Column, Section, Table


def _threads(n: int) -> str:
    return f"{n} thread" if n == 1 else f"{n} threads"


def _gemv(shape: list[int]) -> str:
    """A GEMV's [1, in, out] as one activation row times an nn.Linear weight [out, in]."""
    return f"[1,{shape[1]}]x[{shape[2]},{shape[1]}]ᵀ" if len(shape) == 3 else str(shape)


def _paths_text(paths: dict[str, float], best: str) -> str:
    others = [f"{name} {figure:.1f}" for name, figure in sorted(paths.items(), key=lambda p: -p[1]) if name != best]
    return f"; other paths, GB/s: {', '.join(others)}" if others else ""


def _isas_text(isas: dict[str, float]) -> str:
    return "; the fastest of " + ", ".join(f"{name} {figure:.1f}" for name, figure in isas.items()) if isas else ""


def roofs_table(roofs: MachineRoofs) -> Table:
    columns = [Column("roof", "roof", help="what was measured"),
               Column("dtype", "dtype"),
               Column("best", "best", "ratio", help="the best repetition: GB/s for bandwidth, GFLOP/s for compute"),
               Column("unit", "unit"),
               Column("median", "median", "ratio", help="the median repetition"),
               Column("spread", "spread", "share", help="(max - min) / median over the repetitions"),
               Column("runs", "runs", "int", help="repetitions"),
               Column("isa", "instruction set", help="what the kernel ran: cpuprof's loops' ISA, or the kernel "
                      "torch's library (oneDNN, MKL) names; '?' where it names none (ATen's own)"),
               Column("how", "how", help="the kernel and its size")]
    rows = []
    for b in roofs.bandwidth:
        where = f", arrays on node {b.node}" if b.node is not None else ""
        what = {"read": "read (a sum),"}.get(b.kernel, f"STREAM {b.kernel},")
        rows.append({"roof": f"memory ({b.kernel})", "dtype": "f64", "best": b.gb_per_s.best, "unit": "GB/s",
                     "median": b.gb_per_s.median, "spread": b.gb_per_s.spread, "runs": b.gb_per_s.repetitions,
                     "isa": b.isa or "?",
                     "how": f"native {what} {b.arrays} x {fmt_bytes(b.array_bytes)}, {_threads(b.threads)}{where}"
                            + _isas_text(b.isas)})
    peak = roofs.peak
    if peak is not None:
        rows.append({"roof": "FMA peak", "dtype": "f32", "best": peak.gflop_per_s.best, "unit": "GFLOP/s",
                     "median": peak.gflop_per_s.median, "spread": peak.gflop_per_s.spread,
                     "runs": peak.gflop_per_s.repetitions, "isa": peak.isa,
                     "how": f"native register-only FMA loop (no memory traffic), {_threads(peak.threads)}"})
        for dtype in ("f32", "bf16"):
            theoretical = peak.theoretical(dtype)
            if theoretical is not None and peak.flop_per_cycle is not None and peak.ghz is not None:
                per_cycle = peak.flop_per_cycle * (1 if dtype == "f32" else peak.bf16_factor)
                rows.append({"roof": "theoretical", "dtype": dtype, "best": theoretical, "unit": "GFLOP/s",
                             "median": None, "spread": None, "runs": None,
                             "isa": peak.isa + (" + avx512_bf16" if dtype == "bf16" else ""),
                             "how": f"{_threads(peak.threads)} x {per_cycle} FLOP/cycle x {peak.ghz:.2f} GHz "
                                    f"({peak.pipes}; clock: {peak.ghz_source})"})
    for c in roofs.compute:
        rows.append({"roof": "compute", "dtype": c.dtype, "best": c.gflop_per_s.best, "unit": "GFLOP/s",
                     "median": c.gflop_per_s.median, "spread": c.gflop_per_s.spread,
                     "runs": c.gflop_per_s.repetitions, "isa": c.isa or "?",
                     "how": f"torch.mm [{c.size},{c.size}]x[{c.size},{c.size}], {_threads(c.threads)}"})
    for k in roofs.kernel:
        if not k.weights:
            path = k.path or "F.linear"
            rows.append({"roof": "GEMV kernel", "dtype": k.dtype, "best": k.gb_per_s.best, "unit": "GB/s",
                         "median": k.gb_per_s.median, "spread": k.gb_per_s.spread, "runs": k.gb_per_s.repetitions,
                         "isa": k.isa or "?",
                         "how": f"{path}, weights of {_gemv(k.shape)} in all, read in turn, {_threads(k.threads)}"
                                + _paths_text(k.paths, path)})
            continue
        storage = "int8" if k.weights == "i8" else f"int4, group {k.group_size}"
        kernel = "aten::_weight_int8pack_mm" if k.weights == "i8" else "aten::_weight_int4pack_mm_for_cpu"
        rows.append({"roof": "GEMV kernel", "dtype": f"{k.dtype} x {storage}", "best": k.gb_per_s.best,
                     "unit": "GB/s", "median": k.gb_per_s.median, "spread": k.gb_per_s.spread,
                     "runs": k.gb_per_s.repetitions, "isa": k.isa or "?",
                     "how": f"{kernel}, weights of {_gemv(k.shape)} in all, read in "
                            f"turn (out of the caches), {_threads(k.threads)}"})
        if k.elements_per_s is not None and len(k.cached_shape) == 3:
            rows.append({"roof": "dequantization", "dtype": f"{k.dtype} x {storage}",
                         "best": k.elements_per_s.best / 1e9, "unit": "G weights/s",
                         "median": k.elements_per_s.median / 1e9, "spread": k.elements_per_s.spread,
                         "runs": k.elements_per_s.repetitions, "isa": k.isa or "?",
                         "how": f"{kernel} on one [{k.cached_shape[2]},{k.cached_shape[1]}] weight read again and "
                                f"again (in the caches: what the kernel unpacks when memory does not bind), "
                                f"{_threads(k.threads)}"})
    return Table(columns, rows, caption="measured roofs: the best repetition is the roof; 'theoretical' rows are "
                 "derived, not measured")


def _age(then: str, now: str) -> str | None:
    """How long before ``now`` the ISO 8601 instant ``then`` was, in words; None if unreadable."""
    import datetime

    try:
        seconds = (datetime.datetime.fromisoformat(now) - datetime.datetime.fromisoformat(then)).total_seconds()
    except (TypeError, ValueError):
        return None
    if seconds < 0:
        return None  # after it: a later run probed the entry this one read
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.0f} min"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.0f} days"


def _probe_line(roofs: MachineRoofs, now: str | None) -> str | None:
    """What the probe of the memory read just before the roofs were used, against the cached roof."""
    checked = roofs.probe
    if checked is None:
        return "no probe of the memory recorded with these cached roofs" if roofs.from_cache else None
    when = checked.at[:16].replace("T", " ") + " UTC"
    ago = _age(checked.at, now) if now else None
    read = (f"last probe of the memory, at {when}" + (f" ({ago} before this profile)" if ago else "")
            + f": the {checked.kernel} kernel {checked.gb_per_s:.1f} GB/s, {fmt_percent(checked.ratio)} of the "
            f"cached "
            f"{checked.cached_gb_per_s:.1f} GB/s (measured {checked.cached_measured[:16].replace('T', ' ')} UTC)")
    if checked.outcome == "agrees":
        return read + ": agrees, the cached roofs are used"
    if checked.outcome == "kept":
        return read + ": disagrees, kept as asked (--roofs cached): the ceiling and every share of a roof are off by it"
    return read + ": disagrees (the memory is in another state), so the roofs above were measured again"


def _memory_line(roofs: MachineRoofs, memory: BandwidthRoof) -> str:
    figure = f"memory roof {memory.gb_per_s.best:.1f} GB/s"
    if memory.kernel != "read":
        return (figure + f" (STREAM {memory.kernel}: {memory.arrays} arrays' bytes per pass, write-allocate traffic "
                "not counted, as STREAM counts)")
    triad = max((b.gb_per_s.best for b in roofs.bandwidth if b.kernel == "triad"), default=None)
    text = figure + " (a read-only kernel: a decode only reads its weights"
    text += f"; STREAM triad {triad:.1f} GB/s)" if triad is not None else ")"
    best_gemv = max((k for k in roofs.kernel if not k.weights), key=lambda k: k.gb_per_s.best, default=None)
    if best_gemv is not None:
        text += (f"; torch's best GEMV ({best_gemv.dtype}, {best_gemv.path or 'F.linear'}) reads "
                 f"{best_gemv.gb_per_s.best:.1f} GB/s, {fmt_percent(best_gemv.gb_per_s.best / memory.gb_per_s.best)} "
                 "of it")
    return text


def _peak_line(roofs: MachineRoofs) -> str:
    peak = roofs.peak
    assert peak is not None
    text = f"the cores' f32 peak: {peak.gflop_per_s.best:.0f} GFLOP/s measured by a register-only {peak.isa} FMA loop"
    theoretical, implied = peak.theoretical("f32"), peak.implied_ghz
    if theoretical is None or peak.ghz is None:
        why = peak.pipes if peak.flop_per_cycle is None else f"no clock: {peak.ghz_source}"
        text += f"; theoretical peak not derived ({why})"
    else:
        text += f", theoretical {theoretical:.0f} at the reported {peak.ghz:.2f} GHz"
        if implied is not None and implied > 1.05 * peak.ghz:
            text += (f" (the loop implies {implied:.2f} GHz: " + (
                "above cpufreq's maximum, so this core has more FMA pipes than cpuprof's table says)"
                if peak.ghz_source.startswith("cpufreq") else
                "the cores run above the reported clock, as boost does)"))
        elif implied is not None and implied < 0.8 * peak.ghz:
            text += (f" (the loop reaches {fmt_percent(peak.gflop_per_s.best / theoretical)} of it: fewer FMA pipes "
                     "than assumed, threads sharing a core, or a clock below the reported one)")
    compute = roofs.compute_gflop_per_s("f32")
    if compute is not None:
        text += f"; torch's f32 GEMM reaches {fmt_percent(compute / peak.gflop_per_s.best)} of the measured peak"
    bf16, bf16_peak = roofs.compute_gflop_per_s("bf16"), peak.theoretical("bf16")
    if bf16 is not None and bf16_peak is not None and peak.ghz is not None:
        clock = max(implied or peak.ghz, peak.ghz)
        text += (f", its bf16 GEMM {fmt_percent(bf16 / (bf16_peak * clock / peak.ghz))} of the bf16 theoretical peak "
                 f"at {clock:.2f} GHz")
    return text


def _end_probe_line(checked: RoofProbe) -> str:
    read = (f"at the end of the run ({checked.at[11:16]} UTC) a probe of the memory (the {checked.kernel} kernel) "
            f"read {checked.gb_per_s:.1f} GB/s, {fmt_percent(checked.ratio)} of the {checked.cached_gb_per_s:.1f} GB/s "
            "roof used")
    if checked.outcome == "agrees":
        return read + ": the memory stayed in the state it was judged against"
    return (read + ": the memory changed state during the run, so every share of the memory roof and the ceiling "
            "is uncertain by that much (run it again, or shorter)")


def roofs_lines(roofs: MachineRoofs, now: str | None = None) -> list[str]:
    """``now``: when the profile was made (ISO 8601), for the roofs' age."""
    busy = roofs.run_queue_share is not None and roofs.run_queue_share > defaults.BUSY_CALIBRATION_SHARE
    above = roofs.kernel_above_memory()
    refused = [why for why, held in (("no memory bandwidth", roofs.memory_gb_per_s() is None),
                                     ("memory was busy", above is not None), ("the machine was busy", busy)) if held]
    kept = f"not cached: {' and '.join(refused)}" if refused else "now cached"
    age = _age(roofs.measured, now) if now else None
    origin = (f"from the cache (measured {roofs.measured[:16].replace('T', ' ')} UTC"
              + (f", {age} before this profile" if age else "") + f", in {roofs.seconds:.1f} s)"
              if roofs.from_cache else f"measured for this run in {roofs.seconds:.1f} s ({kept})")
    fp = roofs.fingerprint
    machine = ", ".join(f"{k} {v}" for k, v in fp.items())
    lines = [f"{origin}, at {_threads(roofs.threads)} on CPUs {format_cpulist(roofs.cpus)}; {machine}"]
    memory = roofs.memory_roof()
    if memory is not None:
        lines.append(_memory_line(roofs, memory))
    if roofs.peak is not None:
        lines.append(_peak_line(roofs))
    if above is not None:
        lines.append(f"the {above.dtype} GEMV read {above.gb_per_s.best:.1f} GB/s from memory, more than this memory "
                     "roof allows: something else used memory while the bandwidth was measured, so the memory roof is "
                     "low; measure it again on a quiet machine")
    if roofs.run_queue_share is not None:
        lines.append(f"while measuring, its threads waited for a CPU {fmt_percent(roofs.run_queue_share)} of the time "
                     "(run-queue delay: another process on these CPUs)"
                     + ("; these roofs are low: measure them again on a quiet machine" if busy else ""))
    probed = _probe_line(roofs, now)
    if probed:
        lines.append(probed)
    if roofs.end_probe is not None:
        lines.append(_end_probe_line(roofs.end_probe))
    lines += roofs.errors  # each line names what was not measured, or what the cache said
    return lines


def roofs_section(profile: Profile) -> Section | None:
    roofs = profile.roofs
    if roofs is None:
        return None
    return Section("roofs", "Machine roofs (measured)", roofs_lines(roofs, profile.meta.created),
                   [roofs_table(roofs)])
