"""``cpuprof signal PID start|stop``: opens or closes a profiling window of a ``cpuprof run --on-demand``
(its launcher's PID, which it prints as it starts); see :mod:`cpuprof.launch.window`."""

from __future__ import annotations

import argparse
import os

from .. import options_spec as spec
from ..errors import UsageError
from ..launch.program import WINDOW_SIGNALS
from ..launch.window import launcher_run_dir, request_window

COMMAND = spec.Command(
    "signal", help="open (start) or close (stop) a profiling window of a running `cpuprof run --on-demand`",
    description="Asks a `cpuprof run --on-demand` launcher (PID: the one it printed as it started) to open a "
                "profiling window in every process it profiles (start), or to close and save it (stop). Each window "
                "is saved as its own run in DIR/window-N. The program keeps running either way.",
    groups=(spec.Group(None, spec.SIGNAL),))


def run(args: argparse.Namespace) -> int:
    root = launcher_run_dir(args.pid)
    try:
        request_window(root, args.action)
    except OSError as exc:
        raise UsageError(f"cannot ask process {args.pid} to {args.action} a window: its run directory {root} "
                         f"cannot take the request ({exc.strerror or exc})") from None
    try:
        os.kill(args.pid, WINDOW_SIGNALS[args.action])
    except ProcessLookupError:
        raise UsageError(f"process {args.pid} ended") from None
    except PermissionError:
        raise UsageError(f"no permission to signal process {args.pid}") from None
    what = "open a window" if args.action == "start" else "close and save its window"
    done = "opened it" if args.action == "start" else "saved it"
    print(f"asked cpuprof run (pid {args.pid}) to {what}; its progress lines say when each process has {done}")
    return 0
