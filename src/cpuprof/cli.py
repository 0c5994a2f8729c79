"""``python -m cpuprof``: one subcommand per file in ``commands/``, each thin over the API.

A :class:`~cpuprof.errors.CpuprofError` ends the program with one line on stderr and its exit
code; nothing a user can do wrong shows a traceback.
"""

from __future__ import annotations

import argparse
import sys

from . import exit_codes
from .commands import calibrate, compare, decode, diff, doctor, flamegraph, report, run, trace
from .errors import CpuprofError

COMMANDS = (decode, run, compare, calibrate, report, diff, flamegraph, trace, doctor)


class _Parser(argparse.ArgumentParser):
    """argparse, with usage errors in the same one-line form and exit code as ours."""

    def error(self, message: str) -> None:  # type: ignore[override]
        print(f"cpuprof: error: {message} (see: python -m {self.prog.replace(' ', ' ', 1)} --help)",
              file=sys.stderr)
        raise SystemExit(exit_codes.USAGE)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="cpuprof", description="A CPU profiler for PyTorch LLM inference.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for command in COMMANDS:
        command.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return exit_codes.USAGE
    try:
        return int(args.run(args) or exit_codes.OK)
    except CpuprofError as exc:
        print(f"cpuprof: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("cpuprof: interrupted", file=sys.stderr)
        return exit_codes.INTERRUPTED
    except BrokenPipeError:
        return exit_codes.OK
