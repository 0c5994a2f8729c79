"""Op, region, thread and module names come from the profiled program, and paths from whoever chose
them: every text format shows them and nothing more. Markdown gets no live HTML or table structure
from a name, CSV no formula, a terminal no control sequence, a pasted hint runs nothing."""

from __future__ import annotations

import csv
import io
import re
import shlex
from dataclasses import replace
from pathlib import Path

import pytest
from profiles import make_profile, make_sampled_profile, make_sweep

from cpuprof import cli
from cpuprof.analysis.report_model import Report
from cpuprof.model.ranks import MultiRun, RankOutcome
from cpuprof.reports import (
    FORMATS,
    DiffSource,
    OutputOptions,
    ProfileSource,
    RanksSource,
    Source,
    SweepSource,
    get_output,
)
from cpuprof.safe_text import printable

HTML = "<img src=x onerror=alert(1)>"
FORMULA = '=HYPERLINK("http://x","y")'
PLUS = "+1"
AT = "@SUM(A1)"
TERMINAL = "\x1b]0;pwned\x07\x1b[2J"  # sets the terminal's title, then clears the screen
PIPE_NEWLINE = "left|right\nnext line"
MARKUP = "`tick` **[link](javascript:alert(1))** _em_ ~~gone~~ \\"
C1 = "\x9b31mred\u202egnp.exe"  # the 8-bit CSI, and a right-to-left override
HOSTILE = [HTML, FORMULA, PLUS, AT, TERMINAL, PIPE_NEWLINE, MARKUP, C1]
CONTROL = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u202e]")  # any control character but the line's own end


def hostile_profile(sampled: bool = True):
    """The shared hand-built profile, with every name the profiled program chose made hostile: the
    region, the ops (beside aten::mm, kept so the GEMM and roofline tables are there too), the
    threads and the sampled frames."""
    p = make_sampled_profile() if sampled else make_profile()
    region = HTML
    template = next(op for op in p.ops if op.name == "aten::add")
    for op in p.ops:
        op.region = [region] if op.region else []
        if op.kind == "region":
            op.name = region
    template.name = FORMULA
    extra = [replace(template, id=100 + k, name=name, samples=template.samples)
             for k, name in enumerate(HOSTILE) if name != FORMULA]
    p.ops.extend(extra)
    p.threads[0].name = TERMINAL
    p.threads[1].name = PIPE_NEWLINE
    assert p.settings is not None
    p.settings.in_force.threads[0].name = TERMINAL
    if p.stacks is not None:
        p.stacks.frames[0].name = AT
        p.stacks.frames[0].module = HTML
    p.validate()
    return p


def hostile_sweep():
    sweep = make_sweep()
    for config, name in zip(sweep.configs, (FORMULA, HTML, TERMINAL), strict=True):
        config.label = name
    for run in sweep.runs:
        if run.error:
            run.error = f"{PIPE_NEWLINE} {TERMINAL} {HTML} {MARKUP}"
    return sweep


def source_of(kind: str, tmp_path: Path) -> Source:
    if kind == "profile":
        return ProfileSource(hostile_profile())
    if kind == "diff":
        return DiffSource(hostile_profile(sampled=False), hostile_profile(), HTML, TERMINAL)
    if kind == "sweep":
        return SweepSource(hostile_sweep())
    assert kind == "ranks"
    run = MultiRun(mode="instances", world_size=2, backend="gloo", argv=["cpuprof", "decode", "--instances", "2"],
                   timeout_s=60, finished=True,
                   ranks=[RankOutcome(rank=r, dir=f"rank-{r}", cpus=[r], node=None, threads=2, returncode=r,
                                      failure=f"{TERMINAL} {HTML} {MARKUP}" if r else None) for r in range(2)])
    for r in range(2):
        hostile_profile().save(tmp_path / f"rank-{r}")
    run.save(tmp_path)
    return RanksSource(run, tmp_path)


KINDS = ("profile", "diff", "sweep", "ranks")


def rendered(fmt: str, source: Source) -> str:
    out = io.StringIO()
    get_output(fmt, source.kind).write(source, out, OutputOptions(top=50))
    return out.getvalue()


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("kind", KINDS)
def test_no_report_format_prints_a_control_character_from_a_name(fmt: str, kind: str, tmp_path: Path):
    text = rendered(fmt, source_of(kind, tmp_path))
    assert not CONTROL.findall(text)
    if fmt in ("terminal", "markdown"):
        unescaped = text.replace("\\[", "[").replace("\\]", "]")  # markdown's escapes of the brackets
        assert "\\x1b]0;pwned\\x07\\x1b[2J" in unescaped  # shown, escaped, not dropped


def markdown_cells(line: str) -> list[str]:
    """A GFM table row's cells: split at the pipes no backslash escapes."""
    assert line.startswith("|") and line.endswith("|") and not line.endswith("\\|"), line
    return re.split(r"(?<!\\)\|", line[1:-1])


@pytest.mark.parametrize("kind", KINDS)
def test_markdown_shows_names_as_text_never_as_html_or_structure(kind: str, tmp_path: Path):
    text = rendered("markdown", source_of(kind, tmp_path))
    assert "<img" not in text and "&lt;img src=x onerror=alert(1)&gt;" in text
    # No link, emphasis or code span opened by a name: every such character is escaped.
    assert "[link](" not in text and "\\[link\\](javascript:alert(1))" in text
    for char in "*_`~":
        assert re.search(rf"(?<!\\){re.escape(char)}(?:tick|link|em|gone)", text) is None, char
    # Every row of every table has as many cells as its header.
    tables = re.findall(r"(?:^\|.*\n)+", text, re.M)
    assert tables
    for table in tables:
        rows = table.splitlines()
        assert re.fullmatch(r"\|(:?---:?\|)+", rows[1]), rows[1]
        assert {len(markdown_cells(row)) for row in rows} == {len(markdown_cells(rows[0]))}, table
    # Outside the tables too, a name's newline starts no line of its own.
    assert not any(line.startswith("next line") for line in text.splitlines())


def report_tables(source: Source) -> list:
    report: Report = source.report(OutputOptions(top=50))  # type: ignore[union-attr]
    return [t for s in report.sections for t in s.tables]


@pytest.mark.parametrize("kind", KINDS)
def test_csv_quotes_text_that_would_start_a_formula_and_leaves_numbers_numbers(kind: str, tmp_path: Path):
    source = source_of(kind, tmp_path)
    text = rendered("csv", source)
    blocks = [[row for row in csv.reader(line for line in block.splitlines() if line and not line.startswith("#"))]
              for block in re.split(r"\n\s*\n", text)]
    blocks = [b for b in blocks if b]
    tables = report_tables(source)
    assert [b[0] for b in blocks] == [[c.key for c in t.columns] for t in tables]
    negatives = 0
    cells = set()
    for block, table in zip(blocks, tables, strict=True):
        for row in block[1:]:
            assert len(row) == len(table.columns)
            for cell, column in zip(row, table.columns, strict=True):
                cells.add(cell)
                if column.unit != "text" and cell:
                    negatives += float(cell) < 0  # a number, as written: parseable, never quoted
                else:
                    assert not cell.startswith(("=", "+", "-", "@", "\t", "\r")), (column.key, cell)
    if kind == "profile":
        assert negatives  # the ceiling table's "between ops" row: a negative time stays a number
        assert {"'" + FORMULA, "'" + PLUS, "'" + AT} <= cells
        assert HTML in cells  # text that is no formula is as it was
    if kind == "sweep":
        assert "'" + FORMULA in cells


def test_csv_help_says_what_it_does_to_formula_text():
    assert "'" in get_output("csv").help and "formula" in get_output("csv").help


def test_printable_escapes_every_control_character_and_nothing_else():
    assert printable(TERMINAL) == "\\x1b]0;pwned\\x07\\x1b[2J"
    assert printable("a\tb\r\nc\x7f\x85\u2028") == "a\\tb\\r\\nc\\x7f\\x85\\u2028"
    assert printable("aten::mm ᵀ [1,2]x[2,3] µs é → 中") == "aten::mm ᵀ [1,2]x[2,3] µs é → 中"


def test_an_error_line_shows_a_path_s_control_characters_escaped(tmp_path: Path, capsys):
    missing = tmp_path / f"run{TERMINAL}"
    assert cli.main(["report", str(missing)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and not CONTROL.findall(err) and "\\x1b]0;pwned" in err


HOSTILE_DIR = "my runs/$(touch PWNED) `id`; 'quoted'"


def hint_args(text: str, after: str) -> list[str]:
    """The arguments of the ``python -m cpuprof`` command a hint suggests after ``after``: the
    shell's words up to the first one that ends the command (an unquoted ';')."""
    lexer = shlex.shlex(text.split(after, 1)[1], posix=True, punctuation_chars=";")
    lexer.whitespace_split = True
    words = []
    for word in lexer:
        if word == ";":
            break
        words.append(word)
    return words


def test_the_re_render_hint_quotes_the_directory(tmp_path: Path, capsys):
    from cpuprof.commands.common import show_results

    out_dir = tmp_path / HOSTILE_DIR
    show_results(make_profile(), out_dir, "terminal", 5, False)
    text = capsys.readouterr().out
    assert hint_args(text, "re-render with: ") == ["python", "-m", "cpuprof", "report", str(out_dir)]


def test_the_group_hints_quote_the_directory(tmp_path: Path, capsys):
    from cpuprof.commands.group import show_group

    source = source_of("ranks", tmp_path / HOSTILE_DIR)
    assert isinstance(source, RanksSource)
    show_group(source.run, source.directory, "markdown")
    captured = capsys.readouterr()
    assert hint_args(captured.err, "merged report with: ") == ["python", "-m", "cpuprof", "report",
                                                               str(source.directory)]
    assert hint_args(captured.err, "one process per rank: ") == ["python", "-m", "cpuprof", "trace",
                                                                 str(source.directory), "-o", "trace.json"]


def test_the_compare_hints_quote_the_directory(tmp_path: Path, capsys):
    from cpuprof.commands.compare import write_reports

    out_dir = tmp_path / HOSTILE_DIR
    out_dir.mkdir(parents=True)
    write_reports(make_sweep(), out_dir, "csv", html=False)
    assert hint_args(capsys.readouterr().err, "re-render with: ") == ["python", "-m", "cpuprof", "report",
                                                                       str(out_dir)]


def test_cpuprof_command_round_trips_through_a_shell_split():
    from cpuprof.safe_text import cpuprof_command

    line = cpuprof_command("report", HOSTILE_DIR, "--format", "markdown")
    assert shlex.split(line) == ["python", "-m", "cpuprof", "report", HOSTILE_DIR, "--format", "markdown"]

