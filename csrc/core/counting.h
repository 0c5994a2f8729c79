// How an op's counters are obtained: one strategy per counting mode.
//
// The session times every op itself (wall time, self time, nesting); a strategy decides how the
// threads' counters reach ops. Exact counting reads the team at every op boundary; sampled
// counting lets the kernel sample every thread and joins the samples, on the collector thread,
// with the op timeline the dispatching threads record. The session calls the strategy from the
// per-op path, so implementations must not allocate or lock there: what a dispatching thread
// needs is allocated in prepare_thread(), before its first op touches its op stack.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "core/counting_mode.h"
#include "core/dispatch.h"
#include "core/op_table.h"
#include "core/snapshot.h"
#include "core/team.h"
#include "core/thread_registry.h"
#include "common/limits.h"
#include "perf/perf_events.h"

namespace cpuprof {

// What every strategy reads and writes: the session's shared accounting state.
struct CountingContext {
  std::vector<EventSpec> events;
  ThreadRegistry* registry = nullptr;
  OpTable* table = nullptr;
  TeamSet* team = nullptr;
  bool cpu_clock_event[kMaxEvents] = {};  // task-clock / cpu-clock: nanoseconds of CPU
  std::atomic<uint32_t> scaled_events{0};  // events whose per-op deltas were scaled (multiplexing)
  int n_events() const { return static_cast<int>(events.size()); }

  // Charges `delta` of `event` on thread `slot` to the innermost of `path` (self) and, once each,
  // to every entry of it (inclusive); with an empty path, to "[outside ATen ops]".
  void charge(const uint32_t* path, int depth, int slot, int event, uint64_t delta);
};

// What a collector pass saw of the program creating threads. Sampled rings carry a record of each
// thread a profiled thread creates: a pass that saw none spares the collector its walk of
// /proc/self/task, which costs about a microsecond per thread (a third of a millisecond beside a
// serving engine's hundreds of idle threads, every pass).
enum class ThreadCreation : uint8_t { Unknown, NoneSeen, Seen };

class CountingStrategy {
 public:
  virtual ~CountingStrategy() = default;
  virtual CountingMode mode() const = 0;
  // A thread becomes a dispatching thread (its op stack `state` is about to be used): allocate
  // what its ops will need. Returns false, having allocated nothing it keeps, when memory is
  // short; the session then records none of the thread's ops until a later op's retry succeeds.
  // Must not throw: it runs inside the op callbacks.
  virtual bool prepare_thread(DispatchState& state) noexcept {
    (void)state;
    return true;
  }
  // Frame `depth` of `state` was pushed (its entry and region are set); `enter_ns` is when the
  // callback was entered.
  virtual void begin_op(DispatchState& state, int depth, int64_t enter_ns) = 0;
  // Frame `depth` ends. `hook_inside_ns` is cpuprof's own time inside it (nested callbacks),
  // `wall_ns` its wall time without them; `span_counters`, when not null, receives the op's
  // inclusive counts summed over threads.
  virtual void end_op(DispatchState& state, int depth, int64_t enter_ns, int64_t hook_inside_ns, int64_t wall_ns,
                      uint64_t* span_counters) = 0;
  // The callbacks' last word: a begin callback entered at `enter_ns` started its op at `op_ns`;
  // an end callback entered at `op_ns` (when the op ended) leaves at `exit_ns`.
  virtual void began(DispatchState& state, int depth, int64_t enter_ns, int64_t op_ns) {
    (void)state, (void)depth, (void)enter_ns, (void)op_ns;
  }
  virtual void ended(DispatchState& state, uint32_t entry, int depth, int64_t op_ns, int64_t exit_ns) {
    (void)state, (void)entry, (void)depth, (void)op_ns, (void)exit_ns;
  }
  // The session stops; no op runs any more.
  virtual void stop(int64_t now) = 0;
  // On the collector thread, every collector period: `now` is when the period ended; `final`
  // once after the session stopped, when the threads' totals have been read for the last time.
  // Returns what the pass saw of threads being created.
  virtual ThreadCreation collect(int64_t now, bool final) {
    (void)now;
    (void)final;
    return ThreadCreation::Unknown;
  }
  // Adds what the strategy keeps of its own (samples, stacks) to a snapshot.
  virtual void fill_snapshot(SessionSnapshot* out) { (void)out; }
  // Samples joined to ops (sampled mode), for the overhead report.
  virtual uint64_t samples() const { return 0; }
};

struct CountingOptions {
  CountingMode mode = CountingMode::Sampled;
  int sample_hz = kDefaultSampleHz;
  int stack_bytes = kDefaultStackBytes;
  size_t timeline_samples = kDefaultTimelineSamples;
  int max_slots = kDefaultMaxThreads;
  int64_t started_ns = 0;
  // The session's op stacks, which the sampled strategy reads the op timelines of.
  std::unique_ptr<DispatchState>* states = nullptr;
  std::atomic<int>* states_used = nullptr;
};

std::unique_ptr<CountingStrategy> make_counting_strategy(CountingContext& context, const CountingOptions& options);

// Test and benchmark hook: sessions started from now on settle every OpenMP worker at every op
// boundary, as before workers were charged lazily (false restores).
void inject_eager_workers(bool eager);
// Test hook of exact mode: every clock read saved is made anyway and compared. For a team member
// that stayed off its CPU: the saved reads, those whose clock had moved, the episodes of those (a
// member's reads at one switch position), and the largest movement one hid. For one that stayed on
// it (its clock carried forward by the wall time): the carried reads, those of members other than
// the calling thread, those left unchecked (the checking read itself took over 2 µs: interrupted),
// and over the checked ones the total and largest difference from a read at the same moment and
// how many differed by more than 2 µs.
struct SavedReadStats {
  uint64_t parked = 0, moved_reads = 0, moved_episodes = 0, max_moved_ns = 0;
  uint64_t carried = 0, carried_other = 0, carried_unchecked = 0, carried_error_ns = 0, max_carried_error_ns = 0,
           carried_off = 0;
};
void verify_saved_reads(bool on);
// Test hooks for side-by-side benchmarks: sessions started from now on read the clock of every
// team member asleep since its last read, or of every one running since (False restores).
void inject_read_sleeping_members(bool on);
void inject_read_running_members(bool on);
SavedReadStats saved_read_stats();

}  // namespace cpuprof
