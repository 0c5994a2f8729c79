// SampledCounting, the strategy of sampled counting: its declaration, private to the core (the
// session reaches it through make_counting_strategy). sampled_counting.cpp says how sampled
// counting works. The class is one, but its parts are defined apart, one responsibility a file,
// so that each can be read alone:
//   sampled_counting.cpp           the collector's pass and the join of each record to the ops
//   sampled_ring_drain.cpp         reading the threads' sample rings, unwinding the samples' stacks
//   sampled_replay.cpp             replaying the op timelines; whom an OpenMP worker works for
//   sampled_interval_charging.cpp  charging CPU time by interval, summed per thread and op path
//   sampled_lazy_workers.cpp       charging OpenMP workers lazily, by segments of one timeline
//   sampled_snapshot.cpp           what a snapshot takes of the strategy
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "core/counting.h"
#include "core/stack_table.h"
#include "perf/sample_record.h"
#include "unwind/frame_tables.h"

namespace cpuprof {
namespace detail {

// Which dispatching thread an OpenMP worker's time belongs to, when several run ops at once: the
// one its samples found it working for when the choice was clear, by majority.
struct WorkerVotes {
  uint32_t votes[kMaxDispatchThreads] = {};
};

class SampledCounting final : public CountingStrategy {
 public:
  SampledCounting(CountingContext& context, const CountingOptions& options);

  CountingMode mode() const override { return CountingMode::Sampled; }

  void begin_op(DispatchState&, int, int64_t) override {}
  void end_op(DispatchState&, int, int64_t, int64_t, int64_t, uint64_t*) override {}

  void began(DispatchState& state, int depth, int64_t enter_ns, int64_t op_ns) override {
    state.events.push(enter_ns, op_ns, state.frames[depth].entry, depth, true);
  }

  void ended(DispatchState& state, uint32_t entry, int depth, int64_t op_ns, int64_t exit_ns) override {
    state.events.push(exit_ns, op_ns, entry, depth, false);
  }

  void stop(int64_t now) override { stopped_ns_ = now; }

  uint64_t samples() const override { return joined_.load(std::memory_order_relaxed); }

  ThreadCreation collect(int64_t now, bool final) override;
  void fill_snapshot(SessionSnapshot* out) override;

 private:
  // A record read from a ring, waiting to be joined in time order with the others.
  enum class RecordKind : uint8_t { Sample, SwitchIn, SwitchOut, Exit, Lost };
  struct Pending {
    int64_t time;
    int32_t slot;
    RecordKind kind;
    uint32_t stack;
    uint32_t n_deltas;
    uint64_t deltas[kMaxEvents];  // samples: per event index, the counts since the thread's previous sample
  };

  // Whether a thread is on a CPU, from its switch records, and up to when its time there has
  // been charged. Unknown until its first record: the CPU before that is charged by sample.
  enum class RunState : uint8_t { Unknown, On, Off };
  struct Run {
    RunState state = RunState::Unknown;
    int64_t mark = 0;         // on a CPU: charged up to here
    int64_t tracked_mark = 0; // on a CPU: counted in `tracked` up to here (ahead of `mark` for a worker
                              // charged lazily, whose charges wait for the end of the pass)
    uint32_t seg = 0;         // a lazily charged worker: the first worker segment its walk can need
    uint64_t tracked = 0;     // ns charged by interval since the thread's last sample
    int owner = -1;           // the dispatching thread whose ops its time goes to (-1: none)
    bool dispatching = false; // owner is the thread itself
  };

  // A dispatching thread's op stack, replayed from its op events.
  struct Replay {
    int depth = 0;
    uint32_t path[kMaxDepth];
    uint64_t path_hash[kMaxDepth + 1] = {};  // path_hash[d]: the first d entries of path
    int64_t time = 0;  // events up to this time are applied
    // The last callback of cpuprof's: the thread was in it from hook_from to hook_until.
    int64_t hook_from = 0, hook_until = 0;
  };

  // Interval charges are many (a few per op boundary for every thread on a CPU) and land on few
  // op paths, so they are summed per thread and path in a small direct-mapped table and charged
  // to the op table once per collector pass: an addition per boundary instead of an atomic per op
  // on the path.
  static constexpr uint64_t kOutsideKey = 1, kProfilerKey = 2;
  static constexpr int kSettleBuckets = 1024;
  struct Bucket {
    uint64_t key = 0;  // 0: empty; kOutsideKey, kProfilerKey, or an op path's hash (top bit set)
    uint32_t path = kEmptySequence;
    uint64_t ns = 0;
  };
  // A pass fills a few dozen of a thread's buckets: the flush visits those, not all 1024 (reading
  // every bucket of every thread on a CPU, each pass, was a sixth of the collector's time).
  struct SlotBuckets {
    std::unique_ptr<Bucket[]> table;
    std::vector<uint16_t> used;  // indices filled since the last flush
  };

  // Workers charged lazily. With one dispatching thread, every OpenMP worker on a CPU is charged
  // the same way at each instant: to the op path that thread is in (its callbacks to the
  // profiler), or to no op between its ops. Settling every worker at every op boundary made the
  // collector's work grow with the team (16 threads on 16 CPUs: 9% of a CPU, taken from the team
  // that waits at the next barrier for the worker it preempted). Instead the boundaries close
  // segments of one shared timeline, summed per path as they close; at the end of each pass a
  // worker that stayed on its CPU throughout takes those sums, and one that came or went meanwhile
  // walks the segments of its own time there. The per-thread figures are the same as settling
  // each boundary; a second dispatching thread (or a full path table) goes back to that for good.
  struct WorkerSegment {
    int64_t from, until;
    int64_t hook_from, hook_until;  // the dispatching thread was in cpuprof's callback meanwhile
    uint64_t key;                   // kOutsideKey, or the op path's hash (top bit set)
    uint32_t path;                  // the op path, interned whole
  };
  static constexpr int kSegmentTotals = 2048;  // distinct keys per pass summed; more: workers walk

  // The collector's pass and the join (sampled_counting.cpp).
  void go_off_cpu(int slot, RunState state);
  void go_on_cpu(int slot, int64_t time);
  void process(const Pending& p);
  void join(const Pending& p);
  void charge_remainders();

  // The rings (sampled_ring_drain.cpp).
  void drain_rings();
  void queue_record(int slot, RecordKind kind, const uint8_t* record, size_t time_offset);
  void read_sample(int slot, const ThreadSlot& thread, const ParsedSample& sample);
  uint32_t unwind(const ParsedSample& sample);

  // The op timelines (sampled_replay.cpp).
  int n_states() const { return std::min(options_.states_used->load(std::memory_order_acquire), kMaxDispatchThreads); }
  bool ready(int index) const { return options_.states[index]->ready.load(std::memory_order_acquire); }
  void advance_all(int64_t time);
  void apply_next(int index, int64_t start);
  int dispatch_index_of(int slot) const;
  void assign_owner(int slot, bool vote);

  // Interval charges (sampled_interval_charging.cpp).
  void charge_cpu(const uint32_t* path, int depth, int slot, uint64_t ns);
  Bucket& bucket_for(int slot, uint64_t key);
  void accumulate(int slot, uint64_t key, const uint32_t* path, int depth, uint64_t ns);
  void accumulate_interned(int slot, uint64_t key, uint32_t path_id, uint64_t ns);
  void flush(int slot, Bucket& b);
  void flush_all();
  void settle(int slot, int64_t until);

  // Lazily charged workers (sampled_lazy_workers.cpp).
  bool lazy_worker(int slot) const { return lazy_index_ >= 0 && !runs_[slot].dispatching; }
  int single_ready() const;
  void settle_any(int slot, int64_t until);
  void track(int slot, int64_t until);
  bool open_segment(int64_t from, int64_t until, WorkerSegment* out);
  void charge_segment(int slot, const WorkerSegment& s, int64_t from, int64_t until);
  bool close_worker_segment(int64_t at);
  void add_total(uint64_t key, uint32_t path, uint64_t ns);
  void settle_lazily(int slot, int64_t until);
  void flush_view();
  void clear_segments();
  void enter_lazy();
  void exit_lazy();

  // The snapshot (sampled_snapshot.cpp).
  size_t working_memory_bytes() const;

  CountingContext& ctx_;
  const CountingOptions options_;
  std::mutex mutex_;  // the collector's tables, against snapshots
  std::vector<RawCount> last_;          // [slot][event]: the values at each thread's last sample
  std::vector<uint64_t> samples_of_, lost_of_;  // [slot]
  std::vector<WorkerVotes> votes_;      // [slot]
  std::vector<Run> runs_;               // [slot]
  std::vector<SlotBuckets> buckets_;    // [slot]: interval charges not yet in the op table
  std::vector<int> dirty_;              // slots that have buckets
  std::vector<int> on_cpu_;             // slots whose switch records say they are on a CPU now
  int64_t stopped_ns_ = 0;
  uint64_t switch_records_ = 0, by_interval_ns_ = 0, by_sample_ns_ = 0;
  Replay replays_[kMaxDispatchThreads];
  // Lazily charged workers (see WorkerSegment).
  struct PathId {
    uint64_t key = 0;
    uint32_t id = kEmptySequence;
  };
  static constexpr int kPathIdCache = 256;
  int lazy_index_ = -1;  // the one dispatching thread while workers are charged lazily
  bool lazy_off_ = false;
  const bool eager_workers_;  // inject_eager_workers() as the session started
  int64_t segment_from_ = 0;    // the open segment starts here
  int64_t segments_start_ = 0;  // this pass's first segment starts here
  std::vector<WorkerSegment> segments_;
  std::unique_ptr<Bucket[]> totals_;  // per key: the closed segments' time this pass
  std::vector<uint16_t> totals_used_;
  bool totals_overflow_ = false;
  PathId path_ids_[kPathIdCache];
  std::vector<Pending> pending_;
  std::vector<uint8_t> scratch_;
  bool creation_seen_ = false;
  bool uncovered_ = false;  // this pass found a thread without a sample ring  // this pass's rings held a fork record, or lost records (one may be among them)
  FrameTables frames_;
  StackTable stacks_;
  std::vector<uint64_t> unwind_stops_;
  uint64_t by_frame_pointer_ = 0, by_scanning_ = 0;
  uint64_t unparsed_ = 0, ambiguous_ = 0, late_events_ = 0;
  int cpu_event_ = -1;  // task-clock's index: the CPU time each sample stands for
  std::atomic<uint64_t> joined_{0};
};

}  // namespace detail
}  // namespace cpuprof
