"""The exit codes of cpuprof and of the children it launches, and how an outcome maps to one.

Every command, every launched child and the launcher that reads a child's status use these
names; a number written anywhere else is a bug. An error's code is its class's ``exit_code``
(:mod:`cpuprof.errors`: UsageError and FileFormatError USAGE, NativeModuleError NATIVE_MODULE,
ChildFailed the child's, the rest FAILED); Ctrl-C in the launcher is INTERRUPTED.

The children's codes are how the launcher tells "the child said what failed, in one line"
(FAILED, USAGE) from "interrupted, what was measured is saved" (INTERRUPTED) and from a crash (a
negative status: the signal that killed it).
"""

from __future__ import annotations

OK = 0
FAILED = 1  # the run failed; one line on stderr said what, and what was kept
USAGE = 2  # bad input (a flag, a file): refused before anything ran
NATIVE_MODULE = 3  # the C++ core is missing or was built against another torch
INTERRUPTED = 130  # SIGINT/SIGTERM: 128 + SIGINT, as a shell reports Ctrl-C
SIGNALLED = 128  # a program ended by signal N: 128 + N, as a shell reports it (`cpuprof run`)

# The exit codes a child uses to say it reported its own failure in one line already.
REPORTED_BY_CHILD = (FAILED, USAGE)


def of_child(returncode: int, interrupted: bool) -> int:
    """A failed child's status as the launcher's exit code: INTERRUPTED when the launcher passed it
    a signal (whatever it exited with: a child still starting Python exits 1 on Ctrl-C), the
    child's own status when it exited, FAILED when a signal killed it."""
    if interrupted or returncode == INTERRUPTED:
        return INTERRUPTED
    if 0 < returncode < 256:
        return returncode
    return FAILED


def of_signal(signum: int) -> int:
    """The status a shell gives a program that signal ``signum`` ended: 128 + its number."""
    return SIGNALLED + signum


def of_program(returncode: int, interrupted: bool) -> int:
    """The profiled program's status as ``cpuprof run``'s exit code, as a shell would give it:
    INTERRUPTED when the launcher passed it a signal, 128 + N when signal N killed it, else its own."""
    if interrupted:
        return INTERRUPTED
    if returncode < 0:
        return of_signal(-returncode)
    return returncode


def of_group(returncodes: list[int], interrupted: bool) -> int:
    """A group of children (ranks, processes) as one exit code: ``returncodes`` are the failed
    children's, the first to fail first; OK when none failed."""
    if interrupted:
        return INTERRUPTED
    if not returncodes:
        return OK
    return of_child(returncodes[0], interrupted=False)
