"""The processes a program starts, followed: ``cpuprof run`` profiles every Python process its
program starts that imports torch, the way it profiles the program itself.

How a process is followed. The script child writes ``follow.json`` (the run's profiling options and
launch) in the output directory, names it in ``CPUPROF_FOLLOW`` and puts ``follow_boot/`` first on
``PYTHONPATH``, so that every Python started with that environment (multiprocessing's spawn and
forkserver children, ``subprocess`` children, and theirs) runs ``follow_boot/sitecustomize.py``
as it starts, which calls :func:`follow` here. That installs an import hook and nothing else: a
Python that never imports torch (a tokenizer pool, a compile worker) is left alone. When torch's
import completes, the process profiles itself into ``processes/<pid>/`` under the output
directory with the run's options, and saves its profile:

- at its end, however it ends: at exit (``atexit``), at multiprocessing's own exit (a process that
  multiprocessing started ends with ``os._exit``, past ``atexit``), and on a SIGTERM while the
  program has no handler of its own (``Pool.terminate`` sends one);
- every ``CHECKPOINT_S`` seconds while it runs, so a process killed by SIGKILL keeps what was
  measured until its last checkpoint, marked as one.

A process that multiprocessing forks from a followed one starts a profile of its own (the native
core stops the parent's copy in a forked child). A plain ``os.fork`` child is not followed: it
has no point where it could start outside the fork itself.

This module is imported as every followed Python starts, so it imports only the standard library;
the rest (:mod:`.followed_run`) once torch is imported.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from .torch_import import TorchImportHook

FOLLOW_ENV = "CPUPROF_FOLLOW"  # names the follow file (followed_run.FollowConfig) a followed process reads


# -- in a followed process ----------------------------------------------------------------------
_hook: TorchImportHook | None = None
_run: Any = None  # the FollowedRun of this process, once torch is imported


def follow(path: str) -> None:
    """Called as a followed Python starts: profile it from its first ``import torch``."""
    global _hook
    if _hook is not None or "torch" in sys.modules:
        return
    _hook = TorchImportHook(lambda: _start(path))
    _hook.install()


def warn(message: str) -> None:
    from ..safe_text import printable

    print(f"cpuprof: warning: process {os.getpid()}: {printable(message)}", file=sys.stderr)


def _start(path: str) -> None:
    """Runs inside the process's first ``import torch``; never fails the program's import."""
    global _run
    try:
        from .followed_run import start_followed

        _run = start_followed(path)
    except Exception as exc:  # the follow file unreadable, cpuprof's modules broken
        warn(f"not profiled: {type(exc).__name__}: {exc}")
