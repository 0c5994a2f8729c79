// Exact counting: the team is read at both ends of every op, so every op gets its own deltas.
//
// CPU time comes from each thread's CPU clock (clock_gettime on its thread CPU clock id), which
// the kernel answers from the thread's accounting without interrupting the CPU it runs on; a
// perf read() of a thread running on another CPU costs that CPU an interrupt (about 10 µs in a
// VM). The other events still need perf reads, but only of threads whose clock moved since the
// last read: a thread that has not run cannot have switched, migrated or faulted. The calling
// thread's clock is read last at a begin and first at an end, so the op's CPU time never holds
// cpuprof's own reads of the others. A member whose switch records say it has stayed off its CPU
// since this thread last read its clock is not read again: its clock cannot have moved, and on an
// op of a microsecond each such read was a fifth of the op's cost. Likewise a member (the calling
// thread included) that has stayed on its CPU since its clock was read a moment ago, with no switch
// record since, ran for all of that moment: its clock is carried forward by the wall time instead
// of read again. The wall also holds what the hypervisor steals and interrupts take, which the
// thread's CPU clock leaves out, and a charge once made is not taken back (a later op's delta
// cannot go below zero). So a clock is carried only for a short window (kCarryWindowNs) after a
// read, and only after two reads at the same switch position showed it keeping pace with the wall
// (kCarryPace): a member whose vCPU is stolen, or whose ring stopped telling (a lost switch out, a
// thread gone), fails that test at its next read, and is read until it passes again.
#include <sys/resource.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "common/clock.h"
#include "core/counting.h"

namespace cpuprof {

namespace {

struct SavedReadHook {
  std::atomic<bool> verify{false};
  std::atomic<bool> read_sleeping{false};  // every sleeping member's clock read, as before
  std::atomic<bool> read_running{false};   // every running member's clock read, as before
  std::atomic<uint64_t> parked{0}, moved_reads{0}, moved_episodes{0}, max_moved_ns{0};
  std::atomic<uint64_t> carried{0}, carried_other{0}, carried_unchecked{0}, carried_error_ns{0},
      max_carried_error_ns{0}, carried_off{0};
} g_saved;

// The test hook's line between a carried value that was right (two reads' jitter) and one that was
// not: a vCPU stolen, an interrupt's time, a switch missed. A check whose own read took longer than
// that was itself interrupted and tells nothing.
constexpr uint64_t kCarryCheckNs = 2000;

void raise_to(std::atomic<uint64_t>& most, uint64_t value) {
  uint64_t now = most.load(std::memory_order_relaxed);
  while (value > now && !most.compare_exchange_weak(now, value, std::memory_order_relaxed)) {
  }
}

// How long a running member's clock is carried forward from its last read (see the top). Short
// enough that a vCPU stolen inside it costs a carried value little; long enough that a run of ops
// of a microsecond or two reads the calling thread's clock once, not at each of its boundaries.
constexpr uint64_t kCarryWindowNs = 20000;
// The share of the wall a member's clock must have advanced by between two reads at one switch
// position before it is carried: 90 %, so that a read's own jitter passes and a stall does not.
constexpr int64_t kCarryPaceNum = 9, kCarryPaceDen = 10;

// Team members read per op in exact mode. Beyond it a member's work is charged only through the
// children that read it; a team this large makes every op cost milliseconds in this mode anyway.
constexpr int kMaxExactTeam = 256;

class ExactCounting final : public CountingStrategy {
 public:
  ExactCounting(CountingContext& context, const CountingOptions& options)
      : ctx_(context), buffers_(static_cast<size_t>(kMaxDispatchThreads)) {
    (void)options;
    n_events_ = std::max(context.n_events(), 1);
    stride_ = static_cast<size_t>(kMaxExactTeam) * n_events_;
    rusage_gate_ = true;
    for (int e = 0; e < context.n_events(); ++e) {
      if (context.cpu_clock_event[e]) cpu_clock_mask_ |= 1u << e;
      if (context.cpu_clock_event[e] && cpu_event_ < 0) {
        cpu_event_ = e;
      } else {
        const EventSpec& spec = context.events[e];
        rusage_gate_ = rusage_gate_ && spec.kind == EventKind::Software &&
                       (spec.config == PERF_COUNT_SW_CONTEXT_SWITCHES || spec.config == PERF_COUNT_SW_CPU_MIGRATIONS ||
                        spec.config == PERF_COUNT_SW_PAGE_FAULTS || spec.config == PERF_COUNT_SW_PAGE_FAULTS_MIN ||
                        spec.config == PERF_COUNT_SW_PAGE_FAULTS_MAJ);
      }
    }
    // A thread's CPU clock is read inside a system call, so the part of the call after the read at
    // an op's begin and the part before the read at its end land in the op's CPU time: the time
    // between two back-to-back reads, which is measured here (the least of many tries, as the
    // rest is noise) and taken out of every op's own-thread CPU time.
    int64_t best = INT64_MAX;
    for (int i = 0; i < 200; ++i) {
      timespec a, b;
      clock_gettime(CLOCK_THREAD_CPUTIME_ID, &a);
      clock_gettime(CLOCK_THREAD_CPUTIME_ID, &b);
      best = std::min<int64_t>(best, (b.tv_sec - a.tv_sec) * 1000000000LL + (b.tv_nsec - a.tv_nsec));
    }
    read_overhead_ns_ = best > 0 && best < 100000 ? best : 0;
  }

  CountingMode mode() const override { return CountingMode::Exact; }

  void begin_op(DispatchState& state, int depth, int64_t) override {
    Buffers& b = buffers(state);
    Frame& frame = state.frames[depth];
    frame.team_at_begin = std::min(ctx_.team->size(), kMaxExactTeam);
    // Everything else first: the calling thread's own clock is the last thing read before the op.
    std::memset(b.children.get() + depth * stride_, 0, static_cast<size_t>(frame.team_at_begin) * n_events_ * sizeof(uint64_t));
    b.own_begin_read[depth] = read_members(b, b.start.get() + depth * stride_, frame.team_at_begin, state.slot, /*own_first=*/false);
  }

  void end_op(DispatchState& state, int depth, int64_t, int64_t hook_inside_ns, int64_t wall_ns,
              uint64_t* span_counters) override {
    Buffers& b = buffers(state);
    Frame& frame = state.frames[depth];
    const int n_events = ctx_.n_events();
    const int members_now = std::min(ctx_.team->size(), kMaxExactTeam);
    RawCount* now_counts = b.scratch.get();
    const int own_end_read = read_members(b, now_counts, members_now, state.slot, /*own_first=*/true);
    const RawCount* start = b.start.get() + depth * stride_;
    const uint64_t* children = b.children.get() + depth * stride_;
    uint64_t* parent = depth > 0 ? b.children.get() + (depth - 1) * stride_ : nullptr;
    const uint64_t self_wall = static_cast<uint64_t>(std::max<int64_t>(0, wall_ns - frame.child_ns));
    for (int m = 0; m < members_now; ++m) {
      const int slot = ctx_.team->member(m);
      if (!reads(slot, state.slot) || !ctx_.table->slot_ready(slot)) continue;
      for (int event = 0; event < n_events; ++event) {
        const size_t i = static_cast<size_t>(m) * n_events_ + event;
        uint64_t incl;
        if (m < frame.team_at_begin) {
          // (A carried clock can stand above the next read, by what was stolen in its window:
          // the delta is then zero.)
          const ScaledCount delta = scale_delta(start[i], now_counts[i]);
          incl = static_cast<uint64_t>(std::llround(delta.value));
          if (delta.scaled) ctx_.scaled_events.fetch_or(1u << event, std::memory_order_relaxed);
          // CPU clocks also ran during the nested ops' callbacks (our reads): on this thread, and
          // on the team's workers, which spin between parallel regions while the dispatching
          // thread is in our hook. That time is known exactly; it is taken out, as from the wall.
          // Never below what the children claimed: a worker asleep during our hook spent nothing.
          if (ctx_.cpu_clock_event[event]) {
            incl = incl > static_cast<uint64_t>(hook_inside_ns) ? incl - hook_inside_ns : 0;
            if (slot == state.slot) {
              // Half a read's cost for each end read by a system call; a carried end cost nothing.
              const int64_t reads_cost = read_overhead_ns_ * (b.own_begin_read[depth] + own_end_read) / 2;
              incl = incl > static_cast<uint64_t>(reads_cost) ? incl - reads_cost : 0;
            }
            // The others are read before the calling thread at a begin and after it at an end,
            // so their reads bracket more than the op: the reads of the rest of the team, each a
            // system call. A worker spinning between parallel regions spends all of that bracket
            // on its CPU, which on ops of a microsecond is twice the op or more. The lesser of its
            // delta and the op's wall time is exact in the two cases of an OpenMP team: a worker
            // that spun through the op (the wall time) and one that slept outside it (its delta);
            // in between it errs by at most the bracket's excess. For the calling thread, what is
            // left of its reads' cost lies outside the op too.
            incl = std::min<uint64_t>(incl, static_cast<uint64_t>(wall_ns));
            if (incl < children[i]) incl = children[i];
          }
        } else {
          // Joined the team after this op began, so it was not read then: what this op's
          // children saw of it is what the op can claim.
          incl = children[i];
        }
        if (incl == 0) continue;
        uint64_t self_count = incl > children[i] ? incl - children[i] : 0;
        // Held to the self wall time too: a worker that spun through the op's own brackets but
        // slept in its children would otherwise show the children's wall time as its self CPU.
        if (ctx_.cpu_clock_event[event]) self_count = std::min<uint64_t>(self_count, self_wall);
        ctx_.table->counter(frame.entry, slot, event, false).fetch_add(incl, std::memory_order_relaxed);
        if (self_count) ctx_.table->counter(frame.entry, slot, event, true).fetch_add(self_count, std::memory_order_relaxed);
        if (parent) parent[i] += incl;
        if (span_counters) span_counters[event] += incl;
      }
    }
  }

  void stop(int64_t) override {}

 private:
  struct FreeDeleter {
    void operator()(void* p) const { std::free(p); }
  };
  template <typename T>
  using Buffer = std::unique_ptr<T[], FreeDeleter>;
  template <typename T>
  static Buffer<T> zeroed(size_t n) {
    return Buffer<T>(static_cast<T*>(std::calloc(n, sizeof(T))));
  }

  struct Buffers {
    Buffer<RawCount> start;     // [depth][member][event]: counts when each frame began
    Buffer<uint64_t> children;  // [depth][member][event]: inclusive deltas of its children
    Buffer<RawCount> scratch;   // [member][event]: the read at an op's end
    Buffer<RawCount> last;      // [member][event]: the member's last values read by this thread
    Buffer<uint64_t> last_cpu;  // [member]: its CPU clock at that read
    // [member]: its CPU clock at this thread's last system call reading it; the switch position
    // while that clock is known final (off its CPU), or while it is known to run on (0: neither);
    // and the monotonic time of that read, from which a running member's clock is carried.
    Buffer<uint64_t> member_cpu;
    Buffer<uint64_t> parked_at;
    Buffer<uint64_t> running_at;
    Buffer<int64_t> read_at;
    Buffer<uint64_t> read_position;  // [member]: its switch position at that read (0: not known)
    Buffer<uint64_t> moved_at;       // [member]: the test hook's last position with a moved clock
    Buffer<uint8_t> own_begin_read;  // [depth]: the calling thread's clock read by a system call at the begin
    uint64_t own_signature = 0;      // the calling thread's faults and switches at its last perf read
  };

  // Test hook: the saved read is made anyway, and any clock movement it hid is counted: the reads,
  // the episodes (a member's reads at one switch position), and the largest movement.
  static void verify_parked(Buffers& b, int m, uint64_t position, const ThreadSlot& thread, uint64_t parked) {
    g_saved.parked.fetch_add(1, std::memory_order_relaxed);
    uint64_t now = 0;
    if (!read_clock_ns(thread.cpu_clock, &now) || now <= parked) return;
    g_saved.moved_reads.fetch_add(1, std::memory_order_relaxed);
    if (b.moved_at[m] != position) {
      b.moved_at[m] = position;
      g_saved.moved_episodes.fetch_add(1, std::memory_order_relaxed);
    }
    raise_to(g_saved.max_moved_ns, now - parked);
  }

  // Test hook: a read made now against the value carried (`carried`, at `carried_at`), carried on
  // to the same moment.
  static void verify_carried(clockid_t clock, bool own, uint64_t carried_value, int64_t carried_at) {
    g_saved.carried.fetch_add(1, std::memory_order_relaxed);
    if (!own) g_saved.carried_other.fetch_add(1, std::memory_order_relaxed);
    uint64_t read = 0;
    int64_t at = 0, took = 0;
    if (!read_clock_at(clock, &read, &at, &took)) return;
    if (took > static_cast<int64_t>(kCarryCheckNs)) {
      g_saved.carried_unchecked.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    const uint64_t carried = carried_value + static_cast<uint64_t>(std::max<int64_t>(0, at - carried_at));
    const uint64_t error = read > carried ? read - carried : carried - read;
    g_saved.carried_error_ns.fetch_add(error, std::memory_order_relaxed);
    if (error > kCarryCheckNs) g_saved.carried_off.fetch_add(1, std::memory_order_relaxed);
    raise_to(g_saved.max_carried_error_ns, error);
  }

  // A read of a thread's CPU clock, the monotonic time at its middle (where the kernel took it,
  // give or take half of what the read took), and what it took.
  static bool read_clock_at(clockid_t clock, uint64_t* cpu, int64_t* at, int64_t* took) {
    const int64_t before = now_ns();
    const bool ok = read_clock_ns(clock, cpu);
    *took = now_ns() - before;
    *at = before + *took / 2;
    return ok;
  }

  // Sized when a thread becomes a dispatching thread (prepare_thread, before its first op is
  // pushed), never per op; an op only ever finds them there. calloc, not new[]: blocks this large
  // come zeroed from fresh pages, so nothing is written now and only the depths and members an op
  // actually uses ever become resident (new RawCount[] would write every element: megabytes,
  // tens of milliseconds, inside the first op). A failed allocation returns false instead of
  // throwing out of the op callback, which used to leave the thread's op depth raised for good.
  bool prepare_thread(DispatchState& state) noexcept override {
    Buffers& b = buffers_[state.index];
    if (b.start) return true;
    Buffers fresh;
    fresh.start = zeroed<RawCount>(kMaxDepth * stride_);
    fresh.children = zeroed<uint64_t>(kMaxDepth * stride_);
    fresh.scratch = zeroed<RawCount>(stride_);
    fresh.last = zeroed<RawCount>(stride_);
    fresh.last_cpu = zeroed<uint64_t>(kMaxExactTeam);
    fresh.member_cpu = zeroed<uint64_t>(kMaxExactTeam);
    fresh.parked_at = zeroed<uint64_t>(kMaxExactTeam);
    fresh.running_at = zeroed<uint64_t>(kMaxExactTeam);
    fresh.read_at = zeroed<int64_t>(kMaxExactTeam);
    fresh.read_position = zeroed<uint64_t>(kMaxExactTeam);
    fresh.moved_at = zeroed<uint64_t>(kMaxExactTeam);
    fresh.own_begin_read = zeroed<uint8_t>(kMaxDepth);
    if (!fresh.start || !fresh.children || !fresh.scratch || !fresh.last || !fresh.last_cpu || !fresh.member_cpu ||
        !fresh.parked_at || !fresh.running_at || !fresh.read_at || !fresh.read_position || !fresh.moved_at || !fresh.own_begin_read) {
      return false;
    }
    b = std::move(fresh);
    return true;
  }

  // Only reached for a state prepare_thread() succeeded on: the session calls no op hook before.
  Buffers& buffers(const DispatchState& state) { return buffers_[state.index]; }

  // Other dispatching threads' counters belong to their own ops.
  bool reads(int slot, int own) const { return slot == own || !ctx_.team->is_dispatch(slot); }

  // One member's values into `row`: its CPU clock in the CPU-clock event; its ring-counted
  // events (software events and tracepoints: memory loads, see thread_counters.h); and the rest
  // (hardware events) from a perf read when the clock moved since this thread last read it (else
  // the last values). The calling thread's clock is read after everything else at a begin
  // (`clock_last`) and before it at an end, so neither read lands inside the op's CPU time.
  // Returns whether the clock was read by a system call (rather than known unchanged or carried).
  bool read_member(Buffers& b, int m, int slot, bool own, RawCount* row, bool clock_last = false) {
    const ThreadSlot& thread = ctx_.registry->slot(slot);
    RawCount* last = b.last.get() + static_cast<size_t>(m) * n_events_;
    uint32_t counted = 0;
    const bool read_groups = (thread.counters.group_events() & ~cpu_clock_mask_) != 0;
    if (own && clock_last) {
      thread.counters.read_rings(last, &counted);
      if (read_groups && own_changed(b)) thread.counters.read_groups(last, &counted);
    }
    const clockid_t clock = own ? CLOCK_THREAD_CPUTIME_ID : thread.cpu_clock;
    bool clock_ok = true;
    bool system_call = false;
    uint64_t cpu = 0;
    uint64_t position = 0;
    ThreadCounters::CpuState cpu_state = ThreadCounters::CpuState::Unknown;
    const bool known = thread.counters.switch_position(&position, &cpu_state);
    int64_t now = 0;
    if (known && !own && !read_sleeping_ && position == b.parked_at[m]) {
      cpu = b.member_cpu[m];
      if (g_saved.verify.load(std::memory_order_relaxed)) verify_parked(b, m, position, thread, cpu);
    } else if (known && !read_running_ && position == b.running_at[m] &&
               (now = now_ns()) - b.read_at[m] < static_cast<int64_t>(kCarryWindowNs)) {
      cpu = b.member_cpu[m] + static_cast<uint64_t>(std::max<int64_t>(0, now - b.read_at[m]));
      if (g_saved.verify.load(std::memory_order_relaxed)) verify_carried(clock, own, cpu, now);
    } else {
      system_call = true;
      const uint64_t previous_cpu = b.member_cpu[m];
      const int64_t previous_at = b.read_at[m];
      int64_t took = 0;
      clock_ok = read_clock_at(clock, &cpu, &b.read_at[m], &took);
      b.member_cpu[m] = cpu;
      // The position is the one before the read: a record written during it moves the position
      // the next boundary finds, which then reads again. A member off its CPU keeps this value
      // until it comes back. One on it (the calling thread runs, whatever its last record said)
      // is carried from here if its clock kept pace with the wall since the last read, and this
      // read was not itself interrupted (its time would then be known only to half of that).
      const bool same_position = known && clock_ok && b.read_position[m] == position;
      const bool running = own || cpu_state == ThreadCounters::CpuState::On;
      const bool kept_pace = same_position && cpu >= previous_cpu &&
                             static_cast<int64_t>(cpu - previous_cpu) * kCarryPaceDen >=
                                 (b.read_at[m] - previous_at) * kCarryPaceNum;
      b.parked_at[m] = known && clock_ok && !own && cpu_state == ThreadCounters::CpuState::Off ? position : 0;
      b.running_at[m] = running && kept_pace && took <= static_cast<int64_t>(kCarryCheckNs) ? position : 0;
      b.read_position[m] = known && clock_ok ? position : 0;
    }
    if (!(own && clock_last)) {
      thread.counters.read_rings(last, &counted);
      if (read_groups && (own ? own_changed(b) : cpu != b.last_cpu[m] || !clock_ok)) {
        thread.counters.read_groups(last, &counted);
        b.last_cpu[m] = cpu;
      }
    }
    std::copy(last, last + n_events_, row);
    // The clock in place of perf's task-clock: the same nanoseconds, unscaled (no time "enabled").
    if (clock_ok && cpu_event_ >= 0) row[cpu_event_] = RawCount{cpu, 0, 0};
    return system_call;
  }

  // Whether the calling thread's software events may have moved since it last read them. When they
  // are only switches, migrations and faults, the thread's rusage (one cheap system call) says:
  // a thread that has neither faulted nor been switched out has not migrated either.
  bool own_changed(Buffers& b) {
    if (!rusage_gate_) return true;
    rusage usage;
    if (getrusage(RUSAGE_THREAD, &usage) != 0) return true;
    const uint64_t signature = static_cast<uint64_t>(usage.ru_minflt + usage.ru_majflt) * 1000003ULL +
                               static_cast<uint64_t>(usage.ru_nvcsw + usage.ru_nivcsw) + 1;
    if (signature == b.own_signature) return false;
    b.own_signature = signature;
    return true;
  }

  // Reads the first `n` team members into out[member][event]. The calling thread is read last at
  // a begin and first at an end, so the others' reads fall outside the op on its own clock.
  // Returns whether the calling thread's clock was read by a system call.
  bool read_members(Buffers& b, RawCount* out, int n, int own, bool own_first) {
    int own_member = -1;
    bool own_read = false;
    for (int m = 0; m < n; ++m) {
      if (ctx_.team->member(m) == own) own_member = m;
    }
    if (own_member >= 0 && own_first) {
      own_read = read_member(b, own_member, own, true, out + static_cast<size_t>(own_member) * n_events_);
    }
    for (int m = 0; m < n; ++m) {
      if (m == own_member) continue;
      const int slot = ctx_.team->member(m);
      RawCount* row = out + static_cast<size_t>(m) * n_events_;
      if (reads(slot, own)) {
        read_member(b, m, slot, false, row);
      } else {
        std::fill_n(row, n_events_, RawCount{});  // never read at begin nor end: a zero delta
      }
    }
    if (own_member >= 0 && !own_first) {
      own_read = read_member(b, own_member, own, true, out + static_cast<size_t>(own_member) * n_events_, /*clock_last=*/true);
    }
    return own_read;
  }

  CountingContext& ctx_;
  std::vector<Buffers> buffers_;
  const bool read_sleeping_ = g_saved.read_sleeping.load();
  const bool read_running_ = g_saved.read_running.load();
  int cpu_event_ = -1;             // task-clock's index, read from the threads' CPU clocks
  uint32_t cpu_clock_mask_ = 0;    // every CPU-clock event (task-clock, cpu-clock)
  int64_t read_overhead_ns_ = 0;   // CPU time between two reads of a thread's own clock
  bool rusage_gate_ = false;       // the other events are all ones rusage can tell unchanged
  int n_events_ = 1;
  size_t stride_ = 0;
};

}  // namespace

void verify_saved_reads(bool on) {
  for (auto* counter : {&g_saved.parked, &g_saved.moved_reads, &g_saved.moved_episodes, &g_saved.max_moved_ns,
                        &g_saved.carried, &g_saved.carried_other, &g_saved.carried_unchecked,
                        &g_saved.carried_error_ns, &g_saved.max_carried_error_ns, &g_saved.carried_off}) {
    counter->store(0);
  }
  g_saved.verify.store(on);
}

void inject_read_sleeping_members(bool on) { g_saved.read_sleeping.store(on); }
void inject_read_running_members(bool on) { g_saved.read_running.store(on); }

SavedReadStats saved_read_stats() {
  SavedReadStats stats;
  stats.parked = g_saved.parked.load();
  stats.moved_reads = g_saved.moved_reads.load();
  stats.moved_episodes = g_saved.moved_episodes.load();
  stats.max_moved_ns = g_saved.max_moved_ns.load();
  stats.carried = g_saved.carried.load();
  stats.carried_other = g_saved.carried_other.load();
  stats.carried_unchecked = g_saved.carried_unchecked.load();
  stats.carried_error_ns = g_saved.carried_error_ns.load();
  stats.max_carried_error_ns = g_saved.max_carried_error_ns.load();
  stats.carried_off = g_saved.carried_off.load();
  return stats;
}

std::unique_ptr<CountingStrategy> make_exact_counting(CountingContext& context, const CountingOptions& options) {
  return std::make_unique<ExactCounting>(context, options);
}

}  // namespace cpuprof
