"""`cpuprof run` and `cpuprof diff` end to end: real programs in real launched children, real signals,
the saved profiles read back and compared."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_runs import cpuprof

from cpuprof.analysis.roofline import gemm_groups
from cpuprof.machine.topology import read_topology
from cpuprof.model import Profile

SCRIPTS = Path(__file__).resolve().parents[1] / "fixtures" / "scripts"
MATMULS = SCRIPTS / "matmuls.py"
LLAMA = SCRIPTS / "llama_generate.py"
CPUS = read_topology().online_cpus


def error_line(result: subprocess.CompletedProcess) -> str:
    """cpuprof's one error line (the program's own output may surround it), and no cpuprof traceback."""
    assert "Traceback" not in result.stderr, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("cpuprof: error: ")]
    assert len(errors) == 1, result.stderr
    return errors[0]


def regions(profile: Profile) -> dict[str, int]:
    return {"/".join([*op.region, op.name]): op.calls for op in profile.ops if op.kind == "region"}


def test_run_profiles_a_plain_torch_script(tmp_path: Path):
    result = cpuprof("run", "--threads", "1", "--out", str(tmp_path), "--",
                     "python", str(MATMULS), "--size", "128", "--repeat", "7", "--cpuprof-region")
    assert result.returncode == 0, result.stderr
    assert "checksum" in result.stdout  # the program's own output, then the report
    assert result.stdout.index("checksum") < result.stdout.index("Top ops")
    assert "GEMMs against the roofs" in result.stdout
    assert f"profile saved in {tmp_path}" in result.stdout
    assert "cpuprof: torch imported: profiling every op from here" in result.stderr
    profile = Profile.load(tmp_path)
    assert profile.status.complete and profile.workload is None
    assert profile.meta.argv == [str(MATMULS), "--size", "128", "--repeat", "7", "--cpuprof-region"]
    # the program's arguments reached it: seven products, inside the record_function region
    mm = [op for op in profile.ops if op.name == "aten::mm"]
    assert sum(op.calls for op in mm) == 7 and all(op.region == ["products"] for op in mm)
    assert regions(profile) == {"products": 1, "checksum": 1}
    assert any(op.name == "aten::sum" and op.region == ["checksum"] for op in profile.ops)
    (gemm,) = gemm_groups(profile)
    assert gemm.shape_text == "[128,128]x[128,128]" and gemm.calls == 7 and gemm.op_names == ["aten::mm"]
    # launched like decode's child: the thread count asked for is the one in force
    assert profile.settings.requested.threads == 1 and profile.settings.in_force.torch.num_threads == 1
    assert profile.settings.in_force.env["OMP_NUM_THREADS"] == "1"
    again = cpuprof("report", str(tmp_path))
    assert again.returncode == 0 and "aten::mm" in again.stdout and "GEMMs against the roofs" in again.stdout


@pytest.mark.skipif(importlib.util.find_spec("transformers") is None,
                    reason="transformers is not installed (pip install 'cpuprof[hf]'); the plain-PyTorch test covers "
                           "the same path")
def test_run_profiles_a_transformers_generate_script(tmp_path: Path):
    result = cpuprof("run", "--out", str(tmp_path), "--format", "markdown", "--",
                     "python", str(LLAMA), "--new-tokens", "16")
    assert result.returncode == 0, result.stderr
    assert "generated 16 tokens" in result.stdout
    profile = Profile.load(tmp_path)
    assert profile.status.complete
    assert regions(profile) == {"generate": 1}
    names = {op.name for op in profile.ops if op.kind == "op"}
    assert "aten::mm" in names or "aten::addmm" in names, sorted(names)
    groups = gemm_groups(profile)
    linear_ops = {"aten::mm", "aten::addmm", "aten::linear", "aten::matmul"}
    gemms = [g for g in groups if set(g.op_names) & linear_ops]
    # the projections of hidden 64 (q, o: 64 -> 64; k, v: 64 -> 32 with 2 KV heads; MLP 64 -> 128 -> 64)
    # and the 256-token vocabulary, one decode step's row at a time
    shapes = {g.shape_text for g in gemms}
    assert {"[1,64]x[64,64]ᵀ", "[1,64]x[64,32]ᵀ", "[1,64]x[64,128]ᵀ", "[1,128]x[128,64]ᵀ"} <= shapes, shapes
    assert all(op.region[:1] == ["generate"] for g in gemms for op in g.ops)
    again = cpuprof("report", str(tmp_path))
    assert again.returncode == 0 and "GEMMs against the roofs" in again.stdout and "generate" in again.stdout


def test_run_of_a_module(tmp_path: Path):
    package = tmp_path / "workload"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "square.py").write_text(
        "import sys\nimport torch\n\nx = torch.ones(64, 64)\nfor _ in range(int(sys.argv[1])):\n"
        "    y = x @ x\nprint('argv', sys.argv[1:])\n")
    out = tmp_path / "out"
    result = cpuprof("run", "--out", str(out), "--", "python", "-m", "workload.square", "3", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "argv ['3']" in result.stdout
    profile = Profile.load(out)
    assert profile.meta.argv == [str(package / "square.py"), "3"]  # as python -m sets it
    assert sum(op.calls for op in profile.ops if op.name == "aten::mm") == 3


def test_a_script_that_raises_keeps_what_was_measured(tmp_path: Path):
    result = cpuprof("run", "--out", str(tmp_path), "--", "python", str(MATMULS), "--repeat", "3", "--raise")
    assert result.returncode == 1
    # the program's traceback is the program's, as Python prints it: from its own frame, not cpuprof's
    assert 'raise ValueError("asked to fail")' in result.stderr and "runpy" not in result.stderr
    line = result.stderr.strip().splitlines()[-1]
    assert line == (f"cpuprof: error: the program raised ValueError: asked to fail; what was measured is in "
                    f"{tmp_path / 'profile.json'}")
    profile = Profile.load(tmp_path)
    assert not profile.status.complete and profile.status.reason == "the program raised ValueError: asked to fail"
    assert sum(op.calls for op in profile.ops if op.name == "aten::mm") == 3
    assert "PARTIAL: the program raised ValueError" in result.stdout


def test_exit_status_of_the_script_is_the_exit_status(tmp_path: Path):
    result = cpuprof("run", "--out", str(tmp_path), "--", "python", str(MATMULS), "--repeat", "2", "--exit", "3")
    assert result.returncode == 3
    assert error_line(result).startswith("cpuprof: error: the program exited with status 3; what was measured")
    assert Profile.load(tmp_path).status.reason == "the program exited with status 3"
    # The earlier run's files are replaced only when asked (see test_out_dirs.py).
    result = cpuprof("run", "--out", str(tmp_path), "--overwrite", "--", "python", str(MATMULS), "--repeat", "2",
                     "--exit", "0")
    assert result.returncode == 0 and Profile.load(tmp_path).status.complete


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_interrupted_script_saves_what_was_measured(tmp_path: Path, signum: int):
    marker = tmp_path / "running"
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "cpuprof", "run", "--out", str(out), "--",
                             "python", str(MATMULS), "--repeat", "4", "--until-stopped", str(marker)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not marker.exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    proc.send_signal(signum)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr
    name = signal.Signals(signum).name
    line = error_line(subprocess.CompletedProcess([], 130, stdout, stderr))
    assert line == f"cpuprof: error: the program was interrupted by {name}; what was measured is in {out}/profile.json"
    profile = Profile.load(out)
    assert not profile.status.complete and profile.status.reason == f"the program was interrupted by {name}"
    assert sum(op.calls for op in profile.ops if op.name == "aten::mm") >= 4
    assert "PARTIAL" in stdout


SHUTS_DOWN_ON_SIGINT = """
import signal, sys, time
import torch

stopping = []
signal.signal(signal.SIGINT, lambda *_: stopping.append(1))  # a server's graceful shutdown
a = torch.ones(64, 64)
open(sys.argv[1], "w").close()
while not stopping:
    torch.mm(a, a)
    time.sleep(0.005)
print("shut down cleanly")
"""


def test_a_program_that_shuts_down_on_sigint_gets_its_report(tmp_path: Path):
    """A server ends by itself, status 0, on the SIGINT cpuprof passed it: the run shows its report and
    where it is, says why it ended, and exits with the program's status (not "cpuprof: interrupted")."""
    program, marker, out = tmp_path / "server.py", tmp_path / "serving", tmp_path / "out"
    program.write_text(SHUTS_DOWN_ON_SIGINT)
    proc = subprocess.Popen([sys.executable, "-m", "cpuprof", "run", "--roofs", "off", "--out", str(out), "--",
                             "python", str(program), str(marker)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    deadline = time.monotonic() + 120
    while not marker.exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)  # to the launcher alone: it passes it on
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr
    assert "shut down cleanly" in stdout and "cpuprof: interrupted" not in stderr
    assert "the program ended by itself (status 0) after cpuprof passed it the SIGINT it received" in stderr
    assert f"profile saved in {out}" in stdout and "aten::mm" in stdout
    assert not (out / "crash.txt").exists()


def test_a_killed_script_says_so(tmp_path: Path):
    marker = tmp_path / "running"
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "cpuprof", "run", "--out", str(out), "--",
                             "python", str(MATMULS), "--repeat", "1", "--until-stopped", str(marker)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not marker.exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    (child,) = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
    os.kill(int(child), signal.SIGKILL)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGKILL  # as a shell says of a killed program
    line = error_line(subprocess.CompletedProcess([], proc.returncode, stdout, stderr))
    assert line == ("cpuprof: error: the program's process was killed by SIGKILL (often the kernel's out-of-memory "
                    "killer); it had not yet written a profile")


def test_a_script_that_never_imports_torch(tmp_path: Path):
    script = tmp_path / "plain.py"
    script.write_text("print('no torch here')\n")
    result = cpuprof("run", "--out", str(tmp_path / "out"), "--", "python", str(script))
    assert result.returncode == 1
    assert "no torch here" in result.stdout
    assert "nothing was profiled: torch was never imported" in error_line(result)
    assert not (tmp_path / "out" / "profile.json").exists()


@pytest.mark.parametrize("args, words", [
    ([], "nothing to run: give the program after --"),
    (["python", str(MATMULS)], "put -- between cpuprof's options and the program"),
    (["--"], "nothing to run after --"),
    (["--", "python"], "python with no script"),
    (["--", "python", "/nonexistent/script.py"], "/nonexistent/script.py: no such script"),
    (["--", "python", str(SCRIPTS)], "not a file"),
    (["--", "ruby", "script.rb"], "ruby: cpuprof runs Python programs"),
    (["--", "python", "-c", "print(1)"], "python -c: Python's own options are not supported here"),
    (["--", "python", "-m"], "python -m: expected a module name"),
    (["--", "python", "-m", "no_such_module_for_cpuprof"], "no module named 'no_such_module_for_cpuprof'"),
    (["--threads", "0", "--", "python", str(MATMULS)], "--threads 0: expected a positive whole number"),
    (["--events", "cylces", "--", "python", str(MATMULS)], "unknown event 'cylces'"),
    (["--mode", "guess", "--", "python", str(MATMULS)], "invalid choice: 'guess'"),
])
def test_run_bad_input_gets_one_line(tmp_path: Path, args, words):
    result = cpuprof("run", "--out", str(tmp_path / "out"), *args)
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert words in error_line(result)


# -- diff -------------------------------------------------------------------------------------------


@pytest.mark.skipif(len(CPUS) < 2, reason="needs 2 CPUs to run the same workload on 1 and 2 threads")
def test_diff_of_one_and_two_threads_names_the_gemms(tmp_path: Path):
    """The same matmul-heavy program on 1 and then 2 threads: what changed is its GEMMs' time."""
    # 48 products: their change (tens of ms) must outweigh a one-off stall elsewhere, such as the
    # inputs' randn first touching its pages (aten::normal_ came out on top with 12, once in CI).
    for threads in ("1", "2"):
        result = cpuprof("run", "--threads", threads, "--out", str(tmp_path / threads), "--",
                         "python", str(MATMULS), "--size", "512", "--repeat", "48")
        assert result.returncode == 0, result.stderr
    result = cpuprof("diff", str(tmp_path / "1"), str(tmp_path / "2"), "--format", "json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    sections = {s["id"]: s for s in report["sections"]}
    top = sections["ops"]["tables"][0]["rows"][0]
    assert (top["op"], top["kind"], top["inputs"]) == ("aten::mm", "GEMM", "f32[512,512], f32[512,512]")
    assert top["calls_a"] == top["calls_b"] == 48
    assert top["delta"] == top["self_b"] - top["self_a"]
    gemm = sections["gemms"]["tables"][0]["rows"][0]
    assert (gemm["shape"], gemm["ops"]) == ("[512,512]x[512,512]", "aten::mm")
    settings = {row["setting"]: (row["a"], row["b"]) for row in sections["settings"]["tables"][0]["rows"]}
    assert settings["threads (asked)"] == ("1", "2") and settings["OMP_NUM_THREADS"] == ("1", "2")
    # (How many threads B's products really used is MKL's choice: it may run one on fewer than asked.)
    assert [row["run"] for row in sections["threads"]["tables"][0]["rows"]] == ["A", "B", "B − A"]
    text = cpuprof("diff", str(tmp_path / "1"), str(tmp_path / "2" / "profile.json"), "--top", "3")
    assert text.returncode == 0
    first_row = next(line for line in text.stdout.splitlines() if line.strip().startswith("aten::"))
    assert first_row.split()[:2] == ["aten::mm", "GEMM"]
    markdown = cpuprof("diff", str(tmp_path / "1"), str(tmp_path / "2"), "--format", "markdown")
    assert markdown.returncode == 0 and "| aten::mm | GEMM |" in markdown.stdout


def test_diff_bad_input_gets_one_line(tmp_path: Path):
    good = tmp_path / "good.json"
    from profiles import make_profile

    make_profile().save(good)
    (tmp_path / "truncated.json").write_text('{"format": "cpuprof-profile", "version": 2, "meta": {')
    (tmp_path / "foreign.json").write_text('{"traceEvents": []}')
    for other, words in ((tmp_path / "missing", "no such profile"), (tmp_path / "truncated.json", "not valid JSON"),
                         (tmp_path / "foreign.json", "not a cpuprof profile")):
        for args in ((str(good), str(other)), (str(other), str(good))):
            result = cpuprof("diff", *args)
            assert result.returncode == 2, result.stderr
            assert words in error_line(result)
    result = cpuprof("diff", str(good))
    assert result.returncode == 2 and "the following arguments are required: B" in error_line(result)
    same = cpuprof("diff", str(good), str(good), "--format", "markdown")
    assert same.returncode == 0 and "0 added (only in B), 0 removed (only in A)" in same.stdout
