"""``cpuprof signal PID start|stop``: opens or closes a profiling window of a ``cpuprof run --on-demand``
(its launcher's PID, which it prints as it starts); see :mod:`cpuprof.launch.window`."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from .. import options_spec as spec
from ..errors import UsageError
from ..launch.program import WINDOW_SIGNALS

COMMAND = spec.Command(
    "signal", help="open (start) or close (stop) a profiling window of a running `cpuprof run --on-demand`",
    description="Asks a `cpuprof run --on-demand` launcher (PID: the one it printed as it started) to open a "
                "profiling window in every process it profiles (start), or to close and save it (stop). Each window "
                "is saved as its own run in DIR/window-N. The program keeps running either way.",
    groups=(spec.Group(None, spec.SIGNAL),))


def launcher_argv(pid: int) -> list[str]:
    """The command line of ``pid``; UsageError when there is no such process or it cannot be read."""
    if pid <= 0:
        raise UsageError(f"{pid}: not a process id")
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except FileNotFoundError:
        raise UsageError(f"no process {pid}") from None
    except OSError as exc:
        raise UsageError(f"process {pid} cannot be inspected ({exc.strerror or exc})") from None
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def is_on_demand_launcher(argv: list[str]) -> bool:
    """``python -m cpuprof run ... --on-demand ... -- program``: a Python running cpuprof's run, the
    flag among cpuprof's options (not a wrapper such as ``timeout`` whose arguments say the same)."""
    if len(argv) < 4 or not os.path.basename(argv[0]).startswith("python") or argv[1:4] != ["-m", "cpuprof", "run"]:
        return False
    options = argv[4:argv.index("--")] if "--" in argv else argv[4:]
    return "--on-demand" in options


def run(args: argparse.Namespace) -> int:
    argv = launcher_argv(args.pid)
    if not is_on_demand_launcher(argv):
        shown = " ".join(argv)[:120] or "(no command line)"
        raise UsageError(f"process {args.pid} is not a `cpuprof run --on-demand` launcher (it runs: {shown}); give the "
                         "pid that `cpuprof run --on-demand` printed as it started")
    try:
        os.kill(args.pid, WINDOW_SIGNALS[args.action])
    except ProcessLookupError:
        raise UsageError(f"process {args.pid} ended") from None
    except PermissionError:
        raise UsageError(f"no permission to signal process {args.pid}") from None
    what = "open a window" if args.action == "start" else "close and save its window"
    print(f"asked cpuprof run (pid {args.pid}) to {what}; its progress lines say when each process has")
    return 0
