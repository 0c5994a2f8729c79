// The one clock of the op timeline: CLOCK_MONOTONIC, which is also what perf samples are
// stamped with (use_clockid), so op spans and kernel samples can be joined by time.
#pragma once

#include <time.h>

#include <cstdint>

namespace cpuprof {

inline int64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
}

inline int64_t thread_cpu_ns() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
}

}  // namespace cpuprof
