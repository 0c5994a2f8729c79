"""The self-contained HTML report: one file that opens offline, in any browser, years later.

One output (``--format html``, ``decode --html``, ``compare --html``) with a page per kind of source:
a profile's (:mod:`.html_profile`), a sweep's (:mod:`.html_compare`) and a group of ranks'
(:mod:`.html_ranks`), all laid out with the same furniture (:mod:`.html_page`).

The page reads top down: the verdicts and warnings, then charts where a picture says more than a
table, then every table of the report behind them. The text and tables are the same sections the
other formats lay out; the charts are drawn, as inline SVG, from the figures the analyses computed.
"""

from __future__ import annotations

from typing import TextIO

from ..errors import UsageError
from .base import Role
from .sources import OutputOptions, ProcessesSource, ProfileSource, RanksSource, Source, SourceKind, SweepSource


class HtmlOutput:
    name = "html"
    suffix = ".html"
    other_suffixes: tuple[str, ...] = ()
    reads: tuple[SourceKind, ...] = ("profile", "sweep", "ranks", "processes")
    role: Role = "page"
    help = "one self-contained page with charts, opens offline"

    def write(self, source: Source, out: TextIO, options: OutputOptions) -> int:
        out.write(page(source, options))
        return 0


def page(source: Source, options: OutputOptions) -> str:
    """The page of ``source``, as one string."""
    if isinstance(source, ProfileSource):
        from .html_profile import profile_page

        return profile_page(source.profile, source.report(options))
    if isinstance(source, ProcessesSource):
        from .html_profile import profile_page

        shown = source.shown
        if shown is not None:  # the busiest process's page, its processes table first
            return profile_page(shown.profile, source.report(options))
        raise UsageError("no process of this run was profiled: there is no page to make")
    if isinstance(source, SweepSource):
        from .html_compare import comparison_page

        return comparison_page(source.comparison)
    if isinstance(source, RanksSource):
        from .html_ranks import ranks_page

        return ranks_page(source.run, source.directory)
    raise TypeError(f"no HTML page for a {source.kind} source")  # the registry offers html for none else
