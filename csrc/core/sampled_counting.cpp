// Sampled counting: ops take only timestamps; at the first op boundary after each interval the
// dispatching thread reads the team once and charges the deltas to the op running then.
//
// Statistical per op, exact per thread: one read() per team thread per interval. No background
// thread reads a busy thread, because that read interrupts the CPU it runs on.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>
#include <memory>

#include "core/counting.h"

namespace cpuprof {

namespace {

class SampledCounting final : public CountingStrategy {
 public:
  SampledCounting(CountingContext& context, const CountingOptions& options)
      : ctx_(context),
        interval_ns_(static_cast<int64_t>(std::max(options.sample_interval_us, kMinSampleIntervalUs)) * 1000),
        started_ns_(options.started_ns),
        max_slots_(options.max_slots) {
    const size_t cells = static_cast<size_t>(max_slots_) * kMaxEvents;
    // Zeroed (counters open at zero, so the first delta of a slot starts there) by calloc, whose
    // large blocks are fresh pages: a slot costs memory only once its thread is read.
    last_.reset(static_cast<RawCount*>(std::calloc(cells, sizeof(RawCount))));
    carry_.reset(static_cast<uint64_t*>(std::calloc(cells, sizeof(uint64_t))));
    read_ns_.reset(static_cast<int64_t*>(std::calloc(max_slots_, sizeof(int64_t))));
    if (!last_ || !carry_ || !read_ns_) throw std::bad_alloc();
    next_ns_.store(started_ns_ + interval_ns_, std::memory_order_relaxed);
  }

  CountingMode mode() const override { return CountingMode::Sampled; }

  void begin_op(DispatchState& state, int depth, int64_t enter_ns) override {
    maybe_sample(&state, depth - 1, enter_ns);  // the time so far was the parent's
  }

  void end_op(DispatchState& state, int depth, int64_t enter_ns, int64_t, uint64_t*) override {
    maybe_sample(&state, depth, enter_ns);  // this op is the innermost one running at this instant
  }

  // What the team did since the last sample has no op to go to: it closes the books as
  // "outside", so that ops plus outside add up to the threads' totals.
  void stop(int64_t now) override { sample(nullptr, -1, now); }

  uint64_t samples() const override { return samples_.load(std::memory_order_relaxed); }

 private:
  void maybe_sample(DispatchState* state, int innermost, int64_t now) {
    if (now < next_ns_.load(std::memory_order_relaxed)) return;  // the common case: one load
    sample(state, innermost, now);
  }

  void sample(DispatchState* state, int innermost, int64_t now) {
    bool expected = false;
    if (!busy_.compare_exchange_strong(expected, true, std::memory_order_acquire)) return;
    // Deadlines stay on a fixed grid. Every deadline passed since the last sample fell inside
    // the op running now (an op boundary after any of them would have sampled), so this op is
    // owed one interval for each of them: a 30 ms op is charged 30 ms, not 4.
    const int64_t due = next_ns_.load(std::memory_order_relaxed);
    const int64_t crossed = due <= now ? 1 + (now - due) / interval_ns_ : 1;
    next_ns_.store(due + crossed * interval_ns_, std::memory_order_relaxed);
    const int64_t covered = crossed * interval_ns_;
    if (innermost >= kMaxDepth) innermost = kMaxDepth - 1;
    const uint32_t entry = state != nullptr && innermost >= 0 ? state->frames[innermost].entry : kOutsideEntry;
    const int own = state != nullptr ? state->slot : -1;
    const int n_events = ctx_.n_events();
    const int members = ctx_.team->size();
    RawCount values[kMaxEvents];
    for (int m = 0; m < members; ++m) {
      const int slot = ctx_.team->member(m);
      // This thread and the threads that serve no op of their own (OpenMP workers): theirs is
      // the work of the op running here. Other dispatching threads are read when they sample;
      // the final flush (no state) reads everyone.
      if (state != nullptr && slot != own && ctx_.team->is_dispatch(slot)) continue;
      if (slot >= max_slots_ || !ctx_.table->slot_ready(slot)) continue;
      uint32_t counted = 0;
      ctx_.registry->slot(slot).counters.read_raw(values, &counted);
      const int64_t gap = now - (read_ns_[slot] ? read_ns_[slot] : started_ns_);
      RawCount* last = last_.get() + static_cast<size_t>(slot) * kMaxEvents;
      uint64_t* carry = carry_.get() + static_cast<size_t>(slot) * kMaxEvents;
      for (int e = 0; e < n_events; ++e) {
        if (!((counted >> e) & 1u)) continue;
        const ScaledCount delta = scale_delta(last[e], values[e]);
        last[e] = values[e];
        if (delta.scaled) ctx_.scaled_events.fetch_or(1u << e, std::memory_order_relaxed);
        // A sample lands at the first op boundary after a deadline, so it tends to end a long
        // op, and its gap then also covers ops before the deadline: charging the whole gap to it
        // would favour long ops. It is charged the deadlines' share of the gap at the gap's
        // average rate; the rest carries to the next sample (and at stop to "outside"), so the
        // totals still add up.
        const uint64_t available = static_cast<uint64_t>(std::llround(delta.value)) + carry[e];
        uint64_t value = available;
        if (state != nullptr && gap > covered) {
          value = static_cast<uint64_t>(static_cast<double>(available) * covered / gap);
        }
        carry[e] = available - value;
        if (value) ctx_.charge(entry, state, state != nullptr ? innermost : -1, slot, e, value);
      }
      read_ns_[slot] = now;
    }
    // The deadlines this op was caught running at: the weight behind its statistical counts.
    ctx_.table->entry(entry).samples.fetch_add(static_cast<uint64_t>(crossed), std::memory_order_relaxed);
    samples_.fetch_add(1, std::memory_order_relaxed);
    busy_.store(false, std::memory_order_release);
  }

  CountingContext& ctx_;
  const int64_t interval_ns_;
  const int64_t started_ns_;
  const int max_slots_;
  // One thread samples at a time (the try-lock), so the per-slot arrays need nothing more.
  alignas(64) std::atomic<int64_t> next_ns_{0};
  std::atomic<bool> busy_{false};
  std::atomic<uint64_t> samples_{0};
  struct FreeDeleter {
    void operator()(void* p) const { std::free(p); }
  };
  std::unique_ptr<RawCount[], FreeDeleter> last_;   // [slot][event]: the counts at the last read
  std::unique_ptr<uint64_t[], FreeDeleter> carry_;  // [slot][event]: counted, not yet charged to an op
  std::unique_ptr<int64_t[], FreeDeleter> read_ns_;  // [slot]: when it was last read
};

}  // namespace

std::unique_ptr<CountingStrategy> make_sampled_counting(CountingContext& context, const CountingOptions& options) {
  return std::make_unique<SampledCounting>(context, options);
}

}  // namespace cpuprof
