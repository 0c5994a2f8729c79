"""Something to run the moment a process's ``import torch`` completes: how ``cpuprof run`` starts
profiling in the program it runs and in every Python process that program starts (:mod:`.followed`).

Standard library only: it is installed before the program imports anything, in processes cpuprof
did not start itself.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any


class TorchImportHook(importlib.abc.MetaPathFinder):
    """Calls ``on_imported`` once, the moment torch's own module has finished executing, from the
    thread that imported it, before the import statement returns to the program.

    It finds torch's spec as the rest of ``sys.meta_path`` would, and wraps that one spec's
    loader instance's ``exec_module`` (never the loader's class, nor its type), so torch keeps
    its own loader, spec and module attributes."""

    def __init__(self, on_imported: Callable[[], None]) -> None:
        self.on_imported = on_imported
        self.fired = False
        self._finding = False

    def install(self) -> None:
        sys.meta_path.insert(0, self)

    def remove(self) -> None:
        if self in sys.meta_path:
            sys.meta_path.remove(self)

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != "torch" or self._finding or self.fired:
            return None
        self._finding = True  # the lookup below walks sys.meta_path again, this finder included
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self._finding = False
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader: Any = spec.loader
        original = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            del loader.exec_module  # torch's loader is its own again, whatever happens next
            original(module)
            self.fired = True
            self.remove()
            self.on_imported()

        loader.exec_module = exec_module
        return spec
