"""``cpuprof compare``: which configuration decodes fastest here, beyond the noise, and why."""

from __future__ import annotations

import argparse
import copy
import dataclasses
import math
import sys
from pathlib import Path
from typing import TextIO

from .. import options_spec as spec
from ..errors import CpuprofError, Interrupted, UsageError
from ..launch import parent, run_dir, sweep
from ..launch.options import DecodeOptions
from ..model.compare import COMPARE_FILENAME, Comparison, SweepConfig
from ..safe_text import cpuprof_command, say
from . import decode
from .common import after_report, write_output

HTML_FILENAME = spec.HTML_FILENAME


# What decode's options read that compare does not ask: each run takes decode's defaults.
_TAKEN = {option.name for option in spec.COMPARE_RUNS}
COMMAND = spec.Command(
    "compare", help="sweep threads, OpenMP runtime, binding, allocator, processes, ... and rank them, beyond the noise",
    description="Runs decode once per configuration and repetition, each in a fresh process, in interleaved rounds "
                "whose order rotates, and ranks the configurations by tokens/s with the spread, latency percentiles, "
                "time to first token and the figures that explain the difference (spin, sleep, run-queue delay, "
                "switches, migrations, share of the bandwidth roof, share of each step in all-reduces). Lists (1,2,4) "
                "and ranges (1-4, 1-8+2, 1-16*2) sweep a setting; every combination is run.",
    groups=(
        spec.Group("workload", spec.WORKLOAD, sweep=True),
        spec.Group("launch (comma lists sweep a setting)", (*spec.LAUNCH, *spec.options("--tp", "--instances")),
                   sweep=True),
        spec.Group("runs and profiling", spec.COMPARE_RUNS),
        spec.Group("output", spec.compare_output()),
    ),
    defaults=(("flamegraph", False), *((option.name, option.default_value)
                                        for option in (*spec.PROFILING, spec.CHECKPOINT) if option.name not in _TAKEN)))


def _axes(args: argparse.Namespace) -> dict[str, list[str]]:
    axes = {}
    for axis in sweep.AXES:
        text = getattr(args, axis)
        if text is None:
            continue
        axes[axis] = sweep.parse_values(axis, str(text))
    return axes


def _base_options(args: argparse.Namespace) -> DecodeOptions:
    """decode's options from the flags, with each axis at its single value or left to the configurations."""
    base = copy.copy(args)
    for option in spec.SWEEPS.values():
        setattr(base, option.name, option.default_value)
    return decode.options_from_args(base)


def _plan_from_args(args: argparse.Namespace, argv: list[str]) -> Comparison:
    axes = _axes(args)
    base = _base_options(args)
    quant_modes = axes.get("quant", [base.workload.quant])
    parent.check_group_size_used(base.workload.group_size, quant_modes)
    shards = tuple(int(n) for n in axes.get("tp", ["1"]))
    base = dataclasses.replace(base, workload=parent.with_group_size(base.workload, quant_modes, shards))
    # Several processes are not an option of decode's child, so a single --tp 2 stays in every
    # configuration's values (and label) instead of in the base options.
    swept = {axis: values for axis, values in axes.items()
             if len(values) > 1 or (axis in sweep.LAYOUT_AXES and values != ["1"])}
    fixed = {axis: values[0] for axis, values in axes.items() if axis not in swept}
    comparison = sweep.plan(sweep.apply(base, fixed), swept, args.repetitions, argv)
    combinations = math.prod(len(values) for values in swept.values())
    if len(comparison.configs) < combinations:
        print(f"cpuprof: {combinations - len(comparison.configs)} combination(s) with both --tp and --instances "
              "above 1 left out: decode runs tensor-parallel ranks or independent instances, not both",
              file=sys.stderr)
    return comparison


def _workload_or_launch_flags(argv: list[str]) -> list[str]:
    """The workload and launch flags on the command line (as typed, "--layers" or "--layers=2")."""
    flags = {option.flag for option in (*spec.WORKLOAD, *spec.LAUNCH, *spec.options("--tp", "--instances"))
             if not option.positional}
    flags |= {option.short for option in (*spec.WORKLOAD, *spec.LAUNCH) if option.short}
    given = []
    for word in argv:
        if word == "--":
            break
        flag = word.split("=", 1)[0]
        if flag in flags and flag not in given:
            given.append(flag)
    return given


def _plan_from_profile(args: argparse.Namespace, argv: list[str]) -> Comparison:
    """compare --from DIR: the profile's own options, then each proposal applied to them alone."""
    from ..analysis.proposals import proposals
    from ..launch.child_run import LAUNCH_FILENAME, read_launch_file
    from ..launch.options import ChildConfig
    from ..model import Profile
    from ..model.io import present

    source = Path(args.from_dir)
    given = _workload_or_launch_flags(argv)
    if given:
        raise UsageError(f"--from {source} runs the profile's own workload and launch, with each proposal applied; "
                         f"{', '.join(given)} would be ignored: leave {'it' if len(given) == 1 else 'them'} out, or "
                         "sweep settings without --from")
    profile = Profile.load(source)
    launch_file = (source if source.is_dir() else source.parent) / LAUNCH_FILENAME
    if not present(launch_file):
        raise UsageError(f"--from {source}: no {LAUNCH_FILENAME} beside the profile "
                         "(compare --from needs a profile written by decode)")
    config = read_launch_file(launch_file, ChildConfig)
    if config.rank is not None:
        raise UsageError(f"--from {source}: a profile of one rank of a --{config.rank.mode} run; --from measures "
                         "a single-process profile's proposals (sweep processes with --tp 1,N or --instances 1,N)")
    base = dataclasses.replace(config.options, out=None, launch=dataclasses.replace(
        config.options.launch, threads=config.threads))
    from ..machine.openmp import find_intel_openmp

    found = proposals(profile, intel_openmp=find_intel_openmp() is not None)
    if not found:
        raise UsageError(f"--from {source}: its figures propose nothing to try (no high spin, run-queue delay, "
                         "migrations or idle CPUs); sweep settings yourself with --threads, --omp, ...")
    # The profile's own value of each axis a proposal changes, so the explanation can name what each
    # configuration changed from ("threads 2 → 1"), not only that it differs.
    profiled = sweep.values_of(base, list(dict.fromkeys(axis for p in found for axis in p.values)))
    configs = [SweepConfig(label="as profiled", values=profiled)]
    configs += [SweepConfig(label=sweep.label(p.values), values=p.values, proposal=p.reason) for p in found]
    axes: dict[str, list[str]] = {}
    for p in found:
        for axis, value in p.values.items():
            axes.setdefault(axis, []).append(value)
    return sweep.plan(base, axes, args.repetitions, argv, extra=configs, source=str(source))


def run(args: argparse.Namespace) -> int:
    argv = sys.argv[1:]
    if args.resume:
        if args.from_dir:
            raise UsageError("--resume continues a saved sweep; it takes no --from")
        if not (Path(args.resume) / COMPARE_FILENAME).is_file():
            sweep.load(args.resume)  # its one-line error says what is missing or wrong there
        # Locked as a new sweep's directory is: two resumes of one sweep would run its runs twice.
        with run_dir.claimed(args.resume, "compare", resume=True, flag="--resume") as out_dir:
            comparison = sweep.load(out_dir)
            say(f"cpuprof: resuming {out_dir / COMPARE_FILENAME}: "
                f"{sum(1 for c, r in comparison.order if comparison.finished(c, r))} of {len(comparison.order)} "
                "runs already finished")
            return run_sweep(comparison, out_dir, args)
    comparison = _plan_from_profile(args, argv) if args.from_dir else _plan_from_args(args, argv)
    check_context(comparison)
    if args.out and (Path(args.out) / COMPARE_FILENAME).exists() and not args.overwrite:
        raise UsageError(f"--out {args.out}: holds a comparison already; continue it with "
                         f"{cpuprof_command('compare', '--resume', args.out)}, replace it with "
                         f"{run_dir.OVERWRITE_FLAG}, or choose another directory")
    with run_dir.claimed(args.out, "compare", overwrite=args.overwrite) as out_dir:
        n = len(comparison.configs)
        say(f"cpuprof: {n} configuration(s) × {comparison.repetitions} run(s) = {len(comparison.order)} runs, "
            f"in rotated rounds; results in {out_dir}")
        return run_sweep(comparison, out_dir, args)


def check_context(comparison: Comparison) -> None:
    """Each configuration's prompt and new tokens fit its model's context: checked for all of them
    before the first run starts, as decode checks its own (a sweep of runs that all fail is no answer)."""
    base = sweep.base_options(comparison)
    for config in comparison.configs:
        options = sweep.apply(base, config.values)
        layout = sweep.process_layout(config.values)
        try:
            # A tensor-parallel rank quantizes its slices: their widths must suit the kernels too.
            parent.check_quant(options.workload, shards=layout[1] if layout and layout[0] == "tp" else 1)
            if not options.workload.hf:  # a checkpoint's context is known once it is loaded, in the child
                parent.check_context(options.workload)
        except UsageError as exc:
            where = f" (configuration {config.label})" if config.values else ""
            raise UsageError(f"{exc}{where}") from exc


def run_sweep(comparison: Comparison, out_dir: Path, args: argparse.Namespace) -> int:
    """Runs what the sweep in ``out_dir`` has not finished, then reports it."""
    interrupted = None
    try:
        sweep.run_sweep(comparison, out_dir)
    except (sweep.SweepInterrupted, KeyboardInterrupt) as exc:
        interrupted = exc
    write_reports(comparison, out_dir, args.format, args.html)
    if interrupted is not None:
        raise Interrupted(f"compare was interrupted; what finished is in {out_dir / COMPARE_FILENAME}; "
                          f"resume with: {cpuprof_command('compare', '--resume', out_dir)}")
    done = sum(1 for r in comparison.runs if r.status == "done")
    if done == 0:
        raise CpuprofError(f"no configuration ran to the end; see the errors above and {out_dir}")
    return 0


def write_reports(comparison: Comparison, out_dir: Path, fmt: str, html: bool) -> None:
    render_comparison(comparison, sys.stdout, fmt, out_dir)
    stream, gap = after_report(fmt)
    stream.write(gap + f"comparison saved in {out_dir / COMPARE_FILENAME}; "
                 f"re-render with: {cpuprof_command('report', out_dir)}\n")
    if html:
        from ..reports import OutputOptions, SweepSource, get_output

        target = out_dir / HTML_FILENAME
        source = SweepSource(comparison, str(out_dir))
        write_output(str(target), lambda out: get_output("html", "sweep").write(source, out, OutputOptions()))
        stream.write(f"HTML report: {target}\n")


def render_comparison(comparison: Comparison, out: TextIO, fmt: str, out_dir: Path | None = None) -> None:
    from ..reports import OutputOptions, SweepSource, get_output

    source = SweepSource(comparison, str(out_dir) if out_dir is not None else None)
    get_output(fmt, "sweep", roles=("report",)).write(source, out, OutputOptions())
