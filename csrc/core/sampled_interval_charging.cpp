// Sampled counting's charges by interval (see sampled_counting.cpp): a thread on a CPU is charged
// its time since its last boundary to the op path its dispatching thread was in, summed per thread
// and path in small tables (Bucket, SlotBuckets) that reach the op table once per pass. Apart
// because it is the one accounting of time by interval, which the replay of the op timelines and
// the lazy workers both end in (samples are placed by join(), in sampled_counting.cpp).
#include <algorithm>

#include "core/sampled_counting_impl.h"

namespace cpuprof {
namespace detail {

void SampledCounting::charge_cpu(const uint32_t* path, int depth, int slot, uint64_t ns) {
  for (int e = 0; e < ctx_.n_events(); ++e) {
    if (ctx_.cpu_clock_event[e]) ctx_.charge(path, depth, slot, e, ns);
  }
}

// The bucket `key` is summed in: its own, or an empty one (whatever held it before is flushed).
SampledCounting::Bucket& SampledCounting::bucket_for(int slot, uint64_t key) {
  SlotBuckets& buckets = buckets_[slot];
  if (!buckets.table) {
    buckets.table.reset(new Bucket[kSettleBuckets]);
    buckets.used.reserve(kSettleBuckets);
    dirty_.push_back(slot);
  }
  const uint16_t index = static_cast<uint16_t>((key ^ (key >> 29)) & (kSettleBuckets - 1));
  Bucket& b = buckets.table[index];
  if (b.key == key) return b;
  if (b.key != 0) {
    flush(slot, b);
  } else {
    buckets.used.push_back(index);
  }
  return b;
}

void SampledCounting::accumulate(int slot, uint64_t key, const uint32_t* path, int depth, uint64_t ns) {
  Bucket& b = bucket_for(slot, key);
  if (b.key == key) {
    b.ns += ns;
    return;
  }
  uint32_t id = kEmptySequence;
  if (key != kOutsideKey && key != kProfilerKey) {
    id = stacks_.intern_path(path, depth);
    const uint32_t* entries = nullptr;
    int n = 0;
    stacks_.paths().items_of(id, &entries, &n);
    if (n != depth) {  // the path table is full (it keeps the innermost op alone): charged at once
      charge_cpu(path, depth, slot, ns);
      return;
    }
  }
  b = Bucket{key, id, ns};
}

// The same for a path already interned whole.
void SampledCounting::accumulate_interned(int slot, uint64_t key, uint32_t path_id, uint64_t ns) {
  Bucket& b = bucket_for(slot, key);
  if (b.key == key) {
    b.ns += ns;
  } else {
    b = Bucket{key, path_id, ns};
  }
}

void SampledCounting::flush(int slot, Bucket& b) {
  if (b.key == kOutsideKey) {
    charge_cpu(nullptr, 0, slot, b.ns);
  } else if (b.key == kProfilerKey) {
    const uint32_t profiler_path[1] = {kProfilerEntry};
    charge_cpu(profiler_path, 1, slot, b.ns);
  } else {
    const uint32_t* entries;
    int n;
    stacks_.paths().items_of(b.path, &entries, &n);
    charge_cpu(entries, n, slot, b.ns);
  }
  b = Bucket{};
}

// Every pass: a thread off its CPU gives its table back, so memory follows the threads that
// run, not every thread that ever ran.
void SampledCounting::flush_all() {
  size_t kept = 0;
  for (int slot : dirty_) {
    SlotBuckets& buckets = buckets_[slot];
    for (uint16_t i : buckets.used) {
      if (buckets.table[i].key != 0) flush(slot, buckets.table[i]);
    }
    buckets.used.clear();
    if (runs_[slot].state == RunState::On) {
      dirty_[kept++] = slot;
    } else {
      buckets.table.reset();
      buckets.used = std::vector<uint16_t>();
    }
  }
  dirty_.resize(kept);
}

// Charges a thread on a CPU for its time since it was last charged, up to `until`, to what its
// dispatching thread ran meanwhile (nothing changed there since: every boundary settles first).
void SampledCounting::settle(int slot, int64_t until) {
  Run& run = runs_[slot];
  if (run.state != RunState::On || until <= run.mark) return;
  const int64_t from = run.mark;
  run.mark = until;
  // A thread charged lazily until now (one whose first op made it a dispatching thread) may
  // already have counted part of this in `tracked`, by time: not again.
  const int64_t tracked_from = std::max(from, run.tracked_mark);
  run.tracked_mark = std::max(run.tracked_mark, until);
  if (!ctx_.table->slot_ready(slot)) ctx_.table->reserve_slots(slot + 1);
  if (!ctx_.table->slot_ready(slot)) return;
  const uint64_t ns = static_cast<uint64_t>(until - from);
  if (until > tracked_from) {
    run.tracked += static_cast<uint64_t>(until - tracked_from);
    by_interval_ns_ += static_cast<uint64_t>(until - tracked_from);
  }
  if (run.owner < 0) {
    accumulate(slot, kOutsideKey, nullptr, 0, ns);
    return;
  }
  const Replay& r = replays_[run.owner];
  // The dispatching thread in cpuprof's own callback: its time, and its workers' meanwhile, is
  // the profiler's (op wall times leave the callbacks out too).
  const int64_t hook = std::max<int64_t>(0, std::min(until, r.hook_until) - std::max(from, r.hook_from));
  if (hook > 0) accumulate(slot, kProfilerKey, nullptr, 0, static_cast<uint64_t>(hook));
  if (ns > static_cast<uint64_t>(hook)) {
    const uint64_t rest = ns - static_cast<uint64_t>(hook);
    if (r.depth == 0) {
      accumulate(slot, kOutsideKey, nullptr, 0, rest);
    } else {
      accumulate(slot, r.path_hash[r.depth] | (1ULL << 63), r.path, r.depth, rest);
    }
  }
}

}  // namespace detail

}  // namespace cpuprof
