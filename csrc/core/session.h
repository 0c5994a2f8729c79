// One profiling session: its life cycle and the per-op path.
//
// A session owns the shared accounting state (the thread registry, the team, the op table, the
// dispatching threads' op stacks), a counting strategy that decides how counters reach ops, and
// the collection loop (its background thread). Sources (today the RecordFunction op hook and user regions) feed ops in
// through begin_op/end_op, which are free of torch types so the accounting can be reasoned
// about and stress-tested on its own. There is one session per process because RecordFunction
// callbacks are plain function pointers with no user data.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/hash.h"
#include "common/clock.h"
#include "core/counting.h"
#include "core/dispatch.h"
#include "core/op_table.h"
#include "core/snapshot.h"
#include "core/team.h"
#include "core/collection_loop.h"
#include "core/thread_registry.h"
#include "common/limits.h"
#include "perf/perf_events.h"

namespace cpuprof {

struct SessionConfig {
  std::vector<std::string> events;
  CountingMode mode = CountingMode::Sampled;
  bool record_shapes = true;
  int sample_hz = kDefaultSampleHz;  // sampled mode: samples per second of each thread's CPU time
  int stack_bytes = kDefaultStackBytes;  // user stack copied per sample; 0: leaf and kernel frames only
  int ring_pages = kDefaultRingPages;
  size_t timeline_samples = kDefaultTimelineSamples;
  int op_capacity = kDefaultOpCapacity;
  size_t span_capacity = 0;
  int max_threads = kDefaultMaxThreads;
  std::string sysfs_root = "/sys";
  std::vector<pid_t> own_threads;  // cpuprof's threads the session must not profile (see ThreadRegistry)
};

class Session {
 public:
  static Session& instance();

  // Returns the events that were dropped (with reasons). Throws std::runtime_error when a
  // session is already running, std::invalid_argument for a configuration out of range.
  // `on_started` / `on_stopping` run under the lifecycle lock: the bindings install and remove
  // the RecordFunction hook there, so a start and a stop can never interleave half-way.
  std::vector<DroppedEvent> start(const SessionConfig& config, void (*on_started)() = nullptr);
  void stop(void (*on_stopping)() = nullptr);
  SessionSnapshot snapshot();  // snapshot.cpp
  bool running() const { return running_.load(std::memory_order_acquire); }

  // --- the per-op path ---------------------------------------------------------------------
  // Returns false when the session is not running; otherwise the caller must call leave().
  bool enter() {
    in_flight_.fetch_add(1, std::memory_order_seq_cst);
    if (running_.load(std::memory_order_seq_cst)) return true;
    in_flight_.fetch_sub(1, std::memory_order_release);
    return false;
  }
  void leave() { in_flight_.fetch_sub(1, std::memory_order_release); }
  // Leaves on every path out of a callback, exceptions included: a missed leave() would make
  // stop() wait forever.
  struct Guard {
    Session& session;
    ~Guard() { session.leave(); }
  };
  // The calling thread's op stack, created on its first op; null beyond kMaxDispatchThreads, and
  // null while the thread's buffers could not be allocated (retried at its next op's begin: the
  // end of an op whose begin found no stack has nothing to end).
  DispatchState* dispatch_state(bool op_begins = true);
  // `enter_ns` is when the callback was entered (so the hook's whole cost is kept out of the
  // op's time); `id` identifies the op until it ends (the RecordFunction's address); `key_hash`
  // covers name and inputs, the region and kind are mixed in here; `fill` describes a new entry.
  template <typename Fill>
  void begin_op(DispatchState* state, int64_t enter_ns, uintptr_t id, uint64_t key_hash, bool is_region,
                Fill&& fill);
  void end_op(DispatchState* state, int64_t enter_ns, uintptr_t id);
  bool record_shapes() const { return config_.record_shapes; }
  // The entry of the calling thread's innermost open op or region; 0 when it runs none (or no
  // session runs). Lock-free and allocation-free: the OMPT tool asks at every parallel region.
  uint32_t current_entry() const;
  // One allocation (bytes > 0) or free (bytes < 0) reported by torch's allocator on the calling
  // thread, charged to its innermost open op (or to "outside ops"). Lock-free, allocation-free.
  void record_allocation(int64_t bytes);
  // An op on a thread beyond kMaxDispatchThreads: timed by nobody, counted here.
  void count_unattributed() { no_state_.fetch_add(1, std::memory_order_relaxed); }

  const OpTable& table() const { return table_; }

 private:
  Session() = default;
  void after_fork_in_child();
  // Allocates what the thread's ops need and publishes its op stack (`ready`); null, counted in
  // setup_failures_, when an allocation fails. Runs in the op callbacks: never throws.
  DispatchState* prepare_dispatch_state(DispatchState* state) noexcept;
  int64_t hook_ns() const;

  SessionConfig config_;
  CountingContext context_;
  ThreadRegistry registry_;
  TeamSet team_;
  OpTable table_;
  std::unique_ptr<CountingStrategy> counting_;
  std::unique_ptr<CollectionLoop> collection_;
  std::unique_ptr<DispatchState> pool_[kMaxDispatchThreads];
  std::atomic<int> pool_used_{0};
  std::atomic<uint64_t> generation_{0};
  // Read by every callback: on its own cache line, away from the counters callbacks bump.
  alignas(64) std::atomic<bool> running_{false};
  alignas(64) std::atomic<int> in_flight_{0};
  alignas(64) std::atomic<uint64_t> ops_seen_{0};
  std::atomic<uint64_t> too_deep_{0};
  std::atomic<bool> memory_reported_{false};
  std::atomic<uint64_t> no_state_{0};
  std::atomic<uint64_t> setup_failures_{0};  // a dispatching thread's buffers could not be allocated
  std::atomic<uint64_t> unmatched_{0};
  uint64_t truncated_ = 0;
  int64_t started_ns_ = 0;
  int64_t stopped_ns_ = 0;
  std::mutex lifecycle_;
};

// --- inline per-op path --------------------------------------------------------------------

// Test hook: the next `count` preparations of a dispatching thread fail as an allocation that
// returned nothing would (0 clears), so the error path of a thread's first op can be tested.
void inject_thread_setup_failures(int count);

// Test hook: every op callback (begin and end) spends this long busy inside cpuprof's measured
// hook time, so the overhead the profile reports can be checked against a known cost (0 clears).
void inject_hook_spin_ns(int64_t ns);
extern std::atomic<int64_t> g_injected_hook_spin_ns;

inline uint64_t hash_name(const char* s) {
  uint64_t h = 0xcbf29ce484222325ULL;  // FNV-1a: short names, no allocation
  for (; *s; ++s) h = (h ^ static_cast<unsigned char>(*s)) * 0x100000001b3ULL;
  return h;
}

template <typename Fill>
void Session::begin_op(DispatchState* state, int64_t enter_ns, uintptr_t id, uint64_t key_hash, bool is_region,
                       Fill&& fill) {
  const int d = state->local_depth++;
  if (d >= kMaxDepth) {
    too_deep_.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  const uint32_t parent_region = d > 0 ? state->frames[d - 1].child_region : 0;
  const uint64_t hash = mix_hash(mix_hash(key_hash, parent_region), is_region ? 2 : 1);
  const uint32_t entry = table_.find_or_insert(hash, [&](OpEntry& e) {
    e.kind = is_region ? EntryKind::Region : EntryKind::Op;
    e.region = parent_region;
    fill(e);
  });
  Frame& frame = state->frames[d];
  frame.id = id;
  frame.done = false;
  frame.entry = entry;
  frame.child_region = is_region ? entry : parent_region;
  frame.child_ns = 0;
  counting_->begin_op(*state, d, enter_ns);
  const int64_t begin_ns = now_ns();
  frame.start_ns = begin_ns;
  const int64_t hook = state->hook_ns.load(std::memory_order_relaxed) + (begin_ns - enter_ns);
  state->hook_ns.store(hook, std::memory_order_relaxed);
  frame.hook_ns_at_start = hook;
  counting_->began(*state, d, enter_ns, begin_ns);
}

}  // namespace cpuprof
