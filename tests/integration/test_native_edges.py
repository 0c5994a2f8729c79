"""The core's edges: a failed allocation on a thread's first op, malformed sample records, and the
op table's address space at its largest allowed size."""

from __future__ import annotations

import struct
import threading
from pathlib import Path

import pytest
import torch

import cpuprof
from cpuprof import _native
from cpuprof.errors import UsageError

SOFTWARE = ["task-clock", "context-switches", "page-faults"]


@pytest.mark.parametrize("mode", ["exact", "sampled"])
def test_failed_allocation_on_a_threads_first_op_leaves_the_session_consistent(mode, capsys):
    """The exact strategy allocated a thread's buffers inside its first op's callback, after the
    op stack's depth was raised: a bad_alloc there escaped and left every later op of the thread
    one level deeper. Now the buffers are allocated before the op is pushed; a failure leaves
    one op (and the ops inside it) unrecorded and counted, and the thread's next op tries again."""
    x = torch.randn(32, 32)

    def work() -> None:
        torch.mm(x, x)  # its thread's first op: the injected failure
        with cpuprof.region("after"):
            for _ in range(4):
                torch.mm(x, x)

    _native.testing.inject_thread_setup_failures(1)
    try:
        with cpuprof.profile(SOFTWARE, mode=mode) as prof:
            thread = threading.Thread(target=work)
            thread.start()
            thread.join()
    finally:
        _native.testing.inject_thread_setup_failures(0)
    snap = _native.snapshot()
    assert snap.thread_setup_failures == 1
    # The op that found no op stack and the ops inside it (aten::mm runs aten::resolve_conj),
    # counted by the source; the thread's ops after it are recorded.
    assert snap.unattributed_ops >= 1
    assert snap.unmatched_ends == 0 and snap.truncated_ops == 0 and snap.too_deep == 0
    p = prof.profile
    assert p is not None and p.limits.unattributed_ops == snap.unattributed_ops
    regions = [op for op in p.ops if op.kind == "region" and op.name == "after"]
    assert len(regions) == 1 and regions[0].calls == 1 and regions[0].region == []  # at depth 0: balanced
    inside = [op for op in p.ops if op.name == "aten::mm" and op.region == ["after"]]
    assert sum(op.calls for op in inside) == 4
    assert not [op for op in p.ops if op.name == "aten::mm" and op.region == []]
    assert "op buffers could not be allocated (1 tries)" in capsys.readouterr().err


def _sample_record(values: list[int], chain: list[int], stack: bytes = b"", n_values: int | None = None,
                   n_chain: int | None = None, stack_size: int | None = None, size: int | None = None) -> bytes:
    """A PERF_RECORD_SAMPLE as the core asks for it (csrc/perf/sample_record.h), lengths overridable."""
    body = struct.pack("<QQQ", 0x401000, (4242 << 32) | 4242, 123456789)
    body += struct.pack("<QQQ", len(values) if n_values is None else n_values, 1000, 1000)
    body += b"".join(struct.pack("<Q", v) for v in values)
    body += struct.pack("<Q", len(chain) if n_chain is None else n_chain)
    body += b"".join(struct.pack("<Q", c) for c in chain)
    body += struct.pack("<QQQQ", 2, 0x7ffd0000, 0x7ffc0000, 0x401000)  # abi 64, bp, sp, ip
    body += struct.pack("<Q", len(stack) if stack_size is None else stack_size) + stack
    if stack:
        body += struct.pack("<Q", len(stack))
    total = 8 + len(body)
    header = struct.pack("<IHH", 9, 0, total if size is None else size)  # PERF_RECORD_SAMPLE
    return header + body


def test_malformed_sample_records_never_parse():
    good = _sample_record([7, 8], [0xFFFFFFFFFFFFFE00, 0x401000, 0x401100], stack=bytes(64))
    parsed = _native.testing.parse_sample_record(good)
    assert parsed is not None
    assert parsed["values"] == [7, 8] and parsed["callchain"][1:] == [0x401000, 0x401100]
    assert parsed["tid"] == 4242 and parsed["stack_size"] == 64
    # 8 * n wraps to 0 for n = 2^61: the chain was taken as empty-sized and read far past the record.
    for n in (2**61, 2**61 + 1, 2**63, 2**64 - 1, 4):
        assert _native.testing.parse_sample_record(_sample_record([7], [1, 2, 3], n_chain=n)) is None, n
    for n in (2**61, 2**64 - 1, 3):
        assert _native.testing.parse_sample_record(_sample_record([7, 8], [1], n_values=n)) is None, n
    assert _native.testing.parse_sample_record(_sample_record([7], [1], stack=bytes(16), stack_size=2**64 - 8)) is None
    assert _native.testing.parse_sample_record(_sample_record([7], [1], stack=bytes(16), stack_size=24)) is None
    # Every truncation of a good record, and records shorter than their header.
    for cut in range(len(good)):
        assert _native.testing.parse_sample_record(good[:cut]) is None, cut


def test_op_counters_beyond_the_per_thread_bound_are_refused_before_start():
    """The largest op capacity with 16 events reserved 17 GB of address space per 64 threads."""
    events = ["task-clock", "context-switches", "page-faults"]
    with pytest.raises(UsageError, match="counters per thread"):
        cpuprof.profile(events, op_capacity=_native.limits["kMaxOpCapacity"])
    # The core refuses it too, for callers that skip the Python checks.
    with pytest.raises(ValueError, match="counters per thread"):
        _native.start(events, _native.CountingMode.exact, True, 1000, 0, 0, 8, _native.limits["kMaxOpCapacity"], 0,
                      64)
    assert not _native.running()


def _vm_size_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmSize in /proc/self/status")


def test_op_table_address_space_at_the_largest_allowed_size_stays_bounded():
    """At the largest op capacity × events allowed, with 130 threads (three blocks of 64 thread
    slots), the session's address space grows by at most 1 GiB per block of threads, plus the
    op entries themselves and room for the per-thread perf rings."""
    events = ["task-clock", "cpu-clock", "context-switches", "cpu-migrations", "page-faults", "minor-faults",
              "major-faults", "alignment-faults"]
    limit = _native.limits["kMaxOpCountersPerThread"]
    capacity = limit // len(events)
    release = threading.Event()
    threads = [threading.Thread(target=release.wait) for _ in range(130)]
    for t in threads:
        t.start()
    try:
        before = _vm_size_bytes()
        with cpuprof.profile(events, mode="exact", op_capacity=capacity, warn=False):
            grown = _vm_size_bytes() - before
            snap = _native.snapshot()
    finally:
        release.set()
        for t in threads:
            t.join()
    n_events = len(snap.events)
    registered = len(snap.threads)
    blocks = -(-registered // 64)
    block_bytes = capacity * 64 * n_events * 16
    assert block_bytes <= 1 << 30
    entry_bytes = 2048  # an op entry's description and totals (about 1.2 KB)
    bound = blocks * (1 << 30) + capacity * entry_bytes + 256 * (1 << 20)
    assert snap.memory_bytes <= blocks * block_bytes + capacity * entry_bytes
    assert grown <= bound, f"{grown / 2**30:.2f} GiB grown for {registered} threads, bound {bound / 2**30:.2f} GiB"
