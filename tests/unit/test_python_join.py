"""The join of Python stacks to samples (collect/python_join.py), on a hand-built profile whose
answer is known sample by sample: inside an op a sample takes the caller the op hook recorded at
that op's begin; outside ops, inside a region only, or where the op hook's record has a gap, it
takes the sampler's read; a worker takes the caller of the op its one dispatching thread ran."""

from __future__ import annotations

from collections import Counter

import numpy as np
from profiles import MS, make_profile

from cpuprof.collect.python_join import PythonTrace, join
from cpuprof.model import NativeFrame, SampleTimeline, Sampling, StackCount, Stacks, ThreadStat

CALLER = (("main", "app.py", 3), ("Model.forward", "model.py", 40), ("Linear.forward", "linear.py", 12))
LATER_CALLER = (("main", "app.py", 3), ("Model.forward", "model.py", 41), ("Norm.forward", "norm.py", 7))
READ = (("main", "app.py", 3), ("tokenize", "app.py", 9))

MM, REGION, OUTSIDE = 5, 6, 1
IN_MM_PATH, REGION_PATH, NO_PATH = 1, 2, 0


def profile_with(samples: list[tuple[int, int, int, int]]):
    """(time ms, thread, path, op) samples, one native stack; a count per (thread, path, op)."""
    p = make_profile("sampled")
    p.sampling = Sampling(hz=100, stack_bytes=8192, samples=len(samples), lost=0)
    keys = sorted({(thread, path, op) for _, thread, path, op in samples})
    counts = [StackCount(stack=1, path=path, thread=thread, op=op,
                         samples=sum(1 for s in samples if s[1:] == (thread, path, op)), cpu_ns=0)
              for thread, path, op in keys]
    p.stacks = Stacks(frames=[NativeFrame("gemm", "libx.so", "compute")], stacks=[[], [0]],
                      paths=[[], [REGION, MM], [REGION]], counts=counts,
                      timeline=SampleTimeline(time_ns=[t * MS for t, *_ in samples], thread=[s[1] for s in samples],
                                              op=[s[3] for s in samples], stack=[1] * len(samples),
                                              cpu_us=[10_000] * len(samples), path=[s[2] for s in samples]))
    return p, {key: k for k, key in enumerate(keys)}


def python_of(p, count: int) -> list[tuple[tuple[str, str, int], ...]]:
    stacks = p.stacks
    out = []
    for split in stacks.python_splits:
        if split.count == count:
            frames = tuple((f.function, f.file, f.line) for f in
                           (stacks.python_frames[i] for i in reversed(stacks.python_stacks[split.stack])))
            out += [frames] * split.samples
    return out


def trace(changes: list[tuple[int, tuple | None]]) -> PythonTrace:
    """The op hook's records of thread tid 10: (ms, stack or None for a gap) per change."""
    chains: list = [None]
    ids = []
    for _, stack in changes:
        if stack is None:
            ids.append(0)
        else:
            if stack not in chains:
                chains.append(stack)
            ids.append(chains.index(stack))
    op_callers = {10: (np.array([ms * MS for ms, _ in changes], dtype=np.int64), np.array(ids, dtype=np.int64))}
    return PythonTrace(version="in-process (test)", hz=100, samples=10, errors=0, clock_error_ns=0,
                       changes={77: [(0, READ)]}, idents={77: 10}, cpu_ns=1, op_callers=op_callers,
                       op_caller_chains=chains)


def test_inside_an_op_the_ops_recorded_caller_elsewhere_the_read():
    # thread 0 dispatches (tid 10), thread 1 is its worker
    samples = [(10, 0, IN_MM_PATH, MM), (20, 0, IN_MM_PATH, MM), (30, 0, NO_PATH, OUTSIDE),
               (40, 0, REGION_PATH, REGION), (50, 0, IN_MM_PATH, MM), (60, 1, IN_MM_PATH, MM)]
    p, count = profile_with(samples)
    join(p, trace([(5, CALLER), (45, LATER_CALLER)]))
    assert python_of(p, count[(0, IN_MM_PATH, MM)]) == [CALLER, CALLER, LATER_CALLER]
    assert python_of(p, count[(0, NO_PATH, OUTSIDE)]) == [READ]  # Python between ops: the read
    assert python_of(p, count[(0, REGION_PATH, REGION)]) == [READ]  # Python inside a region, no op
    # the worker: the caller of the op its dispatching thread ran at the time
    assert python_of(p, count[(1, IN_MM_PATH, MM)]) == [LATER_CALLER]
    info = p.sampling.python
    assert (info.joined, info.unmatched, info.op_callers, info.op_caller_changes) == (5, 0, 3, 2)
    assert info.workers_joined == 1


def test_with_two_dispatching_threads_a_worker_takes_no_callers():
    """Which of two dispatching threads that run Python a worker's sample worked for, the join
    does not tell."""
    samples = [(10, 0, IN_MM_PATH, MM), (20, 1, IN_MM_PATH, MM), (30, 2, IN_MM_PATH, MM)]
    p, count = profile_with(samples)
    p.threads[1].role = "dispatch"  # a second dispatching thread (tid 11) that runs Python: read, no callers
    p.threads.append(ThreadStat(tid=13, name="worker", role="worker", counters={}))
    both = trace([(5, CALLER)])
    both.idents[78], both.changes[78] = 11, [(0, READ)]
    join(p, both)
    assert python_of(p, count[(0, IN_MM_PATH, MM)]) == [CALLER]
    assert python_of(p, count[(1, IN_MM_PATH, MM)]) == [READ]
    assert python_of(p, count[(2, IN_MM_PATH, MM)]) == []  # the worker: not joined at all
    assert p.sampling.python.workers_joined == 0


def test_a_dispatching_thread_that_runs_no_python_does_not_stop_the_workers_join():
    """An OpenMP worker that ran an op of its own is a dispatching thread, with no Python: the one
    that runs Python is still the one the workers work for."""
    samples = [(10, 0, IN_MM_PATH, MM), (20, 1, IN_MM_PATH, MM), (30, 2, IN_MM_PATH, MM)]
    p, count = profile_with(samples)
    p.threads[1].role = "dispatch"  # tid 11: neither read nor recorded, so no Python
    p.threads.append(ThreadStat(tid=13, name="worker", role="worker", counters={}))
    join(p, trace([(5, CALLER)]))
    assert python_of(p, count[(2, IN_MM_PATH, MM)]) == [CALLER]
    assert p.sampling.python.workers_joined == 1


def test_a_python_thread_that_runs_no_ops_is_not_a_follower():
    """A Python thread the sampler reads (a tokenizer, a queue) that ran no op is a worker by role,
    and its samples are charged to the op that ran meanwhile, but it was running its own Python."""
    samples = [(10, 0, IN_MM_PATH, MM), (20, 1, IN_MM_PATH, MM)]
    p, count = profile_with(samples)
    with_reader = trace([(5, CALLER)])
    with_reader.idents[79] = 11
    join(p, with_reader)
    assert python_of(p, count[(1, IN_MM_PATH, MM)]) == []
    assert p.sampling.python.workers_joined == 0


def test_a_workers_sample_outside_ops_has_no_python_frames():
    samples = [(10, 0, IN_MM_PATH, MM), (20, 1, NO_PATH, OUTSIDE), (30, 1, IN_MM_PATH, MM)]
    p, count = profile_with(samples)
    join(p, trace([(5, CALLER)]))
    assert python_of(p, count[(1, NO_PATH, OUTSIDE)]) == [()]
    assert python_of(p, count[(1, IN_MM_PATH, MM)]) == [CALLER]


def test_a_gap_in_the_op_hooks_record_falls_back_to_the_read():
    samples = [(10, 0, IN_MM_PATH, MM), (20, 0, IN_MM_PATH, MM), (30, 0, IN_MM_PATH, MM)]
    p, count = profile_with(samples)
    # the ring was full from 15 ms (a gap: None) until a change recorded at 25 ms
    join(p, trace([(5, CALLER), (15, None), (25, LATER_CALLER)]))
    assert python_of(p, count[(0, IN_MM_PATH, MM)]) == [CALLER, READ, LATER_CALLER]
    assert p.sampling.python.op_callers == 2
    assert p.sampling.python.op_caller_changes == 2  # the gap is not a change of caller


def test_a_sample_before_the_first_recorded_caller_takes_the_read():
    p, count = profile_with([(10, 0, IN_MM_PATH, MM), (30, 0, IN_MM_PATH, MM)])
    join(p, trace([(20, CALLER)]))
    assert python_of(p, count[(0, IN_MM_PATH, MM)]) == [READ, CALLER]


def test_a_sample_between_ops_far_from_every_read_takes_its_last_ops_caller():
    """Where the in-process sampler's pacer skipped reads (its thread was beginning ops), a sample
    between ops takes the caller of the thread's last op; near a read's span, from the tick it was
    due at to the read, it takes the read as before. Reads every 10 ms (100 Hz) are due at 3 ms and
    read at once, and due at 60 ms and read at 80 (the GIL held in between)."""
    samples = [(20, 0, NO_PATH, OUTSIDE), (12, 0, NO_PATH, OUTSIDE), (45, 0, NO_PATH, OUTSIDE),
               (55, 0, NO_PATH, OUTSIDE), (70, 0, NO_PATH, OUTSIDE), (95, 0, NO_PATH, OUTSIDE)]
    samples.sort()
    p, count = profile_with(samples)
    paced = trace([(5, CALLER), (30, LATER_CALLER)])
    paced.read_spans = np.array([[3 * MS, 3 * MS], [60 * MS, 80 * MS]], dtype=np.int64)
    paced.ticks_covered = 7
    join(p, paced)
    # 12: within a period of the first read; 20: 17 ms after it, so the last op's (at 5 ms) caller;
    # 45: 15 ms before the second read was due, so the caller of the op at 30 ms; 55 and 70: within
    # a period of the second read's span; 95: 15 ms after it, the op at 30 ms's caller again
    assert Counter(python_of(p, count[(0, NO_PATH, OUTSIDE)])) == Counter({READ: 3, CALLER: 1, LATER_CALLER: 2})
    info = p.sampling.python
    assert (info.op_callers, info.op_callers_between, info.joined, info.ticks_covered) == (0, 3, 6, 7)


def test_with_no_read_at_all_between_ops_samples_take_the_last_ops_caller_or_the_read_before_the_first_op():
    p, count = profile_with([(10, 0, NO_PATH, OUTSIDE), (30, 0, NO_PATH, OUTSIDE)])
    paced = trace([(20, CALLER)])
    paced.read_spans = np.zeros((0, 2), dtype=np.int64)
    join(p, paced)
    # before the thread's first op there is no caller, and the read (none near) is what is left
    assert Counter(python_of(p, count[(0, NO_PATH, OUTSIDE)])) == Counter({READ: 1, CALLER: 1})
    assert p.sampling.python.op_callers_between == 1


def test_a_sampler_that_read_every_period_keeps_the_reads_between_ops():
    """py-spy's trace, or the in-process sampler's without a pacer: no read spans, reads between ops."""
    p, count = profile_with([(30, 0, NO_PATH, OUTSIDE)])
    join(p, trace([(5, CALLER)]))
    assert python_of(p, count[(0, NO_PATH, OUTSIDE)]) == [READ]
    assert p.sampling.python.op_callers_between == 0


def test_a_read_after_skipped_periods_reaches_back_only_as_far_as_its_change_is_placed():
    """The sampler places a change a read saw no earlier than half a period before the tick it was
    due at; before that, the read's stack is the one of a read up to 100 ms older, and a sample
    between ops there takes the fresher caller of its thread's last op."""
    p, count = profile_with([(92, 0, NO_PATH, OUTSIDE), (97, 0, NO_PATH, OUTSIDE)])
    paced = trace([(5, CALLER), (50, LATER_CALLER)])
    paced.read_spans = np.array([[0, 0], [100 * MS, 100 * MS]], dtype=np.int64)
    join(p, paced)
    assert Counter(python_of(p, count[(0, NO_PATH, OUTSIDE)])) == Counter({LATER_CALLER: 1, READ: 1})


def test_after_a_sampler_fault_samples_between_ops_keep_no_python_frames():
    """Past the last read of a sampler that stopped, nothing says whether the thread still ran
    ops: a sample between ops there has no Python frames, as before the pacer; inside ops the
    recorded callers still hold."""
    samples = [(30, 0, NO_PATH, OUTSIDE), (60, 0, NO_PATH, OUTSIDE), (70, 0, IN_MM_PATH, MM)]
    p, count = profile_with(samples)
    faulted = trace([(5, CALLER)])
    faulted.changes = {77: [(0, READ), (45 * MS, ())]}  # the stack read last, then none from the fault on
    faulted.read_spans = np.array([[40 * MS, 40 * MS]], dtype=np.int64)
    faulted.stopped = "the in-process Python sampler stopped: RuntimeError: injected fault"
    join(p, faulted)
    # 30: 10 ms before the read was due, past its reach: the last op's caller
    assert Counter(python_of(p, count[(0, NO_PATH, OUTSIDE)])) == Counter({CALLER: 1, (): 1})
    assert python_of(p, count[(0, IN_MM_PATH, MM)]) == [CALLER]
    assert p.sampling.python.unmatched == 1
