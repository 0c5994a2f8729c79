"""The native core with real perf_event_open counters, real threads and real ATen ops."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable

import pytest
import torch

import cpuprof
from cpuprof import _test_utils as workloads
from cpuprof import native
from cpuprof.errors import NativeModuleError
from cpuprof.machine import capabilities

SOFTWARE = ["task-clock", "context-switches", "cpu-migrations", "page-faults"]
nat = native.load()


def region_op(profile: cpuprof.Profile, name: str) -> cpuprof.model.OpStat:
    matches = [op for op in profile.ops if op.kind == "region" and op.name == name]
    assert len(matches) == 1, [op.name for op in profile.ops if op.kind == "region"]
    return matches[0]


def own_slot(profile: cpuprof.Profile) -> int:
    tid = threading.get_native_id()
    return next(i for i, t in enumerate(profile.threads) if t.tid == tid)


@pytest.fixture(autouse=True)
def clean_injection():
    yield
    nat.testing.inject_open_errno(0, 0)
    nat.testing.inject_running_fraction(0.0)


def test_task_clock_of_busy_loop_matches_cpu_time():
    with cpuprof.profile(SOFTWARE, mode="exact", warn=False) as prof:
        with cpuprof.region("spin"):
            before = time.thread_time_ns()
            workloads.spin_for_ns(200_000_000)
            cpu = time.thread_time_ns() - before
    spin = region_op(prof.profile, "spin")
    counted = spin.counters_incl["task-clock"][own_slot(prof.profile)]
    assert counted == pytest.approx(cpu, rel=0.05)


def test_page_faults_of_fresh_pages_at_least_their_number():
    pages = 2000
    with cpuprof.profile(SOFTWARE, mode="exact", warn=False) as prof:
        with cpuprof.region("touch"):
            workloads.touch_fresh_pages(pages)
    touch = region_op(prof.profile, "touch")
    assert sum(touch.counters_incl["page-faults"]) >= pages


def test_context_switches_of_sleeping_loop_positive():
    with cpuprof.profile(SOFTWARE, mode="exact", warn=False) as prof:
        with cpuprof.region("sleep"):
            for _ in range(5):
                time.sleep(0.005)
    sleep = region_op(prof.profile, "sleep")
    assert sleep.counters_incl["context-switches"][own_slot(prof.profile)] >= 5


@pytest.mark.parametrize("mode", ["exact", "sampled"])
def test_op_on_two_openmp_threads_counts_both(mode):
    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        a = torch.randn(768, 768)
        a @ a  # the OpenMP team exists and has worked before the session starts
        with cpuprof.profile(SOFTWARE, mode=mode, warn=False) as prof:
            for _ in range(40 if mode == "sampled" else 5):
                a @ a
    finally:
        torch.set_num_threads(previous)
    mm = [op for op in prof.profile.ops if op.name == "aten::mm"]
    assert mm, "aten::mm was not seen"
    busy = [ns for ns in mm[0].counters_self["task-clock"] if ns > 0]
    assert len(busy) >= 2, mm[0].counters_self["task-clock"]
    roles = {t.role for t in prof.profile.threads}
    assert {"dispatch", "worker"} <= roles


def steal_ns() -> int:
    """Time the hypervisor ran something else on this machine's vCPUs (all of them; /proc/stat's
    steal column, in clock ticks)."""
    with open("/proc/stat") as f:
        fields = f.readline().split()
    return int(fields[8]) * 1_000_000_000 // os.sysconf("SC_CLK_TCK") if len(fields) > 8 else 0


def test_sum_of_op_cpu_time_matches_process_cpu_time():
    """Sampled mode charges every thread's CPU time to an op or to '[outside ATen ops]'."""
    from cpuprof.workload import build_model, run_decode
    from cpuprof.workload.presets import resolve_config

    cfg = resolve_config("tiny", {"layers": 4, "hidden": 256, "heads": 8, "kv_heads": 4, "ffn": 1024})
    model = build_model(cfg, torch.float32)

    def process_cpu_ns() -> int:
        return time.process_time_ns()  # CLOCK_PROCESS_CPUTIME_ID: every thread, to the nanosecond

    run_decode(model, cfg, prompt_len=8, new_tokens=4, warmup=1)
    prof = cpuprof.profile(SOFTWARE, mode="sampled", sample_hz=1000, warn=False)
    before, steal_before = process_cpu_ns(), steal_ns()
    prof.start()
    deadline = time.monotonic() + 1.5
    while time.monotonic() < deadline:
        run_decode(model, cfg, prompt_len=16, new_tokens=40, warmup=1)
    nat.stop()  # the session alone: the process CPU below leaves out building the profile
    spent_in_session, stolen = process_cpu_ns() - before, steal_ns() - steal_before
    profile = prof.stop()
    spent = spent_in_session - profile.overhead.discovery_cpu_ns
    charged = sum(op.self_total("task-clock") or 0 for op in profile.ops)
    # task-clock runs on while the hypervisor has taken the vCPU away (steal time), which the
    # kernel's CPU time leaves out: at most the machine's steal over the run lies between them
    assert spent * 0.95 <= charged <= spent * 1.05 + stolen, (charged, spent, stolen)
    # The books balance exactly: ops, "[outside ATen ops]" and cpuprof's callbacks are the threads'
    # totals; and those agree with the kernel's own accounting of each thread (schedstat).
    totals = sum(t.cpu_ns or 0 for t in profile.threads)
    assert totals == pytest.approx(charged, rel=0.001)
    sched = sum(t.sched_cpu_ns or 0 for t in profile.threads)
    assert sched * 0.98 <= totals <= sched * 1.02 + stolen, (totals, sched, stolen)


def test_thread_started_after_profiling_is_counted():
    spent = {}

    def spin() -> None:
        before = time.thread_time_ns()
        workloads.spin_for_ns(300_000_000)
        spent["cpu"] = time.thread_time_ns() - before

    with cpuprof.profile(SOFTWARE, warn=False) as prof:
        worker = threading.Thread(target=spin)
        worker.start()
        tid = worker.native_id
        worker.join()
    thread = next(t for t in prof.profile.threads if t.tid == tid)
    # Found by the collector's next pass: only the CPU time before that is missed, a few periods at
    # most on a loaded machine.
    missed_at_most = 4 * native.load().collect_interval_us() * 1000
    assert spent["cpu"] - missed_at_most < thread.cpu_ns <= spent["cpu"] * 1.02


def test_self_and_inclusive_time_nest():
    with cpuprof.profile(SOFTWARE, mode="exact", warn=False) as prof:
        a = torch.randn(64, 64)
        with cpuprof.region("outer"):
            with cpuprof.region("inner"):
                for _ in range(10):
                    torch.matmul(a, a)
    ops = {(op.name, tuple(op.region)): op for op in prof.profile.ops}
    matmul = ops[("aten::matmul", ("outer", "inner"))]
    mm = ops[("aten::mm", ("outer", "inner"))]
    assert matmul.calls == mm.calls == 10
    assert matmul.incl_ns >= mm.incl_ns
    assert matmul.self_ns <= matmul.incl_ns - mm.incl_ns + 1000
    for op in prof.profile.ops:
        assert op.self_ns <= op.incl_ns
    inner = region_op(prof.profile, "inner")
    assert inner.region == ["outer"]


def test_op_table_and_span_ring_are_bounded():
    with cpuprof.profile(SOFTWARE, op_capacity=16, timeline=100, warn=False) as prof:
        for n in range(1, 60):
            torch.zeros(n) + 1  # a new shape each time: a new op key
    lim = prof.profile.limits
    assert lim.ops_overflowed > 0
    assert any(op.name.startswith("[other ops") and op.calls for op in prof.profile.ops)
    assert len(prof.profile.spans) == 100
    assert lim.spans_dropped > 0
    spans = prof.profile.spans
    # Spans are written when they end, so ends rise (within the hook time taken out of parents: a
    # preemption inside one hook can move one parent's end back by more), and the ring keeps the
    # newest: the last one written is the last op of the loop.
    ends = [s + d for s, d in zip(spans.start_ns, spans.dur_ns, strict=True)]
    assert sum(b < a - 50_000 for a, b in zip(ends, ends[1:], strict=False)) <= 1, ends
    last = prof.profile.op_by_id()[spans.op[-1]]
    assert last.name == "[other ops: op table full]" or last.name == "aten::add"


def test_hardware_events_dropped_with_probe_reason_when_no_pmu():
    if capabilities.hardware_pmu():
        pytest.skip(f"this machine has a PMU ({capabilities.hardware_pmu()}); nothing to drop")
    with cpuprof.profile(["task-clock", "cycles", "instructions"], warn=False) as prof:
        torch.ones(4) + 1
    dropped = {d.name: d.reason for d in prof.profile.dropped_events}
    assert set(dropped) == {"cycles", "instructions"}
    assert all("not supported by this CPU or hypervisor" in r for r in dropped.values())
    assert prof.profile.collection.event_names == ["task-clock"]


@pytest.mark.skipif(capabilities.hardware_pmu() is None, reason="no hardware PMU on this machine (e.g. a VM "
                    "without a virtual PMU): cycles and instructions cannot be counted")
def test_hardware_cycles_counted_when_pmu_present():
    with cpuprof.profile(["task-clock", "cycles", "instructions"], mode="exact", warn=False) as prof:
        with cpuprof.region("spin"):
            workloads.spin_for_ns(50_000_000)
    spin = region_op(prof.profile, "spin")
    assert sum(spin.counters_incl["cycles"]) > 1_000_000


@pytest.mark.parametrize("err, words", [
    (errno.EACCES, "perf_event_paranoid"),
    (errno.EMFILE, "file-descriptor limit"),
    (errno.ENOENT, "not supported by this kernel"),
    (errno.ENOSYS, "no perf_event_open"),
    (errno.EBUSY, "busy"),
])
def test_errno_mapping_by_fault_injection(err, words):
    nat.testing.inject_open_errno(err, 1)
    probe = nat.probe_event("task-clock")
    assert not probe.ok
    assert probe.errno == err
    assert words in probe.reason


def test_hardware_enoent_names_missing_pmu():
    assert "no hardware PMU" in nat.open_error_reason(errno.ENOENT, "cycles")


def test_real_fd_limit_gives_the_fd_reason():
    """A real EMFILE, in a child whose RLIMIT_NOFILE is exhausted."""
    code = (
        "import resource, os, torch\n"
        "from cpuprof import native\n"
        "nat = native.load()\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))\n"
        "held = []\n"
        "try:\n"
        "    while True: held.append(os.open('/dev/null', os.O_RDONLY))\n"
        "except OSError: pass\n"
        "print(nat.probe_event('task-clock').reason)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "file-descriptor limit reached (ulimit -n is 64" in out.stdout


def test_all_events_failing_degrades_with_warnings(capsys):
    nat.testing.inject_open_errno(errno.EACCES, -1)
    with cpuprof.profile(SOFTWARE) as prof:
        torch.ones(4) + 1
    nat.testing.inject_open_errno(0, 0)
    err = capsys.readouterr().err
    assert "perf_event_paranoid" in err and err.count("\n") == 1  # one warning line for all four
    assert prof.profile.collection.events == []
    assert any(op.name == "aten::add" and op.calls == 1 for op in prof.profile.ops)  # wall time still works


def test_multiplexed_counts_are_scaled_and_marked():
    assert nat.testing.scale_count(1000, 200, 100) == (2000.0, True, True)
    assert nat.testing.scale_count(1000, 100, 100) == (1000.0, False, True)
    assert nat.testing.scale_count(1000, 100, 0) == (0.0, False, False)
    # Deltas are scaled by the interval's own enabled/running times, as perf stat -I does. Here
    # the group ran all of the first 100 ns and half of the next 200: 500 raw counts in the
    # second interval are 1000. The difference of cumulative scaled counts would say 1250.
    assert nat.testing.scale_delta((0, 0, 0), (1000, 100, 100)) == (1000.0, False, True)
    assert nat.testing.scale_delta((1000, 100, 100), (1500, 300, 200)) == (1000.0, True, True)
    assert nat.testing.scale_delta((1000, 100, 100), (1000, 200, 100)) == (0.0, False, False)  # never ran: unknown
    nat.testing.inject_running_fraction(0.5)
    with cpuprof.profile(SOFTWARE, mode="exact", warn=False) as prof:
        with cpuprof.region("spin"):
            before = time.thread_time_ns()
            workloads.spin_for_ns(50_000_000)
            cpu = time.thread_time_ns() - before
    me = prof.profile.threads[own_slot(prof.profile)]
    assert "task-clock" in me.scaled  # the thread's totals are perf counts, scaled back
    # Per op, exact mode takes CPU time from the thread's clock, which is never multiplexed, and
    # counts software events one record per occurrence (a ring each): exact, never scaled.
    # Hardware events (none here) are perf counts, scaled and marked.
    assert "context-switches" not in me.scaled
    assert prof.profile.collection.scaled_events == []
    spin = region_op(prof.profile, "spin")
    assert spin.counters_incl["task-clock"][own_slot(prof.profile)] == pytest.approx(cpu, rel=0.05)


def test_second_session_while_running_is_refused():
    with cpuprof.profile(SOFTWARE, warn=False):
        with pytest.raises(cpuprof.errors.UsageError, match="already running"):
            cpuprof.profile(SOFTWARE, warn=False).start()


def test_sessions_restart_cleanly():
    for mode in ("exact", "sampled", "exact"):
        with cpuprof.profile(SOFTWARE, mode=mode, warn=False) as prof:
            torch.ones(8) * 2
        assert any(op.name == "aten::mul" and op.calls == 1 for op in prof.profile.ops)


def test_unknown_event_is_a_usage_error():
    with pytest.raises(cpuprof.errors.UsageError, match="unknown event 'cylces'"):
        cpuprof.profile(["cylces"]).start()


def test_tracepoint_counts_context_switches():
    with cpuprof.profile(["task-clock", "sched:sched_switch"], mode="exact", warn=False) as prof:
        with cpuprof.region("sleep"):
            for _ in range(3):
                time.sleep(0.005)
    if prof.profile.dropped_events:
        pytest.skip(f"tracepoints unavailable here: {prof.profile.dropped_events[0].reason}")
    sleep = region_op(prof.profile, "sleep")
    assert sleep.counters_incl["sched:sched_switch"][own_slot(prof.profile)] >= 3


def test_native_refuses_another_torch():
    with pytest.raises(NativeModuleError, match="built against torch 2.13.0 but torch 9.9.9 is installed; rebuild"):
        native.check_torch_version("2.13.0", "9.9.9")
    code = (
        "import cpuprof._build_info as b; b.TORCH_VERSION = '0.0.1'\n"
        "import cpuprof\n"
        "try:\n"
        "    cpuprof.profile().start()\n"
        "except cpuprof.errors.NativeModuleError as e:\n"
        "    print('refused:', e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "refused: cpuprof's native module was built against torch 0.0.1" in out.stdout, out.stderr
    assert "Traceback" not in out.stderr


def test_modules_key_ops_by_enclosing_module():
    net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    x = torch.randn(2, 16)
    with cpuprof.profile(SOFTWARE, modules=True, warn=False) as prof:
        for _ in range(3):
            net(x)
    regions = {op.name: op for op in prof.profile.ops if op.kind == "region"}
    assert regions["Sequential"].calls == 3 and regions["Linear"].calls == 6
    addmm = [op for op in prof.profile.ops if op.name == "aten::addmm"]
    assert {tuple(op.region) for op in addmm} == {("Sequential", "Linear")}
    relu = next(op for op in prof.profile.ops if op.name == "aten::relu")
    assert relu.region == ["Sequential", "ReLU"]
    # hooks are gone after the session
    from torch.nn.modules import module as nn_module
    assert not nn_module._global_forward_pre_hooks


def test_op_whose_shapes_cannot_be_read_does_not_break_the_session():
    """Nested tensors throw on sizes(); the hook keys them as [?] and stop() still returns."""
    nested = torch.nested.nested_tensor([torch.randn(3), torch.randn(5)])
    a = torch.randn(32, 32)
    with cpuprof.profile(SOFTWARE, mode="exact", warn=False) as prof:
        with cpuprof.region("outer"):
            nested.sin()
            for _ in range(5):
                a @ a
    outer = region_op(prof.profile, "outer")
    mm = next(op for op in prof.profile.ops if op.name == "aten::mm")
    assert mm.region == ["outer"] and outer.incl_ns >= mm.incl_ns
    nested_inputs = [op.inputs[0] for op in prof.profile.ops if op.name == "aten::sin"]
    assert any(i.kind == "unknown_shape" and i.dtype == "f32" for i in nested_inputs)


def test_regions_ending_out_of_order_keep_their_own_time():
    import asyncio

    a = torch.randn(64, 64)
    measured: dict[str, float] = {}

    async def request(name: str, sleep_s: float, mms: int) -> None:
        began = time.perf_counter_ns()
        with cpuprof.region(name):
            for _ in range(mms):
                a @ a
            await asyncio.sleep(sleep_s)
        measured[name] = time.perf_counter_ns() - began

    async def both() -> None:
        await asyncio.gather(request("req_a", 0.02, 3), request("req_b", 0.08, 5))

    with cpuprof.profile(SOFTWARE, warn=False) as prof:
        asyncio.run(both())
    for name in ("req_a", "req_b"):  # req_a ends first although req_b began inside it
        assert region_op(prof.profile, name).incl_ns == pytest.approx(measured[name], rel=0.2, abs=3e6)
    # On one thread the regions nest as they began (req_b inside req_a, as in torch.profiler);
    # what matters is that each op stays with the region that was innermost when it ran.
    by_region = {op.region[-1]: op.calls for op in prof.profile.ops if op.name == "aten::mm"}
    assert by_region == {"req_a": 3, "req_b": 5}


def test_exact_mode_two_dispatching_threads_not_double_counted():
    """Each dispatching thread's CPU goes to its own ops only: the ops' total is no more than the
    threads' total (it was ~1.6x when every op also read the other dispatching thread)."""
    a = torch.randn(256, 256)

    def work() -> None:
        torch.set_num_threads(1)  # per thread: no OpenMP team of its own
        for _ in range(30):
            a @ a

    with cpuprof.profile(SOFTWARE, mode="exact", warn=False) as prof:
        threads = [threading.Thread(target=work) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    charged = sum(op.self_total("task-clock") or 0 for op in prof.profile.ops if op.kind == "op")
    spent = sum(t.cpu_ns or 0 for t in prof.profile.threads)
    assert charged <= spent * 1.02
    dispatch = [i for i, t in enumerate(prof.profile.threads) if t.role == "dispatch"]
    assert len(dispatch) == 2


def test_exact_mode_region_open_before_workers_joined_sees_them():
    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        a = torch.randn(512, 512)
        a @ a
        with cpuprof.profile(SOFTWARE, mode="exact", warn=False) as prof:
            with cpuprof.region("outer"):  # opened before the sampler adds the worker to the team
                for _ in range(30):
                    a @ a
    finally:
        torch.set_num_threads(previous)
    outer = region_op(prof.profile, "outer")
    mm = next(op for op in prof.profile.ops if op.name == "aten::mm")
    for slot, value in enumerate(mm.counters_incl["task-clock"]):
        assert outer.counters_incl["task-clock"][slot] >= value


def test_capacity_out_of_range_is_a_usage_error():
    with pytest.raises(cpuprof.errors.UsageError, match="op capacity 4194304: expected 16 to 1048576"):
        cpuprof.profile(op_capacity=1 << 22)


def test_regions_cost_nothing_without_a_profile_and_record_function_scopes_count():
    with cpuprof.region("unprofiled"):  # no session: a no-op, no error
        torch.ones(2) + 1
    with cpuprof.profile(SOFTWARE, warn=False) as prof:
        with torch.profiler.record_function("rf_scope"):
            torch.ones(2) + 1
    add = next(op for op in prof.profile.ops if op.name == "aten::add")
    assert add.region == ["rf_scope"]
    assert not any(op.name == "unprofiled" for op in prof.profile.ops)


@pytest.mark.parametrize("mode", ["exact", "sampled"])
def test_timeline_spans_carry_counters_only_in_exact_mode(mode):
    with cpuprof.profile(SOFTWARE, mode=mode, timeline=50, warn=False) as prof:
        with cpuprof.region("spin"):
            cpu_before = time.thread_time_ns()
            workloads.spin_for_ns(20_000_000)
            cpu_in_spin = time.thread_time_ns() - cpu_before
    spans = prof.profile.spans
    spin_id = region_op(prof.profile, "spin").id
    index = spans.op.index(spin_id)
    assert spans.dur_ns[index] >= 20_000_000
    if mode == "exact":
        # The span's task-clock holds the thread's own CPU clock read inside it (on a loaded
        # machine less than the wall time: the truth is the clock, not the spin's length).
        assert 0.99 * cpu_in_spin <= spans.counters[index][0] <= spans.dur_ns[index]
    else:
        assert spans.counters[index] == []


def test_exact_mode_counts_every_fault_of_the_workers_inside_one_op():
    # One fill_ of fresh memory on two OpenMP threads: every page faults once, on whichever thread
    # writes it, all inside one op; far more faults per thread than a counting ring holds, so
    # the count must survive the ring overflowing (it is re-read) without interrupting the worker.
    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        torch.ones(1 << 20).mul_(2)  # the team exists and has worked
        pages = 16384
        with cpuprof.profile(SOFTWARE, mode="exact", warn=False) as prof:
            x = torch.empty(pages * 1024)  # fp32: 4 KiB per 1024 elements, untouched until the fill
            x.fill_(1.0)
    finally:
        torch.set_num_threads(previous)
    p = prof.profile
    fill = next(op for op in p.ops if op.name == "aten::fill_")
    faults = fill.counters_incl["page-faults"]
    assert sum(faults) >= pages, faults
    assert sum(faults) < pages * 1.1, faults  # each page once (a few more for the op's own work)
    worker = [v for v, t in zip(faults, p.threads, strict=True) if t.role == "worker"]
    assert worker and max(worker) > 1000, (faults, [t.role for t in p.threads])


def exact_ops_beside_a_helper(events: list[str], work: Callable[[], None]):
    """Tiny ops on this thread in exact mode, every saved clock read verified by the test hook,
    until a helper thread (a team member: it has run) has done `work`. Returns the profile, the
    hook's counts, the ops run, and the helper's CPU and wall time in `work`."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)  # no OpenMP worker: the helper is the team's only other member
    a = torch.ones(4)
    start, done = threading.Event(), threading.Event()
    helper_cpu: list[int] = []

    def helper() -> None:
        workloads.spin_for_ns(2_000_000)  # has run: joins the team
        start.wait()
        before, began = time.thread_time_ns(), time.monotonic_ns()
        work()
        helper_cpu.append(time.thread_time_ns() - before)
        helper_cpu.append(time.monotonic_ns() - began)
        done.set()

    nat.testing.verify_saved_reads(True)
    try:
        with cpuprof.profile(events, mode="exact", warn=False) as prof:
            thread = threading.Thread(target=helper)
            thread.start()
            # the collector's passes add the helper to the team
            time.sleep(3 * native.load().collect_interval_us() / 1e6)
            start.set()
            ops = 0
            while not done.is_set():
                for _ in range(200):
                    torch.add(a, a)
                ops += 200
            thread.join()
        stats = nat.testing.saved_read_stats()
    finally:
        nat.testing.verify_saved_reads(False)
        torch.set_num_threads(previous)
    assert helper_cpu
    p = prof.profile
    # Never more CPU in the ops than the helper had.
    slot = next(i for i, t in enumerate(p.threads) if t.tid == thread.native_id)
    charged = sum(op.counters_self["task-clock"][slot] for op in p.ops if op.kind == "op")
    assert charged <= helper_cpu[0] * 1.01 + 2_000_000, (charged, helper_cpu)
    return p, stats, ops, helper_cpu[0], helper_cpu[1]


@pytest.mark.parametrize("events", [SOFTWARE, ["task-clock"]], ids=["switch records on context-switches", "on a dummy"])
def test_exact_mode_skips_reading_a_sleeping_team_member_and_hides_at_most_the_moment_it_wakes(events):
    """A team member asleep since it was last read keeps its CPU clock: exact mode does not read it
    again (a system call per op boundary). Its switch records say when it wakes. The test hook
    makes every saved read anyway and measures what it hid, while a helper thread wakes in bursts
    of a millisecond and the main thread runs thousands of ops."""
    bursts = 20

    def work() -> None:
        for _ in range(bursts):
            workloads.spin_for_ns(1_000_000)
            time.sleep(0.005)

    _, stats, ops, helper_cpu, _ = exact_ops_beside_a_helper(events, work)
    assert helper_cpu >= bursts * 500_000
    # Asleep most of the time: most of the helper's reads (and the idle torch thread's) were saved.
    assert stats["parked"] >= ops // 2, (stats, ops)
    # What a saved read can miss: the moment between a thread's coming back on a CPU and its
    # switch-in record (the kernel's switch from idle: 10-30 us here), at most once per wake; the
    # next read, at the record's new position, counts it. Never a burst's millisecond.
    wakes = 3 * (bursts + 2)  # from each sleep, and from waiting for the GIL
    assert stats["moved_episodes"] <= wakes, (stats, helper_cpu)
    assert stats["max_moved_ns"] <= 500_000, (stats, helper_cpu)  # half a burst


def test_exact_mode_carries_a_running_members_clock_and_the_carried_value_is_the_clock():
    """A team member on its CPU since its clock was read a moment ago (no switch record since) ran
    for all of that moment: exact mode carries its clock forward by the wall time instead of a
    system call at each op boundary. The calling thread is such a member between its own reads, and
    so is a helper spinning on the other CPU. The test hook reads every carried clock anyway, at the
    same moment, and counts how far the two differ."""
    _, stats, ops, helper_cpu, helper_wall = exact_ops_beside_a_helper(
        SOFTWARE, lambda: workloads.spin_for_ns(300_000_000)
    )
    # Four clocks per op (two members, two ends); most of them carried, not read.
    assert stats["carried"] >= ops, (stats, ops)
    # The helper's too, where it had a CPU of its own (on a busy machine it takes turns with this
    # thread, and each turn is a switch record: read, not carried).
    if helper_cpu >= 0.9 * helper_wall:
        assert stats["carried_other"] >= ops // 10, (stats, ops, helper_cpu, helper_wall)
    # Carried and read agree to within the jitter of two reads (tens of ns), except where a vCPU
    # was stolen or an interrupt ran inside a window, which the read leaves out. A check whose own
    # read was interrupted is not counted.
    checked = stats["carried"] - stats["carried_unchecked"]
    assert checked >= stats["carried"] // 2, stats
    assert stats["carried_error_ns"] / checked <= 500, stats
    assert stats["carried_off"] <= 0.02 * checked, stats


def test_exact_mode_does_not_carry_a_clock_that_stopped_keeping_pace_with_the_wall():
    """A switch ring that stopped telling (frozen by a test hook: every thread on its CPU, no record
    since, as after a lost switch out) would have a sleeping helper's clock carried through its
    sleeps, and every op meanwhile charged to it. A clock is carried only after two reads at one
    position showed it keeping pace with the wall, which a sleeping thread's does not."""
    bursts = 20

    def work() -> None:
        for _ in range(bursts):
            workloads.spin_for_ns(1_000_000)
            time.sleep(0.005)

    nat.testing.inject_frozen_switch_positions(True)
    try:
        # Asserts that the ops were charged no more of the helper's CPU than it had.
        _, stats, ops, helper_cpu, helper_wall = exact_ops_beside_a_helper(SOFTWARE, work)
    finally:
        nat.testing.inject_frozen_switch_positions(False)
    assert helper_cpu < 0.5 * helper_wall  # asleep most of the time
    assert stats["parked"] == 0, stats  # no switch out was seen
    # Carried while it spun, and wrongly only in the last window before each sleep (a few per
    # burst); carried on its switch state alone, most of its clocks were, and wrongly: here 129,345
    # of them for 36,800 ops, 120,127 more than 2 us off.
    checked = stats["carried"] - stats["carried_unchecked"]
    assert stats["carried_off"] <= 0.02 * checked, (stats, ops)


@pytest.mark.parametrize("carry", [True, False], ids=["clock carried", "clock read at every boundary"])
def test_exact_mode_cpu_of_a_loop_of_tiny_ops_is_the_threads_cpu_less_the_hooks(carry):
    """The known answer for the calling thread's clock, carried or read: over a region holding
    tens of thousands of ops of a microsecond, its CPU time is the thread's own (Python's
    thread_time) less the time spent inside cpuprof's callbacks, which exact mode takes out."""
    a = torch.ones(4)
    nat.testing.inject_read_running_members(not carry)
    try:
        steal_before = steal_ns()
        with cpuprof.profile(SOFTWARE, mode="exact", warn=False) as prof:
            with cpuprof.region("loop"):
                before, began = time.thread_time_ns(), time.monotonic_ns()
                for _ in range(30_000):
                    torch.add(a, a)
                loop_cpu, loop_wall = time.thread_time_ns() - before, time.monotonic_ns() - began
        stolen = steal_ns() - steal_before
    finally:
        nat.testing.inject_read_running_members(False)
    p = prof.profile
    slot = own_slot(p)
    # The thread's time off its CPU while it should have run: waiting for one (schedstat's run
    # delay over the session) and what the hypervisor stole (its CPU clock leaves that out). The
    # hook's time is taken out as wall time, which then holds some of it: beyond a little, nothing
    # here is known exactly.
    waited = p.threads[slot].run_delay_ns
    if waited is None:
        pytest.skip("the kernel's schedstat was not read for this thread: no run delay to allow for")
    waited += stolen
    if waited > 0.1 * loop_wall:
        pytest.skip(f"this thread was off its CPU {waited / loop_wall:.0%} of the loop: the machine is too busy")
    counted = region_op(p, "loop").counters_incl["task-clock"][slot]
    assert counted == pytest.approx(loop_cpu - p.overhead.hook_ns, abs=0.05 * loop_cpu), (counted, loop_cpu, p.overhead)
    # Op by op: this thread ran through its ops, and through the Python between them (the region's
    # own time), so each part's CPU is its wall time less at most what it waited. An op charged
    # too much starves the region's own part.
    ops = [op for op in p.ops if op.kind == "op"]
    loop = region_op(p, "loop")
    for cpu, wall in (
        (sum(op.counters_self["task-clock"][slot] for op in ops), sum(op.self_ns for op in ops)),
        (loop.counters_self["task-clock"][slot], loop.self_ns),
    ):
        assert cpu >= wall - waited - 0.1 * wall, (cpu, wall, waited)
