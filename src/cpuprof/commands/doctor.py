"""``cpuprof doctor``: what this machine can measure, and why not."""

from __future__ import annotations

import argparse
import sys

from .. import options_spec as spec
from ..machine.capabilities import doctor
from ..reports.doctor import render_json, render_terminal

COMMAND = spec.Command("doctor", help="what this machine can measure, and why not",
                       groups=(spec.Group(None, spec.DOCTOR),))


def run(args: argparse.Namespace) -> int:
    findings = doctor()
    (render_json if args.json else render_terminal)(findings, sys.stdout)
    return 0
