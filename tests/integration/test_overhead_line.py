"""The report's "profiler overhead" line against costs known independently of cpuprof.

The op callbacks are made to cost a known extra time (a test hook spins inside each callback, begin
and end), and what that costs the profiled loop is measured from outside, by the loop's own wall
clock against the same loop without it; the profile must report that cost as its callbacks' time,
per op and as a share of the wall time. The collector thread is made to spend a known CPU time each
period, and the kernel's own account of that thread's run time (schedstat) is read before the
session stops; the profile must report it as the collector's CPU. The in-process Python sampler is
made to read deep stacks often, and the kernel's account of its thread must be what the line says.
"""

from __future__ import annotations

import io
import re
import time
from pathlib import Path

import pytest
import torch

import cpuprof
from cpuprof import native
from cpuprof.reports import render

nat = native.load()
SPIN_NS = 20_000  # per callback: each op pays it twice (begin and end)
OPS = 1500


@pytest.fixture(autouse=True)
def clean_injection():
    yield
    nat.testing.inject_hook_spin_ns(0)
    nat.testing.inject_collect_spin_us(0)


def overhead_line(profile: cpuprof.Profile) -> str:
    """The line as the report says it (the terminal wraps it; the markdown report keeps it whole)."""
    out = io.StringIO()
    render(profile, out, format="markdown")
    lines = [line for line in out.getvalue().splitlines() if "profiler overhead:" in line]
    assert len(lines) == 1, out.getvalue()
    return lines[0]


def timed_loop(mode: str, spin_ns: int) -> tuple[cpuprof.Profile, float]:
    """A profile of OPS additions and the loop's wall time, with `spin_ns` added to every callback."""
    x = torch.ones(4)
    with cpuprof.profile("task-clock", mode=mode, warn=False) as prof:
        nat.testing.inject_hook_spin_ns(spin_ns)
        try:
            start = time.perf_counter()
            for _ in range(OPS):
                torch.add(x, x)
            wall = time.perf_counter() - start
        finally:
            nat.testing.inject_hook_spin_ns(0)
    assert prof.profile is not None
    return prof.profile, wall


@pytest.mark.parametrize("mode", ["sampled", "exact"])
def test_the_callbacks_time_is_what_the_loop_lost(mode: str):
    # Interleaved pairs; the median difference, since a preempted round of either side moves it.
    added_wall, added_hook, spun = [], [], None
    for _ in range(3):
        base, base_wall = timed_loop(mode, 0)
        spun, spun_wall = timed_loop(mode, SPIN_NS)
        assert base.overhead is not None and spun.overhead is not None
        added_wall.append(spun_wall - base_wall)
        added_hook.append((spun.overhead.hook_ns - base.overhead.hook_ns) / 1e9)
    assert spun is not None and spun.overhead is not None and spun.collection is not None
    known = OPS * 2 * SPIN_NS / 1e9  # what the spins cost the loop, by construction
    lost = sorted(added_wall)[1]  # what the loop lost, by its own clock
    assert 0.9 * known <= lost < 1.25 * known, (known, added_wall)
    # The reported callback time accounts for what the loop lost: every spin, nothing else of size.
    hook = sorted(added_hook)[1]
    assert known <= hook < 1.1 * known + 0.005, (known, added_hook)
    assert hook == pytest.approx(lost, rel=0.15), (added_hook, added_wall)
    per_op = spun.overhead.per_op_ns
    assert 2 * SPIN_NS <= per_op < 2 * SPIN_NS + 10_000, per_op
    line = overhead_line(spun)
    share = float(re.search(r"\(([\d.]+)% of the wall time", line).group(1)) / 100
    # The loop is nearly all of the profiled time, and the spins nearly all of the loop.
    assert known / (spun.collection.wall_ns / 1e9) - 0.02 <= share <= 1.0, (line, known, spun.collection.wall_ns)
    assert re.search(rf"\b{per_op:,.0f} ns per op\b|\b{per_op:.0f} ns per op\b", line), line


def thread_run_ns(name: str = "cpuprof-collect") -> int:
    """A thread's run time as the kernel accounts it (schedstat's first field)."""
    for task in Path("/proc/self/task").iterdir():
        try:
            if (task / "comm").read_text().strip() == name:
                return int((task / "schedstat").read_text().split()[0])
        except OSError:
            continue
    raise AssertionError(f"no {name} thread")


def test_the_collectors_cpu_is_the_kernels_account_of_it():
    period_s = nat.collect_interval_us() / 1e6
    spin_us = int(period_s * 1e5)  # a tenth of each period spun: about 10% of a CPU
    with cpuprof.profile("task-clock", warn=False) as prof:
        nat.testing.inject_collect_spin_us(spin_us)
        x = torch.ones(4)
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            torch.add(x, x)
            time.sleep(0.001)
        nat.testing.inject_collect_spin_us(0)
        time.sleep(3 * period_s)  # a few periods without the spin, so the figure read at the last one is settled
        kernel_ns = thread_run_ns()
    profile = prof.profile
    assert profile is not None and profile.overhead is not None and profile.collection is not None
    o = profile.overhead
    # The final period (no spin) runs after the read above: the profile may hold a little more.
    assert 0.95 * kernel_ns <= o.discovery_cpu_ns <= kernel_ns + 20_000_000, (o.discovery_cpu_ns, kernel_ns)
    # A second of periods, each spun a tenth of it: the known part of it.
    assert o.discovery_cpu_ns >= 0.5 * 1.0 / period_s * spin_us * 1000, o.discovery_cpu_ns
    line = overhead_line(profile)
    share = float(re.search(r"\(([\d.]+)% of one CPU\)", line).group(1)) / 100
    assert share == pytest.approx(o.discovery_cpu_ns / profile.collection.wall_ns, abs=0.006), line
    assert 0.04 <= share <= 0.2, line


def test_the_python_samplers_cpu_is_the_kernels_account_of_it():
    x = torch.ones(4)

    def deep(n: int) -> int:
        """400 frames under the ops: each read walks them all, tens of µs at every period."""
        if n:
            return deep(n - 1)
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            torch.add(x, x)  # releases the GIL: the sampler reads at its own rate
        time.sleep(0.02)
        return thread_run_ns("cpuprof-python")

    with cpuprof.profile("task-clock", python_stacks=True, python_hz=1000, warn=False) as prof:
        kernel_ns = deep(400)
    profile = prof.profile
    assert profile is not None and profile.collection is not None and profile.sampling is not None
    py = profile.sampling.python
    assert py is not None and py.cpu_ns is not None and py.error is None
    # The sampler's clock is read as it ends, after the kernel's account above: a few reads more.
    assert kernel_ns <= py.cpu_ns <= kernel_ns + 30_000_000, (py.cpu_ns, kernel_ns)
    # About 1,000 periods: each a read, or waited out by the pacer where the op callers covered it
    # (an add began every few µs; a pacer that oversleeps a tick skips it), with a read every 100 ms
    assert py.samples >= 5 and py.samples + py.ticks_covered >= 100, (py.samples, py.ticks_covered)
    line = overhead_line(profile)
    match = re.search(r"Python stack sampler thread .*? of CPU \(([\d.]+)% of one CPU, ([\d,]+) reads with the GIL "
                      r"held(?:, ([\d,]+) periods not read)?", line)
    assert match, line
    share = float(match.group(1)) / 100
    assert share == pytest.approx(py.cpu_ns / profile.collection.wall_ns, abs=0.006), line
    assert int(match.group(2).replace(",", "")) == py.samples
    assert int((match.group(3) or "0").replace(",", "")) == py.ticks_covered
    assert share > 0, line
