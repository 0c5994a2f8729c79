// The counters of one thread: its events split into perf groups, each read with one read().
//
// Software events and tracepoints share one group, so on a machine without a PMU a thread costs
// exactly one read() per snapshot. Hardware events go in groups of at most four (what a core's
// general-purpose counters hold) so the kernel can multiplex whole groups; PMU events from sysfs
// get a group each, since events of two different PMUs cannot share a group.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <vector>

#include "common/limits.h"
#include "perf/perf_events.h"

namespace cpuprof {

class ThreadCounters {
 public:
  ThreadCounters() = default;
  ThreadCounters(const ThreadCounters&) = delete;
  ThreadCounters& operator=(const ThreadCounters&) = delete;
  ~ThreadCounters() { close(); }

  // Opens every event for `tid`. Returns the number opened; an event that fails here (the probe
  // on the profiling thread already dropped what the machine cannot count) reads as not counted.
  int open(pid_t tid, const std::vector<EventSpec>& events, int* first_errno);

  // Cumulative values since open(), scaled for multiplexing. `scaled` and `counted` are bitmasks
  // over event indices. Allocation-free: called on the per-op path in exact mode.
  bool read(uint64_t* values, uint32_t* scaled, uint32_t* counted) const;
  // The raw readings, for deltas scaled per interval (scale_delta). `counted` as above.
  bool read_raw(RawCount* values, uint32_t* counted) const;

  void close();
  bool is_open() const { return n_groups_ > 0; }

 private:
  struct Group {
    int leader_fd = -1;
    int n = 0;                  // members read back, in order
    int event_index[kMaxEvents];
  };
  Group groups_[kMaxEvents];
  int n_groups_ = 0;
  int fds_[kMaxEvents];
  int n_fds_ = 0;
  int n_events_ = 0;
};

}  // namespace cpuprof
