// The sampler thread: finds new threads, adds to the team the ones that start working, and
// takes the final read that ends every thread's totals.
//
// It never reads a thread that is in the team while the session runs: reading the counters of
// a thread running on another CPU costs that CPU an interrupt (about 10 µs in a VM), and waking
// up on a machine whose CPUs the OpenMP team fills stalls the whole team. The team is read by
// the dispatching threads themselves (see Session::sample). Threads outside the team are idle,
// and reading an idle thread's counters is cheap.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>

#include "thread_registry.h"

namespace cpuprof {

class Session;

class Sampler {
 public:
  static constexpr int kIntervalUs = 20000;  // as often as it rescans for new threads
  explicit Sampler(Session& session);
  ~Sampler();
  // Starts the thread and waits until it has opened counters on every existing thread.
  void start();
  // Stops the thread after one last read of every thread, so totals end exactly at stop().
  void stop();
  int64_t cpu_ns() const { return cpu_ns_.load(std::memory_order_relaxed); }
  uint64_t ticks() const { return ticks_.load(std::memory_order_relaxed); }
  // Cumulative counts of a thread slot at the final read (valid after stop()).
  const uint64_t* last_values(int slot) const { return last_[slot]; }
  uint32_t scaled(int slot) const { return scaled_[slot]; }
  uint32_t counted(int slot) const { return counted_[slot]; }

 private:
  void run();
  void tick(bool final_tick);
  void join_threads_that_ran();

  Session& session_;
  std::thread thread_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_requested_ = false;
  bool ready_ = false;
  int64_t last_scan_ns_ = 0;
  std::atomic<int64_t> cpu_ns_{0};
  std::atomic<uint64_t> ticks_{0};
  uint64_t last_[kMaxThreads][kMaxEvents] = {};
  uint32_t scaled_[kMaxThreads] = {};
  uint32_t counted_[kMaxThreads] = {};
};

}  // namespace cpuprof
