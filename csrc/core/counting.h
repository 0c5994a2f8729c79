// How an op's counters are obtained: one strategy per counting mode.
//
// The session times every op itself (wall time, self time, nesting); a strategy decides when the
// team's counters are read and to which op each delta is charged. Exact counting reads the team
// at every op boundary; sampled counting reads it at the first boundary after each interval.
// The session calls the strategy from the per-op path, so implementations must not allocate or
// lock there.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "core/dispatch.h"
#include "core/op_table.h"
#include "core/team.h"
#include "core/thread_registry.h"
#include "common/limits.h"
#include "perf/perf_events.h"

namespace cpuprof {

enum class CountingMode : uint8_t { Exact = 0, Sampled = 1 };

// What every strategy reads and writes: the session's shared accounting state.
struct CountingContext {
  std::vector<EventSpec> events;
  ThreadRegistry* registry = nullptr;
  OpTable* table = nullptr;
  TeamSet* team = nullptr;
  bool cpu_clock_event[kMaxEvents] = {};  // task-clock / cpu-clock: nanoseconds of CPU
  std::atomic<uint32_t> scaled_events{0};  // events whose per-op deltas were scaled (multiplexing)
  int n_events() const { return static_cast<int>(events.size()); }

  // Charges `delta` of `event` on thread `slot` to frame `innermost` of `state` (self) and to
  // every frame below it (inclusive), or to "[outside ATen ops]" when there is no frame.
  void charge(uint32_t entry, const DispatchState* state, int innermost, int slot, int event, uint64_t delta);
};

class CountingStrategy {
 public:
  virtual ~CountingStrategy() = default;
  virtual CountingMode mode() const = 0;
  // Frame `depth` of `state` was pushed (its entry and region are set); `enter_ns` is when the
  // callback was entered.
  virtual void begin_op(DispatchState& state, int depth, int64_t enter_ns) = 0;
  // Frame `depth` ends. `hook_inside_ns` is cpuprof's own time inside it (nested callbacks);
  // `span_counters`, when not null, receives the op's inclusive counts summed over threads.
  virtual void end_op(DispatchState& state, int depth, int64_t enter_ns, int64_t hook_inside_ns,
                      uint64_t* span_counters) = 0;
  // The session stops; no op runs any more.
  virtual void stop(int64_t now) = 0;
  // Team reads that charged counts to ops (sampled mode), for the overhead report.
  virtual uint64_t samples() const { return 0; }
};

struct CountingOptions {
  CountingMode mode = CountingMode::Sampled;
  int sample_interval_us = kDefaultSampleIntervalUs;
  int n_dispatch_states = kMaxDispatchThreads;
  int max_slots = kDefaultMaxThreads;
  int64_t started_ns = 0;
};

std::unique_ptr<CountingStrategy> make_counting_strategy(CountingContext& context, const CountingOptions& options);

}  // namespace cpuprof
