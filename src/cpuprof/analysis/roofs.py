"""The machine's measured roofs, as a report section: what every GEMM and the decode ceiling are
judged against, with the spread that says how much to trust them."""

from __future__ import annotations

from .. import defaults
from ..model import MachineRoofs, Profile, format_cpulist
from ..units import fmt_bytes, fmt_percent
from .report_model import Column, Section, Table


def _threads(n: int) -> str:
    return f"{n} thread" if n == 1 else f"{n} threads"


def roofs_table(roofs: MachineRoofs) -> Table:
    columns = [Column("roof", "roof", help="what was measured"),
               Column("dtype", "dtype"),
               Column("best", "best", "ratio", help="the best repetition: GB/s for bandwidth, GFLOP/s for compute"),
               Column("unit", "unit"),
               Column("median", "median", "ratio", help="the median repetition"),
               Column("spread", "spread", "share", help="(max - min) / median over the repetitions"),
               Column("runs", "runs", "int", help="repetitions"),
               Column("how", "how", help="the kernel and its size")]
    rows = []
    for b in roofs.bandwidth:
        where = f", arrays on node {b.node}" if b.node is not None else ""
        rows.append({"roof": f"memory ({b.kernel})", "dtype": "f64", "best": b.gb_per_s.best, "unit": "GB/s",
                     "median": b.gb_per_s.median, "spread": b.gb_per_s.spread, "runs": b.gb_per_s.repetitions,
                     "how": f"native STREAM {b.kernel}, {_threads(b.threads)}, 3 x {fmt_bytes(b.array_bytes)}{where}"
                     if b.kernel == "triad" else
                     f"native STREAM {b.kernel}, {_threads(b.threads)}, 2 x {fmt_bytes(b.array_bytes)}{where}"})
    for c in roofs.compute:
        rows.append({"roof": "compute", "dtype": c.dtype, "best": c.gflop_per_s.best, "unit": "GFLOP/s",
                     "median": c.gflop_per_s.median, "spread": c.gflop_per_s.spread,
                     "runs": c.gflop_per_s.repetitions,
                     "how": f"torch.mm [{c.size},{c.size}]x[{c.size},{c.size}], {_threads(c.threads)}"})
    for k in roofs.kernel:
        # the GEMV's shape is [1, in, out]: one activation row times an nn.Linear weight [out, in]
        gemv = f"[1,{k.shape[1]}]x[{k.shape[2]},{k.shape[1]}]ᵀ" if len(k.shape) == 3 else str(k.shape)
        if not k.weights:
            rows.append({"roof": "GEMV kernel", "dtype": k.dtype, "best": k.gb_per_s.best, "unit": "GB/s",
                         "median": k.gb_per_s.median, "spread": k.gb_per_s.spread, "runs": k.gb_per_s.repetitions,
                         "how": f"F.linear {gemv}, {_threads(k.threads)}"})
            continue
        storage = "int8" if k.weights == "i8" else f"int4, group {k.group_size}"
        kernel = "aten::_weight_int8pack_mm" if k.weights == "i8" else "aten::_weight_int4pack_mm_for_cpu"
        rows.append({"roof": "GEMV kernel", "dtype": f"{k.dtype} x {storage}", "best": k.gb_per_s.best,
                     "unit": "GB/s", "median": k.gb_per_s.median, "spread": k.gb_per_s.spread,
                     "runs": k.gb_per_s.repetitions,
                     "how": f"{kernel}, weights of [1,{k.shape[1]}]x[{k.shape[2]},{k.shape[1]}]ᵀ in all, read in "
                            f"turn (out of the caches), {_threads(k.threads)}"})
        if k.elements_per_s is not None and len(k.cached_shape) == 3:
            rows.append({"roof": "dequantization", "dtype": f"{k.dtype} x {storage}",
                         "best": k.elements_per_s.best / 1e9, "unit": "G weights/s",
                         "median": k.elements_per_s.median / 1e9, "spread": k.elements_per_s.spread,
                         "runs": k.elements_per_s.repetitions,
                         "how": f"{kernel} on one [{k.cached_shape[2]},{k.cached_shape[1]}] weight read again and "
                                f"again (in the caches: what the kernel unpacks when memory does not bind), "
                                f"{_threads(k.threads)}"})
    return Table(columns, rows, caption="measured roofs: the best repetition is the roof")


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
            + f": triad {checked.gb_per_s:.1f} GB/s, {fmt_percent(checked.ratio)} of the cached "
            f"{checked.cached_gb_per_s:.1f} GB/s (measured {checked.cached_measured[:16].replace('T', ' ')} UTC)")
    if checked.outcome == "agrees":
        return read + ": agrees, the cached roofs are used"
    if checked.outcome == "kept":
        return read + ": disagrees, kept as asked (--roofs cached): the ceiling and every share of a roof are off by it"
    return read + ": disagrees (the memory is in another state), so the roofs above were measured again"


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
    bw = roofs.memory_gb_per_s()
    if bw is not None:
        lines.append(f"memory roof {bw:.1f} GB/s (STREAM triad: 3 arrays' bytes per pass, write-allocate "
                     "traffic not counted, as STREAM counts)")
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
    lines += roofs.errors  # each line names what was not measured, or what the cache said
    return lines


def roofs_section(profile: Profile) -> Section | None:
    roofs = profile.roofs
    if roofs is None:
        return None
    return Section("roofs", "Machine roofs (measured)", roofs_lines(roofs, profile.meta.created),
                   [roofs_table(roofs)])
