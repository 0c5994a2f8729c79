"""Every command cpuprof prints for a person to paste runs as printed: extracted from the output of
real runs (a decode, a group of instances, a program), whole (never wrapped, never a template such as
rank-N), each run and exiting 0."""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

import pytest
from cli_runs import cpuprof

TINY = ["--preset", "tiny", "--new-tokens", "6", "--prompt-len", "8", "--roofs", "off"]
# A printed command: `python -m cpuprof` and its shell-quoted words, up to the end of the line or a
# sentence's punctuation after it (a command's own words are quoted where they hold any).
COMMAND = re.compile(r"python -m cpuprof(?: (?:'[^']*'|[^\s';]+))+")
# Commands that start new runs rather than read what was saved: run too, but only these.
STARTS_A_RUN = ("calibrate",)


def printed_commands(text: str) -> list[list[str]]:
    found = []
    for match in COMMAND.finditer(text):
        words = shlex.split(match.group(0).rstrip(").,"))
        if words not in found:
            found.append(words)
    return found


@pytest.fixture(scope="module")
def outputs(tmp_path_factory: pytest.TempPathFactory) -> list[tuple[str, str]]:
    base = tmp_path_factory.mktemp("printed")
    program = base / "program.py"
    program.write_text("import torch\nprint(float(torch.ones(4, 4).sum()))\n")
    runs = [("decode", *TINY, "--out", str(base / "decode"), "--flamegraph"),
            ("decode", *TINY, "--instances", "2", "--threads", "1", "--out", str(base / "instances")),
            ("run", "--roofs", "off", "--out", str(base / "cpuprof-out-run"), "--", sys.executable, str(program))]
    texts = []
    for args in runs:
        result = cpuprof(*args, timeout=600)
        assert result.returncode == 0, result.stderr
        texts.append((" ".join(args[:1]), result.stdout + result.stderr))
    return texts


# Placeholders a person would have to replace before the command runs.
TEMPLATE = re.compile(r"rank-N\b|<[^>]+>|^(DIR|PID|FILE|N)$|\bDIR/")


def test_every_printed_command_runs_as_printed(outputs: list[tuple[str, str]], tmp_path: Path):
    """Each command is run, and the commands its own output prints are checked and run in turn (a
    rank's report names its group's, a program's report one process's own)."""
    ran: list[list[str]] = []
    todo = []
    for what, text in outputs:
        commands = printed_commands(text)
        assert commands, f"{what} printed no command to re-render its results:\n{text[-2000:]}"
        todo += [(what, words, 0) for words in commands]
    while todo:
        what, words, depth = todo.pop(0)
        assert not any(TEMPLATE.search(w) for w in words), (what, words)  # never a template
        command = words[3:]  # after python -m cpuprof
        if command[0] in STARTS_A_RUN or words in ran:
            continue
        result = cpuprof(*command, timeout=300, cwd=tmp_path)  # what it writes (trace.json) lands there
        assert result.returncode == 0, (what, words, result.stderr)
        ran.append(words)
        if depth == 0:
            todo += [(" ".join(command[:2]), printed, 1) for printed in printed_commands(result.stdout + result.stderr)]
    assert len(ran) >= 5, ran


def test_each_rank_gets_a_command_of_its_own(outputs: list[tuple[str, str]]):
    (text,) = [t for what, t in outputs if what == "decode" and "rank-1" in t]
    reports = [w for w in printed_commands(text) if w[3] == "report"]
    assert {Path(w[4]).name for w in reports} >= {"rank-0", "rank-1"}


def test_an_on_demand_runs_signal_commands_name_its_launcher(tmp_path: Path):
    """Every `signal` command an --on-demand run prints (the launcher's, the program's process's as it
    imports torch, and the one in its "no window was opened" line) names the launcher's own pid: a
    command that pastes, not `signal <launcher pid>`."""
    program = tmp_path / "program.py"
    program.write_text("import torch\nprint(float(torch.ones(2).sum()))\n")
    result = cpuprof("run", "--on-demand", "--roofs", "off", "--out", str(tmp_path / "out"), "--", sys.executable,
                     str(program), timeout=300)
    text = result.stdout + result.stderr
    signals = [words for words in printed_commands(text) if words[3] == "signal"]
    assert len(signals) >= 2, text  # the launcher's line and the program's own
    assert not any(TEMPLATE.search(w) for words in signals for w in words), signals
    pids = {words[4] for words in signals}
    assert len(pids) == 1 and next(iter(pids)).isdigit(), signals
    assert f"signal {next(iter(pids))} start" in text.split("torch imported:", 1)[1], text
