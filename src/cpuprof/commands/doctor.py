"""``cpuprof doctor``: what this machine can measure, and why not."""

from __future__ import annotations

import argparse
import sys

from .. import options_spec as spec
from ..machine.capabilities import doctor
from ..reports.doctor import render_json, render_terminal


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("doctor", help="what this machine can measure, and why not")
    spec.add_arguments(p, spec.DOCTOR)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    findings = doctor()
    (render_json if args.json else render_terminal)(findings, sys.stdout)
    return 0
