"""What commands share: argument types that reject bad input with argparse's one-line error, and
writing an output file."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from ..errors import UsageError


def _bounded(kind: Callable[[str], float], minimum: float, inclusive: bool, expected: str) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {expected}, not {text!r}") from None
        if value < minimum or (not inclusive and value == minimum):
            raise argparse.ArgumentTypeError(f"expected {expected}, not {text}")
        return value

    return parse


positive_int = _bounded(int, 1, True, "a positive whole number")
non_negative_int = _bounded(int, 0, True, "0 or more")
positive_float = _bounded(float, 0.0, False, "a positive number")


def write_output(output: str, write: Callable[[TextIO], int]) -> int:
    """Runs ``write`` on standard output ('-') or on a file that appears whole or not at all;
    returns what ``write`` returned. An unwritable path is a one-line UsageError."""
    if output == "-":
        return write(sys.stdout)
    target = Path(output)
    if target.is_dir():
        raise UsageError(f"{output} is a directory; give a file name")
    tmp = target.with_name(target.name + ".tmp")
    try:
        with open(tmp, "w") as f:
            result = write(f)
        tmp.replace(target)
    except OSError as exc:
        raise UsageError(f"cannot write {output}: {exc.strerror or exc}") from exc
    finally:
        tmp.unlink(missing_ok=True)
    return result
