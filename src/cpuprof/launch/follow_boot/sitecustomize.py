"""Run by every Python that ``cpuprof run`` follows, as it starts (this directory is first on the
PYTHONPATH a followed program passes to its children): see :mod:`cpuprof.launch.followed`.

It hides itself, so that the ``sitecustomize`` this one stands before (a distribution's, a
virtual environment's) still runs, and the program's own path is what it would be without
cpuprof. Nothing here may stop the program: a failure is one warning line.
"""

import os
import sys


def _chain_to_the_hidden_sitecustomize() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    # Run the next one on the path as a module of its own: this module's entry in sys.modules is
    # the import system's until this file has run.
    import importlib.machinery
    import importlib.util

    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", sys.path)
    if spec is not None and spec.loader is not None:
        hidden = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(hidden)


def _follow() -> None:
    path = os.environ.get("CPUPROF_FOLLOW")
    if not path:
        return
    try:
        import time

        began = time.perf_counter_ns()
        from cpuprof.launch.followed import follow

        follow(path, began)
    except Exception as exc:
        if isinstance(exc, ModuleNotFoundError) and exc.name in ("cpuprof", "cpuprof.launch",
                                                                 "cpuprof.launch.followed"):
            return  # another Python, or an environment without cpuprof: not followed, said nowhere
        print(f"cpuprof: warning: process {os.getpid()} is not followed ({type(exc).__name__}: {exc})",
              file=sys.stderr)


# Following first: it gives the process back the OpenMP variables it would have had without cpuprof,
# before anything (the hidden sitecustomize, a library it loads) reads them.
_follow()
try:
    _chain_to_the_hidden_sitecustomize()
except Exception as exc:  # the hidden one's own failure, as Python would report it
    print(f"Error in sitecustomize; set PYTHONVERBOSE for traceback:\n{type(exc).__name__}: {exc}", file=sys.stderr)
