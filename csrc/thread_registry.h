// Every thread of the process, each with its own counters.
//
// Slots are append-only while a session runs: a thread that exits keeps its slot (its counters
// still read back the final counts), so readers on the per-op path can index slots without a lock.
// Only the sampler thread (and start/stop) appends; it publishes a slot by bumping `size_` with
// release order after the slot is fully written.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "thread_counters.h"

namespace cpuprof {

constexpr int kMaxThreads = 64;

struct ThreadSlot {
  pid_t tid = 0;
  char name[16] = {0};
  int64_t opened_ns = 0;  // when counting started for this thread
  int open_errno = 0;     // non-zero when some event failed to open on this thread
  bool has_run = false;   // had used >1 ms of CPU before counting started (an existing OpenMP worker)
  ThreadCounters counters;
};

class ThreadRegistry {
 public:
  void configure(const std::vector<EventSpec>& events, pid_t exclude_tid);
  // Opens counters on threads of this process not seen yet. Returns how many were added.
  int scan();
  // Opens counters on one thread now (the calling thread on its first op, before a scan sees it).
  int ensure(pid_t tid);
  int size() const { return size_.load(std::memory_order_acquire); }
  const ThreadSlot& slot(int i) const { return *slots_[i]; }
  int find(pid_t tid) const;
  int dropped_threads() const { return dropped_.load(std::memory_order_relaxed); }
  int n_events() const { return static_cast<int>(events_.size()); }
  void close_all();
  void set_excluded(pid_t tid) { exclude_tid_ = tid; }
  // In a forked child: the parent's threads are gone and the mutex may be held by one of them.
  void reset_after_fork();

 private:
  int add_locked(pid_t tid);
  std::vector<EventSpec> events_;
  std::unique_ptr<ThreadSlot> slots_[kMaxThreads];
  std::atomic<int> size_{0};
  std::atomic<int> dropped_{0};
  pid_t exclude_tid_ = 0;
  std::mutex mutex_;
};

int64_t now_ns();

}  // namespace cpuprof
