"""A self-contained SVG flame graph: searchable, zoomable, with every frame coloured by its kind.

It reads like the flame graphs of Brendan Gregg's flamegraph.pl or inferno that perf users know:
the root at the bottom, one box per frame as wide as its share of the total, children sorted
alphabetically, a click zooms into a frame, "Search" highlights the frames a regular expression
matches. It is written here rather than produced by those tools because flamegraph.pl is Perl and
no pip dependency, inferno is a Rust binary, and neither knows our frame kinds: here Python frames,
ops, regions, compute kernels, the OpenMP runtime, the allocator and the OS kernel each get their
own hue, so where the time went reads at a glance. It needs only the standard library, and the file
it writes works offline: the script is inline and nothing is fetched.
"""

from __future__ import annotations

import colorsys
import math
import zlib
from collections.abc import Iterable
from typing import TYPE_CHECKING, TextIO

from ..analysis.flame import FlameStack
from ..units import fmt_ns
from .markup import escape

if TYPE_CHECKING:
    from ..reports.base import Role
    from ..reports.sources import OutputOptions, Source, SourceKind


PAD = 10  # left and right margin, px
FRAME_H = 16  # one stack level, px; the box is a pixel shorter so levels stay apart
FONT_PX = 12
# Verdana's mean advance is about 0.59 em: measuring text needs a browser, so labels are cut on
# this estimate (the same one in the script) and keep 3 px clear of each edge.
CHAR_PX = FONT_PX * 0.59
MATCH_FILL = "rgb(230,0,230)"  # search hits: no kind's hue is this saturated magenta
ROOT_NAME = "all"

# kind: (legend label, hue in degrees, saturation, lightness). Lightness stays high enough for black
# labels; the grey kinds (thread, other) are frames that say where, not what.
_KINDS: dict[str, tuple[str, float, float, float]] = {
    "thread": ("thread", 220, 0.22, 0.68),
    "python": ("Python", 210, 0.65, 0.70),
    "region": ("region", 270, 0.45, 0.74),
    "op": ("op", 170, 0.50, 0.60),
    "special": ("special", 340, 0.55, 0.75),
    "compute": ("compute", 5, 0.75, 0.63),
    "openmp": ("OpenMP", 52, 0.80, 0.58),
    "allocator": ("allocator", 100, 0.50, 0.58),
    "interpreter": ("interpreter", 45, 0.30, 0.72),
    "framework": ("framework", 28, 0.85, 0.62),
    "kernel": ("kernel", 12, 0.45, 0.55),
    "other": ("other native", 60, 0.05, 0.64),
}
_ROOT_COLOUR = (0.0, 0.0, 0.80)



class _Node:
    __slots__ = ("name", "kind", "weight", "children")

    def __init__(self, name: str, kind: str) -> None:
        self.name = name
        self.kind = kind
        self.weight = 0.0
        self.children: dict[tuple[str, str], _Node] = {}


def render(stacks: Iterable[FlameStack], title: str, unit: str, subtitle: str = "",
           min_width_px: float = 0.1, width_px: int = 1200) -> str:
    """The SVG document. ``unit`` is what the weights count: "samples", "nanoseconds" or an event's
    name. Frames narrower than ``min_width_px`` are left out, with their descendants (their weight
    still widens their parents), so a level holds at most ``width / min_width_px`` frames however
    many distinct stacks there are."""
    root, seen = _tree(stacks)
    graph_w = max(width_px - 2 * PAD, 1)
    out: list[str] = []
    if not root.weight > 0:
        message = "no samples" if not seen else f"nothing to draw: the total weight ({unit}) is zero"
        height = _header(out, width_px, title, subtitle, "", [], controls=False) + 40
        out.append(f'<text class="sub" x="{width_px / 2:g}" y="{height - 16}">{_esc(message)}</text>\n')
        return _document(out, width_px, height, script=False)

    frames, elided = _layout(root, graph_w, min_width_px)
    note = ""
    if elided:
        note = (f"{elided:,} frame{'s' if elided != 1 else ''} narrower than {min_width_px:g} px not drawn "
                "(their weight is in their parents' widths)")
    kinds = sorted({n.kind if n.kind in _KINDS else "other" for n, _, _ in frames if n is not root},
                   key=list(_KINDS).index)
    top = _header(out, width_px, title, subtitle, note, kinds, controls=True) + 10
    bottom = top + (max(d for _, _, d in frames) + 1) * FRAME_H
    height = bottom + 28

    out.append(f'<g id="frames" data-pad="{PAD}" data-gw="{graph_w:g}" data-cw="{CHAR_PX:g}">\n')
    total = root.weight
    for node, x, depth in frames:
        share = node.weight / total
        px, pw = PAD + x * graph_w, share * graph_w
        y = bottom - (depth + 1) * FRAME_H
        info = f"{format_weight(node.weight, unit)}, {100 * share:.2f}%"
        if node is not root:
            info += f" [{_KINDS.get(node.kind, _KINDS['other'])[0]}]"
        fill = _colour(node.name, node.kind) if node is not root else _rgb(*_ROOT_COLOUR)
        # The tooltip's first line is the name and its last the figures: the script splits them
        # at the last newline, which no name holds (_clean makes them spaces).
        out.append(f'<g class="f" data-x="{x:.12g}" data-w="{share:.12g}" data-d="{depth}">'
                   f"<title>{_esc(node.name)}\n{_esc(info)}</title>"
                   f'<rect x="{px:.2f}" y="{y}" width="{pw:.2f}" height="{FRAME_H - 1}" rx="2" fill="{fill}"/>'
                   f'<text x="{px + 3:.2f}" y="{y + FRAME_H - 5}">{_esc(label(node.name, pw))}</text></g>\n')
    out.append("</g>\n")
    out.append(f'<text id="details" x="{PAD}" y="{height - 10}"> </text>\n')
    out.append(f'<text id="matched" x="{width_px - PAD}" y="{height - 10}" text-anchor="end"> </text>\n')
    return _document(out, width_px, height, script=True)


def write(stacks: Iterable[FlameStack], out: TextIO, title: str, unit: str, subtitle: str = "") -> None:
    out.write(render(stacks, title, unit, subtitle))


def format_weight(value: float, unit: str) -> str:
    """A frame's weight as its tooltip says it: times in ms or s, counts with thousands separators."""
    if unit == "nanoseconds":
        return fmt_ns(value)
    count = f"{round(value):,}" if abs(value - round(value)) < 1e-6 else f"{value:,.2f}"
    if unit == "samples" and count == "1":
        return "1 sample"
    return f"{count} {unit}"


def label(name: str, width_px: float) -> str:
    """The part of a name that fits a box ``width_px`` wide, cut with ".."; the script's label()
    is the same rule, so zooming in and out gives the labels this would."""
    n = math.floor((width_px - 6) / CHAR_PX)
    if n < 3:
        return ""
    return name if len(name) <= n else name[: n - 2] + ".."


def _tree(stacks: Iterable[FlameStack]) -> tuple[_Node, bool]:
    """The stacks merged into one tree under "all", and whether there were any stacks at all."""
    root = _Node(ROOT_NAME, "root")
    seen = False
    for stack in stacks:
        seen = True
        weight = float(stack.weight)
        # A box can't be negative or infinitely wide; such a weight is an upstream bug, not a frame.
        if not (weight > 0 and math.isfinite(weight)):
            continue
        node = root
        node.weight += weight
        for frame in stack.frames:
            key = (frame.name, frame.kind)
            child = node.children.get(key)
            if child is None:
                child = node.children[key] = _Node(_clean(frame.name), frame.kind)
            child.weight += weight
            node = child
    return root, seen


def _layout(root: _Node, graph_w: float, min_width_px: float) -> tuple[list[tuple[_Node, float, int]], int]:
    """(node, left edge as a share of the total, depth) for every frame wide enough to draw, and how
    many frames were not. Iterative, since a stack can be deeper than Python's recursion limit."""
    total = root.weight
    drawn: list[tuple[_Node, float, int]] = []
    elided = 0
    todo = [(root, 0.0, 0)]
    while todo:
        node, x, depth = todo.pop()
        drawn.append((node, x, depth))
        # A first child starts at exactly its parent's float, so the script's containment and
        # nesting tests see children inside their parents rather than a rounding error outside.
        cx = x
        placed = []
        for key in sorted(node.children):
            child = node.children[key]
            share = child.weight / total
            if share * graph_w < min_width_px:
                elided += _size(child)
            else:
                placed.append((child, cx, depth + 1))
            cx += share
        todo.extend(reversed(placed))
    return drawn, elided


def _size(node: _Node) -> int:
    count, todo = 0, [node]
    while todo:
        n = todo.pop()
        count += 1
        todo.extend(n.children.values())
    return count


def _header(out: list[str], width_px: int, title: str, subtitle: str, note: str, kinds: list[str],
            controls: bool) -> int:
    """Title, controls, subtitle, elision note and legend; returns the y below them."""
    mid = f"{width_px / 2:g}"
    out.append(f'<text id="title" x="{mid}" y="24">{_esc(title)}</text>\n')
    if controls:
        right = width_px - PAD
        out.append(f'<g id="unzoom" class="btn h"><text x="{PAD}" y="24">Reset Zoom</text></g>\n')
        out.append('<g id="search" class="btn"><title>Search frames for a regular expression '
                   '(Ctrl-F or F3; Escape clears)</title>'
                   f'<text x="{right}" y="24" text-anchor="end">Search</text></g>\n')
        out.append('<g id="ic" class="btn"><title>Toggle case-insensitive search</title>'
                   f'<text x="{right - 6 * CHAR_PX - 14:.0f}" y="24" text-anchor="end">ignore case</text></g>\n')
    y = 24
    for line in (subtitle, note):
        if line:
            y += 18
            out.append(f'<text class="sub" x="{mid}" y="{y}">{_esc(line)}</text>\n')
    if kinds:
        y += 20
        x = float(PAD)
        out.append('<g id="legend">')
        for kind in kinds:
            name, hue, sat, light = _KINDS[kind]
            item_w = 14 + len(name) * CHAR_PX + 16
            if x + item_w > width_px - PAD and x > PAD:
                x, y = float(PAD), y + 16
            out.append(f'<rect x="{x:.0f}" y="{y - 10}" width="10" height="10" rx="2" '
                       f'fill="{_rgb(hue, sat, light)}"/><text x="{x + 14:.0f}" y="{y}">{_esc(name)}</text>')
            x += item_w
        out.append("</g>\n")
    return y


_STYLE = """text{font-family:Verdana,sans-serif;font-size:12px;fill:#000}
#title{font-size:17px;text-anchor:middle}
.sub{text-anchor:middle;fill:#444}
.btn{cursor:pointer}
.btn text{fill:#236}
.btn:hover text{text-decoration:underline}
#ic{opacity:.4}
#ic.on{opacity:1;font-weight:bold}
.f{cursor:pointer}
.f:hover rect{stroke:#000;stroke-width:.5}
.parent{opacity:.5}
.h{display:none}
"""


def _document(body: list[str], width_px: int, height: int, script: bool) -> str:
    onload = ' onload="init(evt)"' if script else ""
    head = (f'<?xml version="1.0" encoding="UTF-8" standalone="no"?>\n'
            f'<svg version="1.1" xmlns="http://www.w3.org/2000/svg" width="{width_px}" height="{height}" '
            f'viewBox="0 0 {width_px} {height}"{onload}>\n'
            f"<style>\n{_STYLE}</style>\n"
            '<defs><linearGradient id="bg" x1="0" y1="0" x2="0" y2="1">'
            '<stop offset="0" stop-color="#f8f8f8"/><stop offset="1" stop-color="#ecece0"/></linearGradient></defs>\n'
            '<rect x="0" y="0" width="100%" height="100%" fill="url(#bg)"/>\n')
    tail = f'<script type="text/ecmascript"><![CDATA[{SCRIPT}]]></script>\n' if script else ""
    return head + "".join(body) + tail + "</svg>\n"


def _colour(name: str, kind: str) -> str:
    """The kind's hue, shaded by a hash of the name: neighbours differ, and a name keeps its colour
    from one run to the next (crc32, not hash(), which Python salts per process)."""
    _, hue, sat, light = _KINDS.get(kind, _KINDS["other"])
    h = zlib.crc32(name.encode("utf-8", "surrogatepass"))
    hue += ((h & 0xFF) / 255 - 0.5) * 12 if sat > 0.1 else 0
    light += (((h >> 8) & 0xFF) / 255 - 0.5) * 0.12
    return _rgb(hue % 360, sat, light)


def _rgb(hue: float, sat: float, light: float) -> str:
    r, g, b = colorsys.hls_to_rgb(hue / 360, light, sat)
    return f"rgb({round(r * 255)},{round(g * 255)},{round(b * 255)})"


def _clean(name: str) -> str:
    return name.replace("\r", " ").replace("\n", " ").replace("\t", " ")


def _esc(text: str) -> str:
    # Character references for everything past ASCII keep the file right whatever encoding the
    # stream it is written to uses.
    return escape(text, ascii_only=True)


# The viewer. Frames carry their place as shares of the total (data-x, data-w) and their depth
# (data-d), so zooming is arithmetic on those, never a reading of pixels back. label() and
# matchedShare() use no DOM, so the tests run them under node.
SCRIPT = r"""
"use strict";
var EPS = 1e-9, MATCH = "rgb(230,0,230)";
var frames = [], pad, gw, cw, details, matched, unzoomBtn, searchBtn, icBtn, query = null, ignoreCase = false;

function label(name, width, charWidth) {
  var n = Math.floor((width - 6) / charWidth);
  if (n < 3) return "";
  return name.length <= n ? name : name.slice(0, n - 2) + "..";
}

// Frames either nest or are disjoint. Sorted by left edge, widest first, a match that starts
// before the end of the last one counted lies inside it, and its weight is already counted.
function matchedShare(spans) {
  var s = spans.slice().sort(function (a, b) { return a[0] - b[0] || b[1] - a[1]; });
  var sum = 0, end = -Infinity;
  for (var i = 0; i < s.length; i++) {
    if (s[i][0] >= end - EPS) { sum += s[i][1]; end = s[i][0] + s[i][1]; }
  }
  return sum;
}

function num(el, key) { return parseFloat(el.getAttribute("data-" + key)); }

function init() {
  var root = document.getElementById("frames");
  pad = num(root, "pad"); gw = num(root, "gw"); cw = num(root, "cw");
  details = document.getElementById("details"); matched = document.getElementById("matched");
  unzoomBtn = document.getElementById("unzoom"); searchBtn = document.getElementById("search");
  icBtn = document.getElementById("ic");
  var gs = root.getElementsByTagName("g");
  for (var i = 0; i < gs.length; i++) {
    var g = gs[i], tip = g.getElementsByTagName("title")[0].textContent, nl = tip.lastIndexOf("\n");
    var f = {g: g, rect: g.getElementsByTagName("rect")[0], text: g.getElementsByTagName("text")[0],
             x: num(g, "x"), w: num(g, "w"), d: num(g, "d"), name: tip.slice(0, nl), info: tip.slice(nl + 1)};
    g.cpuprofFrame = f;
    frames.push(f);
  }
  root.addEventListener("click", function (e) { var f = frameOf(e.target); if (f) zoom(f); });
  root.addEventListener("mouseover", function (e) {
    var f = frameOf(e.target);
    details.textContent = f ? f.name + " (" + f.info + ")" : " ";
  });
  root.addEventListener("mouseout", function () { details.textContent = " "; });
  unzoomBtn.addEventListener("click", unzoom);
  searchBtn.addEventListener("click", function () { if (query === null) searchPrompt(); else resetSearch(); });
  icBtn.addEventListener("click", function () {
    ignoreCase = !ignoreCase;
    icBtn.classList.toggle("on", ignoreCase);
    if (query !== null) search(query);
  });
  window.addEventListener("keydown", function (e) {
    if (e.key === "F3" || ((e.ctrlKey || e.metaKey) && (e.key === "f" || e.key === "F"))) {
      e.preventDefault();
      searchPrompt();
    } else if (e.key === "Escape") {
      resetSearch();
    }
  });
}

function frameOf(el) {
  for (; el && el !== document; el = el.parentNode) if (el.cpuprofFrame) return el.cpuprofFrame;
  return null;
}

function place(f, x, w) {
  var px = pad + x * gw, pw = w * gw;
  f.rect.setAttribute("x", px.toFixed(2));
  f.rect.setAttribute("width", pw.toFixed(2));
  f.text.setAttribute("x", (px + 3).toFixed(2));
  f.text.textContent = label(f.name, pw, cw);
}

function show(f, faded) {
  f.g.classList.remove("h");
  f.g.classList.toggle("parent", faded);
}

function zoom(z) {
  if (z.d === 0) { unzoom(); return; }
  var left = z.x, right = z.x + z.w;
  frames.forEach(function (f) {
    var end = f.x + f.w;
    if (f.d < z.d && f.x <= left + EPS && end >= right - EPS) {
      place(f, 0, 1); show(f, true);
    } else if (f.d >= z.d && f.x >= left - EPS && end <= right + EPS) {
      place(f, (f.x - left) / z.w, f.w / z.w); show(f, false);
    } else {
      f.g.classList.add("h");
    }
  });
  unzoomBtn.classList.remove("h");
}

function unzoom() {
  frames.forEach(function (f) { place(f, f.x, f.w); show(f, false); });
  unzoomBtn.classList.add("h");
}

function searchPrompt() {
  var term = window.prompt("Search frames for a regular expression" + (ignoreCase ? " (ignoring case)" : ""),
                           query === null ? "" : query);
  if (term) search(term);
}

function search(term) {
  var re;
  try {
    re = new RegExp(term, ignoreCase ? "i" : "");
  } catch (err) {
    window.alert("Not a regular expression: " + term);
    return;
  }
  query = term;
  var spans = [];
  frames.forEach(function (f) {
    var hit = f.d > 0 && re.test(f.name);  // "all" is not a frame of the program
    f.rect.style.fill = hit ? MATCH : "";
    if (hit) spans.push([f.x, f.w]);
  });
  matched.textContent = "Matched: " + (100 * matchedShare(spans)).toFixed(2) + "%";
  searchBtn.getElementsByTagName("text")[0].textContent = "Reset Search";
}

function resetSearch() {
  query = null;
  frames.forEach(function (f) { f.rect.style.fill = ""; });
  matched.textContent = " ";
  searchBtn.getElementsByTagName("text")[0].textContent = "Search";
}
"""


class FlameSvgOutput:
    """``flamegraph --format svg``: the flame graph as one self-contained SVG (zoom and search inside)."""

    name = "svg"
    suffix = ".svg"
    other_suffixes: tuple[str, ...] = ()
    reads: tuple[SourceKind, ...] = ("stacks",)
    role: Role = "export"
    help = "a flame graph, one self-contained SVG: click to zoom, search (opens in a browser)"

    def write(self, source: Source, out: TextIO, options: OutputOptions) -> int:
        from ..reports.sources import StacksSource

        assert isinstance(source, StacksSource)
        graph = source.graph
        write(graph.stacks, out, title=graph.title, unit=graph.unit, subtitle=graph.subtitle)
        return len(graph.stacks)
