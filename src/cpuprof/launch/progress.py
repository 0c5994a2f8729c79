"""Progress while a run builds and decodes, on a terminal and in logs alike.

On a terminal, one status line rewritten in place; when stderr is a file or a pipe (CI logs,
``| tee``), plain lines: every phase change, and within a phase at most one line every
``PROGRESS_PLAIN_INTERVAL_S``, so a long build or decode is never silent for long and a log is
never flooded.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import TextIO

from .. import defaults
from ..safe_text import printable


class Progress:
    def __init__(self, stream: TextIO | None = None, interval_s: float = defaults.PROGRESS_PLAIN_INTERVAL_S) -> None:
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.interval_s = interval_s
        self._phase: str | None = None
        self._last_plain = 0.0
        self._last_text = ""
        self._lock = threading.Lock()  # keep_alive's thread writes too

    def show(self, text: str, phase: str | None = None) -> None:
        """A status update; ``phase`` names the step it belongs to (a new phase always prints)."""
        if self.tty:
            self.stream.write(f"\r\033[K{printable(text)}")
            self.stream.flush()
            return
        with self._lock:
            now = time.monotonic()
            self._last_text = text
            if phase != self._phase or now - self._last_plain >= self.interval_s:
                self._phase = phase
                self._plain(text)

    def done(self, text: str) -> None:
        """Ends the current phase with a line that stays."""
        self._phase = None
        if self.tty:
            self.stream.write(f"\r\033[K{printable(text)}\n" if text else "\r\033[K")
            self.stream.flush()
        elif text:
            with self._lock:
                self._last_text = ""  # a finished step is not what goes on
                self._plain(text)

    def _plain(self, text: str) -> None:
        self._last_plain = time.monotonic()
        self.stream.write(f"cpuprof: {printable(text)}\n")
        self.stream.flush()

    @contextlib.contextmanager
    def keep_alive(self, doing: Callable[[], str] | None = None) -> Iterator[None]:
        """Around work that can say nothing for long (building a model, measuring roofs, saving): in a
        log, a line at least every ``interval_s`` saying what is under way (``doing()``, else the last
        status shown) and for how long it has been. It is a thread: only around work that is not
        profiled (it would be one of the profile's threads)."""
        if self.tty:
            yield
            return
        stop = threading.Event()
        under_way, since = "", time.monotonic()
        with self._lock:  # the first line an interval from now, not at once
            self._last_plain = max(self._last_plain, since)

        def beat() -> None:
            nonlocal under_way, since
            while not stop.wait(self.interval_s / 4):
                with self._lock:
                    what = (doing() if doing is not None else self._last_text).removesuffix(" ...")
                    if what != under_way:
                        under_way, since = what, time.monotonic()
                    if what and time.monotonic() - self._last_plain >= self.interval_s:
                        self._plain(f"still {what} ({time.monotonic() - since:.0f} s)")

        thread = threading.Thread(target=beat, name="cpuprof-progress", daemon=True)
        try:
            thread.start()
            yield
        finally:
            stop.set()
            if thread.is_alive():
                thread.join()
