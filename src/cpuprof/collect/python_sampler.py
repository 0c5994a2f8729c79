"""Python stacks read inside the profiled process, by a thread of cpuprof's, at a fixed rate.

py-spy reads the interpreter's frames from another process: every sample is dozens of
``process_vm_readv`` calls, and its process takes CPU time from the program's threads where no CPU
is spare (a 2-thread decode on 2 CPUs lost about 5 % of its tokens/s to py-spy alone). In the
process the frames are there to read: with the GIL held no thread pushes or pops one, so a thread
of cpuprof's that holds it reads every other thread's chain as it is (natively on CPython 3.11 to
3.13, see csrc/python/python_stacks.h; elsewhere through ``sys._current_frames()``). No second
process, no ptrace (which containers often refuse).

The price is the GIL. The sampler takes it once a period for the tens of microseconds a read
lasts (30-45 µs for a decode's 24 frames, whose caches the weights have emptied; about 100 µs of
the sampler thread's CPU per period with its sleep and wake). A thread inside an ATen op has
released the GIL (torch's bindings drop it around every op) and does not notice; a thread running
Python gives it up at its next op call, or after ``sys.getswitchinterval()`` (5 ms) at worst.
Reads therefore fall where the GIL was free: inside ops, or a switch interval into a stretch of
pure Python. Each is the thread's true stack at the read's time, which is what the join needs.

A read's stack holds until the next read's: a change seen at read i happened after read i-1, so
it is placed halfway between the two (off by at most half their distance either way, like
py-spy's). The times are CLOCK_MONOTONIC, the op timeline's clock: no alignment.
"""

from __future__ import annotations

import array
import ctypes
import sys
import threading
import time
from collections import deque
from types import FrameType
from typing import cast

from .python_join import PythonTrace

SOURCE = "in-process"
# A stack change kept per thread at most (about 70 bytes each, the stacks themselves interned):
# an hour at 100 Hz with a new stack at every sample. Beyond it the oldest go, which only the
# oldest samples of the timeline (the newest samples) could have needed.
MAX_CHANGES_PER_THREAD = 400_000
_PR_SET_NAME = 15
MAX_SLEEP_S = 0.05

Stack = tuple[tuple[str, str, int], ...]


def _name_this_thread(name: bytes) -> None:
    """The OS name (``/proc``'s comm), which is what the profile's thread list shows."""
    try:
        ctypes.CDLL(None).prctl(_PR_SET_NAME, ctypes.c_char_p(name), 0, 0, 0)
    except (OSError, AttributeError):
        pass


class InProcessPythonSampler:
    """A daemon thread that reads every other Python thread's stack ``hz`` times a second."""

    def __init__(self, hz: int) -> None:
        from .. import native

        self.hz = hz
        self._period_s = 1.0 / hz
        self._stopping = False  # read after each sleep: stop() waits at most MAX_SLEEP_S
        nat = native.load()
        # CPython 3.11 to 3.13: the frames read natively (see csrc/python/python_stacks.h);
        # elsewhere through sys._current_frames(), a few times slower.
        self._nat = nat if nat.python_stacks_supported() else None
        self._frames: dict[tuple[str, str, int], tuple[str, str, int]] = {}
        self._stacks: dict[object, object] = {}  # interned: a stack unchanged is the same object
        self._changes: dict[int, deque[tuple[int, object]]] = {}
        self._last: dict[int, tuple[int, object]] = {}  # ident -> (time of the last read, its stack)
        self._idents: dict[int, int] = {}
        self.samples = 0
        self.error: str | None = None
        self.cpu_ns = 0  # the sampler thread's CPU time, read as it ends
        self._thread = threading.Thread(target=self._run, name="cpuprof-python", daemon=True)

    def start(self) -> None:
        if self._nat is not None:
            self._nat.clear_python_frame_table()
        self._remember_threads()
        self._thread.start()

    @property
    def native_id(self) -> int | None:
        """The sampler thread's OS id (known once start() returned)."""
        return self._thread.native_id

    def _remember_threads(self) -> None:
        for t in threading.enumerate():
            if t.ident is not None and t.native_id is not None:
                self._idents[t.ident] = t.native_id

    def _run(self) -> None:
        _name_this_thread(b"cpuprof-python")
        me = threading.get_ident()
        period = self._period_s
        wake = time.monotonic() + period
        read = self._read_natively if self._nat is not None else self._read_frames
        try:
            while True:
                # A plain sleep, in slices of at most MAX_SLEEP_S so that stop() waits little at low
                # rates: Event.wait cost about 40 µs of CPU more per period (a lock made each time).
                while not self._stopping and (left := wake - time.monotonic()) > 0:
                    time.sleep(min(left, MAX_SLEEP_S))
                if self._stopping:
                    break
                now = time.monotonic_ns()
                for ident, stack in read(me):
                    self._note(ident, now, stack)
                self.samples += 1
                wake += period
                now_s = time.monotonic()
                if wake < now_s:  # the GIL was held long: no burst of catch-up reads after it
                    wake = now_s + period
        except Exception as exc:  # noqa: BLE001 - a sampler fault ends Python stacks, never the program
            self.error = f"the in-process Python sampler stopped: {type(exc).__name__}: {exc}"
        finally:
            self.cpu_ns = time.thread_time_ns()

    def _read_natively(self, me: int) -> list[tuple[int, object]]:
        assert self._nat is not None
        threads = self._nat.read_python_stacks(me)
        for ident, native_id, _ in threads:
            self._idents[ident] = native_id
        return [(ident, stack) for ident, _, stack in threads]

    def _read_frames(self, me: int) -> list[tuple[int, object]]:
        frame_of = self._frames
        read: list[tuple[int, object]] = []
        for ident, frame in sys._current_frames().items():
            if ident == me:
                continue
            if ident not in self._idents:
                self._learn(ident)
            walked: list[tuple[str, str, int]] = []
            f: FrameType | None = frame
            while f is not None:
                code = f.f_code
                key = (getattr(code, "co_qualname", code.co_name), code.co_filename, f.f_lineno or 0)
                walked.append(frame_of.setdefault(key, key))
                f = f.f_back
            walked.reverse()
            read.append((ident, tuple(walked)))
        return read

    def _learn(self, ident: int) -> None:
        """A thread started after the sampler: its OS id while it still runs (an ident is reused)."""
        thread = threading._active.get(ident)  # type: ignore[attr-defined]  # no public lookup by ident
        if thread is not None and thread.native_id is not None:
            self._idents[ident] = thread.native_id

    def _note(self, ident: int, now: int, stack: object) -> None:
        """A read's stack; a change since the last read is placed halfway between the two."""
        stack = self._stacks.setdefault(stack, stack)
        last = self._last.get(ident)
        if last is None:
            self._changes.setdefault(ident, deque(maxlen=MAX_CHANGES_PER_THREAD)).append((now, stack))
        elif last[1] is not stack:
            self._changes[ident].append(((last[0] + now) // 2, stack))
        self._last[ident] = (now, stack)

    def _resolve(self) -> dict[int, list[tuple[int, Stack]]]:
        """The stacks as (function, file, line) tuples, root first."""
        if self._nat is None:
            return {ident: [(t, cast(Stack, s)) for t, s in changes] for ident, changes in self._changes.items()}
        table = [(name, file, line) for name, file, line in self._nat.python_frame_table()]
        self._nat.clear_python_frame_table()
        resolved: dict[object, Stack] = {}
        for packed in self._stacks:
            ids = array.array("I")
            ids.frombytes(cast(bytes, packed))
            resolved[packed] = tuple(table[i] for i in ids)
        return {ident: [(t, resolved[s]) for t, s in changes] for ident, changes in self._changes.items()}

    def stop(self) -> PythonTrace:
        self._stopping = True
        self._thread.join()
        self._remember_threads()
        return PythonTrace(version=f"{SOURCE} (Python {sys.version.split()[0]})", hz=self.hz,
                           samples=self.samples, errors=1 if self.error else 0, clock_error_ns=0,
                           changes=self._resolve(), idents=dict(self._idents), cpu_ns=self.cpu_ns)


__all__ = ["MAX_CHANGES_PER_THREAD", "SOURCE", "InProcessPythonSampler"]
