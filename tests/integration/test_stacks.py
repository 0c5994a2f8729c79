"""Merged stacks against workloads whose answers are known: Python frames (py-spy's and the
in-process sampler's) above the ops they called, worker samples under the ops of the thread they
worked for, every export in its format's own rules, and py-spy's faults as one line with the
profile still made."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from cli_runs import cpuprof

from cpuprof.model import Profile

# Two Python functions, each calling ops for ~0.6 s, one after the other, then an idle tail: the
# matmul must sit under the function that called it, the additions under the other.
KNOWN_CALLERS = textwrap.dedent("""
    import sys, time, torch
    import cpuprof

    torch.set_num_threads(2)
    a = torch.randn(512, 512)
    b = torch.randn(512, 512)
    x = torch.randn(256, 256)

    def python_caller_of_matmul():
        deadline = time.monotonic() + 0.6
        while time.monotonic() < deadline:
            torch.mm(a, b)

    def python_caller_of_add():
        global x
        deadline = time.monotonic() + 0.6
        while time.monotonic() < deadline:
            x = torch.add(x, 1.0)

    a @ b
    # 1 kHz, not the default 250 Hz: the checks below need a few hundred samples of each 0.6 s caller.
    with cpuprof.profile("task-clock", timeline=1000, python_stacks=True, sample_hz=1000, warn=False,
                         python_sampler=sys.argv[2]) as prof:
        python_caller_of_matmul()
        python_caller_of_add()
    prof.export(sys.argv[1])
""")


def run_script(code: str, *args: str, env: dict[str, str] | None = None, timeout: float = 300) -> None:
    result = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=timeout,
                            env={**os.environ, "OMP_NUM_THREADS": "2", **(env or {})})
    assert result.returncode == 0, result.stderr


@pytest.fixture(scope="module")
def callers(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("callers")
    run_script(KNOWN_CALLERS, str(out), "py-spy")
    return out


@pytest.fixture(scope="module")
def callers_in_process(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("callers-in-process")
    run_script(KNOWN_CALLERS, str(out), "in-process")
    return out


def weight_under(stacks, op: str, python_function: str) -> tuple[float, float]:
    """(weight of the op's dispatch-thread stacks with the function among their Python frames,
    weight of all its dispatch-thread stacks)."""
    under = total = 0.0
    for s in stacks:
        names = [f.name for f in s.frames]
        if op not in names or "dispatch" not in names[0]:
            continue
        total += s.weight
        python = [f.name for f in s.frames if f.kind == "python"]
        if any(name.startswith(python_function + " ") for name in python):
            under += s.weight
    return under, total


@pytest.mark.parametrize("sampler", ["py-spy", "in-process"])
def test_python_function_calling_matmul_appears_above_aten_mm(sampler: str, request):
    from cpuprof.analysis.flame import merged_stacks

    profile = Profile.load(request.getfixturevalue("callers" if sampler == "py-spy" else "callers_in_process"))
    py = profile.sampling.python
    assert py is not None and py.error is None, py
    # in-process, periods the op callers covered are not read (test_python_sampler.py's pacer tests)
    assert py.source.startswith(sampler) and py.samples + py.ticks_covered >= 50, py
    # the clock alignment is within about one py-spy period; the in-process reads need none
    assert py.clock_error_ns <= (1e9 / py.hz if sampler == "py-spy" else 0)
    assert py.joined > 0.9 * (py.joined + py.unmatched)
    stacks = merged_stacks(profile)
    under, total = weight_under(stacks, "aten::mm", "python_caller_of_matmul")
    assert total >= 200
    assert under >= 0.85 * total, (under, total)
    under, total = weight_under(stacks, "aten::add", "python_caller_of_add")
    assert total >= 100 and under >= 0.85 * total, (under, total)
    # each Python stack reads root first, and the op follows its caller's frame
    mm = max((s for s in stacks if "aten::mm" in [f.name for f in s.frames] and "dispatch" in s.frames[0].name),
             key=lambda s: s.weight)
    names = [f.name for f in mm.frames]
    kinds = [f.kind for f in mm.frames]
    assert kinds[0] == "thread" and kinds[1] == "python"
    caller = next(i for i, n in enumerate(names) if n.startswith("python_caller_of_matmul "))
    assert names.index("aten::mm") > caller
    assert all(k == "python" for k in kinds[1:caller + 1])
    workers = [s for s in stacks if "worker" in s.frames[0].name and "aten::mm" in [f.name for f in s.frames]]
    assert workers, "the OpenMP worker's GEMM samples are missing"
    if not py.op_caller_changes:  # reads alone (py-spy, or a Python without recorded callers): no
        # Python frames, the op they worked for right under their root
        for s in workers:
            assert all(f.kind != "python" for f in s.frames)
            assert s.frames[1].name == "aten::mm"
        return
    # each op's caller is recorded (in-process, CPython 3.11 to 3.13), and the worker's GEMM samples
    # sit under the Python function that called the GEMM it worked for, then the op
    under = sum(s.weight for s in workers if any(f.name.startswith("python_caller_of_matmul ") for f in s.frames))
    assert under >= 0.85 * sum(s.weight for s in workers), [[f.name for f in s.frames] for s in workers][:5]
    for s in workers:
        kinds = [f.kind for f in s.frames]
        names = [f.name for f in s.frames]
        python = [i for i, k in enumerate(kinds) if k == "python"]
        assert not python or max(python) < names.index("aten::mm")
    assert profile.sampling.python.workers_joined > 0


def test_merged_stacks_weigh_what_the_counts_hold(callers: Path):
    from cpuprof.analysis.flame import merged_stacks

    profile = Profile.load(callers)
    counts = profile.stacks.counts
    for weight, expected in (("samples", sum(c.samples for c in counts)), ("cpu", sum(c.cpu_ns for c in counts))):
        got = sum(s.weight for s in merged_stacks(profile, weight=weight))
        assert got == pytest.approx(expected, rel=1e-9), weight
    one = merged_stacks(profile, thread="T1")
    assert one and all(s.thread == 1 for s in one)
    assert sum(s.weight for s in one) == sum(c.samples for c in counts if c.thread == 1)


FOLDED_LINE = re.compile(r"^(.*)\s+?(\d+(?:\.\d*)?)$")  # flamegraph.pl's own input pattern


def test_folded_export_follows_flamegraph_pl_grammar(callers: Path, tmp_path: Path):
    out = tmp_path / "stacks.folded"
    result = cpuprof("flamegraph", str(callers), "-o", str(out))
    assert result.returncode == 0, result.stderr
    profile = Profile.load(callers)
    lines = out.read_text().splitlines()
    assert lines
    total = 0
    for line in lines:
        m = FOLDED_LINE.match(line)
        assert m, line
        frames = m.group(1).split(";")
        assert all(f.strip() for f in frames), line  # no empty frame
        assert frames[0].startswith("[T"), line
        total += int(m.group(2))
    samples = sum(c.samples for c in profile.stacks.counts)
    assert abs(total - samples) <= len(lines), (total, samples)  # rounding of the Python splits only


@pytest.mark.skipif(shutil.which("perl") is None, reason="perl is not installed")
def test_flamegraph_pl_accepts_the_folded_file(callers: Path, tmp_path: Path):
    script = os.environ.get("CPUPROF_FLAMEGRAPH_PL") or shutil.which("flamegraph.pl")
    if not script:
        pytest.skip("flamegraph.pl is not here (no package ships it; set CPUPROF_FLAMEGRAPH_PL to a copy of "
                    "https://github.com/brendangregg/FlameGraph's flamegraph.pl to run this)")
    folded = tmp_path / "stacks.folded"
    assert cpuprof("flamegraph", str(callers), "-o", str(folded)).returncode == 0
    result = subprocess.run(["perl", script, str(folded)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and "Ignored" not in result.stderr, result.stderr
    assert result.stdout.lstrip().startswith("<?xml") and "aten::mm" in result.stdout


def test_svg_export_is_self_contained_and_names_the_ops(callers: Path, tmp_path: Path):
    import xml.etree.ElementTree as ET

    out = tmp_path / "flame.svg"
    result = cpuprof("flamegraph", str(callers), "-o", str(out), "--weight", "cpu")
    assert result.returncode == 0, result.stderr
    text = out.read_text()
    root = ET.fromstring(text)
    titles = [t.text or "" for t in root.iter("{http://www.w3.org/2000/svg}title")]
    assert any(t.startswith("aten::mm\n") for t in titles), titles[:20]
    assert any(t.startswith("python_caller_of_matmul ") for t in titles)
    assert "http://" not in text.replace("http://www.w3.org", "")  # nothing fetched from elsewhere


def speedscope_schema(tmp_path_factory) -> dict:
    if shutil.which("npm") is None:
        pytest.skip("npm is not installed: speedscope's schema comes from its npm package")
    import tarfile

    where = tmp_path_factory.mktemp("speedscope")
    result = subprocess.run(["npm", "pack", "speedscope@1.25.0", "--silent"], cwd=where, capture_output=True,
                            text=True, timeout=180)
    if result.returncode != 0:
        pytest.skip(f"npm could not fetch speedscope: {result.stderr.strip()[:200]}")
    with tarfile.open(next(where.glob("speedscope-*.tgz"))) as tar:
        member = tar.extractfile("package/dist/release/file-format-schema.json")
        assert member is not None
        return json.load(member)


def test_speedscope_export_validates_against_its_schema(callers: Path, tmp_path: Path, tmp_path_factory):
    import jsonschema

    from cpuprof.exports.speedscope import check_indices

    schema = speedscope_schema(tmp_path_factory)
    out = tmp_path / "profile.json"
    assert cpuprof("flamegraph", str(callers), "-o", str(out)).returncode == 0
    doc = json.loads(out.read_text())
    jsonschema.Draft7Validator(schema).validate(doc)
    assert check_indices(doc) == []
    names = [p["name"] for p in doc["profiles"]]
    assert names[0] == "all threads" and any(n.startswith("T0 dispatch") for n in names)


def check_trace_event_format(doc: dict) -> None:
    """The Trace Event Format's rules for the events cpuprof writes (JSON object form)."""
    assert isinstance(doc["traceEvents"], list)
    assert doc.get("displayTimeUnit") in (None, "ms", "ns")
    slices: dict[int, list[tuple[float, float]]] = {}
    named_threads = set()
    for e in doc["traceEvents"]:
        assert e["ph"] in ("X", "M", "C"), e
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int), e
        assert isinstance(e["name"], str) and e["name"], e
        if e["ph"] == "M":
            assert e["name"] in ("process_name", "thread_name", "thread_sort_index"), e
            assert isinstance(e["args"], dict)
            if e["name"] == "thread_name":
                named_threads.add(e["tid"])
            continue
        assert isinstance(e["ts"], (int, float)) and e["ts"] >= 0, e
        if e["ph"] == "C":
            assert e["args"] and all(isinstance(v, (int, float)) for v in e["args"].values()), e
            continue
        assert isinstance(e["dur"], (int, float)) and e["dur"] >= 0, e
        slices.setdefault(e["tid"], []).append((e["ts"], e["ts"] + e["dur"]))
    # complete events on one thread nest: two slices are disjoint or one holds the other
    for tid, spans in slices.items():
        assert tid in named_threads, tid
        spans.sort(key=lambda s: (s[0], -s[1]))
        open_ends: list[float] = []
        for start, end in spans:
            while open_ends and open_ends[-1] <= start + 1e-3:
                open_ends.pop()
            assert not open_ends or end <= open_ends[-1] + 1e-3, (tid, start, end, open_ends[-1])
            open_ends.append(end)


def test_trace_export_follows_the_trace_event_format(callers: Path, tmp_path: Path):
    out = tmp_path / "trace.json"
    result = cpuprof("trace", str(callers), "-o", str(out))
    assert result.returncode == 0, result.stderr
    doc = json.loads(out.read_text())
    check_trace_event_format(doc)
    profile = Profile.load(callers)
    events = doc["traceEvents"]
    # op spans of the dispatching thread, and the worker's sampled work under the op's name
    dispatch_tid = profile.threads[0].tid
    assert any(e["ph"] == "X" and e["tid"] == dispatch_tid and e["name"] == "aten::mm" for e in events)
    worker_tids = {t.tid for t in profile.threads if t.role == "worker"}
    assert any(e["ph"] == "X" and e["tid"] in worker_tids and e["name"] == "aten::mm" and e["cat"] == "samples"
               for e in events)
    # CPU counters: no thread busier than 1 in any bin (a small tolerance for the bin edges)
    counters = [e for e in events if e["ph"] == "C"]
    assert counters
    assert all(v <= 1.05 for e in counters for v in e["args"].values()), max(
        v for e in counters for v in e["args"].values())


def test_flamegraph_command_bad_input_gets_one_line(callers: Path, tmp_path: Path):
    for args, words in (
        (["--thread", "T9"], "--thread T9: no such thread"),
        (["--weight", "cycles"], "--weight cycles: choose samples, cpu or a counted event"),
    ):
        result = cpuprof("flamegraph", str(callers), "-o", str(tmp_path / "x.svg"), *args)
        assert result.returncode == 2, result.stderr
        assert words in result.stderr and "Traceback" not in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1
    result = cpuprof("flamegraph", str(callers), "-o", str(tmp_path / "x.png"))
    assert result.returncode == 2 and "say which format" in result.stderr
    assert not (tmp_path / "x.svg").exists()


def test_exact_mode_profile_has_no_flame_graph(tmp_path: Path):
    code = textwrap.dedent("""
        import sys, torch, cpuprof
        with cpuprof.profile("task-clock", mode="exact", warn=False) as prof:
            torch.mm(torch.randn(64, 64), torch.randn(64, 64))
        prof.export(sys.argv[1])
    """)
    run_script(code, str(tmp_path))
    result = cpuprof("flamegraph", str(tmp_path), "-o", str(tmp_path / "f.svg"))
    assert result.returncode == 2 and "no sampled stacks" in result.stderr, result.stderr


# py-spy's faults: each is one warning line, and the profile is made without Python stacks.
FAULT = textwrap.dedent("""
    import sys, time, torch, cpuprof
    from cpuprof.collect import pyspy
    pyspy.executable = lambda: sys.argv[2] or None
    a = torch.randn(256, 256)
    with cpuprof.profile("task-clock", python_stacks=True, python_sampler="py-spy") as prof:
        # A tenth of a second of matmuls: a few dozen samples, so the native stacks can be checked.
        deadline = time.monotonic() + 0.1
        while time.monotonic() < deadline:
            torch.mm(a, a)
    prof.export(sys.argv[1])
""")


# The fakes that wait for SIGINT are Python: a shell cannot trap a signal that was ignored when it
# started (a suite run under nohup, or in the background of a non-interactive shell), Python can.
UNTIL_SIGINT = """#!{python}
import signal, sys
output = sys.argv[sys.argv.index("--output") + 1] if "--output" in sys.argv else None


def stop(*_):
    if {writes} and output:
        open(output, "w").write("[]")
    sys.exit(0)


signal.signal(signal.SIGINT, stop)
print("py-spy> Sampling process 100 times a second. Press Control-C to exit.", flush=True)
while True:
    signal.pause()
"""


@pytest.mark.parametrize("fake, words", [
    ("", "py-spy is not installed"),
    ("#!/bin/sh\necho 'Error: Permission Denied (os error 1)' >&2\nexit 1\n", "ptrace refused"),
    (UNTIL_SIGINT.replace("{writes}", "True"), "never saw cpuprof's clock marker"),
    (UNTIL_SIGINT.replace("{writes}", "False"), "py-spy failed: it exited (status 0) without writing"),
])
def test_py_spy_faults_are_one_line_and_the_profile_is_made(tmp_path: Path, fake: str, words: str):
    exe = ""
    if fake:
        script = tmp_path / "py-spy"
        script.write_text(fake.replace("{python}", sys.executable))
        script.chmod(0o755)
        exe = str(script)
    result = subprocess.run([sys.executable, "-c", FAULT, str(tmp_path / "out"), exe], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stderr.splitlines() if "no Python stacks" in line]
    assert len(lines) == 1 and words in lines[0], result.stderr
    assert "Traceback" not in result.stderr
    profile = Profile.load(tmp_path / "out")
    assert profile.sampling.python.error and words in profile.sampling.python.error
    assert any(op.name == "aten::mm" for op in profile.ops)
    assert profile.stacks.counts  # the native stacks are still there
