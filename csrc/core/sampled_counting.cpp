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
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <mutex>
#include <vector>

#include "core/counting.h"
#include "common/hash.h"
#include "core/stack_table.h"
#include "perf/sample_record.h"
#include "unwind/unwinder.h"

namespace cpuprof {

namespace {

std::atomic<bool> g_eager_workers{false};

// Which dispatching thread an OpenMP worker's time belongs to, when several run ops at once: the
// one its samples found it working for when the choice was clear, by majority.
struct WorkerVotes {
  uint32_t votes[kMaxDispatchThreads] = {};
};

class SampledCounting final : public CountingStrategy {
 public:
  SampledCounting(CountingContext& context, const CountingOptions& options)
      : ctx_(context),
        options_(options),
        last_(static_cast<size_t>(options.max_slots) * kMaxEvents),
        samples_of_(static_cast<size_t>(options.max_slots)),
        lost_of_(static_cast<size_t>(options.max_slots)),
        votes_(static_cast<size_t>(options.max_slots)),
        runs_(static_cast<size_t>(options.max_slots)),
        buckets_(static_cast<size_t>(options.max_slots)),
        scratch_(65536) {
    stacks_.init(kMaxStacks, kMaxStackFrames, kMaxStackCounts, options.timeline_samples);
    for (int e = 0; e < context.n_events() && cpu_event_ < 0; ++e) {
      if (context.cpu_clock_event[e]) cpu_event_ = e;
    }
    unwind_stops_.assign(kUnwindStopKinds, 0);
    pending_.reserve(4096);
    on_cpu_.reserve(256);
  }

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

  void collect(int64_t now, bool final) override {
    std::lock_guard<std::mutex> lock(mutex_);
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
  }

  void fill_snapshot(SessionSnapshot* out) override {
    std::lock_guard<std::mutex> lock(mutex_);
    SamplingSnapshot& s = out->sampling;
    s.enabled = true;
    s.sample_hz = options_.sample_hz;
    s.stack_bytes = options_.stack_bytes;
    s.samples = joined_.load(std::memory_order_relaxed);
    s.unparsed = unparsed_;
    s.ambiguous_workers = ambiguous_;
    s.late_op_events = late_events_;
    s.switch_records = switch_records_;
    s.cpu_by_interval_ns = by_interval_ns_;
    s.cpu_by_sample_ns = by_sample_ns_;
    s.stacks_truncated = stacks_.stacks().truncated() + stacks_.paths().truncated();
    s.counts_dropped = stacks_.counts_dropped();
    s.timeline_dropped = stacks_.timeline_dropped();
    s.unwind_stops = unwind_stops_;
    s.frames_by_frame_pointer = by_frame_pointer_;
    s.frames_by_scanning = by_scanning_;
    const int n_states = std::min(options_.states_used->load(), kMaxDispatchThreads);
    for (int i = 0; i < n_states; ++i) s.op_events_dropped += options_.states[i]->events.dropped();
    s.offsets.push_back(0);
    for (uint32_t id = 1; id <= stacks_.stacks().size(); ++id) {
      const uint64_t* pcs;
      int n;
      stacks_.stacks().items_of(id, &pcs, &n);
      s.frames.insert(s.frames.end(), pcs, pcs + n);
      s.offsets.push_back(static_cast<uint32_t>(s.frames.size()));
    }
    s.path_offsets.push_back(0);
    for (uint32_t id = 1; id <= stacks_.paths().size(); ++id) {
      const uint32_t* entries;
      int n;
      stacks_.paths().items_of(id, &entries, &n);
      s.path_entries.insert(s.path_entries.end(), entries, entries + n);
      s.path_offsets.push_back(static_cast<uint32_t>(s.path_entries.size()));
    }
    const int n_events = ctx_.n_events();
    for (const StackCount& c : stacks_.counts()) {
      s.count_stack.push_back(c.stack);
      s.count_path.push_back(c.path);
      s.count_slot.push_back(c.slot);
      s.count_entry.push_back(c.entry);
      s.count_samples.push_back(c.samples);
      s.count_cpu_ns.push_back(cpu_event_ >= 0 ? c.values[cpu_event_] : 0);
      s.count_values.insert(s.count_values.end(), c.values, c.values + n_events);
    }
    for (const TimelineSample& t : stacks_.timeline()) {
      s.timeline_time.push_back(t.time_ns);
      s.timeline_slot.push_back(t.slot);
      s.timeline_entry.push_back(t.entry);
      s.timeline_stack.push_back(t.stack);
      s.timeline_path.push_back(t.path);
      s.timeline_cpu_us.push_back(t.cpu_us);
    }
    s.memory_bytes = stacks_.memory_bytes() + working_memory_bytes();
    // Every thread, sampled or not: one that never gave a sample must still say why.
    for (size_t slot = 0; slot < out->threads.size() && slot < static_cast<size_t>(ctx_.registry->size()); ++slot) {
      if (slot < samples_of_.size()) {
        out->threads[slot].samples = samples_of_[slot];
        out->threads[slot].samples_lost = lost_of_[slot];
        s.samples_lost += lost_of_[slot];
      }
      const ThreadSlot& t = ctx_.registry->slot(static_cast<int>(slot));
      out->threads[slot].sample_errno = t.counters.sampled() ? 0 : (t.counters.sampling_errno() ? t.counters.sampling_errno() : -1);
      out->threads[slot].ring_pages = static_cast<uint32_t>(t.counters.ring_pages());
      out->threads[slot].ring_pages_asked = static_cast<uint32_t>(t.counters.ring_pages_asked());
    }
  }

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

  void drain_rings() {
    ThreadRegistry& registry = *ctx_.registry;
    const int n_slots = std::min(registry.size(), options_.max_slots);
    for (int slot = 0; slot < n_slots; ++slot) {
      ThreadSlot& thread = registry.mutable_slot(slot);
      if (!thread.counters.sampling()) continue;
      thread.counters.ring().consume(scratch_, [&](const perf_event_header& header, const uint8_t* record) {
        if (header.type == PERF_RECORD_LOST) {
          if (header.size < sizeof(header) + 16) {
            ++unparsed_;
            return true;
          }
          uint64_t lost = 0;
          std::memcpy(&lost, record + sizeof(header) + 8, sizeof(lost));  // {id, lost}, then sample_id
          lost_of_[slot] += lost;
          // Its switch records may be among the lost: the thread's state is unknown from here.
          if (header.size >= sizeof(header) + 32) queue_record(slot, RecordKind::Lost, record, sizeof(header) + 24);
          return true;
        }
        if (header.type == PERF_RECORD_SWITCH) {
          // No body; with sample_id_all its trailer is kSampleType's sample_id: {pid, tid}, time.
          const auto kind = (header.misc & PERF_RECORD_MISC_SWITCH_OUT) ? RecordKind::SwitchOut : RecordKind::SwitchIn;
          if (header.size >= sizeof(header) + 16) {
            queue_record(slot, kind, record, sizeof(header) + 8);
          } else {
            ++unparsed_;
          }
          return true;
        }
        if (header.type == PERF_RECORD_EXIT) {
          // {pid, ppid, tid, ptid, time}: a thread's last switch out is never written, its exit is.
          if (header.size >= sizeof(header) + 24) {
            queue_record(slot, RecordKind::Exit, record, sizeof(header) + 16);
          } else {
            ++unparsed_;
          }
          return true;
        }
        if (header.type != PERF_RECORD_SAMPLE) return true;  // throttle and the like
        ParsedSample sample;
        if (!parse_sample(record, header.size, &sample)) {
          ++unparsed_;
          return true;
        }
        read_sample(slot, thread, sample);
        return true;
      });
    }
  }

  // A record of the thread's run state, stamped at `time_offset` on the samples' clock.
  void queue_record(int slot, RecordKind kind, const uint8_t* record, size_t time_offset) {
    uint64_t time = 0;
    std::memcpy(&time, record + time_offset, sizeof(time));
    Pending p;
    p.time = static_cast<int64_t>(time);
    p.slot = slot;
    p.kind = kind;
    p.stack = 0;
    p.n_deltas = 0;
    pending_.push_back(p);
    if (kind != RecordKind::Lost) ++switch_records_;
  }

  void read_sample(int slot, const ThreadSlot& thread, const ParsedSample& sample) {
    Pending p;
    p.time = static_cast<int64_t>(sample.time);
    p.slot = slot;
    p.kind = RecordKind::Sample;
    p.n_deltas = static_cast<uint32_t>(ctx_.n_events());
    std::fill_n(p.deltas, kMaxEvents, 0);
    RawCount* last = &last_[static_cast<size_t>(slot) * kMaxEvents];
    const int n_values = std::min<int>(static_cast<int>(sample.n_values), thread.counters.sample_values());
    for (int i = 0; i < n_values; ++i) {
      const int event = thread.counters.sample_value_event(i);
      const RawCount now{sample.value(static_cast<uint64_t>(i)), sample.time_enabled, sample.time_running};
      const ScaledCount delta = scale_delta(last[event], now);
      last[event] = now;
      if (delta.scaled) ctx_.scaled_events.fetch_or(1u << event, std::memory_order_relaxed);
      p.deltas[event] = static_cast<uint64_t>(std::llround(delta.value));
    }
    p.stack = unwind(sample);
    pending_.push_back(p);
  }

  // The sample's native stack, leaf first: kernel frames (the kernel's call chain), then user
  // frames unwound from the copied stack.
  uint32_t unwind(const ParsedSample& sample) {
    uint64_t pcs[kMaxUnwindFrames * 2];
    int n = 0;
    for (uint64_t i = 0; i < sample.n_callchain && n < kMaxUnwindFrames; ++i) {
      const uint64_t pc = sample.chain(i);
      if (pc >= kContextMax) continue;  // PERF_CONTEXT_* markers
      pcs[n++] = pc;
    }
    UnwindResult result;
    UserRegs regs;
    if (sample.has_user_regs) regs = UserRegs{sample.user_ip, sample.user_sp, sample.user_bp};
    unwind_user_stack(regs, sample.stack, sample.stack ? sample.stack_size : 0, frames_, &result);
    ++unwind_stops_[static_cast<int>(result.stop)];
    by_frame_pointer_ += static_cast<uint64_t>(result.by_frame_pointer);
    by_scanning_ += static_cast<uint64_t>(result.by_scanning);
    for (int i = 0; i < result.n && n < kMaxUnwindFrames * 2; ++i) pcs[n++] = result.pcs[i];
    if (n == 0 && sample.ip) pcs[n++] = sample.ip;  // at least where the CPU was
    return stacks_.intern_stack(pcs, n);
  }

  int n_states() const { return std::min(options_.states_used->load(std::memory_order_acquire), kMaxDispatchThreads); }
  bool ready(int index) const { return options_.states[index]->ready.load(std::memory_order_acquire); }

  // Applies every dispatching thread's op events up to `time`, all of them in time order, so that
  // the threads on a CPU are charged up to each op boundary with the ops open before it.
  void advance_all(int64_t time) {
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

  void apply_next(int index, int64_t start) {
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

  int dispatch_index_of(int slot) const {
    const int n = n_states();
    for (int i = 0; i < n; ++i) {
      if (ready(i) && options_.states[i]->slot == slot) return i;
    }
    return -1;
  }

  // The dispatching thread a thread's time goes to now: itself when it runs ops; for an OpenMP
  // worker (or any thread that runs none), the dispatching thread inside an op, the one it was
  // seen working for by majority when several are; -1 when none is.
  void assign_owner(int slot, bool vote) {
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

  void charge_cpu(const uint32_t* path, int depth, int slot, uint64_t ns) {
    for (int e = 0; e < ctx_.n_events(); ++e) {
      if (ctx_.cpu_clock_event[e]) ctx_.charge(path, depth, slot, e, ns);
    }
  }

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

  // The bucket `key` is summed in: its own, or an empty one (whatever held it before is flushed).
  Bucket& bucket_for(int slot, uint64_t key) {
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

  void accumulate(int slot, uint64_t key, const uint32_t* path, int depth, uint64_t ns) {
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
  void accumulate_interned(int slot, uint64_t key, uint32_t path_id, uint64_t ns) {
    Bucket& b = bucket_for(slot, key);
    if (b.key == key) {
      b.ns += ns;
    } else {
      b = Bucket{key, path_id, ns};
    }
  }

  void flush(int slot, Bucket& b) {
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
  void flush_all() {
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
  void settle(int slot, int64_t until) {
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

  bool lazy_worker(int slot) const { return lazy_index_ >= 0 && !runs_[slot].dispatching; }

  // The one dispatching thread whose op events are replayed, or -1 when there are none or several.
  int single_ready() const {
    int found = -1;
    for (int i = 0, n = n_states(); i < n; ++i) {
      if (!ready(i)) continue;
      if (found >= 0) return -1;
      found = i;
    }
    return found;
  }

  void settle_any(int slot, int64_t until) {
    if (lazy_worker(slot)) {
      settle_lazily(slot, until);
      track(slot, until);
    } else {
      settle(slot, until);
    }
  }

  // The time a lazily charged worker spent on its CPU, counted as settle() counts it.
  void track(int slot, int64_t until) {
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
  bool open_segment(int64_t from, int64_t until, WorkerSegment* out) {
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

  void charge_segment(int slot, const WorkerSegment& s, int64_t from, int64_t until) {
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
  bool close_worker_segment(int64_t at) {
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

  void add_total(uint64_t key, uint32_t path, uint64_t ns) {
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
  void settle_lazily(int slot, int64_t until) {
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
  void flush_view() {
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

  void clear_segments() {
    segments_.clear();
    for (uint16_t i : totals_used_) totals_[i] = Bucket{};
    totals_used_.clear();
    totals_overflow_ = false;
    segments_start_ = segment_from_;
    for (int slot : on_cpu_) runs_[slot].seg = 0;
  }

  // At the start of a pass with a single dispatching thread: the workers on a CPU are settled up
  // to where its op events were applied, and are charged lazily from there.
  void enter_lazy() {
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
  void exit_lazy() {
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

  void go_off_cpu(int slot, RunState state) {
    Run& run = runs_[slot];
    if (run.state == RunState::On) on_cpu_.erase(std::find(on_cpu_.begin(), on_cpu_.end(), slot));
    run.state = state;
  }

  void go_on_cpu(int slot, int64_t time) {
    Run& run = runs_[slot];
    if (run.state != RunState::On) on_cpu_.push_back(slot);
    run.state = RunState::On;
    run.mark = time;
    run.tracked_mark = time;
    run.seg = static_cast<uint32_t>(segments_.size());
  }

  void process(const Pending& p) {
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

  void join(const Pending& p) {
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
  void charge_remainders() {
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

  // What the collector holds between and within passes, besides the stack table: the settle buckets,
  // the lazy workers' segments (cleared each pass, capacity kept) and the records awaiting a join.
  size_t working_memory_bytes() const {
    size_t bytes = dirty_.size() * kSettleBuckets * (sizeof(Bucket) + sizeof(uint16_t));
    bytes += segments_.capacity() * sizeof(WorkerSegment) + totals_used_.capacity() * sizeof(uint16_t);
    if (totals_) bytes += kSegmentTotals * sizeof(Bucket);
    bytes += pending_.capacity() * sizeof(Pending) + scratch_.capacity();
    bytes += (last_.capacity() * sizeof(RawCount)) + runs_.capacity() * sizeof(Run) + votes_.capacity() * sizeof(WorkerVotes);
    return bytes;
  }

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
  const bool eager_workers_ = g_eager_workers.load();
  int64_t segment_from_ = 0;    // the open segment starts here
  int64_t segments_start_ = 0;  // this pass's first segment starts here
  std::vector<WorkerSegment> segments_;
  std::unique_ptr<Bucket[]> totals_;  // per key: the closed segments' time this pass
  std::vector<uint16_t> totals_used_;
  bool totals_overflow_ = false;
  PathId path_ids_[kPathIdCache];
  std::vector<Pending> pending_;
  std::vector<uint8_t> scratch_;
  FrameTables frames_;
  StackTable stacks_;
  std::vector<uint64_t> unwind_stops_;
  uint64_t by_frame_pointer_ = 0, by_scanning_ = 0;
  uint64_t unparsed_ = 0, ambiguous_ = 0, late_events_ = 0;
  int cpu_event_ = -1;  // task-clock's index: the CPU time each sample stands for
  std::atomic<uint64_t> joined_{0};
};

}  // namespace

void inject_eager_workers(bool eager) { g_eager_workers.store(eager); }

std::unique_ptr<CountingStrategy> make_sampled_counting(CountingContext& context, const CountingOptions& options) {
  return std::make_unique<SampledCounting>(context, options);
}

}  // namespace cpuprof
