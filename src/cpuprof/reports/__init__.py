"""Every output cpuprof writes, behind one protocol (:class:`~cpuprof.reports.base.Output`) and in
one table (:data:`~cpuprof.reports.registry.OUTPUTS`): the report formats (one module each here), the
HTML page, and the files other tools read (:mod:`cpuprof.exports`).

    get_output("markdown").write(ProfileSource(profile), sys.stdout, OutputOptions(top=20))
    render(profile, sys.stdout, format="markdown")  # the same, for a profile

A report format lays out the report :func:`cpuprof.analysis.report.build_report` derives from a
profile; it computes nothing itself.
"""

from __future__ import annotations

from typing import TextIO

from .. import defaults
from ..model import Profile
from .base import Output, Renderer
from .registry import OUTPUTS, by_suffix, describe, get_output, output_names
from .sources import (
    DiffSource,
    OutputOptions,
    ProcessesSource,
    ProfileSource,
    RanksSource,
    Source,
    StacksSource,
    SweepSource,
)

# The report formats every command prints on standard output (--format): terminal, markdown, json, csv.
FORMATS = output_names("profile", roles=("report",))
# What ``report --format`` takes: those and the HTML page.
REPORT_FORMATS = output_names("profile", roles=("report", "page"))
RENDERERS: dict[str, type[Renderer]] = {o.name: type(o) for o in OUTPUTS if isinstance(o, Renderer)}


def get_renderer(name: str) -> Renderer:
    """The report format ``name`` (one of FORMATS), to lay out a report already built."""
    output = get_output(name, roles=("report",))
    assert isinstance(output, Renderer)
    return output


def render(profile: Profile, out: TextIO, format: str = "terminal", top: int = defaults.TOP_OPS,
           whole_run: bool = False) -> None:
    get_output(format, "profile", roles=("report",)).write(ProfileSource(profile), out,
                                                           OutputOptions(top=top, whole_run=whole_run))


__all__ = ["FORMATS", "OUTPUTS", "RENDERERS", "REPORT_FORMATS", "DiffSource", "Output", "OutputOptions",
           "ProcessesSource", "ProfileSource", "RanksSource", "Renderer", "Source", "StacksSource", "SweepSource",
           "by_suffix", "describe", "get_output", "get_renderer", "output_names", "render"]
