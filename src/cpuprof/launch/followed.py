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

The launch's thread and binding variables (OMP_NUM_THREADS, OMP_PROC_BIND, OMP_PLACES, ...) are the
program's own process's: a followed process starts with the values it would have had without
cpuprof, except the ones its program set for it (vLLM's OMP_NUM_THREADS for its worker): a program
that places its own processes is not overruled by a launch meant for its first one.

A process that multiprocessing forks from a followed one starts a profile of its own (the native
core stops the parent's copy in a forked child). A plain ``os.fork`` child is not followed: it
has no point where it could start outside the fork itself.

This module is imported as every followed Python starts, so it imports only the standard library;
the rest (:mod:`.followed_run`) once torch is imported.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from .torch_import import TorchImportHook

FOLLOW_ENV = "CPUPROF_FOLLOW"  # names the follow file (followed_run.FollowConfig) a followed process reads
LAUNCH_ENV = "CPUPROF_LAUNCH_ENV"  # environment.LAUNCH_ENV_VAR: the launch's variables, and what they were


# environment.OWNED_VARS, the variables the launch decides (this module imports only the standard
# library; a unit test keeps the two the same).
LAUNCH_OWNED_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OMP_PROC_BIND", "OMP_PLACES", "GOMP_CPU_AFFINITY",
                     "KMP_AFFINITY")

# -- in a followed process ----------------------------------------------------------------------
_hook: TorchImportHook | None = None
_run: Any = None  # the FollowedRun of this process, once torch is imported
# The launch's variables as they were before the launch, once this process has been given them back
# (None: it was not: a process forked from a followed one inherits its parent's as they are).
before_launch: dict[str, str | None] | None = None


def launch_env_values(environ: Any = os.environ) -> dict[str, tuple[str | None, str | None]]:
    """The launch's own variables, as the launcher left them in the program's environment: {variable:
    (the launch's value, the value before the launch)}, None for unset, for every one of them; empty
    when not said, or when what is said is not that (it is read as untrusted input: only the launch's
    variables, only strings, all or nothing)."""
    raw = environ.get(LAUNCH_ENV)
    if not raw:
        return {}
    try:
        said = json.loads(raw)
    except (ValueError, RecursionError):
        return {}
    if not isinstance(said, dict) or set(said) - set(LAUNCH_OWNED_VARS):
        return {}
    values: dict[str, tuple[str | None, str | None]] = {}
    for key in LAUNCH_OWNED_VARS:
        pair = said.get(key, [None, None])
        if not (isinstance(pair, list) and len(pair) == 2
                and all(v is None or (isinstance(v, str) and "\0" not in v) for v in pair)):
            return {}
        values[key] = (pair[0], pair[1])
    return values


def give_back_the_programs_env(environ: Any = os.environ) -> dict[str, str | None]:
    """The launch's variables are for the program's own process: a process it starts gets the
    values it would have had without cpuprof (the OpenMP runtime reads them as torch loads, so this
    runs first of all). A variable the program set itself (vLLM's OMP_NUM_THREADS for its worker) is
    kept; one it set to the very value the launch gave cannot be told from it, and is given back too.
    The processes this one starts inherit what it has then: the launch's account is removed. Returns
    what was given back."""
    global before_launch
    values = launch_env_values(environ)
    environ.pop(LAUNCH_ENV, None)
    if not values:
        return {}
    given: dict[str, str | None] = {}
    for key, (launched, before) in values.items():
        if launched != before and environ.get(key) == launched:
            if before is None:
                environ.pop(key, None)
            else:
                environ[key] = before
            given[key] = before
    before_launch = {key: before for key, (_, before) in values.items()}
    return given


def follow(path: str) -> None:
    """Called as a followed Python starts: profile it from its first ``import torch``."""
    global _hook
    give_back_the_programs_env()
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
