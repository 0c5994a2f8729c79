// See python_read_pacer.h.
#include "python/python_read_pacer.h"

#include <time.h>

#include <algorithm>
#include <atomic>

#include "common/clock.h"
#include "python/python_callers.h"

namespace cpuprof {

namespace {

std::atomic<bool> g_every_tick{false};

// Sleeps to `until_ns` on CLOCK_MONOTONIC in slices of at most 50 ms; false, early, once `stopping`
// is set. A plain timed sleep: a condition variable's wake costs a lock besides.
bool sleep_until(int64_t until_ns, const std::atomic<bool>& stopping) {
  constexpr int64_t kStopCheckNs = 50'000'000;
  for (int64_t now = now_ns(); now < until_ns; now = now_ns()) {
    if (stopping.load(std::memory_order_acquire)) return false;
    const int64_t to = std::min(until_ns, now + kStopCheckNs);
    const timespec at{static_cast<time_t>(to / 1'000'000'000), static_cast<long>(to % 1'000'000'000)};
    clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &at, nullptr);
  }
  return !stopping.load(std::memory_order_acquire);
}

}  // namespace

void inject_python_reads_every_tick(bool on) { g_every_tick.store(on, std::memory_order_relaxed); }

PythonReadPacer::PythonReadPacer(int64_t period_ns, int64_t window_ns, double min_cpu_share, double fill_limit)
    : period_ns_(period_ns > 0 ? period_ns : 1), window_ns_(window_ns), min_cpu_share_(min_cpu_share),
      fill_limit_(fill_limit) {}

PacedTick PythonReadPacer::wait(int64_t tick_ns, int64_t return_by_ns) {
  PacedTick out{tick_ns, 0, false};
  for (;;) {
    if (!sleep_until(out.tick_ns, stopping_)) {
      out.stopping = true;
      return out;
    }
    const int64_t now = now_ns();
    if (now >= return_by_ns || g_every_tick.load(std::memory_order_relaxed) ||
        python_callers_fill() >= fill_limit_ || !python_callers_cover(now, window_ns_, min_cpu_share_)) {
      return out;
    }
    ++out.covered;
    out.tick_ns += period_ns_;
    if (out.tick_ns < now) out.tick_ns = now + period_ns_;  // held off its CPU: no burst of ticks after
  }
}

void PythonReadPacer::stop() { stopping_.store(true, std::memory_order_release); }

}  // namespace cpuprof
