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
    native.load().inject_no_python_callers(sys.argv[2] == "off")
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

    def alternate(n):
        for _ in range(n):
            torch.add(x, x)
            torch.mul(x, x)

    def records():
        (tid, raw, lost), = [d for d in nat.drain_python_callers() if d[1] or d[2]]
        return [struct.unpack_from("qII", raw, i)[:2] for i in range(0, len(raw), 16)], lost

    # Nobody drains during the profile (no sampler: the callers are started by hand), so the
    # thread's ring fills; a drain then makes room, and the next change follows a gap record.
    nat.start_python_callers()
    with cpuprof.profile("task-clock", warn=False):
        alternate(40_000)  # 80,000 changes of caller, more than the ring holds
        full, lost = records()
        alternate(10)
        after, lost_after = records()
    nat.stop_python_callers()
    print((len(full), lost, after[:2], len(after), lost_after))
    chains = nat.python_caller_chains()
    print(([f[0] for f in chains[full[0][1]]], [f[0] for f in chains[after[1][1]]]))
""")


def test_a_full_ring_loses_changes_and_marks_the_gap(tmp_path: Path):
    result = subprocess.run([sys.executable, "-c", RING_SCRIPT], capture_output=True, text=True, timeout=180,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr
    first, second = result.stdout.strip().splitlines()
    kept, lost, after, kept_after, lost_after = ast.literal_eval(first)
    assert kept == 65536 and 80_000 - 65536 <= lost <= 80_000 - 65536 + 10  # the ring holds 65,536
    # after the drain: a gap record (chain 0, "not known") from the first lost change's time, then
    # the next change, recorded as usual
    (gap_ns, gap_chain), (next_ns, next_chain) = after
    assert gap_chain == 0 and next_chain != 0 and gap_ns < next_ns
    assert kept_after == 21 and lost_after == lost
    assert ast.literal_eval(second) == (["<module>", "alternate"], ["<module>", "alternate"])
