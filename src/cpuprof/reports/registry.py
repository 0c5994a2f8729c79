"""Every output cpuprof writes, in one table: each command asks it for the formats it offers and for
the one it was given. Adding a format is adding its module (a class with the attributes and the
``write`` of :class:`~cpuprof.reports.base.Output`) and one line to :data:`OUTPUTS`.
"""

from __future__ import annotations

from ..errors import UsageError
from ..exports.folded import FoldedOutput
from ..exports.roofline_svg import RooflineSvgOutput
from ..exports.speedscope import SpeedscopeOutput
from ..exports.svg import FlameSvgOutput
from ..exports.trace import TraceOutput
from .base import Output, Role
from .csv import CsvRenderer
from .html import HtmlOutput
from .json import JsonRenderer
from .markdown import MarkdownRenderer
from .sources import SourceKind
from .terminal import TerminalRenderer

# In the order --format and --help list them.
OUTPUTS: tuple[Output, ...] = (
    TerminalRenderer(),
    MarkdownRenderer(),
    JsonRenderer(),
    CsvRenderer(),
    HtmlOutput(),
    FlameSvgOutput(),
    FoldedOutput(),
    SpeedscopeOutput(),
    TraceOutput(),
    RooflineSvgOutput(),
)
_BY_NAME = {o.name: o for o in OUTPUTS}
assert len(_BY_NAME) == len(OUTPUTS), "two outputs share a name"

ALL_ROLES: tuple[Role, ...] = ("report", "page", "export")


def output_names(reads: SourceKind | None = None, roles: tuple[Role, ...] = ALL_ROLES) -> tuple[str, ...]:
    """The names of the outputs that read ``reads`` (any source: None) in one of ``roles``, in order."""
    return tuple(o.name for o in OUTPUTS if o.role in roles and (reads is None or reads in o.reads))


def get_output(name: str, reads: SourceKind | None = None, roles: tuple[Role, ...] = ALL_ROLES) -> Output:
    """The output called ``name``; a UsageError naming the choices where there is none of that name
    that reads ``reads`` in one of ``roles``."""
    output = _BY_NAME.get(name)
    if output is None or output.role not in roles or (reads is not None and reads not in output.reads):
        raise UsageError(f"--format {name}: choose one of {', '.join(output_names(reads, roles))}")
    return output


def describe(name: str) -> str:
    """The one line that says what ``--format NAME`` writes."""
    return get_output(name).help


def by_suffix(suffix: str, reads: SourceKind, roles: tuple[Role, ...] = ALL_ROLES) -> Output | None:
    """The output a file name's suffix implies among those that read ``reads``; None if none does."""
    suffix = suffix.lower()
    return next((o for o in OUTPUTS if o.role in roles and reads in o.reads
                 and suffix in (o.suffix, *o.other_suffixes)), None)


__all__ = ["ALL_ROLES", "OUTPUTS", "by_suffix", "describe", "get_output", "output_names"]
