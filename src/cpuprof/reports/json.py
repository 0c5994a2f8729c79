"""The JSON report: the same sections and tables as the other formats, with numbers as numbers.

Values keep their units (nanoseconds, counts, shares of 1); ``null`` means not measured. For
the recorded data itself, read ``profile.json`` (its format is ``profile.schema.json``).
"""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import TextIO

from ..analysis.report_model import Report
from .base import Renderer

FORMAT = "cpuprof-report"
VERSION = 1


class JsonRenderer(Renderer):
    name = "json"
    suffix = ".json"
    help = "the report's tables as data (numbers in their units)"

    def render(self, report: Report, out: TextIO) -> None:
        data = {"format": FORMAT, "version": VERSION, **asdict(report)}
        json.dump(data, out, indent=1)
        out.write("\n")
