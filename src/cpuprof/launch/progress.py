"""Progress while a run builds and decodes, on a terminal and in logs alike.

On a terminal, one status line rewritten in place; when stderr is a file or a pipe (CI logs,
``| tee``), plain lines: every phase change, and within a phase at most one line every
``PROGRESS_PLAIN_INTERVAL_S``, so a long build or decode is never silent for long and a log is
never flooded.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

from .. import defaults


class Progress:
    def __init__(self, stream: TextIO | None = None, interval_s: float = defaults.PROGRESS_PLAIN_INTERVAL_S) -> None:
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.interval_s = interval_s
        self._phase: str | None = None
        self._last_plain = 0.0

    def show(self, text: str, phase: str | None = None) -> None:
        """A status update; ``phase`` names the step it belongs to (a new phase always prints)."""
        if self.tty:
            self.stream.write(f"\r\033[K{text}")
            self.stream.flush()
            return
        now = time.monotonic()
        if phase != self._phase or now - self._last_plain >= self.interval_s:
            self._phase = phase
            self._last_plain = now
            self.stream.write(f"cpuprof: {text}\n")
            self.stream.flush()

    def done(self, text: str) -> None:
        """Ends the current phase with a line that stays."""
        self._phase = None
        if self.tty:
            self.stream.write(f"\r\033[K{text}\n" if text else "\r\033[K")
        elif text:
            self.stream.write(f"cpuprof: {text}\n")
        self.stream.flush()
