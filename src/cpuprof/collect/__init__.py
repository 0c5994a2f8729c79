"""Recording: the native session behind ``cpuprof.profile()``, turned into a Profile."""

from .session import profile, region

__all__ = ["profile", "region"]
