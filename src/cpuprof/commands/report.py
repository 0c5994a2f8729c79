"""``cpuprof report DIR``: re-render a saved profile."""

from __future__ import annotations

import argparse
import json
import sys

from ..model import Profile
from ..reports import terminal


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report", help="re-render a saved profile (a directory or profile.json)")
    p.add_argument("path", help="directory written by cpuprof, or a profile.json")
    p.add_argument("--json", action="store_true", help="print the profile as JSON")
    p.add_argument("--top", type=int, default=20, help="how many ops to list (default 20)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    profile = Profile.load(args.path)
    if args.json:
        json.dump(profile.to_dict(), sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        terminal.render(profile, sys.stdout, top=args.top)
    return 0
