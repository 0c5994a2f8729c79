"""Everything a launched run is asked to do, as one typed value passed from parent to child.

Each part has one owner: the workload's shape and length, the launch (threads, pinning,
runtime, memory: :class:`cpuprof.launch.environment.LaunchSettings`), the profiler, the output.
The parent writes it to ``launch.json`` with the child's resolved context; the child reads it
back as the same types.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass, field
from typing import Final, Literal

from .. import defaults
from ..model import CollectionMode, Requested, Topology
from ..model.workload import DEFAULT_GROUP_SIZE, WeightQuant
from ..workload.presets import ModelConfig
from ..workload.sampling import Sampling
from .environment import LaunchSettings

# Beside the profile: the Python stacks of every thread, written by faulthandler if the child
# crashes (a crash in a native thread shows as one with no Python frame).
CRASH_FILENAME = "crash.txt"

# The machine's roofs: "auto" (cached, else measured before decoding), "remeasure", "off".
Roofs = Literal["auto", "remeasure", "cached", "off"]
ROOFS_CHOICES: Final[tuple[Roofs, ...]] = typing.get_args(Roofs)


@dataclass
class WorkloadOptions:
    preset: str = "llama-3.2-1b"
    overrides: dict[str, int] = field(default_factory=dict)  # shape fields: layers, hidden, ...
    dtype: str = "bf16"
    prompt_len: int = 32
    new_tokens: int = 32
    batch: int = 1
    warmup: int = 2
    sampling: Sampling = "greedy"
    top_k: int = 50
    seed: int = 0
    hf: str | None = None  # a local Hugging Face checkpoint instead of the built-in model
    compile: bool = False  # torch.compile (inductor, weights frozen) the built-in model before decoding
    quant: str = "none"  # the built-in model's projections: none, int8 or int4 (weight-only)
    group_size: int | None = None  # int4's group of inputs per scale; None: DEFAULT_GROUP_SIZE

    def weight_quant(self) -> WeightQuant:
        # A sweep's --group-size is given to each configuration; only int4 ones have groups.
        return WeightQuant(self.quant, (self.group_size or DEFAULT_GROUP_SIZE) if self.quant == "int4"
                           else DEFAULT_GROUP_SIZE)


@dataclass
class ProfileOptions:
    enabled: bool = True
    events: str = defaults.DEFAULT_EVENTS
    mode: CollectionMode = defaults.DEFAULT_MODE
    sample_hz: int = defaults.SAMPLE_HZ
    stack_bytes: int = defaults.STACK_BYTES
    record_shapes: bool = True
    timeline: int = 0
    python_hz: int = 0  # Python stacks read per second; 0: none
    python_sampler: str = defaults.PYTHON_SAMPLER  # who reads them: "in-process" or "py-spy"


@dataclass
class DecodeOptions:
    workload: WorkloadOptions = field(default_factory=WorkloadOptions)
    launch: LaunchSettings = field(default_factory=LaunchSettings)
    profile: ProfileOptions = field(default_factory=ProfileOptions)
    out: str | None = None
    checkpoint_s: float = defaults.CHECKPOINT_S
    roofs: Roofs = "auto"
    calibrate_only: bool = False  # `cpuprof calibrate`: measure the roofs under this launch, decode nothing


@dataclass
class RankConfig:
    """A child's place in a multi-process decode; the rendezvous address comes in its environment
    (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE), as torchrun passes it."""

    mode: str  # "tp" (one rank of a tensor-parallel model) or "instances" (independent decoders)
    rank: int
    world_size: int
    backend: str | None  # torch.distributed backend for "tp"
    timeout_s: float  # a collective waits this long for the other ranks before failing
    cpus: list[int] = field(default_factory=list)


@dataclass
class ChildConfig:
    """What the decode child needs: the options and what the parent resolved for them."""

    options: DecodeOptions
    model: ModelConfig | None  # the built-in model's shape; None for --hf
    threads: int
    requested: Requested
    cpu_set: str
    topology: Topology
    out: str
    rank: RankConfig | None = None  # one of several processes (decode --tp / --instances)
