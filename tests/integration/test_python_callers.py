"""Known answers for the Python caller of each op (csrc/python/python_callers.h): two Python
functions take turns calling the same op every few hundred microseconds, far faster than any
sampler reads stacks, and every sample of each one's GEMM must sit under that function.

Each function's GEMM has its own shape, so the profile tells their samples apart by op key, and
the truth is known without any Python stack: the 96x96 product is only ever called by
``alpha_caller`` and the 160x160 one by ``beta_caller``. With the op hook's callers switched off
the same run is joined by time alone, and then about half the samples land under the wrong
function: the test shows both, so it cannot pass without the callers doing their work."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from cpuprof import native
from cpuprof.model import Profile

pytestmark = pytest.mark.skipif(not native.load().python_callers_supported(),
                                reason="op callers are read natively on CPython 3.11 to 3.13 only")

SCRIPT = textwrap.dedent("""
    import contextlib, sys, time, torch, cpuprof
    from cpuprof import native

    # off: the op hook records no callers, and the stacks are joined by time alone
    native.load().testing.inject_no_python_callers(sys.argv[2] == "off")
    torch.set_num_threads(1)
    a, b = torch.randn(96, 96), torch.randn(160, 160)

    # in a region: each GEMM inside a region opened by its caller (as record_function or a
    # module's forward would), whose ops must still get their own caller
    region = cpuprof.region if sys.argv[3] == "region" else (lambda name: contextlib.nullcontext())

    def alpha_caller():
        with region("alpha"):
            return torch.mm(a, a)

    def beta_caller():
        with region("beta"):
            return torch.mm(b, b)

    def take_turns(cpu_seconds):
        end = time.thread_time() + cpu_seconds
        while time.thread_time() < end:
            for _ in range(3):
                alpha_caller()
            beta_caller()

    with cpuprof.profile("task-clock", timeline=20000, python_stacks=True, python_hz=100, sample_hz=1000) as prof:
        take_turns(1.5)
    prof.export(sys.argv[1])
""")


def profile_of(out: Path, callers: str, region: str = "no-region") -> Profile:
    result = subprocess.run([sys.executable, "-c", SCRIPT, str(out), callers, region], capture_output=True, text=True,
                            timeout=180, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr
    return Profile.load(out)


def gemm_samples_by_caller(profile: Profile) -> dict[str, dict[str, int]]:
    """{shape of the GEMM's first input: {innermost Python function: samples}} of aten::mm."""
    stacks = profile.stacks
    assert stacks is not None
    ops = profile.op_by_id()
    out: dict[str, dict[str, int]] = {"96": {}, "160": {}}
    for split in stacks.python_splits:
        count = stacks.counts[split.count]
        op = ops[count.op]
        if op.name != "aten::mm" or not op.inputs:
            continue
        size = str(op.inputs[0].sizes[0]) if op.inputs[0].sizes else "?"
        frames = stacks.python_stacks[split.stack]
        leaf = stacks.python_frames[frames[0]].function if frames else "(none)"
        out.setdefault(size, {})
        out[size][leaf] = out[size].get(leaf, 0) + split.samples
    return out


def share_under(by_caller: dict[str, dict[str, int]]) -> tuple[float, int]:
    right = by_caller["96"].get("alpha_caller", 0) + by_caller["160"].get("beta_caller", 0)
    total = sum(sum(c.values()) for c in by_caller.values())
    return (right / total if total else 0.0), total


@pytest.mark.parametrize("region", ["no-region", "region"])
def test_each_gemm_sample_sits_under_the_function_that_called_it(region: str, tmp_path: Path):
    profile = profile_of(tmp_path / "on", "on", region)
    py = profile.sampling.python
    assert py is not None and py.error is None
    by_caller = gemm_samples_by_caller(profile)
    share, total = share_under(by_caller)
    assert total >= 200, f"too few GEMM samples to judge ({total})"
    assert share >= 0.98, by_caller
    # the changes were recorded (three alpha calls in a row are one change), none lost
    assert py.op_caller_changes >= 100 and py.op_callers_lost == 0
    assert py.op_callers >= 0.9 * total


FAST_CHANGES = textwrap.dedent("""
    import sys, time, torch, cpuprof
    torch.set_num_threads(1)
    x = torch.ones(4)

    def left():
        return torch.add(x, x)

    def right():
        return torch.add(x, x)

    with cpuprof.profile("task-clock", python_stacks=True, python_hz=100) as prof:
        end = time.thread_time() + 1.0
        while time.thread_time() < end:
            for _ in range(100):
                left()
                right()
    prof.export(sys.argv[1])
""")


def test_a_caller_changing_at_every_op_is_drained_before_its_ring_fills(tmp_path: Path):
    """Two functions take turns calling a microsecond op: a change of caller at every op, hundreds
    of thousands a second, more in a second than a thread's ring holds (65,536). The sampler drains
    the rings every 100 ms, or sooner once one is a quarter full, so none is lost."""
    result = subprocess.run([sys.executable, "-c", FAST_CHANGES, str(tmp_path / "p")], capture_output=True,
                            text=True, timeout=180, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr
    py = Profile.load(tmp_path / "p").sampling.python
    assert py is not None and py.error is None
    assert py.op_caller_changes > 65_536, py  # one drain at the end could not have kept them
    assert py.op_callers_lost == 0, py


def test_without_op_callers_the_time_join_misplaces_them(tmp_path: Path):
    """The control: the same program joined by the sampler's reads alone puts many GEMM samples
    under the other function, which is why the op hook records callers."""
    profile = profile_of(tmp_path / "off", "off")
    py = profile.sampling.python
    assert py is not None and py.error is None and py.op_caller_changes == 0 and py.op_callers == 0
    share, total = share_under(gemm_samples_by_caller(profile))
    assert total >= 200
    assert share < 0.9, f"joined by time alone, {share:.0%} of {total} GEMM samples were under their caller"


RING_SCRIPT = textwrap.dedent("""
    import struct, sys, torch, cpuprof
    from cpuprof import native

    nat = native.load()
    x = torch.ones(4)

    def alternate(n):  # every op a change of caller
        for _ in range(n):
            torch.add(x, x)
            torch.mul(x, x)

    def repeat(n):  # one change, then the same caller
        for _ in range(n):
            torch.add(x, x)

    def records():
        (tid, raw, lost), = [d for d in nat.drain_python_callers() if d[1] or d[2]]
        return [struct.unpack_from("qII", raw, i)[:2] for i in range(0, len(raw), 16)], lost

    # Nobody drains during the profile (no sampler: the callers are started by hand), so the
    # thread's ring fills; a drain makes room.
    out = {}
    nat.start_python_callers()
    with cpuprof.profile("task-clock", warn=False):
        alternate(40_000)  # 80,000 changes of caller, more than the ring holds
        out["full"], out["lost"] = records()
        alternate(10)  # after the drain: a gap record, then the changes
        out["after"], out["lost_after"] = records()
        alternate(40_000)  # full again; then one more change, lost, and the same caller again
        repeat(10)
        out["full_again"], out["lost_again"] = records()
        repeat(3)  # the lost change's caller, recorded once the ring has room
        out["retried"], _ = records()
        alternate(40_000)  # full again, and no change after it: the gap stays open until the stop
    nat.stop_python_callers()
    out["at_stop"], _ = records()
    chains = nat.python_caller_chains()
    out["names"] = [[f[0] for f in chains[c]] for c in (out["full"][0][1], out["after"][1][1], out["retried"][1][1])]
    nat.release_python_callers()
    # the record lists as (how many, the first two, the last)
    print(repr({k: v if k in ("names", "lost", "lost_after", "lost_again", "retried") else (len(v), v[:2], v[-1])
                for k, v in out.items()}))
""")


def test_a_full_ring_loses_changes_and_marks_the_gap(tmp_path: Path):
    result = subprocess.run([sys.executable, "-c", RING_SCRIPT], capture_output=True, text=True, timeout=180,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr
    out = ast.literal_eval(result.stdout.strip().splitlines()[-1])
    ring = 65536
    kept, _, _ = out["full"]
    assert kept == ring and 80_000 - ring <= out["lost"] <= 80_000 - ring + 10
    # after a drain: a gap record (chain 0, "not known") from the first lost change's time, then
    # the next change, recorded as usual; nothing more lost
    kept_after, ((gap_ns, gap_chain), (next_ns, next_chain)), _ = out["after"]
    assert gap_chain == 0 and next_chain != 0 and gap_ns < next_ns
    assert kept_after == 21 and out["lost_after"] == out["lost"]
    # a caller repeated while the ring is full is lost once, not at every op
    kept_again, _, _ = out["full_again"]
    assert kept_again == ring
    assert out["lost_again"] - out["lost"] == 80_000 - ring + 1
    # ... and recorded as soon as there is room, though it did not change again
    (gap_ns, gap_chain), (retry_ns, retry_chain) = out["retried"]
    assert gap_chain == 0 and retry_chain != 0
    # the stop closes a gap that no later change closed
    kept_stop, _, (last_ns, last_chain) = out["at_stop"]
    assert kept_stop == ring + 1 and last_chain == 0 and last_ns > retry_ns
    assert out["names"] == [["<module>", "alternate"], ["<module>", "alternate"], ["<module>", "repeat"]]
