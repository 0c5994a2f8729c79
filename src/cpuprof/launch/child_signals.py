"""How a launched child takes SIGINT and SIGTERM, from its first line to its exit.

A Ctrl-C can come at any moment of a child's life: while Python imports cpuprof (a quarter of a
second), while the run imports torch (most of a second), while it saves, while it cleans up, or
as the interpreter shuts down. Python's own handler raises KeyboardInterrupt wherever the child
is, which leaves half-imported modules behind and, outside the run's ``try``, a traceback
instead of the interrupted ending. So the child's handlers go through three states:

- **deferred** (:func:`defer`), from the child module's first line until the run's ``try`` is in
  place, and again once the ending is decided (cleanup, shutdown): a signal is only recorded;
- **raised** (:func:`raise_on_signal`), while the run runs: the signal is raised as
  :class:`SignalReceived` where the run is (one that came while deferred is raised at once), so
  the run saves what it measured and ends as interrupted;
- after the first is raised, further ones are ignored: the profile is being saved. One raised where
  Python drops exceptions (an object's ``__del__`` the garbage collector ran) is sent again, so
  that it is raised where the run is (:func:`_unraisable`).

Standard library only: the child modules import it before anything else.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_pending: list[int] = []  # signals recorded while deferred, not yet raised
_raising = False  # between raise_on_signal() and defer(): a signal is raised where the run is


class SignalReceived(BaseException):
    """SIGINT or SIGTERM, raised where the child was when it came.

    A BaseException, as KeyboardInterrupt is: raised inside code that catches ``Exception`` (the
    symbol demangler a checkpoint calls, a library's fallback) it would be swallowed, and since
    the handler then ignores further signals, the run would go on, never interrupted."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _record(signum: int, _frame: object) -> None:
    _pending.append(signum)


def _raise(signum: int, _frame: object) -> None:
    # Once is enough: further signals while the profile is being saved are ignored.
    for sig in _SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    raise SignalReceived(signum)


def defer() -> None:
    """From now on SIGINT and SIGTERM are recorded, never raised: nothing is cut short."""
    global _raising
    _raising = False
    for sig in _SIGNALS:
        signal.signal(sig, _record)


def raise_on_signal() -> None:
    """From now on SIGINT and SIGTERM raise SignalReceived, once; one recorded while deferred is
    raised now."""
    global _raising, _previous_hook
    _raising = True
    if sys.unraisablehook is not _unraisable:
        _previous_hook = sys.unraisablehook
        sys.unraisablehook = _unraisable
    if _pending:
        _raise(_pending.pop(0), None)
    for sig in _SIGNALS:
        signal.signal(sig, _raise)


_previous_hook: Callable[[Any], object] | None = None  # the unraisable hook in place before ours
REDELIVER_AFTER_S = 0.001


def _unraisable(unraisable: Any) -> None:
    """A signal raised where Python ignores exceptions (an object's ``__del__`` or a weakref callback,
    which the garbage collector runs wherever the run is) is lost there, with further signals
    ignored, and the run would go on as if never interrupted (a decode of 90,000 tokens ran on in
    CI). Such a signal is delivered again, to be raised where the run is, or recorded if the run is
    already ending; any other exception goes to the hook that was in place."""
    exc = unraisable.exc_value
    if isinstance(exc, SignalReceived):
        if _raising:
            for sig in _SIGNALS:
                signal.signal(sig, _raise)
            # Sent from another thread a moment later: sent from here, the handler would run as the call
            # returns, inside this hook, where what it raises is dropped again. By then the run's own
            # code has resumed, and the handler raises there.
            threading.Timer(REDELIVER_AFTER_S, os.kill, (os.getpid(), exc.signum)).start()
        else:
            _pending.append(exc.signum)
        return
    (_previous_hook or sys.__unraisablehook__)(unraisable)


def take_pending() -> int | None:
    """The first signal recorded while deferred and not raised since (None if none); forgets them."""
    first = _pending[0] if _pending else None
    _pending.clear()
    return first
