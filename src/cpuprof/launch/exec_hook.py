"""A profiled process that ``exec``s another program is saved first.

An exec replaces the process image: no ``atexit``, no finalizer, no signal handler of the old
program runs, so a profile saved "at the end" is never saved, and the launcher finds a process that
measured for minutes reported as killed before its first checkpoint. Every ``os.exec*`` function
goes through ``os.execv`` or ``os.execve`` (``execl``, ``execlp``, ``execvp``... call them by name
in ``os``'s namespace), so wrapping those two sees every exec Python code makes. (``subprocess``
and ``multiprocessing`` exec in a child they forked, through ``_posixsubprocess``: not this.)

If the exec fails (no such file), it raises as before and the process goes on; what was saved is
then an earlier state, and the final save at its real end replaces it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

# pid -> what saves that process before it execs, and the variables the program it becomes must
# not see; a forked child registers its own, or has none.
_savers: dict[int, tuple[Callable[[str], None] | None, tuple[str, ...]]] = {}
_originals: dict[str, Any] = {}


def save_before_exec(save: Callable[[str], None], drop_env: tuple[str, ...] = ()) -> None:
    """``save(program)`` runs in this process just before it execs ``program``; ``drop_env``: variables
    left out of the environment the program it becomes starts with."""
    _savers[os.getpid()] = (save, drop_env)
    if _originals:
        return
    _originals["execv"], _originals["execve"] = os.execv, os.execve

    def execv(path: Any, argv: Any) -> None:
        for name in _before(path):
            os.environ.pop(name, None)
        _originals["execv"](path, argv)

    def execve(path: Any, argv: Any, env: Any) -> None:
        dropped = _before(path)
        if dropped and hasattr(env, "items"):
            env = {k: v for k, v in env.items() if (os.fsdecode(k) if isinstance(k, bytes) else k) not in dropped}
        _originals["execve"](path, argv, env)

    os.execv, os.execve = execv, execve  # type: ignore[assignment]


def _before(path: Any) -> tuple[str, ...]:
    """Saves this process (once: a failed exec and a second try, as os.execvp makes along PATH, do
    not save twice); returns the variables to leave out, at every try."""
    registered = _savers.get(os.getpid())
    if registered is None:
        return ()
    save, drop_env = registered
    if save is None:
        return drop_env
    _savers[os.getpid()] = (None, drop_env)
    try:
        program = os.fsdecode(path) if isinstance(path, (str, bytes, os.PathLike)) else str(path)
        save(program)
    except Exception as exc:  # the program's exec goes ahead whatever happened to its profile
        from ..safe_text import say

        say(f"cpuprof: warning: process {os.getpid()}: its profile could not be saved before it exec'd "
            f"({type(exc).__name__}: {exc})")
    return drop_env
