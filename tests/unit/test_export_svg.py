"""The SVG flame graph, on hand-built stacks whose weights are known: geometry, merging, tooltips,
escaping, elision, colours, and its script (syntax, pure functions, zoom and search) under node."""

from __future__ import annotations

import io
import json
import random
import re
import shutil
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from cpuprof.analysis.flame import FlameFrame, FlameStack
from cpuprof.exports import svg

NS = "{http://www.w3.org/2000/svg}"
NODE = shutil.which("node")
needs_node = pytest.mark.skipif(NODE is None, reason="node is not on PATH: the SVG's script cannot be run")
UGLY = "std::vector<at::Tensor, std::allocator<A&B>> \"q\" 'x'"


def stack(weight: float, *frames: str | tuple[str, str], thread: int = 0) -> FlameStack:
    """Frames as "name" (kind python) or (name, kind), root first."""
    return FlameStack(frames=tuple(FlameFrame(f, "python") if isinstance(f, str) else FlameFrame(*f) for f in frames),
                      weight=weight, thread=thread)


def basic() -> list[FlameStack]:
    """a;b 30, a;c 10, d 60: 100 in all."""
    return [stack(30, "a", ("b", "op")), stack(10, "a", ("c", "compute")), stack(60, ("d", "region"))]


def parse(doc: str) -> ET.Element:
    return ET.fromstring(doc)


def frames(doc: str) -> list[dict[str, Any]]:
    out = []
    for g in parse(doc).iter(NS + "g"):
        if g.get("class") != "f":
            continue
        title, rect, text = g.find(NS + "title"), g.find(NS + "rect"), g.find(NS + "text")
        assert title is not None and rect is not None and text is not None
        name, _, info = (title.text or "").rpartition("\n")
        out.append({"name": name, "info": info, "x": float(rect.get("x", "")), "w": float(rect.get("width", "")),
                    "y": float(rect.get("y", "")), "fill": rect.get("fill"), "label": text.text or "",
                    "dx": float(g.get("data-x", "")), "dw": float(g.get("data-w", "")), "d": int(g.get("data-d", ""))})
    return out


def by_name(doc: str) -> dict[str, dict[str, Any]]:
    found = frames(doc)
    named = {f["name"]: f for f in found}
    assert len(named) == len(found), "names repeat; use frames()"
    return named


def texts(doc: str) -> str:
    return " ".join("".join(e.itertext()) for e in parse(doc).iter(NS + "text"))


def script_of(doc: str) -> str:
    script = parse(doc).find(NS + "script")
    assert script is not None and script.text
    return script.text


def test_widths_are_proportional_to_weights():
    f = by_name(svg.render(basic(), "t", "samples"))
    full = f["all"]["w"]
    assert full == pytest.approx(1200 - 2 * svg.PAD)
    for name, weight in {"a": 40, "b": 30, "c": 10, "d": 60}.items():
        assert f[name]["w"] == pytest.approx(full * weight / 100, abs=0.01), name
        assert f[name]["dw"] == pytest.approx(weight / 100, abs=1e-9), name


def test_children_sit_above_their_parents_and_within_them():
    f = by_name(svg.render(basic(), "t", "samples"))
    for child, parent in [("a", "all"), ("d", "all"), ("b", "a"), ("c", "a")]:
        assert f[child]["y"] == f[parent]["y"] - svg.FRAME_H, child
        assert f[child]["d"] == f[parent]["d"] + 1
        assert f[parent]["x"] <= f[child]["x"]
        assert f[child]["x"] + f[child]["w"] <= f[parent]["x"] + f[parent]["w"] + 0.01
    assert f["all"]["y"] == max(fr["y"] for fr in f.values()), "the root is at the bottom"


def test_children_are_in_alphabetical_order_whatever_the_input_order():
    stacks = [stack(5, "root", n) for n in ["zeta", "Alpha", "mid", "beta"]] + [stack(1, "root", "mid", "x")]
    docs = set()
    for seed in range(5):
        shuffled = stacks[:]
        random.Random(seed).shuffle(shuffled)
        docs.add(svg.render(shuffled, "t", "samples"))
    assert len(docs) == 1, "the input's order shows in the output"
    f = by_name(docs.pop())
    lefts = [f[n]["x"] for n in ["Alpha", "beta", "mid", "zeta"]]  # code point order, as sort(1) in C locale
    assert lefts == sorted(lefts) and len(set(lefts)) == 4
    assert f["Alpha"]["x"] == f["root"]["x"], "the first child starts at its parent's left edge"


def test_render_is_deterministic():
    stacks = basic() + [stack(7, *[f"deep{i}" for i in range(30)])]
    assert svg.render(stacks, "t", "samples", "sub") == svg.render(list(stacks), "t", "samples", "sub")


def test_frames_merge_by_name_and_kind():
    doc = svg.render([stack(5, "a", ("x", "op")), stack(7, "a", ("x", "op")), stack(3, ("a", "op")),
                      stack(2, "a", ("x", "compute"))], "t", "samples")
    found = frames(doc)
    a = sorted((f for f in found if f["name"] == "a"), key=lambda f: f["dw"])
    assert [round(f["dw"] * 17) for f in a] == [3, 14]  # ("a", op) 3 and ("a", python) 5+7+2
    assert "[op]" in a[0]["info"] and "[Python]" in a[1]["info"]
    x = sorted((f for f in found if f["name"] == "x"), key=lambda f: f["dw"])
    assert [round(f["dw"] * 17) for f in x] == [2, 12]  # ("x", compute) 2 and ("x", op) 5+7 merged
    assert len(found) == 5  # all, a (python), a (op), x (op), x (compute)


def test_tooltips_say_name_weight_and_share():
    f = by_name(svg.render(basic() + [stack(1234, "e")], "t", "samples"))  # 1334 in all
    assert f["e"]["info"] == "1,234 samples, 92.50% [Python]"
    assert f["b"]["info"] == "30 samples, 2.25% [op]"
    assert f["all"]["info"] == "1,334 samples, 100.00%"
    ns = by_name(svg.render([stack(12_345_678, "x"), stack(2_500_000_000, "y")], "t", "nanoseconds"))
    assert ns["x"]["info"].startswith("12.3 ms, 0.49%") and ns["y"]["info"].startswith("2.50 s, 99.51%")
    ev = by_name(svg.render([stack(1_234_567, "x")], "t", "page-faults"))
    assert ev["x"]["info"].startswith("1,234,567 page-faults, 100.00%")


@pytest.mark.parametrize(("value", "unit", "text"), [
    (1, "samples", "1 sample"), (2, "samples", "2 samples"), (1234567, "samples", "1,234,567 samples"),
    (999, "nanoseconds", "999 ns"), (1_500_000, "nanoseconds", "1.5 ms"), (3_210_000_000, "nanoseconds", "3.21 s"),
    (42.0, "cycles", "42 cycles"), (2.5, "cycles", "2.50 cycles"),
])
def test_format_weight(value, unit, text):
    assert svg.format_weight(value, unit) == text


def test_names_are_escaped():
    doc = svg.render([stack(3, (UGLY, "compute")), stack(1, ("bad\x01name\nhere", "other"))],
                     'a <title> & "quotes"', "samples", "sub <&>")
    assert UGLY not in doc and "std::vector&lt;at::Tensor" in doc
    f = by_name(doc)  # parses, and the names come back intact
    assert f[UGLY]["label"] == UGLY
    assert "bad\ufffdname here" in f
    assert 'a <title> & "quotes"' in texts(doc) and "sub <&>" in texts(doc)


def test_non_ascii_names_survive_any_output_encoding():
    doc = svg.render([stack(1, "naïve_λ")], "t", "nanoseconds")
    doc.encode("ascii")  # character references, so a latin-1 or ascii stream can take it
    assert "naïve_λ" in by_name(doc)


def test_labels_are_cut_to_fit():
    long = "x" * 300
    f = by_name(svg.render([stack(10, long), stack(10, "short"), stack(80, "wide")], "t", "samples"))
    label = f[long]["label"]
    assert label.endswith("..") and label[:-2] == long[: len(label) - 2]
    assert 6 + len(label) * svg.CHAR_PX <= f[long]["w"]
    assert f["short"]["label"] == "short" and f["wide"]["label"] == "wide"
    assert svg.label("abcdef", 6 + 2.9 * svg.CHAR_PX) == "", "fewer than 3 characters fit: no label"


def test_tiny_frames_are_elided_but_still_weigh_in_their_parents():
    stacks = [stack(1_000_000, "big", "leaf")] + [stack(1, "big", f"tiny{i}", "deeper") for i in range(5)]
    doc = svg.render(stacks, "t", "samples")
    f = by_name(doc)
    assert not any(n.startswith("tiny") or n == "deeper" for n in f)
    assert "10 frames narrower than 0.1 px not drawn" in texts(doc)
    assert f["big"]["dw"] == pytest.approx(1.0)
    assert f["leaf"]["dw"] == pytest.approx(1_000_000 / 1_000_005, rel=1e-9)
    everything = [f["name"] for f in frames(svg.render(stacks, "t", "samples", min_width_px=0))]
    assert "tiny4" in everything and everything.count("deeper") == 5
    assert "not drawn" not in texts(svg.render(stacks, "t", "samples", min_width_px=0))


def test_a_huge_input_gives_a_bounded_file():
    stacks = [stack(1e9, "hot", "leaf")] + [stack(1, f"s{i}", f"t{i}") for i in range(50_000)]
    doc = svg.render(stacks, "t", "samples")
    assert len(frames(doc)) == 3
    assert "100,000 frames narrower" in texts(doc)
    assert len(doc) < 30_000


def test_empty_input_is_a_valid_svg_saying_so():
    doc = svg.render([], "Empty", "samples")
    assert parse(doc).tag == NS + "svg"
    assert "no samples" in texts(doc) and not frames(doc)
    zero = svg.render([stack(0, "a"), stack(-3, "b"), stack(float("nan"), "c")], "Zero", "page-faults")
    assert parse(zero).tag == NS + "svg"
    assert "total weight (page-faults) is zero" in texts(zero) and not frames(zero)


def test_weightless_and_negative_stacks_are_left_out():
    f = by_name(svg.render(basic() + [stack(0, "z"), stack(-5, "n"), stack(float("inf"), "i")], "t", "samples"))
    assert set(f) == {"all", "a", "b", "c", "d"} and f["all"]["info"].startswith("100 samples")


def test_a_deep_stack_grows_the_graph():
    shallow = parse(svg.render(basic(), "t", "samples"))
    chain = [f"f{i}" for i in range(2000)]  # deeper than Python's recursion limit
    doc = svg.render(basic() + [stack(50, *chain)], "t", "samples")
    grown = parse(doc)
    assert float(grown.get("height", "")) - float(shallow.get("height", "")) == (2000 - 2) * svg.FRAME_H
    f = by_name(doc)
    ys = [f[n]["y"] for n in chain]
    assert all(b == a - svg.FRAME_H for a, b in zip(ys, ys[1:], strict=False))
    assert min(ys) > 0


def kind_of(frame: dict[str, Any]) -> str:
    found = re.search(r"\[(.+)\]$", frame["info"])
    assert found, frame["info"]
    return found.group(1)


def test_colours_follow_the_kind():
    kinds = ["python", "op", "region", "special", "compute", "openmp", "allocator", "interpreter", "framework",
             "kernel", "thread", "other"]
    found = frames(svg.render([stack(1, ("x", kind)) for kind in kinds], "t", "samples"))
    fills = {kind_of(f): f["fill"] for f in found if f["name"] == "x"}
    assert len(fills) == len(kinds) and len(set(fills.values())) == len(kinds)
    assert svg.MATCH_FILL not in fills.values()
    # the same name and kind always get the same shade; another name of the kind another one
    again = frames(svg.render([stack(9, "y"), stack(1, ("x", "python"))], "t", "samples"))
    assert next(f["fill"] for f in again if f["name"] == "x") == fills["Python"]
    assert svg._colour("x", "python") != svg._colour("y", "python")
    assert svg._colour("x", "no-such-kind") == svg._colour("x", "other")


def test_the_legend_names_the_kinds_drawn():
    legend = parse(svg.render(basic(), "t", "samples")).find(f".//{NS}g[@id='legend']")
    assert legend is not None
    assert ["".join(t.itertext()) for t in legend.iter(NS + "text")] == ["Python", "region", "op", "compute"]


def test_write_writes_what_render_returns():
    out = io.StringIO()
    assert svg.write(basic(), out, "t", "samples", "sub") is None
    assert out.getvalue() == svg.render(basic(), "t", "samples", "sub")


def test_the_script_is_inline_and_fetches_nothing():
    doc = svg.render(basic(), "t", "samples")
    assert "]]>" not in svg.SCRIPT
    assert not re.search(r"https?://(?!www\.w3\.org/2000/svg)", doc)
    assert "href" not in doc


def test_the_buttons_say_what_they_do():
    doc = svg.render(basic(), "t", "samples")
    labels = re.findall(r'<g id="(\w+)" class="btn[^"]*">(?:<title>[^<]*</title>)?<text[^>]*>([^<]*)</text>', doc)
    assert dict(labels) == {"unzoom": "Reset Zoom", "search": "Search", "ic": "ignore case"}


@needs_node
def test_the_script_is_valid_javascript(tmp_path: Path):
    js = tmp_path / "flame.js"
    js.write_text(script_of(svg.render(basic(), "t", "samples")))
    result = subprocess.run([str(NODE), "--check", str(js)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


def run_node(tmp_path: Path, script: str, program: str) -> Any:
    js = tmp_path / "run.js"
    js.write_text(script + "\n;\n" + program)
    result = subprocess.run([str(NODE), str(js)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@needs_node
def test_the_script_cuts_labels_as_python_does(tmp_path: Path):
    cases = [(name, width) for name in ["", "ab", "abcdef", UGLY, "x" * 200]
             for width in [0, 6, 20, 27.24, 28, 50, 100.5, 400, 1180]]
    got = run_node(tmp_path, svg.SCRIPT,
                   f"console.log(JSON.stringify({json.dumps(cases)}.map(c => label(c[0], c[1], {svg.CHAR_PX}))));")
    assert got == [svg.label(name, width) for name, width in cases]


@needs_node
def test_matched_share_counts_nested_matches_once(tmp_path: Path):
    doc = svg.render(basic() + [stack(20, "a", ("b", "op"), "a")], "t", "samples")  # total 120
    spans = {name: [[f["dx"], f["dw"]] for f in frames(doc) if re.fullmatch(name, f["name"])]
             for name in ["a", "b", "a|b", "a|c", "c|d", "a|b|c|d", "zzz"]}
    got = run_node(tmp_path, svg.SCRIPT,
                   f"var s = {json.dumps(spans)}; var r = {{}};"
                   "for (var k in s) r[k] = matchedShare(s[k]); console.log(JSON.stringify(r));")
    # "a" matches the outer a (60) and the a inside b inside it: 60, not 80
    want = {"a": 60, "b": 50, "a|b": 60, "a|c": 60, "c|d": 70, "a|b|c|d": 120, "zzz": 0}
    assert got == pytest.approx({k: v / 120 for k, v in want.items()}, abs=1e-9)


# A fake DOM of just what the script uses, built from the parsed SVG: enough to run init(), click
# frames, press keys and answer the search prompt, then report every frame's state.
FAKE_DOM = r"""
function El(node, parent) {
  this.tag = node.tag; this.attrs = node.attrs; this.parentNode = parent; this.style = {};
  this.textContent = node.text; this.listeners = {};
  this.classes = new Set((node.attrs["class"] || "").split(/\s+/).filter(Boolean));
  var self = this;
  this.classList = {
    add: function (c) { self.classes.add(c); }, remove: function (c) { self.classes.delete(c); },
    toggle: function (c, on) { if (on === undefined) on = !self.classes.has(c); if (on) self.classes.add(c);
                               else self.classes.delete(c); return on; }
  };
  this.children = node.children.map(function (c) { return new El(c, self); });
}
El.prototype.getAttribute = function (k) { return k in this.attrs ? String(this.attrs[k]) : null; };
El.prototype.setAttribute = function (k, v) { this.attrs[k] = String(v); };
El.prototype.addEventListener = function (t, f) { (this.listeners[t] = this.listeners[t] || []).push(f); };
El.prototype.getElementsByTagName = function (tag) {
  var out = [];
  (function walk(e) { e.children.forEach(function (c) { if (c.tag === tag) out.push(c); walk(c); }); })(this);
  return out;
};
function fire(el, type, ev) { (el.listeners[type] || []).forEach(function (f) { f(ev); }); }
var svgRoot = new El(TREE, null), byId = {};
(function index(e) { if (e.attrs.id) byId[e.attrs.id] = e; e.children.forEach(index); })(svgRoot);
var answer = null, alerts = [];
var document = {documentElement: svgRoot, getElementById: function (id) { return byId[id] || null; }};
var window = {listeners: {}, prompt: function () { return answer; }, alert: function (m) { alerts.push(m); }};
window.addEventListener = El.prototype.addEventListener;
"""

HARNESS = r"""
init();
var states = {}, root = byId["frames"];
function frameNamed(name) { return frames.filter(function (f) { return f.name === name; })[0]; }
function snapshot(key) {
  var s = {};
  frames.forEach(function (f) {
    if (f.name in s) return;  // the first of a name, in document order: the outer one
    s[f.name] = {x: parseFloat(f.rect.getAttribute("x")), w: parseFloat(f.rect.getAttribute("width")),
                 hidden: f.g.classes.has("h"), faded: f.g.classes.has("parent"), fill: f.rect.style.fill || "",
                 label: f.text.textContent};
  });
  states[key] = {frames: s, details: details.textContent, matched: matched.textContent,
                 unzoomHidden: unzoomBtn.classes.has("h"),
                 searchLabel: searchBtn.getElementsByTagName("text")[0].textContent, alerts: alerts.slice()};
}
function key(k, ctrl) { var stopped = false;
  fire(window, "keydown", {key: k, ctrlKey: !!ctrl, metaKey: false, preventDefault: function () { stopped = true; }});
  return stopped; }
fire(root, "mouseover", {target: frameNamed("b").rect});
snapshot("start");
fire(root, "mouseout", {target: frameNamed("b").rect});
fire(root, "click", {target: frameNamed("a").text});
snapshot("zoomed");
fire(root, "click", {target: frameNamed("all").rect});
snapshot("root clicked");
fire(root, "click", {target: frameNamed("a").rect});
fire(byId["unzoom"], "click", {target: byId["unzoom"]});
snapshot("unzoomed");
answer = "^[AB]$"; key("f", true);
snapshot("case-sensitive search");
fire(byId["ic"], "click", {target: byId["ic"]});
snapshot("ignoring case");
key("Escape");
snapshot("escaped");
answer = "("; key("F3");
snapshot("bad regex");
answer = "a"; fire(byId["search"], "click", {target: byId["search"]});
snapshot("search a");
fire(byId["search"], "click", {target: byId["search"]});
snapshot("search toggled off");
console.log(JSON.stringify(states));
"""


def as_tree(e: ET.Element) -> dict[str, Any]:
    return {"tag": e.tag.removeprefix(NS), "attrs": dict(e.attrib), "text": "".join(e.itertext()),
            "children": [as_tree(c) for c in e]}


@needs_node
def test_zoom_and_search_in_a_fake_dom(tmp_path: Path):
    doc = svg.render(basic() + [stack(20, "a", ("b", "op"), "a")], "t", "samples")  # total 120
    tree = json.dumps(as_tree(parse(doc)))
    states = run_node(tmp_path, f"var TREE = {tree};\n{FAKE_DOM}\n{script_of(doc)}", HARNESS)
    full, pad = 1200 - 2 * svg.PAD, svg.PAD
    start = states["start"]
    assert start["frames"]["d"]["x"] == pytest.approx(pad + full * 60 / 120, abs=0.01)
    assert start["unzoomHidden"] and start["matched"].strip() == ""
    assert start["details"] == "b (50 samples, 41.67% [op])"

    zoomed = states["zoomed"]["frames"]  # a (60 of 120) fills the width; b (50) and c (10) share it
    assert zoomed["a"]["x"] == pytest.approx(pad) and zoomed["a"]["w"] == pytest.approx(full, abs=0.01)
    assert zoomed["b"]["w"] == pytest.approx(full * 50 / 60, abs=0.01)
    assert zoomed["c"]["x"] == pytest.approx(pad + full * 50 / 60, abs=0.01)
    assert zoomed["c"]["label"] == "c" and not zoomed["c"]["hidden"]
    assert zoomed["d"]["hidden"] and zoomed["all"]["faded"] and not zoomed["a"]["faded"]
    assert zoomed["all"]["w"] == pytest.approx(full, abs=0.01)
    assert not states["zoomed"]["unzoomHidden"]

    for back in ["root clicked", "unzoomed"]:
        assert states[back]["frames"] == start["frames"], back
        assert states[back]["unzoomHidden"]

    # names are unique here but for "a" (the outer one, 60, holds the inner one, 20)
    sensitive = states["case-sensitive search"]
    assert sensitive["matched"] == "Matched: 0.00%" and sensitive["searchLabel"] == "Reset Search"
    insensitive = states["ignoring case"]
    assert insensitive["matched"] == "Matched: 50.00%"  # a and b, nested in it, counted once
    assert insensitive["frames"]["b"]["fill"] == svg.MATCH_FILL and insensitive["frames"]["d"]["fill"] == ""
    assert insensitive["frames"]["all"]["fill"] == "", "the root is not a frame of the program"
    escaped = states["escaped"]
    assert escaped["matched"].strip() == "" and escaped["searchLabel"] == "Search"
    assert all(f["fill"] == "" for f in escaped["frames"].values())
    assert states["bad regex"]["alerts"] and states["bad regex"]["matched"].strip() == ""
    assert states["search a"]["matched"] == "Matched: 50.00%", "\"all\" matches /a/ but is no frame of the program"
    assert states["search a"]["frames"]["all"]["fill"] == ""
    assert states["search toggled off"]["searchLabel"] == "Search"
    assert all(f["fill"] == "" for f in states["search toggled off"]["frames"].values())
