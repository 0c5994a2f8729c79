"""What the bounded buffers and the machine kept out of a profile, one sentence each."""

from __future__ import annotations

from .. import defaults
from ..model import Profile
from .labels import thread_label


def limit_notes(profile: Profile) -> list[str]:
    lim = profile.limits
    if lim is None:
        return []
    notes = []
    if lim.ops_overflowed:
        notes.append(f"{lim.ops_overflowed:,} op calls fell into '[other ops]' "
                     f"(op table of {lim.op_capacity:,} keys full)")
    if lim.spans_dropped:
        notes.append(f"timeline kept the last {lim.span_capacity:,} spans per thread; {lim.spans_dropped:,} older "
                     "ones were dropped")
    if lim.too_deep:
        notes.append(f"{lim.too_deep:,} ops nested deeper than {defaults.MAX_DEPTH} levels were timed only as part "
                     "of their parents")
    if lim.unattributed_ops:
        notes.append(f"{lim.unattributed_ops:,} ops ran on threads beyond the {defaults.MAX_DISPATCH_THREADS} "
                     "tracked op-running threads and were not timed")
    if lim.truncated_ops:
        notes.append(f"{lim.truncated_ops:,} ops were still running when profiling stopped (not counted)")
    if lim.unmatched_ends:
        notes.append(f"{lim.unmatched_ends:,} op ends had no begin in this session on their thread (ignored)")
    if lim.threads_beyond_limit:
        notes.append(f"{lim.threads_beyond_limit:,} threads beyond the {lim.max_threads:,} thread slots were not "
                     "counted (raise max_threads)")
    by_reason: dict[str, list[str]] = {}
    for t in profile.idle_threads:
        if t.uncounted:
            by_reason.setdefault(t.uncounted, []).append(f"tid {t.tid} ({t.name})")
    for reason, threads in by_reason.items():
        notes.append(f"{len(threads)} thread{'s' if len(threads) != 1 else ''} could not be counted, so "
                     f"{'their' if len(threads) != 1 else 'its'} work is in no figure: {', '.join(threads)}: {reason}")
    partly = [f"{thread_label(i)} ({', '.join(t.uncounted)}: {t.counting_error})"
              for i, t in enumerate(profile.threads) if t.uncounted and t.counting_error]
    if partly:
        notes.append("events not counted on some threads: " + "; ".join(partly))
    s = profile.sampling
    if s is not None:
        not_sampled = [f"{thread_label(i)} ({t.sampling_error})" for i, t in enumerate(profile.threads)
                       if t.sampling_error]
        if not_sampled:
            notes.append("threads not sampled, so their per-op CPU time and stacks are missing (their totals are "
                         "counted): " + "; ".join(not_sampled))
        shrunk = [f"{thread_label(i)} {t.sample_ring_pages} of {t.sample_ring_pages_asked} pages "
                  f"({t.samples_lost:,} samples lost)" for i, t in enumerate(profile.threads) if t.sample_ring_shrunk]
        if shrunk:
            notes.append("sample rings the locked-memory budget (kernel.perf_event_mlock_kb per CPU for all of the "
                         "user's processes, then RLIMIT_MEMLOCK) or memory mapped smaller than asked: "
                         + "; ".join(shrunk) + ". A ring that holds less than a collector period of samples drops "
                         "some at every pass while its thread is busy: raise the budget, or profile fewer threads")
        if s.lost:
            notes.append(f"{s.lost:,} samples were lost: a thread's sample ring filled before the collector drained "
                         "it, so per-op CPU time is short by as many sampling periods (a ring the locked-memory "
                         "budget shrank holds less: raise kernel.perf_event_mlock_kb or RLIMIT_MEMLOCK)")
        if s.op_events_dropped:
            notes.append(f"{s.op_events_dropped:,} op begins and ends were dropped: a dispatching thread's op-event "
                         "ring filled before the collector drained it, so CPU and stacks near them went to the "
                         "wrong ops (calls and wall times are exact)")
        if s.python is not None and s.python.error:
            notes.append(f"no Python frames in the stacks: {s.python.error}")
    if profile.collection is not None:
        user_only = [e.name for e in profile.collection.events if e.user_only]
        if user_only:
            notes.append("counted in user mode only (kernel mode refused by perf_event_paranoid): "
                         + ", ".join(user_only))
        scaled = sorted({e for t in profile.threads for e in t.scaled} | set(profile.collection.scaled_events))
        if scaled:
            notes.append(f"multiplexed, so scaled by time_enabled/time_running: {', '.join(scaled)}")
    return notes
