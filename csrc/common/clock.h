// The one clock of the op timeline: CLOCK_MONOTONIC, which is also what perf samples are
// stamped with (use_clockid), so op spans and kernel samples can be joined by time.
#pragma once

#include <sys/types.h>
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

// The kernel's encoding of a thread's CPU clock id (what pthread_getcpuclockid returns for a
// pthread): any thread of the process may read it, without interrupting the thread.
inline clockid_t thread_cpu_clock(pid_t tid) { return static_cast<clockid_t>((~static_cast<unsigned>(tid) << 3) | 6); }

// A clock's reading in nanoseconds, or false when it cannot be read (a thread that has exited).
inline bool read_clock_ns(clockid_t clock, uint64_t* ns) {
  timespec ts;
  if (clock_gettime(clock, &ts) != 0) return false;
  *ns = static_cast<uint64_t>(ts.tv_sec) * 1000000000ULL + static_cast<uint64_t>(ts.tv_nsec);
  return true;
}

}  // namespace cpuprof
