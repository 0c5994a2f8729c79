"""Module regions: every nn.Module forward becomes a region named by its class."""

from __future__ import annotations

import threading
from typing import Any


def attribute_names(model: Any) -> dict[int, str]:
    """Region names for a model's modules: each module's attribute name in its parent, list
    indices collapsed ("layers.*"), the root by its class. Bounded like class names whatever the
    depth, and they tell q_proj from k_proj, which class names ("Linear") cannot."""
    names: dict[int, str] = {id(model): type(model).__name__}
    for qualified, module in model.named_modules():
        if not qualified:
            continue
        parts = qualified.split(".")
        last = parts[-1]
        if last.isdigit():
            last = f"{parts[-2]}.*" if len(parts) > 1 else "*"
        names.setdefault(id(module), last)
    return names


class ModuleRegions:
    """Makes every nn.Module forward a region, through global module hooks.

    By default a region is named by the module's class ("LlamaDecoderLayer/LlamaMLP/Linear");
    with ``names`` (see :func:`attribute_names`), by the name the model gives it, and by class for
    modules outside that model. Either way the keys stay bounded whatever the depth, which is
    what an aggregate over many layers wants.
    """

    def __init__(self, names: dict[int, str] | None = None) -> None:
        import torch
        from torch.nn.modules import module as nn_module

        self._local = threading.local()
        record_function = torch.autograd.profiler.record_function

        known = names or {}

        def enter(module: Any, _args: Any) -> None:
            scope = record_function(known.get(id(module)) or type(module).__name__)
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
