"""What every output has in common: the protocol, the base of the formats that lay out a report's
tables, and how a cell's value becomes text."""

from __future__ import annotations

from typing import Any, Literal, Protocol, TextIO

from ..analysis.report_model import Column, Report
from ..units import fmt_bytes, fmt_count, fmt_ns, fmt_percent
from .sources import REPORT_SOURCES, OutputOptions, Source, SourceKind, report_of

NOT_MEASURED = "-"

# report: a report's tables, shown on standard output after a run (every command's --format);
# page: a self-contained page of the report with its charts (report --format html, --html);
# export: a file another tool reads (flame graph viewers, Perfetto).
Role = Literal["report", "page", "export"]


class Output(Protocol):
    """One thing cpuprof writes. ``name`` is what ``--format`` takes; ``suffix`` the file extension
    (``other_suffixes``: more that imply it on ``-o``); ``reads`` the kinds of source it can write;
    ``role`` where it is offered; ``help`` one line for ``--help``. ``write`` returns how many items it
    wrote where that means something (distinct stacks, trace events), else 0.

    An exporter needs nothing from this package to be one: it has these attributes and this method."""

    name: str
    suffix: str
    other_suffixes: tuple[str, ...]
    reads: tuple[SourceKind, ...]
    role: Role
    help: str

    def write(self, source: Source, out: TextIO, options: OutputOptions) -> int: ...


class Renderer:
    """A format that lays out a report's sections and tables; it reads every source a report is made
    from (:data:`~cpuprof.reports.sources.REPORT_SOURCES`) and computes nothing itself."""

    name: str
    suffix: str
    help: str
    other_suffixes: tuple[str, ...] = ()
    reads: tuple[SourceKind, ...] = REPORT_SOURCES
    role: Role = "report"
    # Whether the report is text for a person, so that the lines a command adds after it (where the
    # profile was saved, how to re-render it) belong on stdout too; a data format (JSON, CSV,
    # Markdown) keeps stdout to itself and those lines go to stderr.
    for_a_person: bool = False

    def render(self, report: Report, out: TextIO) -> None:
        raise NotImplementedError

    def write(self, source: Source, out: TextIO, options: OutputOptions) -> int:
        self.render(report_of(source, options), out)
        return 0


# Integer columns that name a thread or process: printed as the system prints them, without separators.
IDENTIFIER_KEYS = frozenset({"tid", "pid", "ppid"})


def cell_text(value: Any, column: Column) -> str:
    if value is None:
        return NOT_MEASURED
    unit = column.unit
    if unit == "ns":
        return fmt_ns(value)
    if unit == "count":
        return fmt_count(value)
    if unit == "int":
        return f"{value:,}" if column.key not in IDENTIFIER_KEYS else str(value)
    if unit == "ratio":
        return f"{value:.2f}"
    if unit == "share":
        return fmt_percent(value)
    if unit == "bytes":
        return fmt_bytes(value)
    return str(value)
