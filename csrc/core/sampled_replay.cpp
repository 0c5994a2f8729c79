// Sampled counting's replay of the op timelines (see sampled_counting.cpp): every dispatching
// thread's op events are applied in time order, settling the threads on a CPU at each boundary,
// and each thread is given the dispatching thread its time goes to (itself, or for an OpenMP
// worker the one inside an op, by vote when several are). Apart because it is what walks the op
// path's events; how the time between two boundaries is charged is sampled_interval_charging.cpp's.
#include <algorithm>

#include "common/hash.h"
#include "core/sampled_counting_impl.h"

namespace cpuprof {
namespace detail {

// Applies every dispatching thread's op events up to `time`, all of them in time order, so that
// the threads on a CPU are charged up to each op boundary with the ops open before it.
void SampledCounting::advance_all(int64_t time) {
  if (lazy_index_ >= 0 && single_ready() != lazy_index_) exit_lazy();
  const int n = n_states();
  for (;;) {
    int next = -1;
    int64_t next_start = 0;
    for (int i = 0; i < n; ++i) {
      if (!ready(i)) continue;
      const OpEvent* e = options_.states[i]->events.peek();
      if (e == nullptr) continue;
      const int64_t start = OpEventRing::start_of(*e);
      if (start <= time && (next < 0 || start < next_start)) {
        next = i;
        next_start = start;
      }
    }
    if (next < 0) break;
    apply_next(next, next_start);
  }
  for (int i = 0; i < n; ++i) replays_[i].time = std::max(replays_[i].time, time);
}

void SampledCounting::apply_next(int index, int64_t start) {
  Replay& r = replays_[index];
  OpEventRing& ring = options_.states[index]->events;
  const OpEvent& e = *ring.peek();
  if (start < r.time) ++late_events_;  // published after records past it were joined
  // Another thread became a dispatching thread since advance_all() looked: back to eager first.
  if (lazy_index_ >= 0 && lazy_index_ != index) exit_lazy();
  if (lazy_index_ == index && !close_worker_segment(start)) exit_lazy();
  const bool lazy = lazy_index_ == index;
  // The dispatching thread's own time goes to its ops, from the first boundary seen.
  const int own_slot = options_.states[index]->slot;
  if (own_slot >= 0 && own_slot < static_cast<int>(runs_.size()) && runs_[own_slot].owner != index &&
      runs_[own_slot].state == RunState::On) {
    settle_any(own_slot, start);
    assign_owner(own_slot, false);
  }
  if (lazy) {
    // The workers' time is in the segment just closed; only the dispatching thread is charged now.
    if (own_slot >= 0 && own_slot < static_cast<int>(runs_.size()) && runs_[own_slot].owner == index) {
      settle(own_slot, start);
    }
  } else {
    for (int slot : on_cpu_) {
      if (runs_[slot].owner == index) settle(slot, start);
    }
  }
  const bool was_inside = r.depth > 0;
  if (e.begin) {
    if (e.depth < kMaxDepth) {
      r.path[e.depth] = e.entry;
      r.path_hash[e.depth + 1] = mix_hash(r.path_hash[e.depth], e.entry);
      r.depth = e.depth + 1;
    }
    r.hook_from = e.hook_ns;
    r.hook_until = e.op_ns;
  } else {
    r.depth = std::min<int>(r.depth, e.depth);
    r.hook_from = e.op_ns;
    r.hook_until = e.hook_ns;
  }
  ring.pop();
  if (!lazy && was_inside != (r.depth > 0)) {
    // An OpenMP worker works for whichever dispatching thread is inside an op: that changed.
    for (int slot : on_cpu_) {
      if (runs_[slot].dispatching) continue;
      settle(slot, start);
      assign_owner(slot, false);
    }
  }
}

int SampledCounting::dispatch_index_of(int slot) const {
  const int n = n_states();
  for (int i = 0; i < n; ++i) {
    if (ready(i) && options_.states[i]->slot == slot) return i;
  }
  return -1;
}

// The dispatching thread a thread's time goes to now: itself when it runs ops; for an OpenMP
// worker (or any thread that runs none), the dispatching thread inside an op, the one it was
// seen working for by majority when several are; -1 when none is.
void SampledCounting::assign_owner(int slot, bool vote) {
  Run& run = runs_[slot];
  const int own = dispatch_index_of(slot);
  run.dispatching = own >= 0;
  if (own >= 0) {
    run.owner = own;
    return;
  }
  const int n = n_states();
  int candidates = 0, first = -1;
  for (int i = 0; i < n; ++i) {
    if (ready(i) && replays_[i].depth > 0) {
      ++candidates;
      if (first < 0) first = i;
    }
  }
  if (candidates <= 1) {
    if (vote && first >= 0) ++votes_[slot].votes[first];
    run.owner = first;
    return;
  }
  if (vote) ++ambiguous_;
  int best = -1;
  for (int i = 0; i < n; ++i) {
    if (ready(i) && replays_[i].depth > 0 && (best < 0 || votes_[slot].votes[i] > votes_[slot].votes[best])) best = i;
  }
  run.owner = best;
}

}  // namespace detail

}  // namespace cpuprof
