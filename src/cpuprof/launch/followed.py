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
- every ``CHECKPOINT_S`` seconds while it runs (less often where a save is slow: saving takes at
  most 1/``CHECKPOINT_SHARE`` of its time), so a process killed by SIGKILL keeps what was measured
  until its last checkpoint, marked as one.

The launch's thread and binding variables (OMP_NUM_THREADS, OMP_PROC_BIND, OMP_PLACES, ...) are the
program's own process's: a followed process starts with the values it would have had without
cpuprof, except the ones its program set for it (vLLM's OMP_NUM_THREADS for its worker): a program
that places its own processes is not overruled by a launch meant for its first one.

A process that multiprocessing forks from a followed one starts a profile of its own (the native
core stops the parent's copy in a forked child). A plain ``os.fork`` child is not followed: it
has no point where it could start outside the fork itself.

This module is imported as every followed Python starts, so it imports only the standard library
(and :mod:`.follow_env`, which shares what it knows with :mod:`.followed_run`); the rest once torch
is imported.
"""

from __future__ import annotations

import os
import sys
import time

from . import follow_env
from .torch_import import TorchImportHook

_hook: TorchImportHook | None = None


def follow(path: str, began_ns: int | None = None) -> None:
    """Called as a followed Python starts: profile it from its first ``import torch``. ``began_ns``
    (perf_counter_ns) is when its start-up began importing cpuprof."""
    global _hook
    began_ns = time.perf_counter_ns() if began_ns is None else began_ns
    follow_env.give_back_the_programs_env()
    if _hook is not None or "torch" in sys.modules:
        return
    _hook = TorchImportHook(lambda: _start(path))
    _hook.install()
    follow_env.boot_ns += time.perf_counter_ns() - began_ns
    os.register_at_fork(after_in_child=_forget_boot)


def _forget_boot() -> None:
    follow_env.boot_ns = 0  # a forked child's start-up was its parent's
    follow_env.front_end_freed = None  # and so was what its parent did to its own parent


def _start(path: str) -> None:
    """Runs inside the process's first ``import torch``; never fails the program's import."""
    try:
        from .followed_run import start_followed

        follow_env.current_run = start_followed(path)
    except Exception as exc:  # the follow file unreadable, cpuprof's modules broken
        follow_env.warn(f"not profiled: {type(exc).__name__}: {exc}")
