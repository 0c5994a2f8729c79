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

Sampler::Sampler(Session& session, int interval_us, bool attribute)
    : session_(session), interval_us_(interval_us > 50 ? interval_us : 50), attribute_(attribute) {}

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
  tick(false);  // baseline: the first deltas start here
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ready_ = true;
  }
  wake_.notify_all();
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stop_requested_) {
    wake_.wait_for(lock, std::chrono::microseconds(interval_us_), [this] { return stop_requested_; });
    const bool final_tick = stop_requested_;
    lock.unlock();
    tick(final_tick);
    cpu_ns_.store(thread_cpu_ns(), std::memory_order_relaxed);
    lock.lock();
  }
}

void Sampler::tick(bool final_tick) {
  ThreadRegistry& registry = session_.mutable_registry();
  const int64_t now = now_ns();
  if (!final_tick && now - last_scan_ns_ > kRescanNs) {
    registry.scan();
    last_scan_ns_ = now;
  }
  const int n_slots = registry.size();
  const int n_events = registry.n_events();
  uint64_t values[kMaxEvents];
  for (int slot = 0; slot < n_slots; ++slot) {
    uint32_t scaled = 0, counted = 0;
    registry.slot(slot).counters.read(values, &scaled, &counted);
    for (int e = 0; e < n_events; ++e) {
      // A read that failed (thread gone, never ran) leaves the last value standing.
      const uint64_t value = (counted >> e) & 1u ? values[e] : last_[slot][e];
      delta_[slot][e] = value > last_[slot][e] ? value - last_[slot][e] : 0;
      last_[slot][e] = value;
    }
    scaled_[slot] |= scaled;
    counted_[slot] |= counted;
    if (ticks_.load(std::memory_order_relaxed) > 0 && !(session_.team_mask() >> slot & 1ULL)) {
      for (int e = 0; e < n_events; ++e) {
        if (delta_[slot][e] != 0) {
          session_.join_team(slot);
          break;
        }
      }
    }
  }
  if (attribute_ && ticks_.load(std::memory_order_relaxed) > 0) attribute(n_slots);
  ticks_.fetch_add(1, std::memory_order_relaxed);
}

void Sampler::attribute(int n_slots) {
  OpTable& table = session_.mutable_table();
  const int n_events = table.n_events();
  const int table_slots = table.n_thread_slots();
  // Which op each dispatching thread is in, read from what the op path published.
  struct Active {
    int slot;
    int depth;
    uint32_t stack[kMaxDepth];
  };
  Active active[kMaxDispatchThreads];
  int n_active = 0;
  int newest = -1;
  int64_t newest_ns = 0;
  const int n_states = session_.dispatch_threads() < kMaxDispatchThreads ? session_.dispatch_threads()
                                                                          : kMaxDispatchThreads;
  for (int i = 0; i < n_states; ++i) {
    DispatchState* state = session_.pool_state(i);
    if (!state->ready.load(std::memory_order_acquire)) continue;
    const int depth = state->depth.load(std::memory_order_acquire);
    if (depth <= 0) continue;
    Active& a = active[n_active];
    a.slot = state->slot;
    a.depth = depth < kMaxDepth ? depth : kMaxDepth;
    for (int d = 0; d < a.depth; ++d) a.stack[d] = state->stack[d].load(std::memory_order_relaxed);
    const int64_t begun = state->last_begin_ns.load(std::memory_order_relaxed);
    if (newest < 0 || begun > newest_ns) {
      newest = n_active;
      newest_ns = begun;
    }
    ++n_active;
  }
  // How many ticks caught each op: the weight behind its statistical counts.
  if (n_active == 0) table.entry(kOutsideEntry).samples.fetch_add(1, std::memory_order_relaxed);
  for (int i = 0; i < n_active; ++i) {
    table.entry(active[i].stack[active[i].depth - 1]).samples.fetch_add(1, std::memory_order_relaxed);
  }
  for (int slot = 0; slot < n_slots && slot < table_slots; ++slot) {
    const Active* owner = nullptr;
    for (int i = 0; i < n_active; ++i) {
      if (active[i].slot == slot) owner = &active[i];
    }
    // Only threads that do not run ops themselves (OpenMP workers) serve another thread's op; a
    // dispatching thread between ops is running Python or waiting, and that is "outside".
    if (owner == nullptr && newest >= 0 && !((session_.dispatch_mask() >> slot) & 1ULL)) owner = &active[newest];
    for (int e = 0; e < n_events; ++e) {
      const uint64_t delta = delta_[slot][e];
      if (delta == 0) continue;
      if (owner == nullptr) {
        table.counter(kOutsideEntry, slot, e, false).fetch_add(delta, std::memory_order_relaxed);
        table.counter(kOutsideEntry, slot, e, true).fetch_add(delta, std::memory_order_relaxed);
        continue;
      }
      table.counter(owner->stack[owner->depth - 1], slot, e, true).fetch_add(delta, std::memory_order_relaxed);
      for (int d = 0; d < owner->depth; ++d) {
        bool seen = false;  // an entry on the stack twice (recursion) is charged once inclusively
        for (int k = 0; k < d && !seen; ++k) seen = owner->stack[k] == owner->stack[d];
        if (!seen) table.counter(owner->stack[d], slot, e, false).fetch_add(delta, std::memory_order_relaxed);
      }
    }
  }
}

}  // namespace cpuprof
