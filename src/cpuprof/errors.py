"""Errors that end a command with one line on stderr instead of a traceback.

Everything a user can get wrong, or the machine can lack, raises a subclass of
:class:`CpuprofError`; the CLI prints ``cpuprof: error: <message>`` and exits with
``exit_code`` (one of :mod:`cpuprof.exit_codes`). Anything else is a bug and is allowed to show
its traceback.
"""

from __future__ import annotations

from . import exit_codes


class CpuprofError(Exception):
    """A failure with a message fit for a user; ``exit_code`` is what the CLI returns."""

    exit_code = exit_codes.FAILED


class UsageError(CpuprofError):
    """Bad input on the command line: an unknown choice, an out-of-range number."""

    exit_code = exit_codes.USAGE


class FileFormatError(CpuprofError):
    """A file cpuprof wrote (profile.json, compare.json, ranks.json, launch.json) that is missing,
    truncated, of another kind, damaged or from an unknown format version; the message names the
    file and the problem (see :mod:`cpuprof.model.io`)."""

    exit_code = exit_codes.USAGE


# The name profiles' readers have always raised and caught: the same class.
ProfileFormatError = FileFormatError


class NativeModuleError(CpuprofError):
    """The C++ core is missing or was built against another torch."""

    exit_code = exit_codes.NATIVE_MODULE


class ChildFailed(CpuprofError):
    """The profiled child process crashed, was killed or was interrupted; ``exit_code`` is set from
    its status (:func:`cpuprof.exit_codes.of_child`)."""

    def __init__(self, message: str, exit_code: int = exit_codes.FAILED) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class Interrupted(CpuprofError):
    """A command stopped by SIGINT/SIGTERM after saving what it had; the message says where."""

    exit_code = exit_codes.INTERRUPTED
