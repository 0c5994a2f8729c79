"""Windows of a whole torch.distributed job, opened and closed through the job's own store.

A job's ranks run on several hosts, each under its own ``cpuprof run --on-demand`` launcher;
``cpuprof signal PID`` reaches one launcher. The job's TCPStore is what every rank already
reaches (as dynolog reaches every Kineto of a job), so ``cpuprof signal tcp://HOST:PORT start|stop``
writes the window asked for there, and every rank of an on-demand run polls it, with a connection
of its own, beside the launcher's control file:

    cpuprof/windows       windows opened so far (the next one's number comes from it)
    cpuprof/window        the window asked for: {"window": N, "open": true|false}
    cpuprof/window-seq    bumped at each request: a rank reads the request only when it moved
    cpuprof/listening     ranks polling the store (each adds 1 once)
    cpuprof/window-N-start, cpuprof/window-N-stop   ranks that opened, closed window N

Each rank saves window N as its launcher's ``DIR/window-N/processes/PID``; the hosts' window-N
directories merge like runs (``cpuprof merge``).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

COUNT_KEY = "cpuprof/windows"
STATE_KEY = "cpuprof/window"
SEQ_KEY = "cpuprof/window-seq"
LISTENING_KEY = "cpuprof/listening"
CONNECT_TIMEOUT = timedelta(seconds=10)
SIGNAL_CONNECT_TIMEOUT = timedelta(seconds=5)  # a store not there in 5 s is not there for a person waiting
ACK_WAIT_S = 3.0  # how long `signal` waits for the ranks to say they did it


def ack_key(window: int, action: str) -> str:
    return f"cpuprof/window-{window}-{action}"


def parse_store(text: str) -> tuple[str, int] | None:
    """``tcp://HOST:PORT`` as (host, port); None for anything else."""
    if not text.startswith("tcp://"):
        return None
    host, sep, port = text[len("tcp://"):].rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        return None
    return host.strip("[]"), int(port)


def connect(host: str, port: int, timeout: timedelta = CONNECT_TIMEOUT) -> Any:
    """A client connection of its own to the job's TCPStore (never the program's, which its own
    blocking waits hold)."""
    from torch.distributed import TCPStore

    return TCPStore(host, port, is_master=False, timeout=timeout, wait_for_workers=False)


@contextlib.contextmanager
def _quiet_native_stderr() -> Iterator[None]:
    """File descriptor 2 to /dev/null for the block: what native code writes there itself."""
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


class StoreWindows:
    """A rank's side: the window its job's store asks for, polled; None until the process has
    joined a job whose store is a TCPStore."""

    def __init__(self) -> None:
        self.store: Any = None
        self.seq = 0
        self.failed = False  # the store went away (the job ended): polling stops

    def poll(self, address: str | None) -> tuple[int, bool] | None:
        """The window asked for (number, open) when a request came since the last poll."""
        if self.failed:
            return None
        if self.store is None:
            where = parse_store("tcp://" + address[len("tcp "):]) if address and address.startswith("tcp ") else None
            if where is None:
                return None
            self.store = connect(*where)
            self.store.add(LISTENING_KEY, 1)
        seq = self.store.add(SEQ_KEY, 0)
        if seq == self.seq:
            return None
        self.seq = seq
        state = json.loads(self.store.get(STATE_KEY))
        return int(state["window"]), bool(state["open"])

    def acknowledge(self, window: int, opened: bool) -> None:
        if self.store is not None:
            self.store.add(ack_key(window, "start" if opened else "stop"), 1)


def request(host: str, port: int, action: str) -> tuple[int, int, int]:
    """``signal``'s side: window ``action`` (start or stop) asked of every rank polling the store;
    (the window's number, the ranks that did it within ACK_WAIT_S, the ranks polling)."""
    from ..errors import UsageError

    try:
        with _quiet_native_stderr():  # torch's C++ logs each retry and the stack on stderr itself
            store = connect(host, port, SIGNAL_CONNECT_TIMEOUT)
    except Exception as exc:  # refused, unreachable, timed out: torch raises several kinds
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        first = re.sub(r"^\[[^\]]*\]\s*", "", first)  # c10's "[E1129 07:04:16 socket.cpp:1028] " prefix
        raise UsageError(f"cannot reach the job's store at tcp://{host}:{port} ({first[:200]})") from None
    if action == "start":
        window = store.add(COUNT_KEY, 1)
    else:
        window = store.add(COUNT_KEY, 0)
        if window == 0:
            raise UsageError(f"no window of the job at tcp://{host}:{port} was opened: nothing to stop")
    store.set(STATE_KEY, json.dumps({"window": window, "open": action == "start"}))
    store.add(SEQ_KEY, 1)
    listening = store.add(LISTENING_KEY, 0)
    deadline = time.monotonic() + ACK_WAIT_S
    done = store.add(ack_key(window, action), 0)
    while done < listening and time.monotonic() < deadline:
        time.sleep(0.05)
        done = store.add(ack_key(window, action), 0)
    return window, done, listening
