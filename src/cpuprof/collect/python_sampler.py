"""Python stacks read inside the profiled process, by a thread of cpuprof's, at a fixed rate.

py-spy reads the interpreter's frames from another process: every sample is dozens of
``process_vm_readv`` calls, and its process takes CPU time from the program's threads where no CPU
is spare (a 2-thread decode on 2 CPUs lost about 5 % of its tokens/s to py-spy alone). In the
process the frames are there to read: with the GIL held no thread pushes or pops one, so a thread
of cpuprof's that holds it reads every other thread's chain as it is (natively on CPython 3.11 to
3.13, see csrc/python/python_stacks.h; elsewhere through ``sys._current_frames()``). No second
process, no ptrace (which containers often refuse).

The price is the GIL. The sampler takes it once a period for the tens of microseconds a read
lasts (28 µs for a decode's 24 frames, whose caches the weights have emptied, and 44 µs more of
the sampler thread's CPU per period to sleep, wake and take the GIL back: see
benches/bench_python_read.py). A thread inside an ATen op has
released the GIL (torch's bindings drop it around every op) and does not notice; a thread running
Python gives it up at its next op call, or at ``sys.getswitchinterval()`` (5 ms), later only if a
C call holds it longer.
Reads therefore fall where the GIL was free: inside ops, or a switch interval into a stretch of
pure Python. Each is the thread's true stack at the read's time, which is what the join needs.

A read every 10 ms cannot say which Python line called the op a sample landed in, though, when the
program changes Python function every few tens of microseconds (a decode's modules): joined by time
alone, an ``aten::mm`` sample would sit under whatever module the last read saw. So where frames
are read natively, the op hook also records each op's Python caller at its begin, when it differs
from the thread's last op's (csrc/python/python_callers.h), and the sampler drains those records
at every period; the join gives samples inside ops their op's caller (and a worker's samples
inside ops the caller of the op it worked for), and the reads cover Python between ops.

Most of those reads would only see the op callers again, and each costs the thread that waits for
the GIL. So where callers are recorded, the sampler's period is kept by a native pacer
(csrc/python/python_read_pacer.h) that waits out, with the GIL released, every tick at which each
thread that runs ops began one within a switch interval (or ran too little CPU to be sampled), and
returns for a read only at a tick they do not cover, and every DRAIN_EVERY_NS at the latest (a
read of every thread, and the drain). A decode's sampler then reads about ten times a second
instead of a hundred; a stretch of pure Python, or an op longer than a switch interval, is read at
every period as before. The join gives a sample far from every read its last op's caller.

A read's stack holds until the next read's: a change seen at read i happened after read i-1, so
it is placed halfway between the two (off by at most half their distance either way, like
py-spy's), and no earlier than half a period before the tick read i was due at. The times are
CLOCK_MONOTONIC, the op timeline's clock: no alignment.
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

import numpy as np

from .python_join import PythonTrace, thread_os_ids

SOURCE = "in-process"
# A stack change kept per thread at most (about 70 bytes each, the stacks themselves interned):
# an hour at 100 Hz with a new stack at every sample. Beyond it the oldest go, which only the
# oldest samples of the timeline (the newest samples) could have needed.
MAX_CHANGES_PER_THREAD = 400_000
_PR_SET_NAME = 15
MAX_SLEEP_S = 0.05
# Op-caller changes kept per thread (16 bytes each, 32 MB at most): a decode makes a few thousand a
# second, so this is minutes of them, more than the sample timeline (the newest samples) spans at
# the default rates. Beyond it the oldest drains go; a sample older than what is kept takes the reads.
MAX_OP_CALLER_CHANGES = 2_000_000
# The op hook's caller rings are drained this often, or sooner when one is a quarter full (asked of
# the native side at every period: memory loads). A drain builds Python objects (25-30 µs a period
# in a decode, under the GIL); the rings hold 65,536 changes each, seconds of a decode's.
DRAIN_EVERY_NS = 100_000_000
DRAIN_AT_FILL = 0.25
_CALLER_RECORD = np.dtype([("ns", "<i8"), ("chain", "<u4"), ("unused", "<u4")])  # python_callers.h's

Stack = tuple[tuple[str, str, int], ...]


def _name_this_thread(name: bytes) -> None:
    """The OS name (``/proc``'s comm), which is what the profile's thread list shows."""
    try:
        ctypes.CDLL(None).prctl(_PR_SET_NAME, ctypes.c_char_p(name), 0, 0, 0)
    except (OSError, AttributeError):
        pass


class InProcessPythonSampler:
    """A daemon thread that reads every other Python thread's stack ``hz`` times a second.

    A thread's changes are keyed by its OS thread id where the native reader gives it with every
    read (a pthread ident is reused as soon as its thread ends; an OS id far less often), else by
    its pthread ident, whose OS id is looked up from threading's own list."""

    def __init__(self, hz: int) -> None:
        from .. import native

        self.hz = hz
        self._stopping = False  # read after each sleep: stop() waits at most MAX_SLEEP_S
        nat = native.load()
        # CPython 3.11 to 3.13: the frames read natively, with a table of its own (see
        # csrc/python/python_stacks.h); elsewhere through sys._current_frames(), a few times slower.
        self._reader = nat.PythonFrameReader() if nat.python_stacks_supported() else None
        self._nat = nat if self._reader is not None and nat.python_callers_supported() else None
        # Where op callers are recorded, ticks they cover are waited out without the GIL (see
        # csrc/python/python_read_pacer.h): a thread that began an op within a switch interval
        # (no read lands in a shorter stretch of Python anyway), or ran too little CPU in the
        # period for a sample (a tenth of it), needs no read.
        self._period_ns = 1_000_000_000 // hz
        self._pacer = None
        if self._nat is not None:
            self._pacer = nat.PythonReadPacer(period_ns=self._period_ns,
                                              window_ns=min(self._period_ns, int(sys.getswitchinterval() * 1e9)),
                                              min_cpu_share=0.1, fill_limit=DRAIN_AT_FILL)
        self.ticks_covered = 0  # ticks the pacer waited out: the op callers said every stack
        # The tick each read was due at and the read's time, in pairs: the join takes the reads'
        # stacks near these only. The oldest go past MAX_CHANGES_PER_THREAD reads, as the changes do.
        self._read_spans = array.array("q")
        # OS thread id -> the drained records, (op begin ns, chain id, 0) each, oldest first
        self._callers: dict[int, deque[np.ndarray]] = {}
        self._caller_count: dict[int, int] = {}
        self.op_callers_lost = 0
        self._frames: dict[tuple[str, str, int], tuple[str, str, int]] = {}
        self._stacks: dict[object, object] = {}  # interned: a stack unchanged is the same object
        self._changes: dict[int, deque[tuple[int, object]]] = {}
        self._last: dict[int, tuple[int, object]] = {}  # key -> (time of the last read, its stack)
        self._os_ids: dict[int, int] = {}  # key -> OS thread id
        self.samples = 0
        self.error: str | None = None
        self.cpu_ns = 0  # the sampler thread's CPU time, read as it ends
        self._thread = threading.Thread(target=self._run, name="cpuprof-python", daemon=True)

    def start(self) -> None:
        if self._reader is None:
            self._remember_threads()
        if self._nat is not None:
            try:
                self._nat.start_python_callers()
            except RuntimeError:  # another profile in this process records them: the reads alone
                self._nat = self._pacer = None
        try:
            self._thread.start()
        except RuntimeError:
            self._stop_callers()
            raise

    def _stop_callers(self) -> None:
        if self._nat is not None:
            self._nat.stop_python_callers()

    @property
    def native_id(self) -> int | None:
        """The sampler thread's OS id (known once start() returned)."""
        return self._thread.native_id

    def _remember_threads(self) -> None:
        self._os_ids.update(thread_os_ids())

    def _run(self) -> None:
        _name_this_thread(b"cpuprof-python")
        me = threading.get_ident()
        period_ns = self._period_ns
        read = self._read_natively if self._reader is not None else self._read_frames
        nothing: object = b"" if self._reader is not None else ()
        drained = time.monotonic_ns()
        wake = drained + period_ns
        try:
            while True:
                if self._pacer is not None:  # the covered ticks waited out natively, the GIL released
                    wake, covered, stopping = self._pacer.wait(wake, drained + DRAIN_EVERY_NS)
                    self.ticks_covered += covered
                    if stopping:
                        break
                else:
                    self._sleep_until(wake)
                    if self._stopping:
                        break
                due, now = wake, time.monotonic_ns()
                seen = set()
                for key, stack in read(me):
                    self._note(key, now, stack, due)
                    seen.add(key)
                for key in self._last.keys() - seen:  # gone, or no longer running Python: no stack
                    self._note(key, now, nothing, due)
                self.samples += 1
                self._read_spans.extend((due, now))
                if len(self._read_spans) > 2 * MAX_CHANGES_PER_THREAD + 20_000:
                    del self._read_spans[:len(self._read_spans) - 2 * MAX_CHANGES_PER_THREAD]
                if self._nat is not None and (
                    now - drained >= DRAIN_EVERY_NS or self._nat.python_callers_fill() >= DRAIN_AT_FILL
                ):
                    self._drain_callers()
                    drained = now
                wake += period_ns
                now = time.monotonic_ns()
                if wake < now:  # the GIL was held long: no burst of catch-up reads after it
                    wake = now + period_ns
        except Exception as exc:  # noqa: BLE001 - a sampler fault ends Python stacks, never the program
            self.error = f"the in-process Python sampler stopped: {type(exc).__name__}: {exc}"
            now = time.monotonic_ns()
            for key in list(self._last):  # from here on not known: no stack, not the last one read
                self._note(key, now, nothing)
        finally:
            self.cpu_ns = time.thread_time_ns()

    def _sleep_until(self, wake_ns: int) -> None:
        """A plain sleep, in slices of at most MAX_SLEEP_S so that stop() waits little at low rates:
        Event.wait cost about 40 µs of CPU more per period (a lock made each time)."""
        while not self._stopping and (left := wake_ns - time.monotonic_ns()) > 0:
            time.sleep(min(left / 1e9, MAX_SLEEP_S))

    def _read_natively(self, me: int) -> list[tuple[int, object]]:
        assert self._reader is not None
        read = []
        for _, os_id, stack in self._reader.read(me):
            self._os_ids[os_id] = os_id
            read.append((os_id, stack))
        return read

    def _read_frames(self, me: int) -> list[tuple[int, object]]:
        frame_of = self._frames
        read: list[tuple[int, object]] = []
        for ident, frame in sys._current_frames().items():
            if ident == me:
                continue
            if ident not in self._os_ids:
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

    def _drain_callers(self) -> None:
        """Moves the op hook's caller records into this sampler's arrays (a ring holds seconds)."""
        if self._nat is None:
            return
        lost = 0
        for tid, records, thread_lost in self._nat.drain_python_callers():
            lost += thread_lost
            if not records:
                continue
            chunks = self._callers.setdefault(tid, deque())
            chunk = np.frombuffer(records, dtype=_CALLER_RECORD)
            chunks.append(chunk)
            count = self._caller_count.get(tid, 0) + len(chunk)
            while count > MAX_OP_CALLER_CHANGES and len(chunks) > 1:
                count -= len(chunks.popleft())
            self._caller_count[tid] = count
        self.op_callers_lost = lost

    def _learn(self, ident: int) -> None:
        """A thread started after the sampler: its OS id while it still runs."""
        thread = threading._active.get(ident)  # type: ignore[attr-defined]  # no public lookup by ident
        if thread is not None and thread.native_id is not None:
            self._os_ids[ident] = thread.native_id

    def _note(self, key: int, now: int, stack: object, due: int | None = None) -> None:
        """A read's stack; a change since the last read is placed halfway between the two, but no
        earlier than half a period before the tick this read was due at: where the pacer skipped
        ticks between, the thread was covered by its op begins at each of them, so the change is
        likelier late than early (a guess of the same precision as the halfway one)."""
        stack = self._stacks.setdefault(stack, stack)
        last = self._last.get(key)
        if last is None:
            self._changes.setdefault(key, deque(maxlen=MAX_CHANGES_PER_THREAD)).append((now, stack))
        elif last[1] is not stack:
            due = now if due is None else min(due, now)
            self._changes[key].append((max((last[0] + now) // 2, due - self._period_ns // 2), stack))
        self._last[key] = (now, stack)

    def _resolve(self) -> dict[int, list[tuple[int, Stack]]]:
        """The stacks as (function, file, line) tuples, root first."""
        if self._reader is None:
            return {key: [(t, cast(Stack, s)) for t, s in changes] for key, changes in self._changes.items()}
        table = self._reader.frames()
        resolved: dict[object, Stack] = {}
        for packed in self._stacks:
            ids = array.array("I")
            ids.frombytes(cast(bytes, packed))
            resolved[packed] = tuple(table[i] for i in ids)
        return {key: [(t, resolved[s]) for t, s in changes] for key, changes in self._changes.items()}

    def _resolve_callers(self) -> tuple[dict[int, tuple[np.ndarray, np.ndarray]], list[Stack | None]]:
        """Each thread's op-caller changes as (op begin ns, chain id) arrays, and the chains by id
        (None for id 0, "not known from here on", and for a chain with no Python frame)."""
        if self._nat is None:
            return {}, [None]
        chains: list[Stack | None] = [None]
        chains += [tuple(tuple(frame) for frame in chain) or None for chain in self._nat.python_caller_chains(1)]
        changes = {}
        for tid, chunks in self._callers.items():
            records = np.concatenate(list(chunks))
            changes[tid] = (records["ns"].astype(np.int64), records["chain"].astype(np.int64))
        return changes, chains

    def stop(self) -> PythonTrace:
        """Called once the native session has stopped, so that no op hook runs any more and the
        last drain of op callers is complete."""
        self._stopping = True
        if self._pacer is not None:
            self._pacer.stop()
        try:
            self._thread.join()
            self._stop_callers()
            self._drain_callers()
            op_callers, chains = self._resolve_callers()
        finally:
            if self._nat is not None and self._thread.is_alive():
                # Interrupted while the sampler thread still runs: its pacer may be reading the
                # callers' records with the GIL released, so they are stopped and left, not freed
                # (later profiles in this process then go without op callers).
                self._nat.stop_python_callers()
            elif self._nat is not None:  # even when interrupted: else no later profile could record them
                self._nat.release_python_callers()
        if self._reader is None:
            self._remember_threads()
        changes = self._resolve()
        self._reader = None  # its table, and the code objects it keeps alive, go with it
        return PythonTrace(version=f"{SOURCE} (Python {sys.version.split()[0]})", hz=self.hz,
                           samples=self.samples, errors=1 if self.error else 0, clock_error_ns=0,
                           changes=changes, idents=dict(self._os_ids), cpu_ns=self.cpu_ns, stopped=self.error,
                           op_callers=op_callers, op_caller_chains=chains, op_callers_lost=self.op_callers_lost,
                           read_spans=np.frombuffer(self._read_spans, dtype=np.int64).reshape(-1, 2).copy(),
                           ticks_covered=self.ticks_covered)


__all__ = ["MAX_CHANGES_PER_THREAD", "MAX_OP_CALLER_CHANGES", "SOURCE", "InProcessPythonSampler"]
