"""Module regions: every nn.Module forward becomes a region named by its class."""

from __future__ import annotations

import threading
from typing import Any


class ModuleRegions:
    """Makes every nn.Module forward a region named by its class, through global module hooks.

    Class names, not instance paths: the keys stay bounded ("LlamaDecoderLayer/LlamaMLP/Linear"
    whatever the depth of the model), which is what an aggregate over many layers wants.
    """

    def __init__(self) -> None:
        import torch
        from torch.nn.modules import module as nn_module

        self._local = threading.local()
        record_function = torch.autograd.profiler.record_function

        def enter(module: Any, _args: Any) -> None:
            scope = record_function(type(module).__name__)
            scope.__enter__()
            self._stack().append(scope)

        def leave(module: Any, _args: Any, _output: Any) -> None:
            stack = self._stack()
            if stack:
                stack.pop().__exit__(None, None, None)

        self._handles = [nn_module.register_module_forward_pre_hook(enter),
                         nn_module.register_module_forward_hook(leave, always_call=True)]

    def _stack(self) -> list[Any]:
        if not hasattr(self._local, "stack"):
            self._local.stack = []
        return self._local.stack

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
