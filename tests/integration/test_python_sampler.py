"""The in-process Python sampler against programs whose stacks are known at every moment: a
stretch of pure Python (no op releases the GIL, so the sampler must get it from the interpreter's
switch interval), a stretch of ops, a thread started after the sampler, a fault in the sampler,
and what it costs, as the kernel accounts its thread.

Where py-spy and the in-process sampler must agree (Python frames above the ops they called), the
known-answer test is test_stacks.py's, run with each sampler."""

from __future__ import annotations

import array
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from cpuprof.collect.python_sampler import InProcessPythonSampler
from cpuprof.model import Profile

HZ = 200


def pure_python_spin(seconds: float) -> None:
    """Holds the GIL the whole time: no call here releases it."""
    end = time.monotonic() + seconds
    n = 0
    while time.monotonic() < end:
        n += 1


def sleeper(seconds: float) -> None:
    time.sleep(seconds)


def phase_of(t: int, phases: list[tuple[str, int, int]]) -> str | None:
    for name, begin, end in phases:
        if begin <= t < end:
            return name
    return None


def stack_at(changes: list[tuple[int, tuple]], t: int) -> tuple:
    held: tuple = ()
    for when, stack in changes:
        if when > t:
            break
        held = stack
    return held


def make_sampler(reader: str) -> InProcessPythonSampler:
    """The sampler with its native reader, or made to walk sys._current_frames() (the reader of
    Pythons the native one does not know)."""
    sampler = InProcessPythonSampler(HZ)
    if reader == "frames":
        sampler._reader = None
    elif sampler._reader is None:
        pytest.skip(f"no native frame reader for Python {sys.version.split()[0]}")
    return sampler


@pytest.mark.parametrize("reader", ["native", "frames"])
def test_each_read_is_the_threads_stack_at_its_time_even_in_pure_python(reader: str):
    sampler = make_sampler(reader)
    sampler.start()
    while sampler.samples < 1:  # a thread's first stack is placed at the first read, not before it
        time.sleep(0.001)
    t0 = time.monotonic_ns()
    pure_python_spin(0.4)
    t1 = time.monotonic_ns()
    sleeper(0.3)  # the GIL released: read at once, every period
    t2 = time.monotonic_ns()
    trace = sampler.stop()
    phases = [("pure_python_spin", t0, t1), ("sleeper", t1, t2)]
    me = next(key for key, os_id in trace.idents.items() if os_id == threading.get_native_id())
    assert trace.clock_error_ns == 0 and trace.errors == 0 and sampler.error is None
    changes = trace.changes[me]
    # Every moment of each phase, but a switch interval and two periods at either end (a change is
    # placed halfway between the read that saw it and the one before, and in pure Python reads
    # come a switch interval apart), holds a stack with that phase's function innermost and this
    # test's function under it.
    late = int(sys.getswitchinterval() * 1e9) + 2 * 10**9 // HZ
    for name, begin, end in phases:
        for t in range(begin + late, end - late, 10**9 // HZ // 3):
            stack = stack_at(changes, t)
            names = [f[0] for f in stack]
            assert names and names[-1] == name, (name, (t - begin) / 1e6, names[-3:])
            assert "test_each_read_is_the_threads_stack_at_its_time_even_in_pure_python" in names
            file, line = stack[-1][1], stack[-1][2]
            assert file == __file__ and line > 0
    # At most a read a period; in the spin one a period and a switch interval at best (the GIL is
    # handed over at the interval), in the sleep one a period.
    spin, sleep = (t1 - t0) / 1e9, (t2 - t1) / 1e9
    at_best = spin / (1 / HZ + sys.getswitchinterval()) + sleep * HZ
    assert 0.3 * at_best <= trace.samples <= (spin + sleep) * HZ * 1.1 + 3, (trace.samples, at_best)


class Walker:
    def method(self, depth: int, ready: threading.Event, done: threading.Event, through_generator: bool) -> None:
        def inner(n: int) -> None:
            if n:
                return inner(n - 1)
            ready.set()
            done.wait()
        if through_generator:
            next(inner(depth) for _ in range(1))
        else:
            inner(depth)


def test_the_native_read_is_the_interpreters_own_stack():
    """Every thread's frames as CPython itself gives them (sys._current_frames(), f_back,
    f_lineno): a method, a closure recursing, threading's own frames; and through a generator,
    whose frame object's f_back CPython 3.11 leaves empty while the chain goes on to its caller."""
    from cpuprof import native

    nat = native.load()
    if not nat.python_stacks_supported():
        pytest.skip(f"no native frame reader for Python {sys.version.split()[0]} (3.11 to 3.13 have one)")
    reader = nat.PythonFrameReader()
    done = threading.Event()
    threads = []
    for through_generator in (False, True):
        ready = threading.Event()
        thread = threading.Thread(target=Walker().method, args=(30, ready, done, through_generator))
        thread.start()
        ready.wait(10)
        threads.append(thread)
    try:
        me = threading.get_ident()
        read = {ident: (native_id, stack) for ident, native_id, stack in reader.read(me)}
        table = reader.frames()
        expected = []  # read while the thread still waits: a frame object is a live view
        f = sys._current_frames()[threads[0].ident]
        while f is not None:
            expected.append((f.f_code.co_qualname, f.f_code.co_filename, f.f_lineno))
            f = f.f_back
        expected.reverse()
    finally:
        done.set()
        for thread in threads:
            thread.join()
    assert me not in read

    def stack_of(thread: threading.Thread) -> list[tuple[str, str, int]]:
        native_id, packed = read[thread.ident]
        assert native_id == thread.native_id
        ids = array.array("I")
        ids.frombytes(packed)
        return [table[i] for i in ids]

    plain = stack_of(threads[0])
    assert plain == expected
    assert [name for name, _, _ in plain].count("Walker.method.<locals>.inner") == 31
    names = [name for name, _, _ in stack_of(threads[1])]
    assert names[0] == "Thread._bootstrap" and names[-2:] == ["Event.wait", "Condition.wait"]
    at = names.index("Walker.method")
    assert names[at + 1] == "Walker.method.<locals>.<genexpr>"
    assert names[at + 2:at + 33] == ["Walker.method.<locals>.inner"] * 31
    # another reader has a table of its own
    assert nat.PythonFrameReader().frames() == [("(frame table full)", "", 0)]
    assert len(reader.frames()) == len(table) and reader.frames(1) == table[1:]


@pytest.mark.parametrize("reader", ["native", "frames"])
def test_a_thread_started_after_the_sampler_is_named_by_its_os_id(reader: str):
    sampler = make_sampler(reader)
    sampler.start()
    ids: dict[str, int] = {}

    def late_thread() -> None:
        ids["native"] = threading.get_native_id()
        sleeper(0.2)

    t = threading.Thread(target=late_thread)
    t.start()
    t.join()
    time.sleep(0.05)  # reads after its end
    trace = sampler.stop()
    key = next(key for key, os_id in trace.idents.items() if os_id == ids["native"])
    changes = trace.changes[key]
    assert any(stack and stack[-1][0] == "sleeper" for _, stack in changes)
    assert changes[-1][1] == ()  # gone: no stack from then on
    # the sampler never reads itself
    assert sampler._thread.ident not in trace.changes and sampler.native_id not in trace.changes
    assert not any(name == "InProcessPythonSampler._run" for changes in trace.changes.values()
                   for _, stack in changes for name, _, _ in stack)


def paced_profile(every_tick: bool, work) -> tuple:  # noqa: ANN001
    """The Python frames of a profile of `work` at HZ, read with the pacer or at every period."""
    import cpuprof
    from cpuprof import native

    nat = native.load()
    if not nat.python_callers_supported():
        pytest.skip(f"no op callers for Python {sys.version.split()[0]} (3.11 to 3.13 record them): no pacer")
    nat.testing.inject_python_reads_every_tick(every_tick)
    try:
        with cpuprof.profile("task-clock", python_stacks=True, python_hz=HZ, warn=False) as prof:
            work()
    finally:
        nat.testing.inject_python_reads_every_tick(False)
    py = prof.profile.sampling.python
    assert py is not None and py.error is None, py
    return py, prof.profile.collection.wall_ns * HZ / 1e9


def ops_for(seconds: float) -> None:
    import torch

    x = torch.ones(4)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        torch.add(x, x)


@pytest.mark.parametrize("every_tick", [False, True], ids=["paced", "every-tick"])
def test_a_thread_beginning_ops_is_not_read_but_every_100_ms(every_tick: bool):
    """A thread that begins an op every few microseconds: its Python is its ops' callers, so the pacer
    reads only at its deadline (every 100 ms: DRAIN_EVERY_NS); the control reads at every period."""
    from cpuprof.collect.python_sampler import DRAIN_EVERY_NS

    py, periods = paced_profile(every_tick, lambda: ops_for(1.0))
    if every_tick:
        assert py.ticks_covered == 0 and py.samples >= 0.5 * periods, (py.samples, periods)
        return
    deadlines = periods / HZ * 1e9 / DRAIN_EVERY_NS
    # a tick is read where the thread was off its CPU over the window yet ran a tenth of the time
    # since its clock was last read (a loaded machine), so more than the deadlines; the control
    # reads at least half the periods
    assert 0.5 * deadlines <= py.samples <= deadlines + 0.3 * periods, (py.samples, deadlines, periods)
    assert py.samples + py.ticks_covered >= 0.5 * periods, (py.samples, py.ticks_covered, periods)


@pytest.mark.parametrize("every_tick", [False, True], ids=["paced", "every-tick"])
def test_a_thread_that_ran_ops_and_now_sleeps_is_not_read_but_every_100_ms(every_tick: bool):
    """Asleep, a thread runs too little CPU in a period (under a tenth) for a sample to land in its
    Python, so its stack need not be read at every period."""
    from cpuprof.collect.python_sampler import DRAIN_EVERY_NS

    def work() -> None:
        ops_for(0.05)
        sleeper(1.0)

    py, periods = paced_profile(every_tick, work)
    if every_tick:
        assert py.ticks_covered == 0 and py.samples >= 0.5 * periods, (py.samples, periods)
        return
    deadlines = periods / HZ * 1e9 / DRAIN_EVERY_NS
    assert py.samples <= deadlines + 0.3 * periods and py.ticks_covered >= 0.5 * periods, (py, periods)


@pytest.mark.parametrize("every_tick", [False, True], ids=["paced", "every-tick"])
def test_a_thread_that_ran_ops_and_now_runs_pure_python_is_read_every_period(every_tick: bool):
    """Past a switch interval without an op begin, a thread running Python is read at each period as
    without the pacer (one a switch interval after each read, the interpreter's GIL hand-over)."""
    def work() -> None:
        ops_for(0.05)
        pure_python_spin(1.0)

    py, periods = paced_profile(every_tick, work)
    at_best = 1.0 / (1 / HZ + sys.getswitchinterval())
    assert py.samples >= 0.3 * at_best, (py.samples, at_best, py.ticks_covered)
    assert py.ticks_covered <= 0.1 * periods, (py.ticks_covered, periods)


SCRIPT = textwrap.dedent("""
    import sys, time, torch, cpuprof
    from cpuprof.collect import python_sampler

    torch.set_num_threads(2)
    a = torch.randn(256, 256)
    fail_after = int(sys.argv[2])
    if fail_after:  # the reader fails from its (fail_after + 1)th read on, whichever reader it is
        sampler = python_sampler.InProcessPythonSampler
        real_native, real_frames, calls = sampler._read_natively, sampler._read_frames, [0]
        def failing(real):
            def read(self, me):
                calls[0] += 1
                if calls[0] > fail_after:
                    raise RuntimeError("injected fault")
                return real(self, me)
            return read
        sampler._read_natively, sampler._read_frames = failing(real_native), failing(real_frames)

    # Each stretch lasts 0.4 s of the main thread's CPU time, however much of a CPU it gets.
    def pure_python_stretch():
        end = time.thread_time() + 0.4
        while time.thread_time() < end:
            pass

    def op_caller():
        end = time.thread_time() + 0.4
        while time.thread_time() < end:
            torch.mm(a, a)

    with cpuprof.profile("task-clock", timeline=2000, python_stacks=True, python_hz=200, sample_hz=1000) as prof:
        op_caller()
        pure_python_stretch()
        op_caller()
    prof.export(sys.argv[1])
""")


def run(out: Path, fail_after: int = 0) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", SCRIPT, str(out), str(fail_after)], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "OMP_NUM_THREADS": "2"})


@pytest.fixture(scope="module")
def stretches(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("stretches")
    result = run(out)
    assert result.returncode == 0, result.stderr
    assert "no Python stacks" not in result.stderr, result.stderr
    return out


def test_samples_between_ops_carry_the_pure_python_function_that_ran(stretches: Path):
    from cpuprof.analysis.flame import merged_stacks

    profile = Profile.load(stretches)
    py = profile.sampling.python
    assert py.source.startswith("in-process (Python ") and py.error is None
    assert py.cpu_ns is not None and py.cpu_ns > 0
    assert py.joined > 0.9 * (py.joined + py.unmatched)
    by_function: dict[str, float] = {"pure_python_stretch": 0.0, "op_caller": 0.0}
    mm_total = mm_under = misplaced = 0.0
    for s in merged_stacks(profile):
        if "dispatch" not in s.frames[0].name:
            continue
        python = [f.name.split(" ")[0] for f in s.frames if f.kind == "python"]
        ops = [f.name for f in s.frames if f.kind == "op"]
        for name in by_function:
            if name in python:
                by_function[name] += s.weight
        if "aten::mm" in ops:
            mm_total += s.weight
            mm_under += s.weight if "op_caller" in python else 0.0
        if "pure_python_stretch" in python and ops:
            misplaced += s.weight
    # 0.4 s of pure Python at 1 kHz of the thread's CPU: hundreds of samples, nearly all named.
    assert by_function["pure_python_stretch"] >= 200, by_function
    assert mm_total >= 200 and mm_under >= 0.95 * mm_total, (mm_under, mm_total)
    # No op ran in the pure-Python stretch: an op's sample under it is one from either edge, where
    # the change is placed halfway between two reads up to a switch interval apart (~1 % here).
    assert misplaced <= 0.05 * mm_total, (misplaced, mm_total)
    # The sampler's thread is cpuprof's, like the collector: not profiled (it ran beside the ops and
    # would count as their worker), its CPU in the overhead line instead. The team is T0 and its
    # one OpenMP worker.
    assert not any(t.name == "cpuprof-python" for t in profile.threads), [t.name for t in profile.threads]
    assert len([t for t in profile.threads if t.role == "worker"]) <= 1, [(t.name, t.role) for t in profile.threads]


def test_a_sampler_fault_is_one_line_and_keeps_what_it_read(tmp_path: Path):
    result = run(tmp_path, fail_after=20)
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stderr.splitlines() if "Python stacks" in line]
    assert len(lines) == 1 and "Python stacks incomplete" in lines[0] and "injected fault" in lines[0], result.stderr
    assert "Traceback" not in result.stderr
    profile = Profile.load(tmp_path)
    py = profile.sampling.python
    # the reads before the fault (at the pacer's deadlines in the first op_caller, at every period
    # in the pure-Python stretch) and the op callers still name what ran
    assert py.samples == 20 and py.errors == 1 and py.joined > 0
    assert "injected fault" in py.stopped
    out = subprocess.run([sys.executable, "-m", "cpuprof", "report", str(tmp_path), "--format", "markdown"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "the Python sampler stopped before the profile did" in out.stdout, out.stderr
    assert any(op.name == "aten::mm" for op in profile.ops)
