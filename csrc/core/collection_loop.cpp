#include "core/collection_loop.h"

#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>

#include "common/clock.h"
#include "common/limits.h"

namespace cpuprof {

namespace {
std::atomic<int64_t> g_collect_delay_us{0};
std::atomic<int64_t> g_collect_spin_us{0};
std::atomic<int64_t> g_collect_interval_us{0};
}  // namespace

void inject_collect_interval_us(int64_t interval_us) {
  g_collect_interval_us.store(std::clamp<int64_t>(interval_us, 0, kMaxInjectedCollectIntervalUs));
}

int64_t collect_interval_us() {
  const int64_t injected = g_collect_interval_us.load(std::memory_order_relaxed);
  return injected > 0 ? injected : kCollectIntervalUs;
}

void inject_collect_delay_us(int64_t delay_us) { g_collect_delay_us.store(delay_us); }
void inject_collect_spin_us(int64_t spin_us) { g_collect_spin_us.store(spin_us > 0 ? spin_us : 0); }

CollectionLoop::CollectionLoop(ThreadRegistry& registry, TeamSet& team, OpTable& table,
                               Collect collect)
    : registry_(registry), team_(team), table_(table), collect_(std::move(collect)), interval_us_(collect_interval_us()) {}

CollectionLoop::~CollectionLoop() { stop(); }

void CollectionLoop::start() {
  thread_ = std::thread([this] { run(); });
  std::unique_lock<std::mutex> lock(mutex_);
  wake_.wait(lock, [this] { return ready_; });
}

void CollectionLoop::stop() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_requested_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void CollectionLoop::scan() {
  scans_.fetch_add(1, std::memory_order_relaxed);
  // Threads created while this walk opens counters (by a thread whose ring is not open yet) are
  // neither listed nor told by a fork record: a walk that added threads is followed by another.
  size_at_scan_ = registry_.size();
  registry_.scan(tid_);
  const int n = registry_.size();
  table_.reserve_slots(n);
  for (int slot = 0; slot < n; ++slot) {
    if (registry_.slot(slot).has_run && table_.slot_ready(slot)) team_.join(slot);
  }
  last_scan_ns_ = now_ns();
}

void CollectionLoop::run() {
  tid_ = static_cast<pid_t>(syscall(SYS_gettid));
  // Named, so top, perf and py-spy users can tell cpuprof's own thread from the program's.
  pthread_setname_np(pthread_self(), "cpuprof-collect");
  scan();
  tick(false);  // baseline for telling which threads start working
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ready_ = true;
  }
  wake_.notify_all();
  std::unique_lock<std::mutex> lock(mutex_);
  // The loop ends only after a final tick: a stop requested while a tick runs (long with hundreds
  // of threads) must still get the final read, or every thread's totals stop at its last tick.
  for (bool final_tick = false; !final_tick;) {
    wake_.wait_for(lock, std::chrono::microseconds(interval_us_), [this] { return stop_requested_; });
    final_tick = stop_requested_;
    lock.unlock();
    const int64_t delay_us = g_collect_delay_us.load(std::memory_order_relaxed);
    if (delay_us > 0 && !final_tick) std::this_thread::sleep_for(std::chrono::microseconds(delay_us));
    const int64_t spin_us = g_collect_spin_us.load(std::memory_order_relaxed);
    if (spin_us > 0 && !final_tick) {
      for (const int64_t until = thread_cpu_ns() + spin_us * 1000; thread_cpu_ns() < until;) {
      }
    }
    tick(final_tick);
    if (collect_) {
      last_creation_ = collect_(now_ns(), final_tick);
      // Found now rather than a period later: a thread's work before it is found is counted nowhere.
      if (last_creation_ == ThreadCreation::Seen && !final_tick) scan();
    }
    cpu_ns_.store(thread_cpu_ns(), std::memory_order_relaxed);
    lock.lock();
  }
}

void CollectionLoop::tick(bool final_tick) {
  const int64_t now = now_ns();
  const bool due = now - last_read_ns_ > static_cast<int64_t>(kDiscoveryIntervalUs) * 1000;
  if (!final_tick && !due) return;  // a collector period without discovery
  last_read_ns_ = now;
  // Where the rings tell thread creation, a walk only when they told one (done already, after the
  // pass's collect), when threads were added since the last walk began (by it, or by a first op),
  // or at the fallback interval.
  const bool told = last_creation_ != ThreadCreation::Unknown;
  const bool added = registry_.size() != size_at_scan_;
  const bool fallback = now - last_scan_ns_ > static_cast<int64_t>(kDiscoveryFallbackUs) * 1000;
  if (!final_tick && (!told || added || fallback)) scan();
  const int n_slots = registry_.size();
  const int n_events = registry_.n_events();
  uint64_t values[kMaxEvents];
  for (int slot = 0; slot < n_slots; ++slot) {
    if (!final_tick && team_.contains(slot)) continue;
    ThreadSlot& s = registry_.mutable_slot(slot);
    // A thread found idle at its last read that has had no record written since (no switch in, no
    // sample) has not run: its counters are as they were, and their read(), most of a pass beside a
    // serving engine's hundreds of idle backends, is skipped. The final tick reads every thread.
    uint64_t activity = 0;
    const bool activity_known = !final_tick && s.counters.activity_position(&activity);
    if (activity_known && s.quiet_at_read && activity == s.activity_at_read) {
      reads_skipped_.fetch_add(1, std::memory_order_relaxed);
      continue;
    }
    uint32_t scaled = 0, counted = 0;
    s.counters.read(values, &scaled, &counted);
    bool changed = false;
    for (int e = 0; e < n_events; ++e) {
      // A read that failed (thread gone, never ran) leaves the last value standing.
      if (!((counted >> e) & 1u)) continue;
      changed = changed || values[e] > s.last_values[e];
      s.last_values[e] = values[e];
    }
    s.last_scaled |= scaled;
    s.last_counted |= counted;
    s.quiet_at_read = activity_known && !changed;
    s.activity_at_read = activity;
    if (final_tick) s.sched_at_stop = read_schedstat(s.tid);
    if (changed && ticks_.load(std::memory_order_relaxed) > 0 && table_.slot_ready(slot)) team_.join(slot);
  }
  ticks_.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace cpuprof
