"""``cpuprof report DIR``: re-render a saved profile (or a saved comparison) in any format."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TextIO

from .. import defaults
from ..model import Profile
from ..model.compare import COMPARE_FILENAME, Comparison
from ..model.io import PROFILE_FILENAME
from ..model.ranks import RANKS_FILENAME, MultiRun
from ..reports import FORMATS, get_renderer, render
from .common import positive_int, write_output

# html needs the profile itself (its charts are drawn from the data), not only the report's tables,
# so it is not one of the table renderers.
REPORT_FORMATS = (*FORMATS, "html")


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report", help="re-render a saved profile or comparison (a directory, profile.json or "
                                      "compare.json)")
    p.add_argument("path", help="directory written by cpuprof (decode, decode --tp/--instances, or compare), a "
                                "profile.json, a compare.json or a ranks.json")
    p.add_argument("--format", default="terminal", choices=REPORT_FORMATS,
                   help="terminal (default), markdown (GitHub tables), json (the report's tables as data) or html "
                        "(one self-contained page with charts, opens offline)")
    p.add_argument("-o", "--output", default="-", metavar="FILE", help="write to FILE (default: standard output)")
    p.add_argument("--top", type=positive_int, default=defaults.TOP_OPS,
                   help=f"how many ops to list (default {defaults.TOP_OPS})")
    p.set_defaults(run=run)


def _is_comparison(path: str) -> bool:
    p = Path(path)
    if p.is_dir():
        return (p / COMPARE_FILENAME).is_file() and not (p / PROFILE_FILENAME).is_file()
    return p.name == COMPARE_FILENAME


def _is_ranks(path: str) -> bool:
    p = Path(path)
    return (p / RANKS_FILENAME).is_file() if p.is_dir() else p.name == RANKS_FILENAME


def run(args: argparse.Namespace) -> int:
    if _is_ranks(args.path):
        directory = Path(args.path) if Path(args.path).is_dir() else Path(args.path).parent
        multi = MultiRun.load(directory)
        from ..analysis.ranks import ranks_report

        def write_ranks(out: TextIO) -> int:
            if args.format == "html":
                from ..reports.html_ranks import write_ranks_html

                write_ranks_html(multi, directory, out)
            else:
                get_renderer(args.format).render(ranks_report(multi, directory), out)
            return 0

        write_output(args.output, write_ranks)
    elif _is_comparison(args.path):
        from ..launch.sweep import load

        comparison = load(args.path)
        write_output(args.output, lambda out: _write_comparison(comparison, out, args.format))
    else:
        profile = Profile.load(args.path)
        write_output(args.output, lambda out: _write_profile(profile, out, args.format, args.top))
    if args.output != "-":
        print(f"wrote {args.output} ({args.format})", file=sys.stderr)
    return 0


def _write_profile(profile: Profile, out: TextIO, fmt: str, top: int) -> int:
    if fmt == "html":
        from ..reports.html import write_profile_html

        write_profile_html(profile, out, top=top)
    else:
        render(profile, out, format=fmt, top=top)
    return 0


def _write_comparison(comparison: Comparison, out: TextIO, fmt: str) -> int:
    if fmt == "html":
        from ..reports.html import write_comparison_html

        write_comparison_html(comparison, out)
    else:
        from ..analysis.compare import comparison_report

        get_renderer(fmt).render(comparison_report(comparison), out)
    return 0
