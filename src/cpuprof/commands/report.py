"""``cpuprof report DIR``: re-render a saved profile in any format."""

from __future__ import annotations

import argparse
import sys

from .. import defaults
from ..model import Profile
from ..reports import FORMATS, render
from .common import positive_int


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report", help="re-render a saved profile (a directory or profile.json)")
    p.add_argument("path", help="directory written by cpuprof, or a profile.json")
    p.add_argument("--format", default="terminal", choices=FORMATS,
                   help="terminal (default), markdown (GitHub tables) or json (the report's tables as data)")
    p.add_argument("--top", type=positive_int, default=defaults.TOP_OPS,
                   help=f"how many ops to list (default {defaults.TOP_OPS})")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    profile = Profile.load(args.path)
    render(profile, sys.stdout, format=args.format, top=args.top)
    return 0
