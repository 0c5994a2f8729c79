// One profiling session: the accounting state that every collector shares.
//
// The op hook (RecordFunction callbacks) and the sampler thread both write into this state; the
// bindings read it out as a snapshot. There is one session per process because RecordFunction
// callbacks are plain function pointers with no user data. The per-op entry points (begin_op /
// end_op) are here, free of torch types, so the accounting can be reasoned about and tested on
// its own; op_hook.cpp only turns a RecordFunction into a key.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "op_table.h"
#include "perf_events.h"
#include "thread_registry.h"

namespace cpuprof {

constexpr int kMaxDepth = 64;
constexpr int kMaxDispatchThreads = 32;

enum class CountingMode : uint8_t {
  // Reads every thread's counters at every op boundary: exact per-op deltas, ~2 read()s per
  // thread per op.
  Exact = 0,
  // Ops take timestamps; at the first op boundary after each interval the dispatching thread
  // reads the team's counters once and charges the deltas to the op running at that moment.
  // Statistical per op, exact per thread, one read() per team thread per interval.
  Sampled = 1,
};

struct SessionConfig {
  std::vector<std::string> events;
  CountingMode mode = CountingMode::Sampled;
  bool record_shapes = true;
  int sample_interval_us = 4000;
  int op_capacity = 2048;
  size_t span_capacity = 0;
  int max_threads = kMaxThreads;
  std::string sysfs_root = "/sys";
};

struct DroppedEvent {
  std::string name;
  int err = 0;
  std::string reason;
};

struct Frame {
  uintptr_t id;  // the RecordFunction's address: ends are matched to begins by it
  bool done;     // ended out of order (asyncio, generators); popped once frames above it end
  uint32_t entry;
  uint32_t child_region;  // region in force for this op's children
  int64_t start_ns;
  int64_t child_ns;       // inclusive time of direct children
  int64_t hook_ns_at_start;
  uint64_t team;  // exact mode: thread slots read at begin, and so at end
  int registered; // exact mode: slots that existed at begin; later ones started at zero
};

// Everything a report needs, copied out under the lifecycle lock so that no reader ever touches
// memory that start() reallocates or fds that stop() closes.
struct EntrySnapshot {
  uint32_t index;
  EntryKind kind;
  std::string name;
  std::string shapes;
  uint32_t region;
  uint64_t calls, incl_ns, self_ns, max_ns, samples;
  std::vector<uint64_t> incl, self;  // [slot][event], flattened
};

struct ThreadSnapshot {
  pid_t tid;
  std::string name;
  int64_t opened_ns;
  int open_errno;
  std::vector<uint64_t> totals;
  uint32_t scaled;
  uint32_t counted;
};

struct SpanSnapshot {
  std::vector<uint32_t> entry;
  std::vector<int32_t> thread_slot, depth;
  std::vector<int64_t> start_ns, dur_ns;
  std::vector<uint64_t> counters;  // [span][event], flattened
  uint64_t written = 0, dropped = 0;
};

struct SessionSnapshot {
  std::vector<EventSpec> events;
  CountingMode mode;
  bool record_shapes;
  int sample_interval_us;
  bool running;
  int64_t started_ns, stopped_ns, now_ns;
  uint64_t ops_seen, too_deep, unattributed_ops, unmatched_ends, truncated;
  int64_t hook_ns, sampler_cpu_ns;
  uint64_t sampler_ticks, samples;
  uint32_t scaled_events;  // bitmask: events whose per-op deltas were scaled for multiplexing
  std::vector<pid_t> dispatch_tids;
  int threads_beyond_limit;
  int op_capacity;
  uint64_t ops_overflowed;
  size_t memory_bytes;
  size_t span_capacity;
  int n_slots;
  std::vector<ThreadSnapshot> threads;
  std::vector<EntrySnapshot> entries;
  SpanSnapshot spans;
};

// Per dispatching thread (a thread that runs ATen ops). Owned by that thread on the op path;
// other threads read it only once `ready`, and only its atomics and its span ring.
struct DispatchState {
  // Set (release) once tid and slot are written: other threads read a state only when ready.
  std::atomic<bool> ready{false};
  pid_t tid = 0;
  int slot = -1;  // registry slot of this thread
  int local_depth = 0;  // may exceed kMaxDepth; frames beyond it are not recorded
  std::atomic<int64_t> hook_ns{0};
  Frame frames[kMaxDepth];
  // Exact mode: per frame, every thread's counters at the op's start, and the inclusive deltas
  // of its children ([depth][slot][event]).
  std::unique_ptr<RawCount[]> start_counts;
  std::unique_ptr<uint64_t[]> child_counts;
  SpanRing spans;  // sized when a thread takes this state: allocation once per thread, not per op
};

class Sampler;

class Session {
 public:
  static Session& instance();

  // Returns the events that were dropped (with reasons). Throws std::runtime_error when a
  // session is already running, std::invalid_argument for a configuration out of range.
  // `on_started` / `on_stopping` run under the lifecycle lock: the bindings install and remove
  // the RecordFunction hook there, so a start and a stop can never interleave half-way.
  std::vector<DroppedEvent> start(const SessionConfig& config, void (*on_started)() = nullptr);
  void stop(void (*on_stopping)() = nullptr);
  SessionSnapshot snapshot();
  bool running() const { return running_.load(std::memory_order_acquire); }

  // --- the per-op path ---------------------------------------------------------------------
  // Both return false when the session is not running; otherwise the caller must call leave().
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
  DispatchState* dispatch_state();
  // `enter_ns` is when the callback was entered; `id` identifies the op until it ends (the
  // RecordFunction's address); `key_hash` covers name and shapes, the region and kind are mixed
  // in here; `fill` writes name/shapes into a new entry.
  template <typename Fill>
  void begin_op(DispatchState* state, int64_t enter_ns, uintptr_t id, uint64_t key_hash, bool is_region,
                Fill&& fill);
  void end_op(DispatchState* state, int64_t enter_ns, uintptr_t id);
  bool record_shapes() const { return config_.record_shapes; }
  // An op on a thread beyond kMaxDispatchThreads: timed by nobody, counted here.
  void count_unattributed() { no_state_.fetch_add(1, std::memory_order_relaxed); }

  // --- read-out ------------------------------------------------------------------------------
  const SessionConfig& config() const { return config_; }
  const std::vector<EventSpec>& events() const { return events_; }
  const OpTable& table() const { return table_; }
  std::vector<ThreadSnapshot> thread_snapshots() const;
  const ThreadRegistry& registry() const { return registry_; }
  int64_t started_ns() const { return started_ns_; }
  int64_t stopped_ns() const { return stopped_ns_; }
  uint64_t ops_seen() const { return ops_seen_.load(std::memory_order_relaxed); }
  uint64_t too_deep() const { return too_deep_.load(std::memory_order_relaxed); }
  uint64_t unattributed_threads() const { return no_state_.load(std::memory_order_relaxed); }
  int64_t hook_ns() const;
  int64_t sampler_cpu_ns() const;
  uint64_t sampler_ticks() const;

  // Used by the sampler.
  ThreadRegistry& mutable_registry() { return registry_; }
  // Both modes read only threads that have done work since the session started (the "team"):
  // a read() costs ~1 µs here, and processes carry threads that never run (signal handlers,
  // idle pools). The sampler adds a thread the tick after it first does anything.
  void join_team(int slot) {
    if (slot >= 0 && slot < 64) team_mask_.fetch_or(1ULL << slot, std::memory_order_relaxed);
  }
  uint64_t team_mask() const { return team_mask_.load(std::memory_order_relaxed); }
  // Threads that run ops. Their counters belong to their own ops: exact mode does not read them
  // for other threads' ops, and the sampler never charges them to another thread's op.
  uint64_t dispatch_mask() const { return dispatch_mask_.load(std::memory_order_relaxed); }
  void after_fork_in_child();
  // Sampled mode: called at op boundaries; when the interval has passed, reads the team and
  // charges the deltas to frame `innermost` of `state` (its stack below it inclusively), or to
  // "[outside ATen ops]" when innermost < 0. Cheap when not due: one load and a compare.
  void maybe_sample(DispatchState* state, int innermost, int64_t now) {
    if (now < next_sample_ns_.load(std::memory_order_relaxed)) return;
    sample(state, innermost, now);
  }

 private:
  Session() = default;
  // Reads the team's counters; `own` is read first or last so that the other reads' cost falls
  // outside the op on the calling thread's clock.
  // Returns how many slots it wrote (the registered ones); the rest of `out` is left alone.
  int read_all(RawCount* out, uint64_t team, int own, bool own_first);
  std::vector<ThreadSnapshot> thread_snapshots_locked() const;
  void sample(DispatchState* state, int innermost, int64_t now);
  void charge(uint32_t entry, const DispatchState* state, int innermost, int slot, int event, uint64_t delta);

  SessionConfig config_;
  std::vector<EventSpec> events_;
  ThreadRegistry registry_;
  OpTable table_;
  std::unique_ptr<DispatchState> pool_[kMaxDispatchThreads];
  std::atomic<int> pool_used_{0};
  std::atomic<uint64_t> generation_{0};
  // Read by every callback: on its own cache line, away from the counters callbacks bump.
  alignas(64) std::atomic<bool> running_{false};
  alignas(64) std::atomic<int> in_flight_{0};
  alignas(64) std::atomic<uint64_t> team_mask_{0};
  std::atomic<uint64_t> dispatch_mask_{0};
  std::atomic<uint64_t> ops_seen_{0};
  std::atomic<uint64_t> too_deep_{0};
  std::atomic<uint64_t> no_state_{0};
  std::atomic<uint64_t> unmatched_{0};
  uint64_t truncated_ = 0;
  // Sampled mode. One thread samples at a time (the try-lock), so the last values need no more.
  alignas(64) std::atomic<int64_t> next_sample_ns_{0};
  std::atomic<bool> sampling_{false};
  int64_t sample_interval_ns_ = 0;
  std::atomic<uint64_t> samples_{0};
  RawCount sample_last_[kMaxThreads][kMaxEvents] = {};
  uint64_t sample_carry_[kMaxThreads][kMaxEvents] = {};  // counted, not yet charged to an op
  int64_t sample_read_ns_[kMaxThreads] = {};             // when each slot was last read
  std::atomic<uint32_t> scaled_events_{0};  // events whose per-op deltas were scaled
  bool cpu_clock_event_[kMaxEvents] = {};  // task-clock / cpu-clock: nanoseconds of CPU
  int n_slots_ = 0;  // thread slots in the op table and in exact-mode snapshots
  int64_t started_ns_ = 0;
  int64_t stopped_ns_ = 0;
  std::unique_ptr<Sampler> sampler_;
  std::mutex lifecycle_;
};

// --- inline per-op path --------------------------------------------------------------------

inline uint64_t hash_name(const char* s) {
  uint64_t h = 0xcbf29ce484222325ULL;  // FNV-1a: short names, no allocation
  for (; *s; ++s) h = (h ^ static_cast<unsigned char>(*s)) * 0x100000001b3ULL;
  return h;
}

inline uint64_t mix_hash(uint64_t h, uint64_t v) {
  h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
  return h * 0xff51afd7ed558ccdULL;
}

template <typename Fill>
void Session::begin_op(DispatchState* state, int64_t enter_ns, uintptr_t id, uint64_t key_hash, bool is_region,
                       Fill&& fill) {
  const int d = state->local_depth++;
  if (d >= kMaxDepth) {
    too_deep_.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  // `enter_ns` is taken by the caller before it hashed the key, so the hook's whole cost is
  // counted as overhead and kept out of the op's time.
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
  if (config_.mode == CountingMode::Sampled) {
    maybe_sample(state, d - 1, enter_ns);  // before this op: the time so far was its parent's
  } else {
    const size_t stride = static_cast<size_t>(n_slots_) * events_.size();
    const uint64_t own = state->slot >= 0 && state->slot < 64 ? 1ULL << state->slot : 0;
    frame.team = (team_mask_.load(std::memory_order_relaxed) & ~dispatch_mask_.load(std::memory_order_relaxed)) | own;
    frame.registered = read_all(state->start_counts.get() + d * stride, frame.team, state->slot, /*own_first=*/false);
    std::memset(state->child_counts.get() + d * stride, 0, stride * sizeof(uint64_t));
  }
  const int64_t begin_ns = now_ns();
  frame.start_ns = begin_ns;
  const int64_t hook = state->hook_ns.load(std::memory_order_relaxed) + (begin_ns - enter_ns);
  state->hook_ns.store(hook, std::memory_order_relaxed);
  frame.hook_ns_at_start = hook;
}

}  // namespace cpuprof
