// What a snapshot takes of sampled counting (see sampled_counting.cpp): the sampling figures, the
// stack, path, count and timeline tables copied out flat, and each thread's sampling state. Apart
// because it only reads the strategy's tables, under its lock, to fill the session's snapshot.
#include <algorithm>
#include <mutex>

#include "core/sampled_counting_impl.h"

namespace cpuprof {
namespace detail {

void SampledCounting::fill_snapshot(SessionSnapshot* out) {
  std::lock_guard<std::mutex> lock(mutex_);
  SamplingSnapshot& s = out->sampling;
  s.enabled = true;
  s.sample_hz = options_.sample_hz;
  s.stack_bytes = options_.stack_bytes;
  s.samples = joined_.load(std::memory_order_relaxed);
  s.unparsed = unparsed_;
  s.ambiguous_workers = ambiguous_;
  s.late_op_events = late_events_;
  s.switch_records = switch_records_;
  s.cpu_by_interval_ns = by_interval_ns_;
  s.cpu_by_sample_ns = by_sample_ns_;
  s.stacks_truncated = stacks_.stacks().truncated() + stacks_.paths().truncated();
  s.counts_dropped = stacks_.counts_dropped();
  s.timeline_dropped = stacks_.timeline_dropped();
  s.unwind_stops = unwind_stops_;
  s.frames_by_frame_pointer = by_frame_pointer_;
  s.frames_by_scanning = by_scanning_;
  const int n_states = std::min(options_.states_used->load(), kMaxDispatchThreads);
  for (int i = 0; i < n_states; ++i) s.op_events_dropped += options_.states[i]->events.dropped();
  s.offsets.push_back(0);
  for (uint32_t id = 1; id <= stacks_.stacks().size(); ++id) {
    const uint64_t* pcs;
    int n;
    stacks_.stacks().items_of(id, &pcs, &n);
    s.frames.insert(s.frames.end(), pcs, pcs + n);
    s.offsets.push_back(static_cast<uint32_t>(s.frames.size()));
  }
  s.path_offsets.push_back(0);
  for (uint32_t id = 1; id <= stacks_.paths().size(); ++id) {
    const uint32_t* entries;
    int n;
    stacks_.paths().items_of(id, &entries, &n);
    s.path_entries.insert(s.path_entries.end(), entries, entries + n);
    s.path_offsets.push_back(static_cast<uint32_t>(s.path_entries.size()));
  }
  const int n_events = ctx_.n_events();
  for (const StackCount& c : stacks_.counts()) {
    s.count_stack.push_back(c.stack);
    s.count_path.push_back(c.path);
    s.count_slot.push_back(c.slot);
    s.count_entry.push_back(c.entry);
    s.count_samples.push_back(c.samples);
    s.count_cpu_ns.push_back(cpu_event_ >= 0 ? c.values[cpu_event_] : 0);
    s.count_values.insert(s.count_values.end(), c.values, c.values + n_events);
  }
  for (const TimelineSample& t : stacks_.timeline()) {
    s.timeline_time.push_back(t.time_ns);
    s.timeline_slot.push_back(t.slot);
    s.timeline_entry.push_back(t.entry);
    s.timeline_stack.push_back(t.stack);
    s.timeline_path.push_back(t.path);
    s.timeline_cpu_us.push_back(t.cpu_us);
  }
  s.memory_bytes = stacks_.memory_bytes() + working_memory_bytes();
  // Every thread, sampled or not: one that never gave a sample must still say why.
  for (size_t slot = 0; slot < out->threads.size() && slot < static_cast<size_t>(ctx_.registry->size()); ++slot) {
    if (slot < samples_of_.size()) {
      out->threads[slot].samples = samples_of_[slot];
      out->threads[slot].samples_lost = lost_of_[slot];
      s.samples_lost += lost_of_[slot];
    }
    const ThreadSlot& t = ctx_.registry->slot(static_cast<int>(slot));
    out->threads[slot].sample_errno = t.counters.sampled() ? 0 : (t.counters.sampling_errno() ? t.counters.sampling_errno() : -1);
    out->threads[slot].ring_pages = static_cast<uint32_t>(t.counters.ring_pages());
    out->threads[slot].ring_pages_asked = static_cast<uint32_t>(t.counters.ring_pages_asked());
  }
}

// What the collector holds between and within passes, besides the stack table: the settle buckets,
// the lazy workers' segments (cleared each pass, capacity kept) and the records awaiting a join.
size_t SampledCounting::working_memory_bytes() const {
  size_t bytes = dirty_.size() * kSettleBuckets * (sizeof(Bucket) + sizeof(uint16_t));
  bytes += segments_.capacity() * sizeof(WorkerSegment) + totals_used_.capacity() * sizeof(uint16_t);
  if (totals_) bytes += kSegmentTotals * sizeof(Bucket);
  bytes += pending_.capacity() * sizeof(Pending) + scratch_.capacity();
  bytes += (last_.capacity() * sizeof(RawCount)) + runs_.capacity() * sizeof(Run) + votes_.capacity() * sizeof(WorkerVotes);
  return bytes;
}

}  // namespace detail

}  // namespace cpuprof
