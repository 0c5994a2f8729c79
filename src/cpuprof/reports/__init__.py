"""One module per output format, behind one interface (:class:`~cpuprof.reports.base.Renderer`).

    render(profile, sys.stdout, format="markdown")

A renderer lays out the report :func:`cpuprof.analysis.report.build_report` derives from a
profile; it computes nothing itself. Adding a format is adding a module and a line below.
"""

from __future__ import annotations

from typing import TextIO

from .. import defaults
from ..errors import UsageError
from ..model import Profile
from .base import Renderer
from .csv import CsvRenderer
from .json import JsonRenderer
from .markdown import MarkdownRenderer
from .terminal import TerminalRenderer

RENDERERS: dict[str, type[Renderer]] = {
    r.name: r for r in (TerminalRenderer, MarkdownRenderer, JsonRenderer, CsvRenderer)}
FORMATS = tuple(RENDERERS)


def get_renderer(name: str) -> Renderer:
    try:
        return RENDERERS[name]()
    except KeyError:
        raise UsageError(f"--format {name}: choose one of {', '.join(FORMATS)}") from None


def render(profile: Profile, out: TextIO, format: str = "terminal", top: int = defaults.TOP_OPS) -> None:
    from ..analysis.report import build_report

    get_renderer(format).render(build_report(profile, top=top), out)
