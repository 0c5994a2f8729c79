// The counters of one thread: its events split into perf groups, each read with one read().
//
// Exact mode counts software events and tracepoints another way: each is a sampling event of
// period 1, so every occurrence writes a bare record into a small ring of its own, and the count
// is the records consumed. Reading it is a few memory loads:
// no system call, and above all no read() of a thread running on another CPU, which interrupts
// that CPU (about 10 µs here) and is what made exact mode slow when OpenMP workers spin. A ring
// found full may have dropped records: the event's true count is then read() once and the
// difference kept, so more occurrences between two reads than the ring holds are still counted.
//
// One of those rings (the context-switches event's, or a dummy event's when context-switches is
// not counted) also carries the thread's switch records, so a reader knows without a system call
// whether the thread has been off its CPU since it last read the thread's CPU clock: a thread
// asleep since then has the same clock, and reading it again is a system call saved per op
// boundary and per sleeping team member (see switch_position).
//
// Software events and tracepoints share one group, so on a machine without a PMU a thread costs
// exactly one read() per snapshot. Hardware events go in groups of at most four (what a core's
// general-purpose counters hold) so the kernel can multiplex whole groups; PMU events from sysfs
// get a group each, since events of two different PMUs cannot share a group.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <vector>

#include "common/limits.h"
#include "perf/perf_events.h"
#include "perf/sample_ring.h"

namespace cpuprof {

// Test hook: every thread's switch ring says, from now on, that it is on its CPU and has written no
// record since (a ring that stopped telling, as after a lost switch out), until False restores.
void inject_frozen_switch_positions(bool on);

class ThreadCounters {
 public:
  ThreadCounters() = default;
  ThreadCounters(const ThreadCounters&) = delete;
  ThreadCounters& operator=(const ThreadCounters&) = delete;
  ~ThreadCounters() { close(); }

  // Opens every event for `tid`. Returns the number opened; an event that fails here (the probe
  // on the profiling thread already dropped what the machine cannot count) reads as not counted.
  // With `sampling`, the group of software events (task-clock first) samples: its leader writes
  // a record every `period` ns of the thread's CPU time into a ring of `ring_pages` pages, each
  // with the group's values (see sample_record.h). If sampling cannot be set up, the events
  // still count, and `sampling_errno()` says why.
  struct Sampling {
    uint64_t period_ns = 1000000;
    uint32_t stack_bytes = 8192;
    size_t ring_pages = 64;
  };
  // With `count_by_ring` (exact mode), software events and tracepoints other than the CPU clock
  // are counted through rings (above); one whose ring cannot be set up joins its group instead.
  int open(pid_t tid, const std::vector<EventSpec>& events, int* first_errno, const Sampling* sampling = nullptr,
           bool count_by_ring = false);

  // Cumulative values since open(), scaled for multiplexing. `scaled` and `counted` are bitmasks
  // over event indices. Allocation-free: called on the per-op path in exact mode.
  bool read(uint64_t* values, uint32_t* scaled, uint32_t* counted) const;
  // The raw readings, for deltas scaled per interval (scale_delta). `counted` as above.
  bool read_raw(RawCount* values, uint32_t* counted) const;
  // The two halves of read_raw: the ring-counted events (memory loads), and the groups (one
  // read() each). Each writes only its own events' values and bits.
  void read_rings(RawCount* values, uint32_t* counted) const;
  bool read_groups(RawCount* values, uint32_t* counted) const;
  uint32_t ring_events() const { return ring_mask_; }  // bitmask of the ring-counted events
  // Where the thread's switch ring stands: a position that moves with every record, and whether
  // the last switch record read was a switch out (Off) or in (On); Unknown before the first one,
  // and after a full ring, which may have dropped one, until the next. Equal positions at two calls mean no switch record was written
  // in between; a thread coming back on a CPU runs for a moment (10-30 µs here) before its switch-in
  // record is. False when the position is not known for sure (records waiting that another reader
  // is consuming) or the thread has no switch ring (sampled mode, a kernel without switch records).
  // Memory loads only, unless records are waiting.
  enum class CpuState : uint8_t { Unknown = 0, Off = 1, On = 2 };
  bool switch_position(uint64_t* position, CpuState* cpu_state) const;
  // A position that moves whenever the kernel writes any record for this thread: a sample, a switch
  // in or out, a ring-counted event. Where its rings carry switch records, a thread that was off
  // its CPU and has not moved it since has not run since. False without switch records. Memory loads.
  bool activity_position(uint64_t* position) const;
  uint32_t group_events() const { return group_mask_; }

  void close();
  bool is_open() const { return n_groups_ > 0 || n_ring_counts_ > 0; }

  // Sampling: the ring of the sampling group, and which event each value of a sample is.
  bool sampling() const { return ring_.mapped(); }
  // Whether this thread was sampled since it was opened (still true after close), or why not.
  bool sampled() const { return sampled_; }
  int sampling_errno() const { return sampling_errno_; }
  // The sample ring's data pages as mapped (0: not sampled), and as asked for: fewer where the
  // locked-memory budget refused the asked size (open()'s retry at half the size).
  // Kept after close(): the snapshot that reports them is taken once the rings are gone.
  size_t ring_pages() const { return ring_pages_mapped_; }
  size_t ring_pages_asked() const { return ring_pages_asked_; }
  SampleRing& ring() { return ring_; }
  int sample_value_event(int i) const { return groups_[sample_group_].event_index[i]; }
  int sample_values() const { return sample_group_ >= 0 ? groups_[sample_group_].n : 0; }

 private:
  struct Group {
    int leader_fd = -1;
    int n = 0;                  // members read back, in order
    int event_index[kMaxEvents];
  };
  // One ring-counted event. Its ring is consumed by whichever thread reads it first (a try-lock:
  // a reader that finds it busy takes the count last published).
  struct RingCount {
    int event = -1;
    int fd = -1;
    SampleRing ring;
    mutable std::atomic<uint64_t> count{0};
    mutable uint64_t seen = 0;      // records consumed
    mutable int64_t correction = 0;  // the true count (a read()) minus `seen`, since records were lost
    mutable std::atomic<bool> busy{false};
    bool tracks_switches = false;          // its ring also carries the thread's switch records
    mutable CpuState cpu_state = CpuState::Unknown;  // what its last switch record said
    // Published after each consume: (ring position consumed + 1) << 2 | cpu_state.
    mutable std::atomic<uint64_t> switch_state{0};
    mutable std::vector<uint8_t> scratch;  // empty: the count needs headers only, not record bytes
  };
  uint64_t ring_count(const RingCount& r) const;
  static uint64_t pack_switch_state(uint64_t consumed, CpuState state) {
    return ((consumed + 1) << 2) | static_cast<uint64_t>(state);
  }
  bool open_ring_count(const EventSpec& spec, pid_t tid, int event, bool with_switches);
  void open_switch_ring(pid_t tid);
  void note_if_asleep(pid_t tid);
  RingCount ring_counts_[kMaxEvents];
  int n_ring_counts_ = 0;
  int switch_ring_ = -1;  // the ring count whose ring carries the switch records, or -1
  uint32_t ring_mask_ = 0, group_mask_ = 0;
  bool cpu_clock_counted_ = false;  // the thread's CPU clock event is open in a group
  SampleRing ring_;
  int sample_group_ = -1;
  int sampling_errno_ = 0;
  size_t ring_pages_asked_ = 0;
  size_t ring_pages_mapped_ = 0;
  bool sampled_ = false;
  Group groups_[kMaxEvents];
  int n_groups_ = 0;
  int fds_[kMaxEvents];
  int n_fds_ = 0;
  int n_events_ = 0;
};

}  // namespace cpuprof
