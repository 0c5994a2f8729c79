// Sampled counting's lazy charging of OpenMP workers (see WorkerSegment in
// sampled_counting_impl.h): with one dispatching thread, op boundaries close segments of one
// shared timeline instead of settling every worker, and each worker is charged from them at the
// end of the pass. Apart because it is a mode of its own, entered and left for good, with its own
// state (segments_, totals_); its figures are those of sampled_interval_charging.cpp's settle().
#include <algorithm>

#include "core/sampled_counting_impl.h"

namespace cpuprof {
namespace detail {

// The one dispatching thread whose op events are replayed, or -1 when there are none or several.
int SampledCounting::single_ready() const {
  int found = -1;
  for (int i = 0, n = n_states(); i < n; ++i) {
    if (!ready(i)) continue;
    if (found >= 0) return -1;
    found = i;
  }
  return found;
}

void SampledCounting::settle_any(int slot, int64_t until) {
  if (lazy_worker(slot)) {
    settle_lazily(slot, until);
    track(slot, until);
  } else {
    settle(slot, until);
  }
}

// The time a lazily charged worker spent on its CPU, counted as settle() counts it.
void SampledCounting::track(int slot, int64_t until) {
  Run& run = runs_[slot];
  if (until <= run.tracked_mark) return;
  const uint64_t ns = static_cast<uint64_t>(until - run.tracked_mark);
  run.tracked_mark = until;
  if (!ctx_.table->slot_ready(slot)) ctx_.table->reserve_slots(slot + 1);
  if (!ctx_.table->slot_ready(slot)) return;
  run.tracked += ns;
  by_interval_ns_ += ns;
}

// The worker's view of the dispatching thread's state now, as a segment from `from` on.
bool SampledCounting::open_segment(int64_t from, int64_t until, WorkerSegment* out) {
  const Replay& r = replays_[lazy_index_];
  *out = WorkerSegment{from, until, r.hook_from, r.hook_until, kOutsideKey, kEmptySequence};
  if (r.depth == 0) return true;
  out->key = r.path_hash[r.depth] | (1ULL << 63);
  PathId& cached = path_ids_[out->key & (kPathIdCache - 1)];
  if (cached.key != out->key) {
    const uint32_t id = stacks_.intern_path(r.path, r.depth);
    const uint32_t* entries = nullptr;
    int n = 0;
    stacks_.paths().items_of(id, &entries, &n);
    if (n != r.depth) return false;  // the path table is full
    cached = PathId{out->key, id};
  }
  out->path = cached.id;
  return true;
}

void SampledCounting::charge_segment(int slot, const WorkerSegment& s, int64_t from, int64_t until) {
  const uint64_t ns = static_cast<uint64_t>(until - from);
  if (s.key == kOutsideKey) {
    accumulate_interned(slot, kOutsideKey, kEmptySequence, ns);
    return;
  }
  const int64_t hook = std::max<int64_t>(0, std::min(until, s.hook_until) - std::max(from, s.hook_from));
  if (hook > 0) accumulate_interned(slot, kProfilerKey, kEmptySequence, static_cast<uint64_t>(hook));
  if (ns > static_cast<uint64_t>(hook)) accumulate_interned(slot, s.key, s.path, ns - static_cast<uint64_t>(hook));
}

// Closes the segment up to an op boundary of the dispatching thread, before the boundary is
// applied. False when its path could not be interned whole.
bool SampledCounting::close_worker_segment(int64_t at) {
  at = std::max(at, segment_from_);
  if (at == segment_from_) return true;
  WorkerSegment s;
  if (!open_segment(segment_from_, at, &s)) return false;
  segments_.push_back(s);
  segment_from_ = at;
  const uint64_t ns = static_cast<uint64_t>(s.until - s.from);
  if (s.key == kOutsideKey) {
    add_total(kOutsideKey, kEmptySequence, ns);
  } else {
    const int64_t hook = std::max<int64_t>(0, std::min(s.until, s.hook_until) - std::max(s.from, s.hook_from));
    if (hook > 0) add_total(kProfilerKey, kEmptySequence, static_cast<uint64_t>(hook));
    if (ns > static_cast<uint64_t>(hook)) add_total(s.key, s.path, ns - static_cast<uint64_t>(hook));
  }
  return true;
}

void SampledCounting::add_total(uint64_t key, uint32_t path, uint64_t ns) {
  if (totals_overflow_) return;
  for (size_t i = (key ^ (key >> 29)) & (kSegmentTotals - 1);; i = (i + 1) & (kSegmentTotals - 1)) {
    Bucket& b = totals_[i];
    if (b.key == key) {
      b.ns += ns;
      return;
    }
    if (b.key == 0) {
      if (totals_used_.size() >= kSegmentTotals / 2) {
        totals_overflow_ = true;
        return;
      }
      b = Bucket{key, path, ns};
      totals_used_.push_back(static_cast<uint16_t>(i));
      return;
    }
  }
}

// Charges a lazily charged worker for its time from its mark to `until`: the closed segments,
// then the open one.
void SampledCounting::settle_lazily(int slot, int64_t until) {
  Run& run = runs_[slot];
  if (run.state != RunState::On || until <= run.mark) return;
  const int64_t from = run.mark;
  run.mark = until;
  if (!ctx_.table->slot_ready(slot)) ctx_.table->reserve_slots(slot + 1);
  if (!ctx_.table->slot_ready(slot)) return;
  size_t i = std::min<size_t>(run.seg, segments_.size());
  while (i < segments_.size() && segments_[i].until <= from) ++i;
  for (; i < segments_.size() && segments_[i].from < until; ++i) {
    const WorkerSegment& s = segments_[i];
    charge_segment(slot, s, std::max(from, s.from), std::min(until, s.until));
  }
  if (i > 0 && segments_[i - 1].until > until) --i;  // its rest is still to charge
  run.seg = static_cast<uint32_t>(i);
  if (until > segment_from_) {
    const int64_t open_from = std::max(from, segment_from_);
    WorkerSegment open;
    if (open_segment(segment_from_, until, &open)) {
      charge_segment(slot, open, open_from, until);
    } else {
      // The path table is full: charged at once to what it keeps of the path, as accumulate()
      // does; the callback's part still goes to the profiler.
      const Replay& r = replays_[lazy_index_];
      const int64_t hook = std::max<int64_t>(0, std::min(until, r.hook_until) - std::max(open_from, r.hook_from));
      if (hook > 0) accumulate_interned(slot, kProfilerKey, kEmptySequence, static_cast<uint64_t>(hook));
      const uint64_t rest = static_cast<uint64_t>(until - open_from - hook);
      if (rest > 0) charge_cpu(r.path, r.depth, slot, rest);
    }
  }
}

// At the end of a pass: every lazily charged worker is charged up to the last boundary, and
// the pass's segments are dropped.
void SampledCounting::flush_view() {
  if (lazy_index_ < 0) return;
  for (int slot : on_cpu_) {
    Run& run = runs_[slot];
    if (run.dispatching || run.mark >= segment_from_) continue;
    if (run.mark == segments_start_ && !totals_overflow_) {
      if (!ctx_.table->slot_ready(slot)) ctx_.table->reserve_slots(slot + 1);
      if (ctx_.table->slot_ready(slot)) {
        for (uint16_t i : totals_used_) accumulate_interned(slot, totals_[i].key, totals_[i].path, totals_[i].ns);
      }
      run.mark = segment_from_;
    } else {
      settle_lazily(slot, segment_from_);
    }
  }
  clear_segments();
}

void SampledCounting::clear_segments() {
  segments_.clear();
  for (uint16_t i : totals_used_) totals_[i] = Bucket{};
  totals_used_.clear();
  totals_overflow_ = false;
  segments_start_ = segment_from_;
  for (int slot : on_cpu_) runs_[slot].seg = 0;
}

// At the start of a pass with a single dispatching thread: the workers on a CPU are settled up
// to where its op events were applied, and are charged lazily from there.
void SampledCounting::enter_lazy() {
  if (lazy_index_ >= 0 || lazy_off_ || eager_workers_) return;
  const int index = single_ready();
  if (index < 0) return;
  const int64_t from = replays_[index].time;
  for (int slot : on_cpu_) {
    if (!runs_[slot].dispatching) settle(slot, from);
  }
  if (!totals_) totals_.reset(new Bucket[kSegmentTotals]);
  lazy_index_ = index;
  segment_from_ = from;
  clear_segments();
}

// Back to settling every worker at every boundary, for good: each is charged up to where its
// time was counted, and takes the owner settle() needs.
void SampledCounting::exit_lazy() {
  for (int slot : on_cpu_) {
    Run& run = runs_[slot];
    if (run.dispatching) continue;
    const int64_t until = std::max({segment_from_, run.mark, run.tracked_mark});
    settle_lazily(slot, until);
    track(slot, until);
  }
  lazy_index_ = -1;
  lazy_off_ = true;
  clear_segments();
  for (int slot : on_cpu_) {
    if (!runs_[slot].dispatching) assign_owner(slot, false);
  }
}

}  // namespace detail

}  // namespace cpuprof
