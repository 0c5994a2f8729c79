"""Errors that end a command with one line on stderr instead of a traceback.

Everything a user can get wrong, or the machine can lack, raises a subclass of
:class:`CpuprofError`; the CLI prints ``cpuprof: error: <message>`` and exits with
``exit_code``. Anything else is a bug and is allowed to show its traceback.
"""

from __future__ import annotations


class CpuprofError(Exception):
    """A failure with a message fit for a user; ``exit_code`` is what the CLI returns."""

    exit_code = 1


class UsageError(CpuprofError):
    """Bad input on the command line: an unknown choice, an out-of-range number."""

    exit_code = 2


class ProfileFormatError(CpuprofError):
    """A profile file that is truncated, foreign, or from an unknown format version."""

    exit_code = 2


class NativeModuleError(CpuprofError):
    """The C++ core is missing or was built against another torch."""

    exit_code = 3


class ChildFailed(CpuprofError):
    """The profiled child process crashed, was killed or was interrupted."""

    exit_code = 1
