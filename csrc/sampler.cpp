#include "sampler.h"

#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <chrono>

#include "session.h"

namespace cpuprof {

namespace {

constexpr int64_t kRescanNs = 20 * 1000 * 1000;  // how often to look for new threads

int64_t thread_cpu_ns() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
}

}  // namespace

Sampler::Sampler(Session& session) : session_(session) {}

Sampler::~Sampler() { stop(); }

void Sampler::start() {
  thread_ = std::thread([this] { run(); });
  std::unique_lock<std::mutex> lock(mutex_);
  wake_.wait(lock, [this] { return ready_; });
}

void Sampler::stop() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_requested_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void Sampler::run() {
  ThreadRegistry& registry = session_.mutable_registry();
  registry.set_excluded(static_cast<pid_t>(syscall(SYS_gettid)));
  registry.scan();
  last_scan_ns_ = now_ns();
  join_threads_that_ran();
  tick(false);  // baseline for telling which threads start working
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ready_ = true;
  }
  wake_.notify_all();
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stop_requested_) {
    wake_.wait_for(lock, std::chrono::microseconds(kIntervalUs), [this] { return stop_requested_; });
    const bool final_tick = stop_requested_;
    lock.unlock();
    tick(final_tick);
    cpu_ns_.store(thread_cpu_ns(), std::memory_order_relaxed);
    lock.lock();
  }
}

void Sampler::join_threads_that_ran() {
  const ThreadRegistry& registry = session_.registry();
  const int n_slots = registry.size();
  for (int slot = 0; slot < n_slots && slot < 64; ++slot) {
    if (registry.slot(slot).has_run) session_.join_team(slot);
  }
}

void Sampler::tick(bool final_tick) {
  ThreadRegistry& registry = session_.mutable_registry();
  const int64_t now = now_ns();
  if (!final_tick && now - last_scan_ns_ > kRescanNs) {
    registry.scan();
    last_scan_ns_ = now;
    join_threads_that_ran();
  }
  const int n_slots = registry.size();
  const int n_events = registry.n_events();
  const uint64_t team = session_.team_mask();
  uint64_t values[kMaxEvents];
  for (int slot = 0; slot < n_slots; ++slot) {
    if (!final_tick && slot < 64 && ((team >> slot) & 1ULL)) continue;
    uint32_t scaled = 0, counted = 0;
    registry.slot(slot).counters.read(values, &scaled, &counted);
    bool changed = false;
    for (int e = 0; e < n_events; ++e) {
      // A read that failed (thread gone, never ran) leaves the last value standing.
      if (!((counted >> e) & 1u)) continue;
      changed = changed || values[e] > last_[slot][e];
      last_[slot][e] = values[e];
    }
    scaled_[slot] |= scaled;
    counted_[slot] |= counted;
    if (changed && ticks_.load(std::memory_order_relaxed) > 0) session_.join_team(slot);
  }
  ticks_.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace cpuprof
