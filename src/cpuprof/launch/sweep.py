"""Running a configuration sweep: every configuration, repeated, each run a fresh decode child.

The order is interleaved and rotated, as in careful benchmarking: round k runs every
configuration once, starting with configuration k, so slow drift of the machine (thermal state,
a neighbour's load, page cache) spreads over all configurations instead of favouring the ones
that ran first. After each run the sweep is saved, so Ctrl-C or a crash loses at most the run
in progress, and ``--resume`` runs only what is missing.
"""

from __future__ import annotations

import dataclasses
import datetime
import itertools
import os
import re
import signal
import sys
import threading
import time
import typing
from collections.abc import Callable
from pathlib import Path

from .. import __version__, defaults, exit_codes
from ..errors import CpuprofError, FileFormatError, UsageError
from ..model.codec import from_json, to_json
from ..model.compare import (
    COMPARE_FILE,
    COMPARE_FORMAT,
    COMPARE_VERSION,
    Comparison,
    RunMetrics,
    SweepConfig,
    SweepRun,
)
from ..model.io import file_in
from ..model.run_layout import rank_dir
from ..options_spec import SWEEPS, Option
from ..safe_text import printable
from . import parent
from .options import DecodeOptions

# Axes a sweep varies, in the order a configuration's label names them, and the value
# ``decode`` uses when the flag is not given (the baseline prefers these): the options that
# declare an Axis (cpuprof.options_spec).
AXES = tuple(SWEEPS)
DECODE_DEFAULTS = {axis: option.baseline for axis, option in SWEEPS.items() if option.baseline is not None}
NUMERIC_AXES = tuple(axis for axis, option in SWEEPS.items() if option.sweep and option.sweep.numeric)
# How many processes a configuration runs, and as what: not a DecodeOptions field but decode's
# --tp N / --instances N, so apply() leaves them to process_layout().
LAYOUT_AXES = tuple(axis for axis, option in SWEEPS.items() if option.sweep and option.sweep.layout)
CHILD_LOG = "child.log"


class SweepInterrupted(Exception):
    """Ctrl-C (or SIGTERM) during a sweep: what finished is saved."""


def parse_values(axis: str, text: str) -> list[str]:
    """A flag's comma list, where numeric axes also take ranges: 1-4, 1-8+2 (step), 1-16*2 (factor)."""
    values: list[str] = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            raise UsageError(f"--{axis} {text}: an empty value in the list")
        match = re.fullmatch(r"(\d+)-(\d+)(?:([+*])(\d+))?", item) if axis in NUMERIC_AXES else None
        if match:
            first, last = int(match.group(1)), int(match.group(2))
            op, step = match.group(3) or "+", int(match.group(4) or 1)
            if last < first or step < 1 or (op == "*" and (step < 2 or first < 1)):
                raise UsageError(f"--{axis} {item}: expected first-last, first-last+step or first-last*factor "
                                 "with first <= last")
            number = first
            while number <= last:
                values.append(str(number))
                number = number + step if op == "+" else number * step
        else:
            values.append(item)
    for checked in values:
        check_value(axis, checked)
    if len(set(values)) != len(values):
        raise UsageError(f"--{axis} {text}: a value is listed twice")
    return values


def check_value(axis: str, value: str) -> None:
    """Bad input is caught before anything runs; whether a value works here is found by running it."""
    _option(axis).check_sweep_value(value)


def _option(axis: str) -> Option:
    if axis not in SWEEPS:
        raise UsageError(f"cannot sweep {axis}")
    return SWEEPS[axis]


# Where each part of decode's options sits in DecodeOptions: WorkloadOptions -> "workload", ...
_PARTS = {hint: name for name, hint in typing.get_type_hints(DecodeOptions).items() if dataclasses.is_dataclass(hint)}


def apply(options: DecodeOptions, values: dict[str, str]) -> DecodeOptions:
    """The base options with one configuration's values in place."""
    for axis, value in values.items():
        option = _option(axis)
        if option.target is None:
            continue  # processes: see process_layout
        owner, field = option.target
        part = _PARTS[owner]
        changed = dataclasses.replace(getattr(options, part), **{field: option.check_sweep_value(value)})
        options = dataclasses.replace(options, **{part: changed})
    return options


def values_of(options: DecodeOptions, axes: list[str]) -> dict[str, str]:
    """Each axis's value in ``options`` as a sweep writes it, where that text gives the value back
    (a setting left to the runtime's default, such as blocktime, has none and is left out)."""
    values: dict[str, str] = {}
    for axis in axes:
        option = _option(axis)
        if option.target is None:
            continue
        owner, field = option.target
        value = getattr(getattr(options, _PARTS[owner]), field)
        if value is None:
            continue
        text = ("on" if value == (option.action == "store_true") else "off") if option.action else str(value)
        try:
            if option.check_sweep_value(text) == value:
                values[axis] = text
        except UsageError:
            continue
    return values


def process_layout(values: dict[str, str]) -> tuple[str, int] | None:
    """("tp", n) or ("instances", n) for a configuration of several processes; None for one."""
    for mode in LAYOUT_AXES:
        if int(values.get(mode, "1")) > 1:
            return mode, int(values[mode])
    return None


def layout_conflict(values: dict[str, str]) -> bool:
    """Tensor-parallel ranks and independent instances at once: decode runs one or the other."""
    return all(int(values.get(mode, "1")) > 1 for mode in LAYOUT_AXES)


def label(values: dict[str, str]) -> str:
    return " ".join(f"{axis}={value}" for axis, value in values.items()) or "as given"


def rotated_order(n_configs: int, repetitions: int) -> list[list[int]]:
    """Round k runs every configuration once, starting with configuration k mod n."""
    order: list[list[int]] = []
    for rep in range(repetitions):
        start = rep % n_configs
        order.extend([(start + i) % n_configs, rep + 1] for i in range(n_configs))
    return order


def default_baseline(configs: list[SweepConfig]) -> int:
    """The configuration closest to what ``decode`` does without flags (else the first listed)."""
    def score(config: SweepConfig) -> int:
        return sum(1 for axis, value in config.values.items() if DECODE_DEFAULTS.get(axis) == value)

    best = max(range(len(configs)), key=lambda i: (score(configs[i]), -i))
    return best


def plan(base: DecodeOptions, axes: dict[str, list[str]], repetitions: int, argv: list[str],
         extra: list[SweepConfig] | None = None, source: str | None = None) -> Comparison:
    """The cross product of the axes (or the given configurations, for --from), in rotated rounds.
    Combinations with both --tp and --instances above 1 are left out: decode runs one or the other."""
    if extra is not None:
        configs = extra
    else:
        names = list(axes)
        combos = [dict(zip(names, combo, strict=True)) for combo in itertools.product(*(axes[n] for n in names))]
        combos = [values for values in combos if not layout_conflict(values)]
        if not combos:
            raise UsageError("--tp and --instances above 1 together: decode runs tensor-parallel ranks or "
                             "independent instances, not both; sweep --tp 1,N --instances 1,M instead")
        configs = [SweepConfig(label=label(values), values=values) for values in combos]
    return Comparison(
        format=COMPARE_FORMAT, version=COMPARE_VERSION,
        created=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        cpuprof_version=__version__, argv=argv, base=to_json(base), axes=axes, configs=configs,
        repetitions=repetitions, order=rotated_order(len(configs), repetitions),
        baseline=0 if extra is not None else default_baseline(configs), source=source,
    )


def save(comparison: Comparison, out_dir: Path) -> Path:
    return comparison.save(out_dir)


def load(path: str | os.PathLike[str]) -> Comparison:
    """A saved sweep whose every configuration can run: its base options and each configuration's
    values are decoded here, so a damaged file is one line before anything starts (a resume), not
    a traceback in the middle of the sweep."""
    comparison = Comparison.load(path)
    try:
        base = base_options(comparison)
        for config in comparison.configs:
            apply(base, config.values)
            process_layout(config.values)
    except (CpuprofError, ValueError, TypeError, RecursionError) as exc:  # DecodeError is a ValueError
        source = file_in(path, COMPARE_FILE)
        raise FileFormatError(f"{source} is a damaged cpuprof comparison ({exc})") from exc
    return comparison


def base_options(comparison: Comparison) -> DecodeOptions:
    return from_json(DecodeOptions, comparison.base, "comparison.base")


def _child_error(log: Path) -> str | None:
    """The child's own one-line error, from its log."""
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return None
    errors = [line.removeprefix("cpuprof: error: ") for line in lines if line.startswith("cpuprof: error: ")]
    return errors[-1] if errors else None


def run_one(comparison: Comparison, config: int, repetition: int, out_dir: Path) -> SweepRun:
    """One run of one configuration; a configuration that fails is a result, not the end of the sweep."""
    from ..analysis.compare import run_metrics

    run_dir = out_dir / f"config-{config + 1:02d}" / f"run-{repetition}"
    run_dir.mkdir(parents=True, exist_ok=True)
    options = dataclasses.replace(apply(base_options(comparison), comparison.configs[config].values),
                                  out=str(run_dir))
    record = SweepRun(config=config, repetition=repetition, status="failed", out_dir=str(run_dir))
    layout = process_layout(comparison.configs[config].values)
    if layout is not None:
        return _run_group(options, layout, run_dir, record)
    started = time.monotonic()
    try:
        outcome = parent.launch(options, run_dir, log=run_dir / CHILD_LOG)
    except CpuprofError as exc:  # rejected before it ran: a NUMA node or allocator not here, ...
        record.error = str(exc)
        record.wall_s = time.monotonic() - started
        return record
    record.wall_s = time.monotonic() - started
    # The child saves what it has and exits INTERRUPTED; a signal before its handlers are set kills it, or
    # (while Python itself starts) makes it exit 1: the launcher knows it passed a signal on.
    if outcome.interrupted or outcome.returncode in (exit_codes.INTERRUPTED, -signal.SIGINT, -signal.SIGTERM):
        record.status = "interrupted"
        return record
    message = parent.failure_message(outcome)
    if message is not None:
        own = _child_error(run_dir / CHILD_LOG)
        record.error = own or message
        return record
    assert outcome.profile is not None
    return _measured(record, run_metrics(outcome.profile), "the run")


def _run_group(options: DecodeOptions, layout: tuple[str, int], run_dir: Path, record: SweepRun) -> SweepRun:
    """One run of a configuration of several processes, as ``decode --tp N`` / ``--instances N`` runs
    it: each rank's profile and log in run_dir/rank-K, and ranks.json."""
    from ..analysis.compare import group_metrics
    from . import ranks

    mode, n = layout
    started = time.monotonic()
    try:
        run = ranks.launch_ranks(options, run_dir, mode, n, relay=False)
    except CpuprofError as exc:  # a placement or memory check refused it before anything started
        record.error = str(exc)
        record.wall_s = time.monotonic() - started
        return record
    record.wall_s = time.monotonic() - started
    if run.interrupted:
        record.status = "interrupted"
        return record
    if run.failures:
        record.error = run.failures[0]
        return record
    return _measured(record, group_metrics(run, run.profiles(run_dir)), "a rank")


def _measured(record: SweepRun, metrics: RunMetrics | None, who: str) -> SweepRun:
    """A run that ended well is done, with its figures, if it measured a decode step."""
    if metrics is None:
        record.error = f"{who} measured no decode step (raise --new-tokens above --warmup)"
        return record
    record.status = "done"
    record.metrics = metrics
    return record


class _SweepSignals:
    """SIGINT and SIGTERM for as long as the sweep runs, heard whatever this process's handlers were.

    Between runs, and between a run's child's end and the run's result line, the launcher's own
    forwarding (parent.Supervision) is not in force, and the process's handler was all there was:
    in a background job (``compare ... &`` in a script) SIGINT is ignored, so a signal there was
    lost and the sweep went on to mark every run done. Here it raises KeyboardInterrupt while a
    run is under way (``raising``: the run is interrupted, not done, whatever its child did) and
    is recorded otherwise: the sweep stops before its next run."""

    def __init__(self) -> None:
        self.received: int | None = None
        self.raising = False
        self._previous: dict[int, typing.Any] = {}

    def __enter__(self) -> _SweepSignals:
        self._previous = {sig: signal.signal(sig, self._heard) for sig in (signal.SIGINT, signal.SIGTERM)}
        return self

    def __exit__(self, *_exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _heard(self, signum: int, _frame: object) -> None:
        if self.received is None:
            self.received = signum
        if self.raising:
            self.raising = False  # once: the run's interrupted ending is being recorded
            raise KeyboardInterrupt


# A child's lines that are not progress: what went wrong, or a remark.
PROGRESS_NOT = ("cpuprof: error", "cpuprof: warning", "cpuprof: note")
_SAYING = threading.Lock()


def say(line: str) -> None:
    """A line on stderr in one write: the heartbeat's thread and the sweep's own lines never interleave."""
    with _SAYING:
        sys.stderr.write(printable(line) + "\n")
        sys.stderr.flush()


_STILL = re.compile(r"^still (.*) \(\d+ s\)$")


class Heartbeat:
    """While a run's child works, its output going to its log, a line at least every ``interval_s``
    with the last progress line the log has and the time so far: a piped compare is never silent for
    long (a compiled configuration decodes for minutes)."""

    def __init__(self, what: str, run_dir: Path, report: Callable[[str], None],
                 interval_s: float = defaults.PROGRESS_PLAIN_INTERVAL_S) -> None:
        self.what, self.run_dir, self.report, self.interval_s = what, run_dir, report, interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="cpuprof-heartbeat", daemon=True)
        self._started = time.monotonic()

    def __enter__(self) -> Heartbeat:
        try:
            self._thread.start()
        except BaseException:  # a Ctrl-C as it started: the thread must not outlive the block
            self._stop.set()
            raise
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _beat(self) -> None:
        while not self._stop.wait(self.interval_s):
            said = last_progress_line([self.run_dir / CHILD_LOG, rank_dir(self.run_dir, 0) / CHILD_LOG])
            if said:  # the child's own "still X (13 s)": one clock, the run's, is enough
                said = _STILL.sub(r"\1", said)
            self.report(f"cpuprof: {self.what}: {said or 'starting'} ({time.monotonic() - self._started:.0f} s)")


def last_progress_line(logs: list[Path], tail_bytes: int = 8192) -> str | None:
    """The last ``cpuprof: `` line of the first of ``logs`` that exists (a child's progress, plain in a
    log), without the prefix; read as untrusted text (the log holds the program's output too)."""
    for log in logs:
        try:
            with log.open("rb") as f:
                f.seek(max(0, f.seek(0, os.SEEK_END) - tail_bytes))
                text = f.read().decode(errors="replace")
        except OSError:
            continue
        lines = text.splitlines()
        if lines and not text.endswith("\n"):
            lines.pop()  # a line the child is still writing
        for line in reversed(lines):
            if line.startswith("cpuprof: ") and not line.startswith(PROGRESS_NOT):
                return printable(line.removeprefix("cpuprof: "))[:200]
        return None
    return None


def _time_left(comparison: Comparison, left: int) -> str:
    """About how long the runs still to make take, from the mean of those made so far (runs of one
    configuration take alike; a sweep's configurations differ, hence "about")."""
    walls = [r.wall_s for r in comparison.runs if r.status == "done" and r.wall_s > 0]
    if not left or not walls:
        return ""
    seconds = left * sum(walls) / len(walls)
    when = f"{seconds / 60:.0f} min" if seconds >= 90 else f"{seconds:.0f} s"
    return f"; {left} run{'s' if left != 1 else ''} left, about {when}"


def run_sweep(comparison: Comparison, out_dir: Path,
              report_progress: Callable[[str], None] = say) -> None:
    """Runs what is missing, saving after each run; raises SweepInterrupted on Ctrl-C or SIGTERM."""
    from . import run_times

    todo = [(c, r) for c, r in comparison.order if not comparison.finished(c, r)]
    total = len(comparison.order)
    done_before = total - len(todo)
    base = base_options(comparison)

    def signature(config: int) -> str:
        values = comparison.configs[config].values
        return run_times.signature(apply(base, values), values)

    if todo:
        line = run_times.estimate_line([(comparison.configs[c].label, signature(c)) for c, _ in todo])
        report_progress(f"cpuprof: {line}")
    with _SweepSignals() as signals:
        save(comparison, out_dir)
        for k, (config, repetition) in enumerate(todo, done_before + 1):
            what = f"[{k}/{total}] {comparison.configs[config].label}, run {repetition}"
            if signals.received is not None:  # between two runs
                raise SweepInterrupted(what)
            report_progress(f"cpuprof: {what} ...")
            run_dir = out_dir / f"config-{config + 1:02d}" / f"run-{repetition}"
            try:
                signals.raising = True
                with Heartbeat(what, run_dir, report_progress):
                    record = run_one(comparison, config, repetition, out_dir)
                signals.raising = False
            except KeyboardInterrupt:
                record = SweepRun(config=config, repetition=repetition, status="interrupted", out_dir=str(run_dir))
            signals.raising = False
            if signals.received is not None and record.status != "interrupted":
                # It came after the run's child ended, before this result: the run does not count.
                record = SweepRun(config=config, repetition=repetition, status="interrupted", out_dir=str(run_dir))
            comparison.runs = [r for r in comparison.runs if (r.config, r.repetition) != (config, repetition)]
            comparison.runs.append(record)
            save(comparison, out_dir)
            if record.status == "interrupted":
                raise SweepInterrupted(what)
            if record.status == "failed":
                report_progress(f"cpuprof: {what}: failed: {record.error}")
            else:
                run_times.record(signature(config), record.wall_s)
                m = record.metrics
                assert m is not None
                report_progress(f"cpuprof: {what}: {m.tokens_per_s:.2f} tokens/s, p50 {m.p50_ms:.1f} ms "
                                f"({record.wall_s:.0f} s){_time_left(comparison, total - k)}")
