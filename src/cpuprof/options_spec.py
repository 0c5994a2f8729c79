"""Every option and argument of every command, declared once.

An :class:`Option` says the flag, its help, how its text is checked and parsed, and where its value
goes: a field of an options dataclass (:class:`~cpuprof.launch.options.WorkloadOptions`,
:class:`~cpuprof.launch.options.ProfileOptions`, :class:`~cpuprof.launch.environment.LaunchSettings`,
:class:`~cpuprof.launch.options.DecodeOptions`). That field is the option's one typed home: its
default is the option's default and, when the field is a ``Literal``, its values are the option's
choices. From these tables come the argparse arguments of every command, the options built from
the parsed flags, and compare's sweep axes (an option with an :class:`Axis` takes a comma list there).

The commands that read saved files (report, diff, flamegraph, trace) and the small ones (signal,
doctor) take their arguments from tables here too, so a flag shared by several commands (``--top``,
``--format``, ``-o``, ``--out``, ``--html``) is one :class:`Option` with one check, one default and
help that names its choices from the registry they come from. No command file calls
``add_argument``: a test holds them to it.

Adding an option: a field in its options dataclass, an entry in its group below, and the code that
uses the value. Nothing here imports torch or the native module: the CLI builds its parsers from it
on a machine that has neither.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import typing
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from . import defaults
from .errors import UsageError
from .launch import environment, program
from .launch.options import DecodeOptions, ProfileOptions, WorkloadOptions
from .launch.ranks import BACKENDS, DEFAULT_TIMEOUT_S
from .launch.window import WindowPlan
from .model.workload import DEFAULT_GROUP_SIZE, INT4_GROUP_SIZES, QUANT_MODES
from .workload.dtypes import DTYPE_NAMES
from .workload.presets import OVERRIDABLE_FIELDS, PRESETS

T = TypeVar("T")


def _bounded(kind: Callable[[str], float], minimum: float, inclusive: bool, expected: str) -> Callable[[str], Any]:
    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {expected}, not {text!r}") from None
        if not math.isfinite(value):  # nan, inf, and 1e400 (which float() reads as inf)
            raise argparse.ArgumentTypeError(f"expected {expected}, not {text} (a finite number)")
        if value < minimum or (not inclusive and value == minimum):
            raise argparse.ArgumentTypeError(f"expected {expected}, not {text}")
        return value

    return parse


positive_int = _bounded(int, 1, True, "a positive whole number")
non_negative_int = _bounded(int, 0, True, "0 or more")
positive_float = _bounded(float, 0.0, False, "a positive number")


@dataclass(frozen=True)
class Axis:
    """How ``compare`` sweeps an option: its flag takes a comma list, each value run as a configuration."""

    help: str  # compare's help for the list
    numeric: bool = False  # ranges too: 1-4, 1-8+2 (step), 1-16*2 (factor)
    metavar: str | None = None
    # The value decode runs with when the flag is not given, as a sweep writes it (the baseline
    # prefers it); by default the option's default.
    baseline: str | None = None
    # Processes (decode --tp/--instances): not a field of decode's options but how many children run.
    layout: bool = False


_FROM_FIELD: Any = object()  # Option.default: the target field's default


@dataclass(frozen=True)
class Option:
    """One flag: its help, how its text is checked, and the options field its value goes to."""

    flag: str
    help: str  # argparse expands %(default)s and %(choices)s
    target: tuple[type, str] | None = None  # the options dataclass and field that hold the value
    default: Any = _FROM_FIELD
    type: Callable[[str], Any] | None = None  # argparse's check of the text (one-line error, exit 2)
    # The text to the field's value after parsing, where the check needs its own words or the
    # machine (UsageError, one line, before anything starts).
    parse: Callable[[Any], Any] | None = None  # the text (a positional with nargs: the list of words)
    choices: Sequence[str] | None = None  # by default the target field's Literal values
    metavar: str | None = None
    action: str | None = None  # "store_true" / "store_false"
    dest: str | None = None
    short: str | None = None
    sweep: Axis | None = None
    nargs: str | None = None  # argparse's: "?", argparse.REMAINDER
    required: bool = False

    @property
    def positional(self) -> bool:
        """A positional argument: its ``flag`` is its name, with no dashes."""
        return not self.flag.startswith("-")

    @property
    def name(self) -> str:
        """The argparse destination."""
        if self.positional:
            return self.flag
        if self.dest is not None:
            return self.dest
        if self.target is not None:
            return self.target[1]
        return self.flag.removeprefix("--").replace("-", "_")

    @property
    def default_value(self) -> Any:
        if self.default is not _FROM_FIELD:
            return self.default
        if self.target is None:
            return None
        cls, name = self.target
        found = {f.name: f for f in dataclasses.fields(cls)}[name]
        if found.default is not dataclasses.MISSING:
            return found.default
        return None if found.default_factory is dataclasses.MISSING else found.default_factory()

    @property
    def choice_values(self) -> tuple[str, ...] | None:
        if self.choices is not None:
            return tuple(self.choices)
        if self.target is None:
            return None
        cls, name = self.target
        hint = typing.get_type_hints(cls)[name]
        return typing.get_args(hint) if typing.get_origin(hint) is typing.Literal else None

    def add_to(self, group: argparse._ActionsContainer, sweep: bool = False) -> None:
        """The flag on a parser; with ``sweep``, as compare's comma list when the option has an axis."""
        names = [n for n in (self.short, self.flag) if n]
        kwargs: dict[str, Any] = {"help": self.help}
        if not self.positional:
            kwargs["dest"] = self.name
        if self.required:
            kwargs["required"] = True
        if self.nargs is not None:
            kwargs["nargs"] = self.nargs
        if sweep and self.sweep is not None:
            # A list is text until compare checks each value, so argparse holds no default or choices
            # to expand in the help: they are written in here.
            kwargs["help"] = (self.help.replace("%(choices)s", ", ".join(self.choice_values or ()))
                              .replace("%(default)s", str(self.baseline)) + "; " + self.sweep.help)
            kwargs.update(default=None, metavar=self.sweep.metavar or self.metavar)
            group.add_argument(*names, **kwargs)
            return
        if self.action is not None:
            kwargs["action"] = self.action
        else:
            kwargs.update(type=self.type, choices=self.choice_values, metavar=self.metavar)
            if not (self.positional and self.default_value is None):  # a positional's default is its absence
                kwargs["default"] = self.default_value
        group.add_argument(*names, **kwargs)

    def value(self, args: argparse.Namespace) -> Any:
        """The parsed flag as its field's value."""
        raw = getattr(args, self.name)
        return self.parse(raw) if self.parse is not None and raw is not None else raw

    # -- compare's sweeps --------------------------------------------------------------------
    @property
    def baseline(self) -> str | None:
        """The sweep value decode uses when the flag is not given."""
        if self.sweep is None:
            return None
        if self.sweep.baseline is not None:
            return self.sweep.baseline
        default = self.default_value
        if isinstance(default, bool):
            return "on" if default else "off"
        return None if default is None else str(default)

    def check_sweep_value(self, text: str) -> Any:
        """One value of a sweep list as its field's value; UsageError names the flag and the value."""
        if self.action is not None:  # a switch: on or off
            if text not in ("on", "off"):
                raise UsageError(f"{self.flag} {text}: expected on, off or on,off")
            return (text == "on") == (self.action == "store_true")
        choices = self.choice_values
        if choices is not None:
            if text not in choices:
                raise UsageError(f"{self.flag} {text}: choose from {', '.join(choices)}")
            return text
        if self.parse is not None:
            return self.parse(text)
        if self.type is not None:
            try:
                return self.type(text)
            except (argparse.ArgumentTypeError, ValueError) as exc:
                raise UsageError(f"{self.flag} {text}: {exc}") from None
        return text


@dataclass(frozen=True)
class Group:
    """Options shown together in --help (``title`` None: the command's own, untitled); with
    ``sweep``, those with an axis take compare's comma lists."""

    title: str | None
    options: tuple[Option, ...]
    sweep: bool = False


@dataclass(frozen=True)
class Command:
    """A subcommand: its name, its help, and every argument it takes, by group. ``defaults``: values
    its ``run`` reads that no flag of its sets (compare runs decode's options at their defaults)."""

    name: str
    help: str
    groups: tuple[Group, ...]
    description: str | None = None
    usage: str | None = None
    defaults: tuple[tuple[str, Any], ...] = ()

    def add_to(self, sub: argparse._SubParsersAction, run: Callable[[argparse.Namespace], int]) -> None:
        parser = sub.add_parser(self.name, help=self.help, description=self.description, usage=self.usage)
        for group in self.groups:
            where = parser if group.title is None else parser.add_argument_group(group.title)
            add_arguments(where, group.options, sweep=group.sweep)
        parser.set_defaults(run=run, **dict(self.defaults))


def options(*names: str, among: Iterable[Option] | None = None) -> tuple[Option, ...]:
    """The named options (by flag), in the order given."""
    by_flag = {o.flag: o for o in (ALL if among is None else among)}
    return tuple(by_flag[n] for n in names)


def with_help(option: Option, help: str) -> Option:
    """The same option (default, choices, target) described for another command."""
    return dataclasses.replace(option, help=help)


def for_program(table: Iterable[Option], program: str) -> tuple[Option, ...]:
    """Helps that name what runs (decode: "the decode", run: "the program")."""
    return tuple(dataclasses.replace(o, help=o.help.replace("{program}", program)) for o in table)


def add_arguments(group: argparse._ActionsContainer, table: Iterable[Option], sweep: bool = False) -> None:
    for option in table:
        option.add_to(group, sweep=sweep)


def build(cls: type[T], table: Iterable[Option], args: argparse.Namespace, **extra: Any) -> T:
    """An options dataclass from the parsed flags of the options whose target is in it."""
    values = {o.target[1]: o.value(args) for o in table if o.target is not None and o.target[0] is cls}
    return cls(**values, **extra)


# -- the workload: decode, and compare (where --dtype, --batch and --compile take lists) -------------
def _override(field: str) -> Option:
    return Option(f"--{field.replace('_', '-')}", f"override the preset's {field.replace('_', ' ')}", dest=field,
                  type=positive_int, metavar="N", default=None)


WORKLOAD: tuple[Option, ...] = (
    Option("--preset", "the built-in model's shape: %(choices)s (default %(default)s)",
           (WorkloadOptions, "preset"), choices=tuple(PRESETS), metavar="NAME"),
    *(_override(field) for field in OVERRIDABLE_FIELDS),
    Option("--dtype", "%(choices)s (default %(default)s)", (WorkloadOptions, "dtype"), choices=DTYPE_NAMES,
           sweep=Axis("a comma list sweeps them")),
    Option("--prompt-len", "prompt tokens for prefill (default %(default)s)", (WorkloadOptions, "prompt_len"),
           type=positive_int),
    Option("--new-tokens", "decode steps (default %(default)s)", (WorkloadOptions, "new_tokens"), type=positive_int),
    Option("--batch", "sequences decoded together (default %(default)s)", (WorkloadOptions, "batch"),
           type=positive_int, sweep=Axis("a list or range sweeps them", numeric=True)),
    Option("--warmup", "decode steps left out of tokens/s, fewer than --new-tokens (default %(default)s)",
           (WorkloadOptions, "warmup"), type=non_negative_int),
    Option("--sampling", "how the next token is chosen: %(choices)s (default %(default)s)",
           (WorkloadOptions, "sampling")),
    Option("--top-k", "with --sampling topk: sample among the k most likely tokens (default %(default)s)",
           (WorkloadOptions, "top_k"), type=positive_int),
    Option("--seed", "seed of the random weights, the prompt and top-k sampling (default %(default)s)",
           (WorkloadOptions, "seed"), type=int),
    Option("--hf", "decode a local Hugging Face checkpoint (needs transformers)", (WorkloadOptions, "hf"),
           metavar="PATH"),
    Option("--compile", "torch.compile the built-in model (inductor, weights frozen as constants, so oneDNN packs "
                        "them once instead of on every call); compiled before the profile starts, outside the "
                        "figures", (WorkloadOptions, "compile"), action="store_true",
           sweep=Axis("on,off sweeps both", metavar="on,off")),
    Option("--quant", "store the built-in model's projections and lm_head weight-only quantized: %(choices)s "
                      "(default %(default)s; int8: a scale per output channel, int4: a scale and zero point per "
                      "group; torch's own CPU kernels; changes the model's numerics)",
           (WorkloadOptions, "quant"), choices=QUANT_MODES, sweep=Axis("a comma list sweeps them")),
    Option("--group-size", f"with --quant int4: inputs per scale, one of {', '.join(map(str, INT4_GROUP_SIZES))} "
                           f"(default {DEFAULT_GROUP_SIZE})", (WorkloadOptions, "group_size"), type=positive_int,
           metavar="N"),
)


def _parse_cpus(text: str) -> list[int]:
    from .machine.topology import read_topology

    return environment.parse_cpus(text, read_topology())


# -- the launch: decode, run, calibrate, and compare (where most take lists) ------------------------
LAUNCH: tuple[Option, ...] = (
    Option("--threads", "OpenMP/torch threads (default: every CPU of the chosen set)",
           (environment.LaunchSettings, "threads"), parse=environment.parse_threads,
           sweep=Axis("1,2 or 1-4 sweeps them (with --tp/--instances, each process's threads)", numeric=True)),
    Option("--numa", "bind CPUs and memory to this NUMA node", (environment.LaunchSettings, "numa"),
           parse=environment.parse_numa, metavar="NODE",
           sweep=Axis("0,1 sweeps the nodes", numeric=True, metavar="NODES")),
    Option("--cpus", "explicit CPU list, e.g. 0-3,8",
           (environment.LaunchSettings, "cpus"), parse=_parse_cpus, metavar="LIST"),
    Option("--bind", "OpenMP thread placement: %(choices)s (default %(default)s)",
           (environment.LaunchSettings, "bind"), sweep=Axis("a comma list sweeps them")),
    Option("--omp", "OpenMP runtime: gnu (torch's libgomp, default) or intel (libiomp5, preloaded)",
           (environment.LaunchSettings, "omp"), sweep=Axis("gnu,intel sweeps both")),
    Option("--blocktime", "ms an idle OpenMP thread spins before sleeping (KMP_BLOCKTIME / GOMP_SPINCOUNT), or "
                          "infinite", (environment.LaunchSettings, "blocktime_ms"), dest="blocktime",
           parse=environment.parse_blocktime, metavar="MS", sweep=Axis("0,200 sweeps them", numeric=True)),
    Option("--allocator", "memory allocator: default (the system's, the default), jemalloc or tcmalloc (preloaded)",
           (environment.LaunchSettings, "allocator"), sweep=Axis("a comma list sweeps them")),
    Option("--oversubscribe", "allow more threads than CPUs", (environment.LaunchSettings, "oversubscribe"),
           action="store_true"),
)

LAUNCH_GROUP = Group("launch: threads, pinning, OpenMP, NUMA", LAUNCH)  # the same flags mean the same launch

# -- several processes ------------------------------------------------------------------------------
_RANK_TIMEOUT_HELP = ("how long ranks wait for each other in an all-reduce of the model, and how long the others "
                      "get to end once one rank has failed before they are stopped (default %(default)g; starting "
                      "up, ranks wait for each other up to "
                      f"{defaults.RANK_STARTUP_TIMEOUT_S:g} s, or this if longer)")
RANKS: tuple[Option, ...] = (
    Option("--tp", "split the built-in model tensor-parallel over N processes (attention heads and MLP width "
                   "sharded, an all-reduce after attention and after the MLP), through torch.distributed",
           type=positive_int, metavar="N",
           sweep=Axis("1,2 compares one process with two ranks, each on its share of the CPUs (gloo)",
                      numeric=True, metavar="N[,N]", baseline="1", layout=True)),
    Option("--instances", "N independent decoders side by side, for aggregate throughput", type=positive_int,
           metavar="N", sweep=Axis("1,2: each on its share of the CPUs, ranked by their tokens/s together",
                                   numeric=True, metavar="N[,N]", baseline="1", layout=True)),
    Option("--ranks-per-node", "ranks on each NUMA node (default: as few as fit, one per node when there are "
                               "enough)", type=positive_int, metavar="K"),
    Option("--backend", "torch.distributed backend for --tp: gloo (default) or ccl (needs Intel's oneCCL "
                        "bindings)", choices=BACKENDS, default=BACKENDS[0]),
    Option("--rank-timeout", _RANK_TIMEOUT_HELP, type=positive_float, default=DEFAULT_TIMEOUT_S, metavar="S"),
)
# run --nproc N: the program's own collectives have their own timeouts.
PROCESSES: tuple[Option, ...] = (
    Option("--nproc", "run N copies of the program, with RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT "
                      "set as torchrun sets them (rendezvous on localhost), for torch.distributed programs; one "
                      "merged report", type=positive_int, metavar="N"),
    with_help(options("--ranks-per-node", among=RANKS)[0],
              "processes on each NUMA node (default: as few as fit, one per node when there are enough)"),
    with_help(options("--rank-timeout", among=RANKS)[0],
              "once one process has failed, how long the others get to end before they are stopped (default "
              "%(default)g)"),
)

# run: the processes the program starts.
FOLLOW: tuple[Option, ...] = (
    Option("--no-follow", "profile the program's own process only; by default every Python process it starts "
                          "that imports torch (multiprocessing workers, a serving engine's engine core, subprocess "
                          "children, recursively) is profiled too, each into DIR/processes/PID", dest="follow",
           action="store_false", default=True),
)

non_negative_float = _bounded(float, 0.0, True, "0 or more seconds")

# run: a window of a long-running program (launch.window).
WINDOW: tuple[Option, ...] = (
    Option("--delay", "start profiling S seconds after each process imports torch (default 0): past a server's "
                      "start-up", (WindowPlan, "delay_s"), type=non_negative_float, metavar="S"),
    Option("--duration", "profile for S seconds, then save the profile; the program runs on unprofiled "
                         "(default: to its end)", (WindowPlan, "duration_s"), type=positive_float, metavar="S"),
    Option("--on-demand", "start the program unprofiled; `python -m cpuprof signal PID start` (PID: this "
                          "launcher's, printed at the start) opens a window in every profiled process, `... stop` "
                          "closes and saves it into DIR/window-N", (WindowPlan, "on_demand"), action="store_true"),
)

# -- the profiler: decode and run (compare takes --events and --mode) -------------------------------
_SAMPLED_ONLY = "sampled mode: "
PROFILING: tuple[Option, ...] = (
    Option("--events", "events and presets, comma separated (default: %(default)s)", (ProfileOptions, "events")),
    Option("--mode", "sampled (default): each thread's CPU is charged to the ops it worked for by the on-CPU "
                     "intervals the kernel's switch records give, and the kernel samples every thread on its CPU "
                     "clock for native stacks and the other events (low overhead, statistical per op for "
                     "events other than CPU time); exact: every working thread read at every op boundary "
                     "(exact per op, a few µs per op)", (ProfileOptions, "mode")),
    Option("--sample-hz", _SAMPLED_ONLY + "samples per second of each thread's CPU time (default %(default)s, "
                          f"{defaults.MIN_SAMPLE_HZ} to {defaults.MAX_SAMPLE_HZ})", (ProfileOptions, "sample_hz"),
           type=positive_int),
    Option("--stack-bytes", _SAMPLED_ONLY + "user stack copied per sample to unwind native stacks (default "
                            f"%(default)s, up to {defaults.MAX_STACK_BYTES}, a multiple of 8; 0: leaf only)",
           (ProfileOptions, "stack_bytes"), type=non_negative_int),
    # Not given: none, or defaults.PYTHON_HZ with --flamegraph (see python_hz in commands/common.py).
    Option("--python-hz", _SAMPLED_ONLY + "read the Python stacks of {program}'s threads HZ times a second, for the "
                          f"Python frames above the ops in stacks (up to {defaults.MAX_PYTHON_HZ}; default 0, none, or "
                          f"{defaults.PYTHON_HZ} with --flamegraph)", (ProfileOptions, "python_hz"),
           type=non_negative_int, metavar="HZ", default=None),
    Option("--python-sampler", "who reads the Python stacks: in-process (default; a thread of cpuprof's in {program} "
                               "takes the GIL for each read, tens of µs, and each op's own caller is recorded at its "
                               "begin, exact) or py-spy (from outside, no GIL, reads only, but its own CPU time "
                               "competes with {program}'s where no CPU is spare, and it needs ptrace)",
           (ProfileOptions, "python_sampler"), choices=defaults.PYTHON_SAMPLERS),
    Option("--no-shapes", "do not key ops by their inputs", (ProfileOptions, "record_shapes"), action="store_false"),
    Option("--timeline", "keep the last N op spans of each op-running thread (default: none for decode, which times "
                         f"its own steps; {defaults.PROGRAM_TIMELINE} for run, whose decode steps are found in them)",
           (ProfileOptions, "timeline"), type=non_negative_int, metavar="N", default=None),
)
NO_PROFILE = Option("--no-profile", "decode without the profiler (a baseline)", (ProfileOptions, "enabled"),
                    dest="profile", action="store_false")
ROOFS = Option("--roofs", "the machine's measured roofs (memory bandwidth, compute, GEMV kernel) every GEMM and the "
                          "decode ceiling are judged against: auto (default) takes them from the cache for this "
                          "machine, torch and launch once a short probe of the memory (0.2 s) agrees with them, or "
                          "measures them (a few seconds); remeasure; cached: keep a cached roof the probe disagrees "
                          "with (the report gives both); off",
               (DecodeOptions, "roofs"))

PROGRAM_ROOFS = Option("--roofs", "the machine's measured roofs (memory bandwidth, compute, GEMV kernel) the program's "
                                  "GEMMs and decode are judged against, settled before the program starts, in a child "
                                  "launched as it is: auto (default) takes them from the cache once a short probe of "
                                  "the memory agrees with them, or measures them (a few seconds); remeasure; cached: "
                                  "keep a cached roof the probe disagrees with; off",
                       choices=("auto", "remeasure", "cached", "off"), default="auto")


# -- the output -------------------------------------------------------------------------------------
def _formats(reads: str = "profile", roles: tuple[str, ...] | None = ("report",)) -> tuple[str, ...]:
    """The output registry's names of what reads ``reads`` (in ``roles``; None: any): a new format
    appears in every --format that can take it by itself."""
    from .reports import output_names
    from .reports.registry import ALL_ROLES

    return output_names(reads, roles=ALL_ROLES if roles is None else roles)  # type: ignore[arg-type]


def format_option(formats: tuple[str, ...] | None = None, what: str = "the report on stdout") -> Option:
    """--format, its choices from the output registry (by default the report formats)."""
    return Option("--format", f"{what}: %(choices)s (default %(default)s)",
                  choices=formats if formats is not None else _formats(), default="terminal")


TOP = Option("--top", "rows of the op, GEMM and region tables (default %(default)s)", type=positive_int,
             default=defaults.TOP_OPS)

WHOLE_RUN = Option("--whole-run", "a program's op, region and GEMM tables over its whole run (by default, where "
                                  "decode steps are found in it, over those steps, its start-up apart)",
                   action="store_true")


def out_dir_option(what: str, command: str) -> Option:
    """--out DIR: where a launched command's results go."""
    return Option("--out", f"where {what} (default cpuprof-out/{command}-<time>)", metavar="DIR")


def output_file(help: str, required: bool = True) -> Option:
    """-o FILE of the commands that write one file ('-': standard output)."""
    return Option("--output", help, short="-o", metavar="FILE", required=required,
                  default=None if required else "-")


# Every command that writes a run's directory takes it: an --out holding an earlier run's files is
# refused without it (see launch/run_dir.py); a live run's directory is refused even with it.
OVERWRITE = Option("--overwrite", "replace the files of an earlier, finished run in --out DIR (without it such "
                                  "a directory is refused; one a live run is using always is)", action="store_true")


def output_options(command: str) -> tuple[Option, ...]:
    """Where the profile goes and how its report is shown: the flags decode and run share."""
    return (
        out_dir_option("the profile is saved", command),
        OVERWRITE,
        format_option(),
        Option("--json", "same as --format json", action="store_true"),
        Option("--flamegraph", "also write flame.svg (merged Python, op and native stacks of every thread, by "
                               "samples) and trace.json (Chrome/Perfetto) next to the profile", action="store_true"),
        with_help(TOP, "ops listed in the report (default %(default)s)"),
    )


HTML_FILENAME = "report.html"
HTML = Option("--html", f"also write {HTML_FILENAME} beside the profile: the report with its charts, one "
                        "self-contained page that opens offline", action="store_true")
CHECKPOINT = Option("--checkpoint-s", "save the profile so far every S seconds while decoding (default %(default)g)",
                    (DecodeOptions, "checkpoint_s"), type=positive_float, metavar="S")

ALL: tuple[Option, ...] = (*WORKLOAD, *LAUNCH, *RANKS, *PROFILING, NO_PROFILE, ROOFS, CHECKPOINT)

# -- compare: its runs, and where they go ------------------------------------------------------------
COMPARE_RUNS: tuple[Option, ...] = (
    Option("--repetitions", "runs per configuration, each a fresh process (default %(default)s; 2 or more to test "
                            "for noise)", short="-r", type=positive_int, default=3),
    with_help(NO_PROFILE, "runs without the profiler: throughput only, no spin/sleep/switch/roofline figures"),
    with_help(options("--events")[0], "events of each run's profile (default: %(default)s)"),
    with_help(options("--mode")[0], "each run's profiling mode (default %(default)s, the cheaper)"),
    with_help(ROOFS, "the machine roofs for the bandwidth-roof share: auto (cached, else measured once per "
                     "launch), remeasure, off"),
    Option("--from", "sweep what a saved decode profile's verdicts propose, each against that profile's own "
                     "settings, and say which proposals held", dest="from_dir", metavar="DIR"),
    Option("--resume", "run what an interrupted compare in DIR did not finish", metavar="DIR"),
)


def compare_output() -> tuple[Option, ...]:
    return (out_dir_option("compare.json and each run's profile go", "compare"), OVERWRITE, format_option(),
            Option("--html", f"also write {HTML_FILENAME} (charts and tables) in DIR", action="store_true"))


def calibrate_output() -> tuple[Option, ...]:
    return (out_dir_option("the result is saved", "calibrate"), OVERWRITE, format_option())


# -- run: the program, after -- -----------------------------------------------------------------------
PROGRAM = Option("command", f"the program, after --: {program.FORMS}", nargs=argparse.REMAINDER,
                 metavar="-- python script.py [args]", parse=program.script_target)

# -- the readers of saved files -----------------------------------------------------------------------
SAVED_PROFILE = "directory written by cpuprof, or a profile.json"


def report_options() -> tuple[Option, ...]:
    return (
        Option("path", "directory written by cpuprof (decode, decode --tp/--instances, run, or compare), a "
                       "profile.json, a compare.json or a ranks.json"),
        format_option(_formats(roles=("report", "page")), "the format"),
        output_file("write to FILE (default: standard output)", required=False),
        with_help(TOP, "how many ops to list (default %(default)s)"),
        WHOLE_RUN,
    )


def diff_options() -> tuple[Option, ...]:
    return (
        Option("before", "the profile before: a " + SAVED_PROFILE, metavar="A"),
        Option("after", "the profile after", metavar="B"),
        format_option(what="the format"),
        TOP,
    )


def merge_options() -> tuple[Option, ...]:
    return (
        Option("runs", "each host's run directory (written by cpuprof run on that host)", metavar="DIR", nargs="+"),
        out_dir_option("the merged run goes", "merge"),
        OVERWRITE,
    )


def flamegraph_options() -> tuple[Option, ...]:
    return (
        Option("path", SAVED_PROFILE),
        output_file("where to write: .svg (flame graph), .folded or .txt (flamegraph.pl's input), .json "
                    "(speedscope); '-' for standard output"),
        Option("--format", "override the format the suffix implies: %(choices)s",
               choices=_formats("stacks", roles=None)),
        Option("--weight", "samples (default), cpu (CPU time) or a counted event's name (e.g. page-faults)",
               default="samples"),
        Option("--thread", "one thread: its label (T1) or tid; default all, merged", metavar="T"),
        Option("--no-python", "leave the Python frames out", dest="python", action="store_false", default=True),
    )


TRACE: tuple[Option, ...] = (
    Option("path", SAVED_PROFILE + "; a decode --tp/--instances directory gives one process per rank, on one "
                                   "clock"),
    output_file("the trace file ('-': standard output)"),
)

SIGNAL_ACTIONS = tuple(program.WINDOW_SIGNALS)
SIGNAL: tuple[Option, ...] = (
    Option("pid", "the pid of the `cpuprof run --on-demand` launcher, or tcp://HOST:PORT: the store of a "
                  "torch.distributed job whose every rank runs under an --on-demand launcher (a window on every "
                  "rank, on every host)", metavar="PID|tcp://HOST:PORT"),
    Option("action", "start: open a window; stop: close and save it", choices=SIGNAL_ACTIONS),
)

DOCTOR: tuple[Option, ...] = (Option("--json", "print the findings as JSON", action="store_true"),)

# -- compare's sweep axes, in the order a configuration's label names them ---------------------------
_AXIS_ORDER = ("--tp", "--instances", "--threads", "--omp", "--bind", "--blocktime", "--allocator", "--numa",
               "--dtype", "--quant", "--batch", "--compile")
SWEEPS: dict[str, Option] = {o.name: o for o in options(*_AXIS_ORDER)}
