// Sampled counting: the kernel samples every thread on its own CPU clock; samples are joined by
// time to the op timeline of the thread they work for.
//
// On the op path a dispatching thread only appends its op begins and ends to a ring (24 bytes
// each, no counter read, no syscall). Every thread's sampling event (task-clock, the leader of
// its counter group) writes a record each 1/Hz of that thread's CPU time into a ring the kernel
// fills without stopping anyone: the time, the group's counter values, the kernel call chain,
// the user registers and a copy of the user stack; and a switch record each time the thread goes
// on or off a CPU. The collector thread drains the rings every period, orders the records by
// time and replays each dispatching thread's op stack along them.
//
// CPU time is charged by interval, not by sample: between two records of a thread, the time it
// was on a CPU is split over the ops its dispatching thread went through meanwhile, so no op gets
// more of a thread's CPU than the op lasted. Charging a whole period to the op a sample lands in
// is biased wherever sample times correlate with op boundaries: a sleeping OpenMP worker's timer
// that expired as it went to sleep fires just after it wakes, inside the next parallel op, with
// the CPU of its previous run. Samples still place the other events (page faults, ...) and the
// native stacks, and a thread's CPU that its switch records do not cover (before its first
// record, around lost records, all of it on a kernel without switch records) is charged where
// the sample lands, as a statistical estimate.
//
// The strategy is one class (SampledCounting, declared in sampled_counting_impl.h) whose parts
// are defined in files of their own, one responsibility each (the header lists them). This one
// holds the collector's pass: the records drained, sorted by time and joined one by one to the op
// timelines (process, join), and, once the session stopped, what remained after the last samples.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <memory>
#include <mutex>

#include "core/sampled_counting_impl.h"
#include "unwind/unwinder.h"

namespace cpuprof {

namespace {

std::atomic<bool> g_eager_workers{false};

}  // namespace

namespace detail {

SampledCounting::SampledCounting(CountingContext& context, const CountingOptions& options)
    : ctx_(context),
      options_(options),
      last_(static_cast<size_t>(options.max_slots) * kMaxEvents),
      samples_of_(static_cast<size_t>(options.max_slots)),
      lost_of_(static_cast<size_t>(options.max_slots)),
      votes_(static_cast<size_t>(options.max_slots)),
      runs_(static_cast<size_t>(options.max_slots)),
      buckets_(static_cast<size_t>(options.max_slots)),
      eager_workers_(g_eager_workers.load()),
      scratch_(65536) {
  stacks_.init(kMaxStacks, kMaxStackFrames, kMaxStackCounts, options.timeline_samples);
  for (int e = 0; e < context.n_events() && cpu_event_ < 0; ++e) {
    if (context.cpu_clock_event[e]) cpu_event_ = e;
  }
  unwind_stops_.assign(kUnwindStopKinds, 0);
  pending_.reserve(4096);
  on_cpu_.reserve(256);
}

ThreadCreation SampledCounting::collect(int64_t now, bool final) {
  std::lock_guard<std::mutex> lock(mutex_);
  creation_seen_ = false;
  uncovered_ = false;
  enter_lazy();
  frames_.refresh();  // libraries loaded since the last pass (torch loads some lazily)
  // Op events are stamped when their callback began and published a little later; samples are
  // joined only once every op event up to their time has surely been published.
  const int64_t until = final ? INT64_MAX : now - static_cast<int64_t>(kJoinLagUs) * 1000;
  // Rings are emptied every period (they hold 2.5); samples wait in memory until the op
  // timeline has caught up with them.
  drain_rings();
  // Stable: a thread's records keep their ring order where their times are equal.
  std::stable_sort(pending_.begin(), pending_.end(),
                   [](const Pending& a, const Pending& b) { return a.time < b.time; });
  size_t joined = 0;
  while (joined < pending_.size() && pending_[joined].time <= until) process(pending_[joined++]);
  pending_.erase(pending_.begin(), pending_.begin() + static_cast<std::ptrdiff_t>(joined));
  if (final) {
    advance_all(INT64_MAX);
    const int64_t end = stopped_ns_ > 0 ? stopped_ns_ : now;
    // Eager settling charged workers through every boundary, past the stop too: the same here.
    for (int slot : on_cpu_) settle_any(slot, lazy_worker(slot) ? std::max(end, segment_from_) : end);
    flush_view();
    flush_all();
    charge_remainders();
  } else {
    advance_all(until);
    flush_view();
    flush_all();
  }
  if (creation_seen_) return ThreadCreation::Seen;
  // Fork records come with the switch records' attr.task: without them, or with threads no ring
  // covers (without one, beyond the slots), nothing is known.
  const bool covered = !uncovered_ && ctx_.registry->threads_beyond_limit() == 0 &&
                       ctx_.registry->size() <= options_.max_slots;
  return context_switch_records() && covered ? ThreadCreation::NoneSeen : ThreadCreation::Unknown;
}

void SampledCounting::go_off_cpu(int slot, RunState state) {
  Run& run = runs_[slot];
  if (run.state == RunState::On) on_cpu_.erase(std::find(on_cpu_.begin(), on_cpu_.end(), slot));
  run.state = state;
}

void SampledCounting::go_on_cpu(int slot, int64_t time) {
  Run& run = runs_[slot];
  if (run.state != RunState::On) on_cpu_.push_back(slot);
  run.state = RunState::On;
  run.mark = time;
  run.tracked_mark = time;
  run.seg = static_cast<uint32_t>(segments_.size());
}

void SampledCounting::process(const Pending& p) {
  advance_all(p.time);
  Run& run = runs_[p.slot];
  switch (p.kind) {
    case RecordKind::SwitchIn:
      // On already: its switch out was lost, and when it left is unknown. The gap is charged to
      // no op; the next sample places what the thread ran in it.
      go_on_cpu(p.slot, p.time);
      assign_owner(p.slot, false);
      return;
    case RecordKind::SwitchOut:
    case RecordKind::Exit:
      if (run.state == RunState::On) settle_any(p.slot, p.time);
      go_off_cpu(p.slot, RunState::Off);
      return;
    case RecordKind::Lost:
      go_off_cpu(p.slot, RunState::Unknown);
      return;
    case RecordKind::Sample:
      join(p);
      return;
  }
}

void SampledCounting::join(const Pending& p) {
  Run& run = runs_[p.slot];
  if (run.state == RunState::On) {
    // A lazily charged worker's charges wait for the pass's end; what the sample needs now is
    // how much of its CPU time the intervals cover, which is its time on the CPU.
    if (lazy_worker(p.slot)) {
      track(p.slot, p.time);
    } else {
      settle(p.slot, p.time);
    }
  } else if (context_switch_records()) {
    go_on_cpu(p.slot, p.time);  // a sample is taken on a CPU: its first record, or a lost switch in
  }
  assign_owner(p.slot, true);
  const int owner = run.owner;
  const uint32_t* path = owner >= 0 ? replays_[owner].path : nullptr;
  int depth = owner >= 0 ? replays_[owner].depth : 0;
  uint32_t profiler_path[1] = {kProfilerEntry};
  if (owner >= 0) {
    const Replay& r = replays_[owner];
    if (p.time >= r.hook_from && p.time < r.hook_until) {
      path = profiler_path;
      depth = 1;
    }
  }
  const uint32_t innermost = depth > 0 ? path[depth - 1] : kOutsideEntry;
  if (!ctx_.table->slot_ready(p.slot)) ctx_.table->reserve_slots(p.slot + 1);
  if (!ctx_.table->slot_ready(p.slot)) return;
  ctx_.team->join(p.slot);  // a thread that was sampled worked
  for (uint32_t e = 0; e < p.n_deltas; ++e) {
    uint64_t delta = p.deltas[e];
    if (ctx_.cpu_clock_event[e]) {
      // CPU time the intervals did not cover. A few microseconds per switch are the kernel's
      // own switching path, timed by task-clock but outside the switch records' stamps: it
      // belongs to no op the records can name, and landing it on the op under the sample would
      // give a microsecond op that sample's share. More than that (before the thread's first
      // record, around lost records, no switch records at all) is charged where the sample
      // landed, the statistical estimate.
      const uint64_t uncovered = delta > run.tracked ? delta - run.tracked : 0;
      by_sample_ns_ += uncovered;
      if (run.tracked > 0 && uncovered <= delta / 8) {
        if (uncovered) ctx_.charge(nullptr, 0, p.slot, static_cast<int>(e), uncovered);
        continue;
      }
      delta = uncovered;
    }
    if (delta) ctx_.charge(path, depth, p.slot, static_cast<int>(e), delta);
  }
  run.tracked = 0;
  ctx_.table->entry(innermost).samples.fetch_add(1, std::memory_order_relaxed);
  const uint64_t cpu = cpu_event_ >= 0 ? p.deltas[cpu_event_] : 0;
  const uint32_t path_id = depth > 0 ? stacks_.intern_path(path, depth) : kEmptySequence;
  stacks_.count(p.stack, path_id, p.slot, innermost, p.deltas, static_cast<int>(p.n_deltas));
  stacks_.record(TimelineSample{p.time, p.slot, innermost, p.stack, path_id, static_cast<uint32_t>(std::min<uint64_t>(cpu / 1000, UINT32_MAX))});
  ++samples_of_[p.slot];
  joined_.fetch_add(1, std::memory_order_relaxed);
}

// After the last sample of each thread, its counters went on until the session stopped: that
// remainder (the final totals minus the last sample's values) is charged to "[outside ATen
// ops]", less the CPU time already charged to ops by interval since, so that ops plus outside
// equal the totals.
void SampledCounting::charge_remainders() {
  ThreadRegistry& registry = *ctx_.registry;
  const int n_slots = std::min(registry.size(), options_.max_slots);
  const int n_events = ctx_.n_events();
  for (int slot = 0; slot < n_slots; ++slot) {
    const ThreadSlot& thread = registry.slot(slot);
    const uint64_t tracked = runs_[slot].tracked;
    if (!thread.counters.sampling() || (samples_of_[slot] == 0 && tracked == 0) || !ctx_.table->slot_ready(slot)) continue;
    const RawCount* last = &last_[static_cast<size_t>(slot) * kMaxEvents];
    for (int e = 0; e < n_events; ++e) {
      const ScaledCount at_last = scale_count(last[e].raw, last[e].enabled, last[e].running);
      const uint64_t sampled = static_cast<uint64_t>(std::llround(at_last.value));
      uint64_t remainder = thread.last_values[e] > sampled ? thread.last_values[e] - sampled : 0;
      if (ctx_.cpu_clock_event[e]) remainder = remainder > tracked ? remainder - tracked : 0;
      if (remainder) ctx_.charge(nullptr, 0, slot, e, remainder);
    }
  }
}

}  // namespace detail

void inject_eager_workers(bool eager) { g_eager_workers.store(eager); }

std::unique_ptr<CountingStrategy> make_sampled_counting(CountingContext& context, const CountingOptions& options) {
  return std::make_unique<detail::SampledCounting>(context, options);
}

}  // namespace cpuprof
