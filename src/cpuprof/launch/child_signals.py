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
- after the first is raised, further ones are ignored: the profile is being saved.

Standard library only: the child modules import it before anything else.
"""

from __future__ import annotations

import signal

_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_pending: list[int] = []  # signals recorded while deferred, not yet raised


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
    for sig in _SIGNALS:
        signal.signal(sig, _record)


def raise_on_signal() -> None:
    """From now on SIGINT and SIGTERM raise SignalReceived, once; one recorded while deferred is
    raised now."""
    if _pending:
        _raise(_pending.pop(0), None)
    for sig in _SIGNALS:
        signal.signal(sig, _raise)


def take_pending() -> int | None:
    """The first signal recorded while deferred and not raised since (None if none); forgets them."""
    first = _pending[0] if _pending else None
    _pending.clear()
    return first
