"""The element types decoding runs in: their names on the command line, sizes, and torch types.

The one table of them; torch is imported only when a torch dtype is asked for, so the launcher
(which never imports torch) can check ``--dtype`` and size the model.
"""

from __future__ import annotations

from typing import Any

from ..errors import UsageError

DTYPE_BYTES: dict[str, int] = {"bf16": 2, "fp32": 4}
DTYPE_NAMES: tuple[str, ...] = tuple(DTYPE_BYTES)


def check_dtype(name: str, flag: str = "--dtype") -> str:
    if name not in DTYPE_BYTES:
        raise UsageError(f"{flag} {name}: choose one of {', '.join(DTYPE_NAMES)}")
    return name


def dtype_bytes(name: str) -> int:
    return DTYPE_BYTES[check_dtype(name)]


def torch_dtype(name: str) -> Any:
    import torch

    return {"bf16": torch.bfloat16, "fp32": torch.float32}[check_dtype(name)]


def dtype_name_of(dtype: Any) -> str:
    """The command-line name of a torch dtype ("bf16"), or its torch spelling if it has none."""
    import torch

    names = {torch.bfloat16: "bf16", torch.float32: "fp32"}
    return names.get(dtype, str(dtype).removeprefix("torch."))


def name_for_bytes(n: int) -> str:
    """The name of the element size, for messages."""
    return next((name for name, size in DTYPE_BYTES.items() if size == n), f"{n}-byte")
