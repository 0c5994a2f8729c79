"""A self-contained SVG roofline chart: every GEMM group against the machine's measured roofs.

Log-log axes, arithmetic intensity (flop per byte of the least traffic) against GFLOP/s, as in
Williams, Waterman and Patterson's roofline model: the memory roof is the line bandwidth x
intensity up to the ridge, each dtype's compute roof a horizontal line from its ridge on, and the
best GEMV torch reaches (the kernel roof) a dashed line below the memory roof. Each GEMM group is
a circle whose area is proportional to its time, so the circles that matter are the big ones far
below their roof. Hovering a circle shows its figures and verdict. Only the standard library: the
file works offline and needs no plotting package.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, TextIO

from ..analysis.roofline import GemmGroup
from ..model import MachineRoofs
from ..units import fmt_ns, fmt_percent
from .markup import escape

if TYPE_CHECKING:
    from ..reports.base import Role
    from ..reports.sources import OutputOptions, Source, SourceKind


WIDTH, HEIGHT = 960, 600
LEFT, RIGHT, TOP, BOTTOM = 80, 250, 56, 64  # margins around the plot, px; the legend is on the right
FONT = "Verdana, sans-serif"
MAX_RADIUS = 28.0  # the group with the most time, px
MIN_RADIUS = 2.5  # still visible and hoverable however little time it had
LABEL_CHARS = 40  # a circle's label is cut to this; the tooltip has it in full
LABEL_CHAR_PX = 10 * 0.6  # Verdana's mean advance at the labels' 10 px: an estimate (measuring needs a browser)
# Values a log axis can hold (zero, negatives and infinities have no place on it); the axes stretch
# over whatever decades the data spans in between.
VALUE_RANGE = (1e-200, 1e200)

# Colours per dtype (colour-blind-safe Tableau hues); dtypes not listed take the rest in order.
_DTYPE_COLOURS = {"bf16": "#d62728", "f32": "#1f77b4", "f16": "#2ca02c", "f64": "#9467bd", "i8": "#8c564b"}
_SPARE_COLOURS = ("#ff7f0e", "#17becf", "#e377c2", "#7f7f7f", "#bcbd22")
_MEMORY_COLOUR = "#222222"


def _finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value) and VALUE_RANGE[0] <= value <= VALUE_RANGE[1]


def _num(value: float) -> str:
    """A figure for a label: three significant digits, no exponent below a million."""
    if value >= 1e6 or value < 1e-3:
        return f"{value:.2g}"
    if value >= 100:
        return f"{value:,.0f}"
    return f"{value:.3g}"


def _decade_label(exponent: int) -> str:
    if -3 <= exponent <= 5:
        return f"{10.0 ** exponent:,.{max(0, -exponent)}f}"
    return f"1e{exponent}"


class _Axes:
    """Log-log mapping from data to pixels over whole decades."""

    def __init__(self, xs: list[float], ys: list[float]) -> None:
        self.x_lo, self.x_hi = self._decades(xs, (0.1, 1000.0))
        self.y_lo, self.y_hi = self._decades(ys, (0.1, 1000.0))
        self.left, self.right = LEFT, WIDTH - RIGHT
        self.top, self.bottom = TOP, HEIGHT - BOTTOM

    @staticmethod
    def _decades(values: list[float], default: tuple[float, float]) -> tuple[float, float]:
        values = [v for v in values if _finite(v)]
        if not values:
            return default
        lo = math.floor(math.log10(min(values)) - 0.15)  # a little room below and above the data
        hi = math.ceil(math.log10(max(values)) + 0.15)
        return 10.0 ** lo, 10.0 ** max(hi, lo + 1)

    def x(self, value: float) -> float:
        span = math.log10(self.x_hi / self.x_lo)
        return self.left + (self.right - self.left) * math.log10(value / self.x_lo) / span

    def y(self, value: float) -> float:
        span = math.log10(self.y_hi / self.y_lo)
        return self.bottom - (self.bottom - self.top) * math.log10(value / self.y_lo) / span

    def clip_line(self, slope: float, x_from: float, x_to: float) -> tuple[float, float] | None:
        """The x range over which y = slope x lies inside the plot, within [x_from, x_to]."""
        lo = max(x_from, self.x_lo, self.y_lo / slope)
        hi = min(x_to, self.x_hi, self.y_hi / slope)
        return (lo, hi) if lo < hi else None


def _colours(dtypes: Sequence[str]) -> dict[str, str]:
    spare = iter(_SPARE_COLOURS * (len(dtypes) // len(_SPARE_COLOURS) + 1))
    return {d: _DTYPE_COLOURS.get(d) or next(spare) for d in dtypes}


def _plotted(groups: Sequence[GemmGroup]) -> list[GemmGroup]:
    return [g for g in groups if g.time_ns > 0 and _finite(g.intensity) and _finite(g.gflop_per_s)]


def _tooltip(group: GemmGroup) -> str:
    lines = [f"{group.shape_text} ({group.work.dtype}): {', '.join(group.op_names)}",
             f"{group.calls:,} calls, {fmt_ns(group.time_ns)}",
             f"intensity {_num(group.intensity)} flop/B, {_num(group.gflop_per_s or 0)} GFLOP/s, "
             f"{_num(group.gb_per_s or 0)} GB/s"]
    if group.roof_share is not None:
        lines.append(f"{fmt_percent(group.roof_share)} of its {group.bound} roof"
                     + (f", {fmt_ns(group.lost_ns)} lost" if group.lost_ns is not None else ""))
    if group.verdict:
        lines.append(group.verdict)
    return "\n".join(lines)


def render(groups: Sequence[GemmGroup], roofs: MachineRoofs | None, title: str = "GEMMs against the roofs") -> str:
    """The chart as one SVG document. Groups without time (no rate) have no point and are not drawn."""
    return '<?xml version="1.0" encoding="UTF-8" standalone="no"?>\n' + element(groups, roofs, title) + "\n"


def element(groups: Sequence[GemmGroup], roofs: MachineRoofs | None, title: str = "GEMMs against the roofs",
            attributes: str = "") -> str:
    """The chart's ``<svg>`` element alone, to inline in an HTML page; ``attributes`` (already
    escaped, e.g. ``class="chart"``) are added to it. Each GEMM group's circle has class "mark"."""
    points = _plotted(groups)
    dtypes = sorted({g.work.dtype for g in groups} | ({c.dtype for c in roofs.compute} | {k.dtype for k in roofs.kernel}
                                                      if roofs else set()))
    colour = _colours(dtypes)
    bw = roofs.memory_gb_per_s() if roofs else None
    peaks = {d: p for d in dtypes if roofs and (p := roofs.compute_gflop_per_s(d)) and _finite(p)}
    kernels = {d: k for d in dtypes if roofs and (k := roofs.kernel_gb_per_s(d)) and _finite(k)}
    if bw is not None and not _finite(bw):
        bw = None

    xs = [g.intensity for g in points]
    ys = [g.gflop_per_s or 0.0 for g in points]
    if bw:
        xs += [p / bw for p in peaks.values()]
        ys += list(peaks.values())
        if not peaks:  # no compute roof: show the memory roof over the data's intensities
            ys += [bw * x for x in xs]
    else:
        ys += list(peaks.values())
    xs += [p / k for d, k in kernels.items() if (p := peaks.get(d))]
    axes = _Axes(xs, ys)

    extra = f" {attributes}" if attributes else ""
    out: list[str] = [
        f'<svg version="1.1" xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
        f'viewBox="0 0 {WIDTH} {HEIGHT}" font-family="{FONT}" font-size="12"{extra}>',
        f"<title>{escape(title)}</title>",
        f'<rect x="0" y="0" width="{WIDTH}" height="{HEIGHT}" fill="white"/>',
        f'<text x="{WIDTH / 2:.1f}" y="24" text-anchor="middle" font-size="16">{escape(title)}</text>',
    ]
    out += _grid(axes)
    out += _roofs(axes, bw, peaks, kernels, colour)
    out += _points(axes, points, colour)
    out += _legend(bw, peaks, kernels, colour, [g.work.dtype for g in points], roofs)
    if roofs is None or bw is None:
        out.append(f'<text x="{axes.left + 8}" y="{axes.top + 16}" fill="#555">'
                   f'{escape("no roofs measured: points only (cpuprof calibrate measures them)")}</text>')
    if not points:
        out.append(f'<text x="{(axes.left + axes.right) / 2:.1f}" y="{(axes.top + axes.bottom) / 2:.1f}" '
                   f'text-anchor="middle" fill="#555">{escape("no GEMM with measured time")}</text>')
    out.append("</svg>")
    return "\n".join(out)


def _grid(axes: _Axes) -> list[str]:
    out = [f'<rect x="{axes.left}" y="{axes.top}" width="{axes.right - axes.left}" '
           f'height="{axes.bottom - axes.top}" fill="none" stroke="#888"/>']
    x_decades = range(round(math.log10(axes.x_lo)), round(math.log10(axes.x_hi)) + 1)
    y_decades = range(round(math.log10(axes.y_lo)), round(math.log10(axes.y_hi)) + 1)
    # Past a dozen decades every label would collide: label every other (or every third) one.
    x_step = max(1, math.ceil(len(x_decades) / 12))
    y_step = max(1, math.ceil(len(y_decades) / 10))
    for i, e in enumerate(x_decades):
        px = axes.x(10.0 ** e)
        out.append(f'<line x1="{px:.1f}" y1="{axes.top}" x2="{px:.1f}" y2="{axes.bottom}" stroke="#e4e4e4"/>')
        if i % x_step == 0:
            out.append(f'<text x="{px:.1f}" y="{axes.bottom + 16}" text-anchor="middle">{_decade_label(e)}</text>')
    for i, e in enumerate(y_decades):
        py = axes.y(10.0 ** e)
        out.append(f'<line x1="{axes.left}" y1="{py:.1f}" x2="{axes.right}" y2="{py:.1f}" stroke="#e4e4e4"/>')
        if i % y_step == 0:
            out.append(f'<text x="{axes.left - 6}" y="{py + 4:.1f}" text-anchor="end">{_decade_label(e)}</text>')
    out.append(f'<text x="{(axes.left + axes.right) / 2:.1f}" y="{HEIGHT - 18}" text-anchor="middle">'
               "arithmetic intensity (flop per byte of the least traffic)</text>")
    mid = (axes.top + axes.bottom) / 2
    out.append(f'<text x="20" y="{mid:.1f}" text-anchor="middle" transform="rotate(-90 20 {mid:.1f})">'
               "GFLOP/s</text>")
    return out


def _line(axes: _Axes, x1: float, y1: float, x2: float, y2: float, stroke: str, width: float, dashed: bool,
          tooltip: str) -> str:
    dash = ' stroke-dasharray="6 4"' if dashed else ""
    return (f'<line x1="{axes.x(x1):.1f}" y1="{axes.y(y1):.1f}" x2="{axes.x(x2):.1f}" y2="{axes.y(y2):.1f}" '
            f'stroke="{stroke}" stroke-width="{width}"{dash}><title>{escape(tooltip)}</title></line>')


def _roofs(axes: _Axes, bw: float | None, peaks: dict[str, float], kernels: dict[str, float],
           colour: dict[str, str]) -> list[str]:
    out = []
    top_peak = max(peaks.values(), default=None)
    if bw:
        # The memory roof up to the highest ridge: beyond it every dtype's compute roof binds.
        span = axes.clip_line(bw, axes.x_lo, top_peak / bw if top_peak else axes.x_hi)
        if span:
            lo, hi = span
            out.append(_line(axes, lo, bw * lo, hi, bw * hi, _MEMORY_COLOUR, 2.0, False,
                             f"memory roof: {_num(bw)} GB/s x intensity"))
            angle = math.degrees(math.atan2(axes.y(bw * hi) - axes.y(bw * lo), axes.x(hi) - axes.x(lo)))
            mx, my = axes.x(math.sqrt(lo * hi)), axes.y(bw * math.sqrt(lo * hi))
            out.append(f'<text x="{mx:.1f}" y="{my - 6:.1f}" text-anchor="middle" fill="{_MEMORY_COLOUR}" '
                       f'transform="rotate({angle:.1f} {mx:.1f} {my - 6:.1f})">'
                       f'{escape(f"memory {_num(bw)} GB/s")}</text>')
    for dtype, peak in sorted(peaks.items()):
        start = max(axes.x_lo, peak / bw) if bw else axes.x_lo
        if not axes.y_lo <= peak <= axes.y_hi or start >= axes.x_hi:
            continue
        out.append(_line(axes, start, peak, axes.x_hi, peak, colour[dtype], 2.0, False,
                         f"{dtype} compute roof: {_num(peak)} GFLOP/s"
                         + (f", ridge at {_num(peak / bw)} flop/B" if bw else "")))
        out.append(f'<text x="{axes.right - 4}" y="{axes.y(peak) - 5:.1f}" text-anchor="end" fill="{colour[dtype]}">'
                   f'{escape(f"{dtype} peak {_num(peak)} GFLOP/s")}</text>')
    for dtype, kernel in sorted(kernels.items()):
        kernel_peak = peaks.get(dtype)
        span = axes.clip_line(kernel, axes.x_lo, kernel_peak / kernel if kernel_peak else axes.x_hi)
        if span:
            lo, hi = span
            out.append(_line(axes, lo, kernel * lo, hi, kernel * hi, colour[dtype], 1.5, True,
                             f"{dtype} kernel roof: the best GEMV torch reaches, {_num(kernel)} GB/s x intensity"))
    return out


LABEL_HEIGHT_PX = 12


def _place_label(cx: float, cy: float, radius: float, width: float, axes: _Axes,
                 placed: list[tuple[float, float, float, float]]) -> tuple[str, float, float] | None:
    """Where a circle's label goes: right of it, else left, at its height or moved up or down a line
    or two, the first place that overlaps no label already placed; None where there is none (GEMMs
    of one intensity pile up: their tooltips still name them)."""
    for dy in (0, -LABEL_HEIGHT_PX, LABEL_HEIGHT_PX, -2 * LABEL_HEIGHT_PX, 2 * LABEL_HEIGHT_PX):
        for anchor in ("start", "end"):
            x0 = cx + radius + 3 if anchor == "start" else cx - radius - 3 - width
            if x0 < axes.left or x0 + width > axes.right:
                continue
            y = cy + 4 + dy
            box = (x0, x0 + width, y - LABEL_HEIGHT_PX + 2, y + 2)
            if box[2] < axes.top or box[3] > axes.bottom:
                continue
            if not any(box[0] < b[1] and b[0] < box[1] and box[2] < b[3] and b[2] < box[3] for b in placed):
                placed.append(box)
                return anchor, (x0 if anchor == "start" else x0 + width), y
    return None


def _points(axes: _Axes, points: list[GemmGroup], colour: dict[str, str]) -> list[str]:
    out = []
    placed: list[tuple[float, float, float, float]] = []
    longest = max((g.time_ns for g in points), default=1)
    # Biggest first, so small circles stay on top and hoverable.
    for group in sorted(points, key=lambda g: g.time_ns, reverse=True):
        radius = max(MIN_RADIUS, MAX_RADIUS * math.sqrt(group.time_ns / longest))  # area in proportion to time
        cx = min(max(axes.x(group.intensity), axes.left), axes.right)
        cy = min(max(axes.y(group.gflop_per_s or axes.y_lo), axes.top), axes.bottom)
        fill = colour.get(group.work.dtype, "#7f7f7f")
        out.append(f'<circle class="mark" cx="{cx:.1f}" cy="{cy:.1f}" r="{radius:.1f}" fill="{fill}" '
                   f'fill-opacity="0.45" stroke="{fill}" stroke-width="1.2"><title>{escape(_tooltip(group))}</title>'
                   "</circle>")
        label = group.shape_text
        if len(label) > LABEL_CHARS:
            label = label[:LABEL_CHARS - 1] + "…"
        where = _place_label(cx, cy, radius, len(label) * LABEL_CHAR_PX, axes, placed)
        if where is not None:
            anchor, lx, ly = where
            out.append(f'<text class="point-label" x="{lx:.1f}" y="{ly:.1f}" font-size="10" fill="#333" '
                       f'text-anchor="{anchor}">{escape(label)}</text>')
    return out


def _legend(bw: float | None, peaks: dict[str, float], kernels: dict[str, float], colour: dict[str, str],
            point_dtypes: list[str], roofs: MachineRoofs | None) -> list[str]:
    x = WIDTH - RIGHT + 20
    out = [f'<text x="{x}" y="{TOP + 6}" font-weight="bold">legend</text>']
    # (marker, stroke colour, dashed, text); markers are lines and squares, never circles: the
    # circles are the GEMMs alone.
    entries: list[tuple[str, str, bool, str]] = []
    if bw:
        entries.append(("line", _MEMORY_COLOUR, False, f"memory roof {_num(bw)} GB/s"))
    entries += [("line", colour[d], False, f"{d} compute roof {_num(p)} GFLOP/s") for d, p in sorted(peaks.items())]
    entries += [("line", colour[d], True, f"{d} GEMV kernel roof {_num(k)} GB/s") for d, k in sorted(kernels.items())]
    entries += [("square", colour.get(d, "#7f7f7f"), False, f"{d} GEMM") for d in sorted(set(point_dtypes))]
    y = TOP + 6
    for marker, stroke, dashed, text in entries:
        y += 20
        if marker == "line":
            dash = ' stroke-dasharray="6 4"' if dashed else ""
            out.append(f'<line x1="{x}" y1="{y}" x2="{x + 24}" y2="{y}" stroke="{stroke}" stroke-width="2"{dash}/>')
        else:
            out.append(f'<rect x="{x + 6}" y="{y - 6}" width="12" height="12" fill="{stroke}" fill-opacity="0.45" '
                       f'stroke="{stroke}"/>')
        out.append(f'<text x="{x + 30}" y="{y + 4}">{escape(text)}</text>')
    y += 28
    out.append(f'<text x="{x}" y="{y}" fill="#555">circle area ∝ time</text>')
    if roofs is not None:
        origin = "cached" if roofs.from_cache else "measured"
        out.append(f'<text x="{x}" y="{y + 16}" fill="#555">'
                   f'{escape(f"roofs {origin} {roofs.measured[:10]}, {roofs.threads} threads")}</text>')
    return out


__all__ = ["element", "render"]


class RooflineSvgOutput:
    """roofline.svg beside a profile that has machine roofs: each GEMM shape against them."""

    name = "roofline-svg"
    suffix = ".svg"
    other_suffixes: tuple[str, ...] = ()
    reads: tuple[SourceKind, ...] = ("profile",)
    role: Role = "export"
    help = "the profile's GEMMs against the machine's roofs, one SVG"

    def write(self, source: Source, out: TextIO, options: OutputOptions) -> int:
        from ..analysis.roofline import gemm_groups
        from ..reports.sources import ProfileSource

        assert isinstance(source, ProfileSource)
        profile = source.profile
        groups = gemm_groups(profile)
        title = (f"{profile.workload.model.name}: GEMMs against the roofs" if profile.workload
                 else "GEMMs against the roofs")
        out.write(render(groups, profile.roofs, title=title))
        return len(groups)
