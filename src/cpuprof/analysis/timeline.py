"""Each thread's CPU over the run, from the sample timeline: how busy it was in each slice of wall time."""

from __future__ import annotations

from dataclasses import dataclass

from .. import defaults
from ..model import Profile
from .labels import team_order, thread_label

# A bucket holds at least this many sampling periods of one thread's CPU: a busy share is then
# measured to a fifth or better, not read off one or two samples.
MIN_PERIODS_PER_BUCKET = 5
MAX_BUCKETS = 120


@dataclass
class ThreadBusy:
    thread: int  # index into Profile.threads
    label: str  # T0, T1, ... as every table says
    cpu_ns: list[float]  # the thread's CPU time in each bucket

    def shares(self, bucket_ns: float) -> list[float]:
        """Each bucket's CPU time / its wall time: 1.0 is one CPU busy throughout."""
        return [ns / bucket_ns for ns in self.cpu_ns]


@dataclass
class BusyTimeline:
    """Each thread's CPU time per wall-time bucket, from the sample timeline."""

    start_ns: int  # the first bucket's start (CLOCK_MONOTONIC)
    bucket_ns: float
    buckets: int
    threads: list[ThreadBusy]
    samples: int
    dropped: int  # samples older than the timeline kept
    hz: int


def busy_timeline(profile: Profile) -> BusyTimeline | None:
    """None where the profile has no sample timeline (exact mode, not profiled, nothing sampled)."""
    tl = profile.stacks.timeline if profile.stacks is not None else None
    c = profile.collection
    if tl is None or not len(tl) or c is None:
        return None
    hz = profile.sampling.hz if profile.sampling else defaults.SAMPLE_HZ
    dropped = profile.sampling.timeline_dropped if profile.sampling else 0
    # With samples dropped the timeline holds only the newest: the chart starts at the first kept one.
    start = min(tl.time_ns) if dropped else c.started_ns
    end = max(c.stopped_ns, max(tl.time_ns))
    span = max(end - start, 1)
    buckets = int(max(1, min(MAX_BUCKETS, span * hz // (MIN_PERIODS_PER_BUCKET * 1_000_000_000))))
    cpu = {i: [0.0] * buckets for i in team_order(profile)}
    for t, thread, cpu_us in zip(tl.time_ns, tl.thread, tl.cpu_us, strict=True):
        if thread not in cpu:
            continue
        # A sample closes the CPU time since the thread's previous one: spread it over the wall time
        # just before the sample (as the trace's CPU counter does), clipped to the chart.
        lo, hi = max(start, t - cpu_us * 1000), min(end, t)
        row = cpu[thread]
        while lo < hi:
            # integer bucket edges, start + ceil(k * span / buckets): the next edge is always past lo
            k = min((lo - start) * buckets // span, buckets - 1)
            edge = min(hi, start - (-(k + 1) * span // buckets))
            row[k] += edge - lo
            lo = edge
    return BusyTimeline(start_ns=start, bucket_ns=span / buckets, buckets=buckets,
                        threads=[ThreadBusy(k, thread_label(k), ns) for k, ns in cpu.items()],
                        samples=len(tl), dropped=dropped, hz=hz)


__all__ = ["MAX_BUCKETS", "MIN_PERIODS_PER_BUCKET", "BusyTimeline", "ThreadBusy", "busy_timeline"]
