// The collection loop: the session's one background thread ("cpuprof-collect"). Each period it
// hands the counting strategy its turn (sampled mode drains the sample rings and joins them to
// the op timelines here); it also finds new threads (when the rings say one was created, else
// every discovery interval) and adds to the team the ones that start working; at stop it takes the
// final read that ends every thread's totals. Discovering threads is one of its jobs, not its
// purpose, hence the name.
//
// It never reads a thread that is in the team while the session runs: reading the counters of
// a thread running on another CPU costs that CPU an interrupt (about 10 µs in a VM), and waking
// up on a machine whose CPUs the OpenMP team fills stalls the whole team. The team is read by
// the counting strategy on the dispatching threads themselves. Threads outside the team are
// idle, and reading an idle thread's counters is cheap.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>

#include "core/counting.h"
#include "core/op_table.h"
#include "core/team.h"
#include "core/thread_registry.h"

namespace cpuprof {

// Test hook: every collector period but the final one takes this much longer, as it does with
// hundreds of threads to read, so that a stop requested mid-period can be tested (0 clears).
void inject_collect_delay_us(int64_t delay_us);
// Test hook: every collector period but the final one spends this much CPU time busy, so the
// collector's CPU the profile reports can be checked against a known cost (0 clears).
void inject_collect_spin_us(int64_t spin_us);
// Test hook: the collector's period for sessions started from now on (0: kCollectIntervalUs; at
// most 10 s). Only the sample rings follow it: the op-event rings (kOpEventCapacity) hold about
// 2.5 s of a decode's op boundaries, and drop (and count) beyond.
constexpr int64_t kMaxInjectedCollectIntervalUs = 10000000;
void inject_collect_interval_us(int64_t interval_us);
// The period sessions started now use; sample rings are sized to it.
int64_t collect_interval_us();

class CollectionLoop {
 public:
  // `collect(now, final)` runs after each tick (see CountingStrategy::collect).
  using Collect = std::function<ThreadCreation(int64_t, bool)>;
  CollectionLoop(ThreadRegistry& registry, TeamSet& team, OpTable& table, Collect collect = nullptr);
  ~CollectionLoop();
  // Starts the thread and waits until it has opened counters on every existing thread.
  void start();
  // Stops the thread after one last read of every thread, so totals end exactly at stop().
  void stop();
  int64_t cpu_ns() const { return cpu_ns_.load(std::memory_order_relaxed); }
  uint64_t ticks() const { return ticks_.load(std::memory_order_relaxed); }
  // Counter reads left out because the thread had not run since it was last found idle.
  uint64_t idle_reads_skipped() const { return reads_skipped_.load(std::memory_order_relaxed); }
  // Walks of /proc/self/task for new threads.
  uint64_t scans() const { return scans_.load(std::memory_order_relaxed); }

 private:
  void run();
  void tick(bool final_tick);
  void scan();

  ThreadRegistry& registry_;
  TeamSet& team_;
  OpTable& table_;
  Collect collect_;
  ThreadCreation last_creation_ = ThreadCreation::Unknown;
  const int64_t interval_us_;  // the period, fixed when the session starts (its rings are sized to it)
  std::thread thread_;
  pid_t tid_ = 0;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_requested_ = false;
  bool ready_ = false;
  int64_t last_scan_ns_ = 0;
  int64_t last_read_ns_ = 0;  // the last tick that read the threads outside the team
  int size_at_scan_ = 0;      // the registry's size as the last walk began
  std::atomic<int64_t> cpu_ns_{0};
  std::atomic<uint64_t> ticks_{0};
  std::atomic<uint64_t> reads_skipped_{0};
  std::atomic<uint64_t> scans_{0};
};

}  // namespace cpuprof
