"""Folded stacks, the input of flamegraph.pl and inferno: one line per distinct stack,
``root;child;leaf weight``, frames separated by ';' (so frame names never contain one)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, TextIO

from ..analysis.flame import FlameStack

if TYPE_CHECKING:
    from ..reports.base import Role
    from ..reports.sources import OutputOptions, Source, SourceKind



def fold(stacks: Iterable[FlameStack]) -> list[tuple[str, int]]:
    """(folded stack, integer weight) pairs, heaviest first; weights round to whole units
    because flamegraph.pl reads integers, and a stack that rounds to zero is left out."""
    lines: dict[str, int] = {}
    for s in stacks:
        key = ";".join(f.name.replace(";", ":").replace("\n", " ") for f in s.frames)
        lines[key] = lines.get(key, 0) + round(s.weight)
    return sorted(((k, w) for k, w in lines.items() if w > 0), key=lambda kv: (-kv[1], kv[0]))


def write(stacks: Iterable[FlameStack], out: TextIO) -> int:
    """Writes the folded lines; returns how many."""
    lines = fold(stacks)
    for key, weight in lines:
        out.write(f"{key} {weight}\n")
    return len(lines)


class FoldedOutput:
    """``flamegraph --format folded``: flamegraph.pl's and inferno's input."""

    name = "folded"
    suffix = ".folded"
    other_suffixes: tuple[str, ...] = (".txt",)
    reads: tuple[SourceKind, ...] = ("stacks",)
    role: Role = "export"
    help = "folded stacks, one line per stack (flamegraph.pl, inferno)"

    def write(self, source: Source, out: TextIO, options: OutputOptions) -> int:
        from ..reports.sources import StacksSource

        assert isinstance(source, StacksSource)
        write(source.graph.stacks, out)
        return len(source.graph.stacks)
