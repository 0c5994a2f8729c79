// Every thread of the process, each with its own counters.
//
// Slots are append-only while a session runs: a thread that exits keeps its slot (its counters
// still read back the final counts), so readers on the per-op path can index slots without a
// lock. The slot array is sized at start (any thread count the machine has); only the discovery
// thread and a thread's own first op append, under the mutex, and a slot is published by bumping
// `size_` with release order after it is fully written.
#pragma once

#include <sys/types.h>
#include <time.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "common/limits.h"
#include "perf/thread_counters.h"

namespace cpuprof {

// The kernel's scheduler statistics of one thread (/proc/self/task/<tid>/schedstat).
struct SchedStat {
  bool ok = false;
  int64_t cpu_ns = 0;        // time on a CPU
  int64_t run_delay_ns = 0;  // time runnable but waiting for a CPU (the run queue)
  int64_t timeslices = 0;
};
SchedStat read_schedstat(pid_t tid);

struct ThreadSlot {
  pid_t tid = 0;
  clockid_t cpu_clock = 0;  // the thread's CPU clock, readable from any thread of the process
  char name[16] = {0};
  int64_t opened_ns = 0;  // when counting started for this thread
  int open_errno = 0;     // non-zero when some event failed to open on this thread
  bool has_run = false;   // had already worked before counting started (an existing OpenMP worker)
  SchedStat sched_at_open;
  ThreadCounters counters;
  // The collection loop's latest read (its final one after stop): the thread's totals.
  // Written only by that thread while the session runs; read by others only once it stopped.
  uint64_t last_values[kMaxEvents] = {};
  uint32_t last_scaled = 0;
  uint32_t last_counted = 0;
  SchedStat sched_at_stop;  // not ok when the thread had exited by then
  // The collection loop's own: whether its last read found the counters unchanged, and the
  // thread's activity position (ThreadCounters::activity_position) taken just before that read.
  bool quiet_at_read = false;
  uint64_t activity_at_read = 0;
};

class ThreadRegistry {
 public:
  // Sizes the slots for up to `max_threads` threads and forgets every earlier thread. With
  // `sampling`, every thread's counters sample; with `count_by_ring` (exact mode) software events
  // are counted through rings (see ThreadCounters::open).
  void configure(const std::vector<EventSpec>& events, int max_threads,
                 const ThreadCounters::Sampling* sampling = nullptr, bool count_by_ring = false);
  // cpuprof's own threads besides the collection thread (the Python stack sampler): never
  // profiled, as they would otherwise be counted as workers of the ops they ran beside. Set
  // before the first scan; read-only while the session runs.
  void set_own_threads(std::vector<pid_t> tids) { own_threads_ = std::move(tids); }
  // Opens counters on threads of this process not seen yet, except `exclude_tid` (the
  // collection thread itself) and the own threads. Returns how many were added.
  int scan(pid_t exclude_tid);
  // Opens counters on one thread now (the calling thread on its first op, before a scan sees it).
  int ensure(pid_t tid);
  int size() const { return size_.load(std::memory_order_acquire); }
  int capacity() const { return static_cast<int>(slots_.size()); }
  const ThreadSlot& slot(int i) const { return *slots_[i]; }
  ThreadSlot& mutable_slot(int i) { return *slots_[i]; }
  int find(pid_t tid) const;
  // The most threads seen at once beyond the slots, over the session.
  int threads_beyond_limit() const { return beyond_limit_.load(std::memory_order_relaxed); }
  // CPU time scans spent opening counters on the threads they found (a one-off cost per thread,
  // apart from the collector's cost per period).
  int64_t scan_setup_cpu_ns() const { return scan_setup_cpu_ns_.load(std::memory_order_relaxed); }
  int n_events() const { return static_cast<int>(events_.size()); }
  void close_all();
  // In a forked child: the parent's threads are gone and the mutex may be held by one of them.
  void reset_after_fork();

 private:
  int add_locked(pid_t tid);
  std::vector<EventSpec> events_;
  ThreadCounters::Sampling sampling_;
  bool sampled_ = false;
  int task_dir_fd_ = -1;  // /proc/self/task, kept open across scans
  std::vector<pid_t> own_threads_;
  bool count_by_ring_ = false;
  std::vector<std::unique_ptr<ThreadSlot>> slots_;
  // The tids in the slots, sorted: a scan of hundreds of threads looks each up in log time, where
  // a walk of the slots per tid made discovery quadratic in the threads.
  std::vector<pid_t> known_tids_;
  std::atomic<int> size_{0};
  std::atomic<int> beyond_limit_{0};
  std::atomic<int64_t> scan_setup_cpu_ns_{0};
  std::mutex mutex_;
};

}  // namespace cpuprof
