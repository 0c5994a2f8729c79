"""Argument types shared by commands: each rejects bad input with argparse's one-line error."""

from __future__ import annotations

import argparse
from collections.abc import Callable


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
