"""SVG primitives for the HTML report's charts: linear scales with round ticks, axes, and the chart
element itself.

Charts are drawn by Python when the report is rendered, as inline SVG: the page needs no plotting
library and no network to be read. Every chart is one ``<svg class="chart" data-chart="NAME"
data-marks="N">`` whose data marks (a step's dot, a thread's bar) carry ``class="mark"``, so a
test, or a reader's own script, finds a chart by name and counts what it drew.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .markup import escape as esc

FONT = "system-ui, -apple-system, 'Segoe UI', Roboto, 'Helvetica Neue', Arial, sans-serif"
AXIS_COLOUR = "#666"
GRID_COLOUR = "#e6e6e6"
# Colour-blind-safe hues (Okabe and Ito), in the order charts take them.
BLUE, ORANGE, GREEN, VERMILION, PURPLE, SKY, YELLOW, GREY = (
    "#0072b2", "#e69f00", "#009e73", "#d55e00", "#cc79a7", "#56b4e9", "#f0e442", "#999999")


def nice_step(span: float, ticks: int) -> float:
    """A round step (1, 2 or 5 times a power of ten) that cuts ``span`` into about ``ticks`` parts."""
    if not span > 0 or not math.isfinite(span):
        return 1.0
    raw = span / max(ticks, 1)
    power = 10.0 ** math.floor(math.log10(raw))
    for factor in (1.0, 2.0, 5.0, 10.0):
        if raw <= factor * power * (1 + 1e-9):
            return factor * power
    return 10.0 * power


def tick_text(value: float, step: float) -> str:
    """A tick's label with as many decimals as the step needs, and thousands separators."""
    decimals = max(0, -math.floor(math.log10(step) + 1e-9)) if step > 0 else 0
    text = f"{value:,.{decimals}f}"
    return "0" if text.strip("-0.,") == "" else text


@dataclass
class Scale:
    """A linear map from data to pixels; ``step`` is the round tick step the domain was widened to."""

    lo: float
    hi: float
    px_lo: float
    px_hi: float
    step: float

    def __call__(self, value: float) -> float:
        span = self.hi - self.lo
        return self.px_lo + (self.px_hi - self.px_lo) * ((value - self.lo) / span if span else 0.5)

    def ticks(self) -> list[float]:
        first = math.ceil(self.lo / self.step - 1e-9)
        last = math.floor(self.hi / self.step + 1e-9)
        return [k * self.step for k in range(first, last + 1)]

    def text(self, value: float) -> str:
        return tick_text(value, self.step)


def linear(lo: float, hi: float, px_lo: float, px_hi: float, ticks: int = 5, integer: bool = False) -> Scale:
    """A scale over [lo, hi] widened to whole tick steps (``integer``: steps of at least 1)."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        lo, hi = 0.0, 1.0
    if hi <= lo:
        hi = lo + (abs(lo) or 1.0)
    step = nice_step(hi - lo, ticks)
    if integer:
        step = max(1.0, round(step))
    return Scale(math.floor(lo / step + 1e-9) * step, math.ceil(hi / step - 1e-9) * step, px_lo, px_hi, step)


class Chart:
    """One chart being drawn: a fixed viewBox (the page scales it to its width), a plot area inside
    the margins, and the count of data marks drawn."""

    def __init__(self, name: str, width: int, height: int, title: str,
                 margins: tuple[int, int, int, int] = (64, 24, 16, 48)) -> None:
        left, right, top, bottom = margins
        self.name, self.width, self.height, self.title = name, width, height, title
        self.x0, self.x1, self.y0, self.y1 = left, width - right, top, height - bottom
        self.parts: list[str] = []
        self.marks = 0

    def add(self, *elements: str) -> None:
        self.parts.extend(elements)

    def mark(self, element: str) -> None:
        """A data mark: ``element`` is one SVG element whose class list starts with "mark"."""
        self.marks += 1
        self.parts.append(element)

    def x_axis(self, scale: Scale, label: str, grid: bool = False, labels: dict[float, str] | None = None) -> None:
        self.add(f'<line x1="{self.x0}" y1="{self.y1}" x2="{self.x1}" y2="{self.y1}" stroke="{AXIS_COLOUR}"/>')
        for v in scale.ticks():
            x = scale(v)
            if grid:
                self.add(f'<line x1="{x:.1f}" y1="{self.y0}" x2="{x:.1f}" y2="{self.y1}" stroke="{GRID_COLOUR}"/>')
            self.add(f'<line x1="{x:.1f}" y1="{self.y1}" x2="{x:.1f}" y2="{self.y1 + 4}" stroke="{AXIS_COLOUR}"/>',
                     f'<text x="{x:.1f}" y="{self.y1 + 16}" text-anchor="middle" class="tick">'
                     f"{esc(labels.get(v, scale.text(v)) if labels else scale.text(v))}</text>")
        self.add(f'<text x="{(self.x0 + self.x1) / 2:.1f}" y="{self.height - 8}" text-anchor="middle" '
                 f'class="axis-label">{esc(label)}</text>')

    def y_axis(self, scale: Scale, label: str, grid: bool = True) -> None:
        self.add(f'<line x1="{self.x0}" y1="{self.y0}" x2="{self.x0}" y2="{self.y1}" stroke="{AXIS_COLOUR}"/>')
        for v in scale.ticks():
            y = scale(v)
            if grid:
                self.add(f'<line x1="{self.x0}" y1="{y:.1f}" x2="{self.x1}" y2="{y:.1f}" stroke="{GRID_COLOUR}"/>')
            self.add(f'<text x="{self.x0 - 6}" y="{y + 4:.1f}" text-anchor="end" class="tick">{esc(scale.text(v))}'
                     "</text>")
        mid = (self.y0 + self.y1) / 2
        self.add(f'<text x="14" y="{mid:.1f}" text-anchor="middle" transform="rotate(-90 14 {mid:.1f})" '
                 f'class="axis-label">{esc(label)}</text>')

    def legend(self, entries: list[tuple[str, str]], x: float, y: float) -> None:
        """(swatch SVG drawn at the origin, text) pairs in a row from (x, y); swatches are 12 px wide."""
        for swatch, text in entries:
            self.add(f'<g transform="translate({x:.1f} {y:.1f})">{swatch}'
                     f'<text x="16" y="4" class="legend">{esc(text)}</text></g>')
            x += 16 + 6.5 * len(text) + 18  # about 6.5 px per character at the legend's 11 px

    def render(self) -> str:
        return (f'<svg class="chart" data-chart="{esc(self.name)}" data-marks="{self.marks}" role="img" '
                f'xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {self.width} {self.height}" '
                f'width="{self.width}" height="{self.height}" font-family="{esc(FONT)}" font-size="12">'
                f"<title>{esc(self.title)}</title>" + "".join(self.parts) + "</svg>")


def tooltip(text: str) -> str:
    return f"<title>{esc(text)}</title>"
