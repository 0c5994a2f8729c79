// The sampler thread: finds new threads, keeps per-thread totals, and in sampled mode charges
// counter deltas to the op that is running.
//
// In sampled mode the op path only publishes which op is on top of each dispatching thread's
// stack; every `interval` this thread reads all threads' counters once (one read() per thread)
// and gives each thread's delta to an op: a dispatching thread's own delta to its own innermost
// op, an OpenMP worker's delta to the op most recently begun on any dispatching thread (the op
// whose parallel region the worker is serving), and anything seen while no op runs to
// "[outside ATen ops]". The attribution is statistical, like any sampling profiler: an op much
// shorter than the interval is charged only in proportion to how often it is caught running.
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
  Sampler(Session& session, int interval_us, bool attribute);
  ~Sampler();
  // Starts the thread and waits until it has opened counters on every existing thread.
  void start();
  // Stops the thread after one last read, so totals end exactly at stop().
  void stop();
  int64_t cpu_ns() const { return cpu_ns_.load(std::memory_order_relaxed); }
  uint64_t ticks() const { return ticks_.load(std::memory_order_relaxed); }
  // Cumulative counts of a thread slot at the last tick (frozen after stop()).
  const uint64_t* last_values(int slot) const { return last_[slot]; }
  uint32_t scaled(int slot) const { return scaled_[slot]; }
  uint32_t counted(int slot) const { return counted_[slot]; }

 private:
  void run();
  void tick(bool final_tick);
  void attribute(int n_slots);

  Session& session_;
  const int interval_us_;
  const bool attribute_;
  std::thread thread_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_requested_ = false;
  bool ready_ = false;
  int64_t last_scan_ns_ = 0;
  std::atomic<int64_t> cpu_ns_{0};
  std::atomic<uint64_t> ticks_{0};
  uint64_t last_[kMaxThreads][kMaxEvents] = {};
  uint64_t delta_[kMaxThreads][kMaxEvents] = {};
  uint32_t scaled_[kMaxThreads] = {};
  uint32_t counted_[kMaxThreads] = {};
};

}  // namespace cpuprof
