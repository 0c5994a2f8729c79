"""cpuprof: a CPU-focused, low-level profiler for PyTorch LLM inference."""

__version__ = "0.2.0"

from .collect import profile, region  # noqa: E402
from .model import Profile  # noqa: E402

__all__ = ["Profile", "profile", "region", "__version__"]
