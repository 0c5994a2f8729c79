"""``python -m cpuprof``: one subcommand per file in ``commands/``, each thin over the API.

A :class:`~cpuprof.errors.CpuprofError` ends the program with one line on stderr and its exit
code; nothing a user can do wrong shows a traceback.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from . import exit_codes, native
from .commands import calibrate, compare, decode, diff, doctor, flamegraph, merge, report, run, signal, trace
from .errors import CpuprofError
from .safe_text import cpuprof_command, printable

COMMANDS = (decode, run, signal, compare, calibrate, report, diff, merge, flamegraph, trace, doctor)
# The commands that run the profiler (torch and the native module, here or in a child). The others
# read saved files and work in an install without torch; these are refused there, in one line,
# before anything starts.
PROFILING_COMMANDS = frozenset({"decode", "run", "compare", "calibrate", "doctor"})


class _Parser(argparse.ArgumentParser):
    """argparse, with usage errors in the same one-line form and exit code as ours, and no
    abbreviated flags: `--thread 2` taken for `--threads 2` hides a typo, and an abbreviation that
    works today breaks when a flag sharing its prefix is added."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> None:  # type: ignore[override]
        print(f"cpuprof: error: {printable(message)} (see: python -m {self.prog.replace(' ', ' ', 1)} --help)",
              file=sys.stderr)
        raise SystemExit(exit_codes.USAGE)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="cpuprof", description="A CPU profiler for PyTorch LLM inference.")
    # Not dest="command": run's own positional (the program to run) is called that.
    sub = parser.add_subparsers(dest="subcommand", metavar="COMMAND", parser_class=_Parser)
    for command in COMMANDS:
        command.COMMAND.add_to(sub, command.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.subcommand is None:
        parser.print_help()
        return exit_codes.USAGE
    try:
        if args.subcommand in PROFILING_COMMANDS:
            native.require(args.subcommand)
        return int(args.run(args) or exit_codes.OK)
    except CpuprofError as exc:
        # An error can name a path or a name read from a file: shown, never run by the terminal.
        print(f"cpuprof: error: {printable(str(exc))}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        from .launch.run_dir import saved_in

        where = saved_in()
        saved = (f"; what was saved before it is in {printable(str(where))} (re-render with: "
                 f"{printable(cpuprof_command('report', where))})") if where is not None else ""
        print(f"cpuprof: interrupted{saved}", file=sys.stderr)
        return exit_codes.INTERRUPTED
    except BrokenPipeError:
        return exit_codes.OK
