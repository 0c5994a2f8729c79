"""The option spec (cpuprof.options_spec): every options field has its flag, the flags' defaults are
the fields' defaults, enumerations are choices, and compare's axes set the fields their options name."""

from __future__ import annotations

import dataclasses

import pytest

from cpuprof import options_spec as spec
from cpuprof.cli import build_parser
from cpuprof.commands import common, decode
from cpuprof.launch import sweep
from cpuprof.launch.environment import LaunchSettings
from cpuprof.launch.options import DecodeOptions, ProfileOptions, WorkloadOptions
from cpuprof.model.codec import DecodeError, from_json
from cpuprof.reports import FORMATS

# Fields no flag fills one to one: parts of DecodeOptions, the shape overrides (--layers, ...),
# what the command decides (the output directory, calibrate's own run). (The Python stacks' rate
# has its flag, --python-hz, whose default depends on --flamegraph.)
NOT_FLAGS = {
    (DecodeOptions, "workload"), (DecodeOptions, "launch"), (DecodeOptions, "profile"), (DecodeOptions, "out"),
    (DecodeOptions, "calibrate_only"), (WorkloadOptions, "overrides"),
}
OPTIONS_TYPES = (DecodeOptions, WorkloadOptions, LaunchSettings, ProfileOptions)


def test_every_options_field_has_one_flag_and_every_flag_one_field():
    targets = [o.target for o in spec.ALL if o.target is not None]
    fields = {(cls, f.name) for cls in OPTIONS_TYPES for f in dataclasses.fields(cls)}
    assert set(targets) <= fields, "an option fills a field that does not exist"
    assert fields - set(targets) == NOT_FLAGS, \
        "a field of the options has no flag: declare it in cpuprof.options_spec"
    assert len({o.flag for o in spec.ALL}) == len(spec.ALL) and len(set(targets)) == len(targets)


def test_the_flags_defaults_are_the_options_defaults():
    args = build_parser().parse_args(["decode"])
    assert decode.options_from_args(args) == DecodeOptions()
    run_args = build_parser().parse_args(["run", "--", "python", "x.py"])
    assert common.profile_options(run_args) == ProfileOptions()
    assert decode.launch_from_args(run_args) == LaunchSettings()


@pytest.mark.parametrize("command", ["decode", "run", "calibrate", "compare"])
def test_enumerations_are_choices_refused_before_anything_starts(command: str, capsys: pytest.CaptureFixture[str]):
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "subcommand").choices[command]  # type: ignore[union-attr]
    enumerated = [a for a in sub._actions if a.choices]
    assert {a.option_strings[-1] for a in enumerated} >= {"--format"}
    assert next(a for a in enumerated if "--format" in a.option_strings).choices == FORMATS
    for action in enumerated:
        with pytest.raises(SystemExit) as exit:
            parser.parse_args([command, action.option_strings[-1], "no-such-choice"])
        assert exit.value.code == 2
        assert "invalid choice: 'no-such-choice'" in capsys.readouterr().err


def test_launch_and_workload_enumerations_are_their_literal_types():
    by_flag = {o.flag: o for o in spec.ALL}
    assert by_flag["--mode"].choice_values == ("sampled", "exact")
    assert by_flag["--sampling"].choice_values == ("greedy", "topk")
    assert by_flag["--bind"].choice_values == ("close", "spread", "none")
    with pytest.raises(DecodeError, match="'guess' is not one of"):
        from_json(ProfileOptions, {"mode": "guess"}, "profile")


def _other_value(option: spec.Option) -> str:
    if option.action is not None:
        return "on" if option.baseline == "off" else "off"
    choices = option.choice_values
    if choices:
        return next(c for c in choices if c != option.baseline)
    return "3"


@pytest.mark.parametrize("axis", [a for a in sweep.AXES if a not in sweep.LAYOUT_AXES])
def test_each_sweep_axis_sets_the_field_its_option_names(axis: str):
    option = spec.SWEEPS[axis]
    assert option.target is not None
    owner, field = option.target
    text = _other_value(option)
    applied = sweep.apply(DecodeOptions(), {axis: text})
    part = next(value for value in vars(applied).values() if type(value) is owner)
    assert getattr(part, field) == option.check_sweep_value(text) != getattr(owner(), field)


def test_the_baseline_of_a_sweep_is_what_decode_runs_without_the_flag():
    assert sweep.DECODE_DEFAULTS == {"tp": "1", "instances": "1", "omp": "gnu", "bind": "close",
                                     "allocator": "default", "dtype": "bf16", "quant": "none", "batch": "1",
                                     "compile": "off"}


@pytest.mark.parametrize("command", ["decode", "run", "calibrate", "compare", "report"])
def test_abbreviated_flags_are_refused(command: str, capsys: pytest.CaptureFixture[str]):
    # `--thread 2` for `--threads 2` (or `--form` for `--format`) is a typo to name, not to guess
    flag = "--form" if command == "report" else "--thread"
    with pytest.raises(SystemExit) as exit:
        build_parser().parse_args([command, flag, "2"])
    assert exit.value.code == 2
    assert "unrecognized arguments" in capsys.readouterr().err


def test_no_command_declares_a_flag_of_its_own():
    """Every command's flags come from the spec: a flag typed again in a command file drifts (report's
    hand-written --format help once left csv out)."""
    import ast
    from pathlib import Path

    root = Path(spec.__file__).parent
    offenders = []
    for path in sorted(root.rglob("*.py")):
        if path.name == "options_spec.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "add_argument"):
                offenders.append(f"{path.relative_to(root)}:{node.lineno}")
    assert offenders == [], "declare these in cpuprof.options_spec"


@pytest.mark.parametrize("command", ["report", "diff"])
def test_format_choices_are_the_registrys(command: str):
    from cpuprof.reports import REPORT_FORMATS

    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "subcommand").choices[command]  # type: ignore[union-attr]
    action = next(a for a in sub._actions if "--format" in a.option_strings)
    expected = REPORT_FORMATS if command == "report" else FORMATS
    assert tuple(action.choices) == expected and "csv" in expected  # type: ignore[arg-type]
    help_text = " ".join(sub.format_help().split())
    assert f"{', '.join(expected)} (default terminal)" in help_text


@pytest.mark.parametrize(("argv", "words"), [
    (["decode", "--prompt-len", "0"], "argument --prompt-len: expected a positive whole number, not 0"),
    (["decode", "--new-tokens", "-3"], "argument --new-tokens: expected a positive whole number, not -3"),
    (["decode", "--batch", "0"], "argument --batch: expected a positive whole number, not 0"),
    (["decode", "--warmup", "-1"], "argument --warmup: expected 0 or more, not -1"),
    (["decode", "--layers", "0"], "argument --layers: expected a positive whole number, not 0"),
    (["decode", "--new-tokens", "x"], "argument --new-tokens: expected a positive whole number, not 'x'"),
    (["diff", "a", "b", "--top", "0"], "argument --top: expected a positive whole number, not 0"),
    (["report", "a", "--top", "0"], "argument --top: expected a positive whole number, not 0"),
    (["compare", "--repetitions", "0"], "argument -r/--repetitions: expected a positive whole number, not 0"),
])
def test_each_numbers_range_is_checked_once_by_its_option(argv: list[str], words: str,
                                                         capsys: pytest.CaptureFixture[str]):
    with pytest.raises(SystemExit) as exit:
        build_parser().parse_args(argv)
    assert exit.value.code == 2
    err = capsys.readouterr().err
    assert words in err and err.count("\n") == 1


def test_what_ties_two_numbers_is_checked_before_the_child_starts(tmp_path):
    """--warmup against --new-tokens, --top-k against the preset's vocabulary: refused by
    launch.parent.prepare in one line, before a child or an output directory exists."""
    from cpuprof.errors import UsageError
    from cpuprof.launch import parent

    args = build_parser().parse_args(["decode", "--preset", "tiny", "--new-tokens", "4", "--warmup", "4"])
    with pytest.raises(UsageError, match=r"--warmup 4: expected 0 to 3 \(fewer than --new-tokens 4\)"):
        parent.prepare(decode.options_from_args(args), tmp_path / "out")
    args = build_parser().parse_args(["decode", "--preset", "tiny", "--sampling", "topk", "--top-k", "100000"])
    with pytest.raises(UsageError, match="--top-k 100000: the model's vocabulary has 256 tokens"):
        parent.prepare(decode.options_from_args(args), tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("text", ["nan", "inf", "-inf", "1e400", "NaN"])
@pytest.mark.parametrize("flag", ["--delay", "--duration", "--rank-timeout"])
def test_float_options_refuse_what_is_not_a_finite_number(flag: str, text: str, capsys: pytest.CaptureFixture[str]):
    """--delay nan was once accepted and blamed on launch.json after it was written: refused at the door."""
    with pytest.raises(SystemExit) as exit:
        build_parser().parse_args(["run", f"{flag}={text}", "--", "python", "x.py"])
    assert exit.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {flag}:" in err and "a finite number" in err and err.count("\n") == 1
