"""Text that reaches other programs: a terminal, a shell.

Op, region, module and thread names come from the profiled program, and paths from whoever chose
them: a name can hold an escape sequence that retitles or clears the terminal, and a path pasted
from a hint can hold ``$(...)``. Every plain-text line cpuprof prints with such text in it goes
through :func:`printable`; every command line it suggests is built by :func:`cpuprof_command`.
(Markdown, CSV, HTML and SVG escape for their own readers, in their renderers.)
"""

from __future__ import annotations

import re
import shlex
import sys
from os import PathLike
from typing import TextIO

# C0 controls (newline and tab included: a name on one line keeps a table a table), DEL, C1
# controls (ESC's 8-bit forms among them), the line and paragraph separators, and the
# bidirectional overrides and isolates that make a line read differently from what it holds.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u200e\u200f\u202a-\u202e\u2066-\u2069]")
_NAMED = {"\n": "\\n", "\t": "\\t", "\r": "\\r"}


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    code = ord(char)
    return _NAMED.get(char) or (f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")


def printable(text: str) -> str:
    """``text`` with every control character written as an escape (``\\x1b``, ``\\n``, ``\\u202e``),
    so that printing it shows it and does nothing else."""
    return _CONTROL.sub(_escape, text)


def say(line: str, stream: TextIO | None = None) -> None:
    """One line cpuprof prints while it runs (on stderr, or ``stream``), escaped and flushed: such a
    line can hold a process's name, a script's path or a line of a child's log, none of which may
    drive the terminal (retitle it, ring it, or forge a line of cpuprof's)."""
    out = stream if stream is not None else sys.stderr
    out.write(printable(line) + "\n")
    out.flush()


def cpuprof_command(*args: str | PathLike[str]) -> str:
    """``python -m cpuprof ARGS`` with each argument quoted for a POSIX shell: pasted, it runs
    cpuprof on exactly those arguments, whatever a path holds."""
    return "python -m cpuprof " + " ".join(shlex.quote(str(a)) for a in args)
