"""How the next token is chosen from the logits: the names the command line, the options and the
child share. Torch-free, so the launcher can check ``--sampling`` before anything starts."""

from __future__ import annotations

import typing
from typing import Final, Literal

Sampling = Literal["greedy", "topk"]
SAMPLING_MODES: Final[tuple[Sampling, ...]] = typing.get_args(Sampling)
