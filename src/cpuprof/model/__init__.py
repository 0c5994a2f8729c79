"""The profile model: every report and exporter reads these types and nothing else."""

from ..defaults import COLLECTION_MODES, EXACT, SAMPLED, CollectionMode
from .contention import WAIT_KINDS, OmptInfo, OmpWait, OmpWork, OpenMPWaits
from .io import FORMAT, PROFILE_FILENAME, VERSION
from .machine import Cpu, Node, OpenMPInfo, OpenMPRuntime, Topology, format_cpulist, parse_cpulist
from .profile import (
    CPU_EVENT,
    Capabilities,
    Collection,
    DistributedRank,
    DroppedEvent,
    EventInfo,
    IdleThread,
    Limits,
    Meta,
    OpInput,
    OpStat,
    Overhead,
    Profile,
    Spans,
    Status,
    ThreadStat,
)
from .roofs import ArithmeticPeak, BandwidthRoof, ComputeRoof, KernelRoof, MachineRoofs, Repeated, RoofProbe
from .settings import (
    AllocatorInfo,
    FrontEndGivenBack,
    InForce,
    MemPolicy,
    Requested,
    Settings,
    ThreadPlacement,
    TorchThreads,
    WeightPages,
)
from .stacks import (
    CATEGORIES,
    NativeFrame,
    PythonFrame,
    PythonSampling,
    PythonSplit,
    SampleTimeline,
    Sampling,
    StackCount,
    Stacks,
)
from .workload import Collectives, DecodeWorkload, KvCachePoint, MemoryPoint, ModelInfo, RankInfo, StepFigures

__all__ = [
    "WAIT_KINDS", "OmptInfo", "OmpWait", "OmpWork", "OpenMPWaits",
    "BandwidthRoof", "KvCachePoint", "MemoryPoint", "ComputeRoof", "KernelRoof", "MachineRoofs", "Repeated",
    "ArithmeticPeak", "RoofProbe",
    "CATEGORIES", "NativeFrame", "PythonFrame", "PythonSampling", "PythonSplit", "SampleTimeline", "Sampling",
    "StackCount", "Stacks",
    "COLLECTION_MODES", "CPU_EVENT", "EXACT", "SAMPLED", "CollectionMode",
    "FORMAT", "PROFILE_FILENAME", "VERSION", "AllocatorInfo", "Capabilities", "Collection", "Cpu",
    "Collectives", "DecodeWorkload", "DistributedRank", "DroppedEvent", "EventInfo", "IdleThread", "InForce",
    "FrontEndGivenBack", "Limits", "MemPolicy",
    "Meta", "ModelInfo", "Node", "OpInput", "OpStat", "OpenMPInfo", "OpenMPRuntime", "Overhead", "Profile",
    "RankInfo", "Requested",
    "Settings", "Spans", "Status", "StepFigures", "ThreadPlacement", "ThreadStat", "Topology", "TorchThreads",
    "WeightPages", "format_cpulist", "parse_cpulist",
]
