"""The viewer: what reads saved profiles needs neither torch nor cpuprof's native module.

Profiles are made on servers and read on laptops. Every command here runs in a child process in
which importing torch or ``cpuprof._native`` fails (``None`` in ``sys.modules``), through the CLI's
own entry point. CI also runs this file in a second virtual environment where cpuprof was
installed without torch (``.ci/run``): there nothing needs blocking, and the install itself is
what is tested (the build info it got, the one-line refusal of the profiling commands).
"""

from __future__ import annotations

import csv
import importlib.util
import io
import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
from profiles import V1_DECODE, make_profile, make_sampled_profile, make_sweep

from cpuprof import defaults

ROOT = Path(__file__).resolve().parents[2]
TORCH_INSTALLED = importlib.util.find_spec("torch") is not None

# Runs each argv through cpuprof.cli.main with torch and the native module blocked, and writes
# each one's exit code, standard output and standard error, and the blocked modules that got
# imported anyway (none may), to the JSON file named by its second argument.
CHILD = """
import sys
sys.modules["torch"] = None
sys.modules["cpuprof._native"] = None
import contextlib, io, json
import cpuprof.analysis.report, cpuprof.exports, cpuprof.model, cpuprof.reports
from cpuprof.cli import main

results = []
for argv in json.loads(sys.argv[1]):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(argv)
    results.append({"rc": rc, "stdout": out.getvalue(), "stderr": err.getvalue()})
imported = sorted(name for name, module in sys.modules.items()
                  if module is not None and (name.split(".")[0] == "torch" or name == "cpuprof._native"))
with open(sys.argv[2], "w") as f:
    json.dump({"results": results, "imported": imported}, f)
"""


def run_viewer(tmp_path: Path, *argvs: list[str]) -> list[dict[str, Any]]:
    """Each argv's {rc, stdout, stderr}, run through the CLI in one child without torch or _native."""
    results_file = tmp_path / "results.json"
    child = subprocess.run([sys.executable, "-c", CHILD, json.dumps(list(argvs)), str(results_file)],
                           capture_output=True, text=True, timeout=300)
    assert child.returncode == 0, child.stderr
    outcome = json.loads(results_file.read_text())
    assert outcome["imported"] == []
    return list(outcome["results"])


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A sampled profile with stacks and spans, an exact one, a real decode's (version 1) and a sweep."""
    from cpuprof.launch.sweep import save

    root = tmp_path_factory.mktemp("saved")
    make_sampled_profile().save(root / "sampled")
    make_profile("exact").save(root / "exact")
    save(make_sweep(), root / "sweep")
    return {"sampled": root / "sampled", "exact": root / "exact", "decode": V1_DECODE, "sweep": root / "sweep"}


def test_the_viewer_imports_nothing_that_needs_torch():
    """The check the issue gives anyone to run, and every module of the layers the viewer uses."""
    layers = ("model", "analysis", "reports", "exports")
    modules = ["cpuprof"] + [
        f"cpuprof.{layer}.{path.stem}" for layer in layers
        for path in sorted((Path(defaults.__file__).parent / layer).glob("*.py")) if path.stem != "__init__"]
    # The layers do not reach the workload (which needs torch) either; the CLI does, for presets.
    code = ("import sys; sys.modules['torch'] = None; sys.modules['cpuprof._native'] = None\n"
            + "".join(f"import {name}\n" for name in modules)
            + "assert 'cpuprof.workload' not in sys.modules, 'a layer of the viewer imports the workload'\n"
            + "import cpuprof.cli\n")
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert child.returncode == 0, child.stderr


@pytest.mark.parametrize("profile", ["sampled", "decode"])
def test_report_renders_a_saved_profile_in_every_format(tmp_path: Path, saved: dict[str, Path], profile: str):
    formats = ("terminal", "markdown", "json", "csv", "html")
    results = run_viewer(tmp_path, *[["report", str(saved[profile]), "--format", fmt, "-o", str(tmp_path / fmt)]
                                     for fmt in formats])
    assert [r["rc"] for r in results] == [0] * len(formats), [r["stderr"] for r in results]
    text = {fmt: (tmp_path / fmt).read_text() for fmt in formats}
    op = "aten::mm" if profile == "sampled" else "aten::linear"
    assert all(op in text[fmt] for fmt in formats)
    assert "| --- |" in text["markdown"] or "|---" in text["markdown"]
    report = json.loads(text["json"])
    assert report["format"] == "cpuprof-report" and report["sections"]
    assert len(list(csv.reader(io.StringIO(text["csv"])))) > 5
    assert text["html"].lstrip().lower().startswith("<!doctype html>") and "<svg" in text["html"]


def test_diff_flamegraph_and_trace_of_saved_profiles(tmp_path: Path, saved: dict[str, Path]):
    sampled = str(saved["sampled"])
    diff, svg, folded, speedscope, trace = run_viewer(
        tmp_path, ["diff", str(saved["exact"]), sampled, "--format", "json"],
        ["flamegraph", sampled, "-o", str(tmp_path / "flame.svg")],
        ["flamegraph", sampled, "-o", str(tmp_path / "stacks.folded")],
        ["flamegraph", sampled, "-o", str(tmp_path / "stacks.json")],
        ["trace", sampled, "-o", str(tmp_path / "trace.json")])
    assert [r["rc"] for r in (diff, svg, folded, speedscope, trace)] == [0] * 5
    assert json.loads(diff["stdout"])["sections"]
    assert ET.parse(tmp_path / "flame.svg").getroot().tag == "{http://www.w3.org/2000/svg}svg"
    # The sampled profile's two stacks (see tests/profiles.py), weighted by their samples.
    assert sorted(line.rsplit(" ", 1)[1] for line in (tmp_path / "stacks.folded").read_text().splitlines()) == [
        "100", "50"]
    assert "speedscope" in json.loads((tmp_path / "stacks.json").read_text())["$schema"]
    assert json.loads((tmp_path / "trace.json").read_text())["traceEvents"]


def test_a_saved_sweep_renders(tmp_path: Path, saved: dict[str, Path]):
    terminal, html = run_viewer(tmp_path, ["report", str(saved["sweep"])],
                                ["report", str(saved["sweep"]), "--format", "html", "-o", str(tmp_path / "s.html")])
    assert terminal["rc"] == html["rc"] == 0
    assert "threads=2" in terminal["stdout"] and "threads=2" in (tmp_path / "s.html").read_text()


def test_profiling_commands_say_in_one_line_what_they_need(tmp_path: Path):
    argvs = [["decode", "--preset", "tiny"], ["run", "--", sys.executable, "-c", "pass"],
             ["compare", "--threads", "1,2"], ["calibrate"], ["doctor"]]
    for argv, result in zip(argvs, run_viewer(tmp_path, *argvs), strict=True):
        assert result["rc"] == 2
        assert result["stderr"].count("\n") == 1 and "Traceback" not in result["stderr"]
        assert result["stderr"].startswith(f"cpuprof: error: {argv[0]} needs torch (torch==2.13.0) and cpuprof's "
                                           "native module built against it; ")


def test_the_installed_limits_are_the_cores():
    """The build info every install gets (a viewer's too) holds limits.h's values, as does a source
    tree's fallback that reads the header itself."""
    assert defaults.CORE_LIMITS == defaults.read_limits_header((ROOT / "csrc/common/limits.h").read_text())
    assert {"kMaxDepth", "kDefaultSampleHz", "kMaxOpCapacity"} <= set(defaults.CORE_LIMITS)


@pytest.mark.skipif(not defaults.SOURCE_LIMITS_HEADER.is_file(), reason="cpuprof is installed, not run from its source")
def test_a_source_tree_without_build_info_reads_the_header():
    code = ("import sys; sys.modules['cpuprof._build_info'] = None; sys.modules['torch'] = None\n"
            "from cpuprof import defaults; print(defaults.SAMPLE_HZ, defaults.MAX_DEPTH)")
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert child.returncode == 0, child.stderr
    assert child.stdout.split() == [str(defaults.SAMPLE_HZ), str(defaults.MAX_DEPTH)]


@pytest.mark.skipif(TORCH_INSTALLED, reason="torch is installed: this checks an install made without it (CI's viewer "
                                            "environment)")
def test_an_install_without_torch_is_the_viewer():
    from cpuprof import _build_info, native

    assert _build_info.TORCH_VERSION == ""
    assert importlib.util.find_spec("cpuprof._native") is None
    assert native.missing() == ("this install has neither (a viewer: report, diff, flamegraph and trace read saved "
                                "profiles)")


def test_the_torch_the_message_names_is_the_one_readme_installs():
    readme = (ROOT / "README.md").read_text()
    from cpuprof import native

    assert f"pip install {native.TORCH_REQUIREMENT} " in readme


def test_outputs_write_into_devices_and_link_targets_and_refuse_what_they_cannot_write(tmp_path: Path,
                                                                                     saved: dict[str, Path]):
    """`-o /dev/null` once turned the device into a regular file: a device node (made here, never the
    system's) and a link are written through, each command's file is whole, and a directory or a
    read-only mount is one line and exit 2 with nothing replaced."""
    import os
    import stat

    null = tmp_path / "null"
    try:
        os.mknod(null, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    except PermissionError:
        pytest.skip("mknod is not permitted here (needs CAP_MKNOD)")
    real = tmp_path / "real.svg"
    real.write_text("old")
    link = tmp_path / "flame.svg"
    link.symlink_to(real)
    readonly = tmp_path / "ro"
    readonly.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k,ro", "tmpfs", str(readonly)],
                             capture_output=True).returncode == 0
    sampled = str(saved["sampled"])
    try:
        results = run_viewer(tmp_path,
                             ["flamegraph", sampled, "--format", "svg", "-o", str(null)],
                             ["trace", sampled, "-o", str(null)],
                             ["report", sampled, "--format", "html", "-o", str(null)],
                             ["flamegraph", sampled, "-o", str(link)],
                             ["report", sampled, "-o", str(tmp_path)],
                             ["trace", sampled, "-o", str(readonly / "trace.json")])
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(readonly)], capture_output=True)
    device, trace, html, through_link, directory, read_only = results
    assert [device["rc"], trace["rc"], html["rc"], through_link["rc"]] == [0, 0, 0, 0], results
    assert stat.S_ISCHR(null.stat().st_mode) and os.major(null.stat().st_rdev) == 1
    assert link.is_symlink() and ET.parse(real).getroot().tag == "{http://www.w3.org/2000/svg}svg"
    assert directory["rc"] == 2 and directory["stderr"].count("\n") == 1 and "is a directory" in directory["stderr"]
    assert tmp_path.is_dir()
    if mounted:
        assert read_only["rc"] == 2 and read_only["stderr"].count("\n") == 1
        assert "read-only file system" in read_only["stderr"] and "Traceback" not in read_only["stderr"]


def test_a_run_of_hundreds_of_processes_reports_in_the_memory_of_one(tmp_path: Path):
    """report of a run directory held every process's profile in memory at once (10,000 entries:
    984 MB; 3,000 of 323 KB: 3.9 GB). Read one profile at a time, a run of 400 processes
    each takes about what a run of one does, and its table lists the 200 busiest with a note. (Each
    profile here holds ~0.6 MB once loaded: 400 of them at once would take ~250 MB more.)"""
    import dataclasses
    import os

    big = make_sampled_profile()
    add = next(op for op in big.ops if op.name == "aten::add")
    big.ops += [dataclasses.replace(add, id=1000 + k, name=f"aten::op_{k}") for k in range(300)]
    big.validate()
    one, many = tmp_path / "one", tmp_path / "many"
    big.save(one / "processes" / "100")
    written = one / "processes" / "100" / "profile.json"
    assert written.stat().st_size > 100_000
    for pid in range(100, 500):  # hard links: the disk holds one copy, the reader parses 400
        (many / "processes" / str(pid)).mkdir(parents=True)
        os.link(written, many / "processes" / str(pid) / "profile.json")
    code = ("import resource, sys\nsys.modules['torch'] = None\nfrom cpuprof.cli import main\n"
            "rc = main(['report', sys.argv[1], '--top', '5'])\n"
            "print('MAXRSS', rc, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)\n")

    def peak_kb(directory: Path) -> tuple[int, str]:
        child = subprocess.run([sys.executable, "-c", code, str(directory)], capture_output=True, text=True,
                               timeout=300)
        last = child.stdout.strip().splitlines()[-1].split()
        assert last[:2] == ["MAXRSS", "0"], child.stderr
        return int(last[2]), child.stdout

    alone, _ = peak_kb(one)
    crowd, report = peak_kb(many)
    assert crowd - alone < 60_000, f"{alone} KB for one process, {crowd} KB for 400"
    assert "400 processes: the table lists the 200 that ran the most op time" in " ".join(report.split())
