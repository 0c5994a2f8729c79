"""``cpuprof signal PID start|stop``: opens or closes a profiling window of a ``cpuprof run --on-demand``
(its launcher's PID, which it prints as it starts); see :mod:`cpuprof.launch.window`."""

from __future__ import annotations

import argparse
import os

from .. import exit_codes
from .. import options_spec as spec
from ..errors import UsageError
from ..launch.job_windows import ACK_WAIT_S, parse_store, request
from ..launch.program import WINDOW_SIGNALS
from ..launch.window import launcher_run_dir, request_window
from ..safe_text import printable, say

COMMAND = spec.Command(
    "signal", help="open (start) or close (stop) a profiling window of a running `cpuprof run --on-demand`",
    description="Asks a `cpuprof run --on-demand` launcher (PID: the one it printed as it started) to open a "
                "profiling window in every process it profiles (start), or to close and save it (stop). Each window "
                "is saved as its own run in DIR/window-N. The program keeps running either way. Given a "
                "torch.distributed job's store (tcp://HOST:PORT, MASTER_ADDR:MASTER_PORT under torchrun), it asks "
                "every rank of the job, on every host, through that store.",
    groups=(spec.Group(None, spec.SIGNAL),))


def run(args: argparse.Namespace) -> int:
    store = parse_store(args.pid)
    if store is not None:
        return _through_the_store(*store, args.action)
    if not args.pid.isdigit():
        raise UsageError(f"{args.pid}: expected the launcher's pid, or a job's store as tcp://HOST:PORT")
    args.pid = int(args.pid)
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


def _through_the_store(host: str, port: int, action: str) -> int:
    window, done, listening = request(host, port, action)
    did = "opened" if action == "start" else "closed and saved"
    address = printable(f"tcp://{host}:{port}")
    print(f"window {window} asked of every rank polling the job's store at {address}: {done} of "
          f"{listening} {did} it within {ACK_WAIT_S:g} s; each saves it in its launcher's DIR/window-{window}; "
          "merge the hosts' with: python -m cpuprof merge HOST0_DIR/window-N HOST1_DIR/window-N --out M")
    if listening == 0:
        say("cpuprof: warning: no rank polls this store: are the ranks running under `cpuprof run --on-demand`?")
    return 0 if done == listening and listening else exit_codes.FAILED
