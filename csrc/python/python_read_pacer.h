// When the in-process Python sampler reads: a tick every period, but a read (which takes the GIL)
// only at the ticks where the op callers do not already say every thread's Python stack.
//
// Why: a read takes the GIL, and a decode's dispatching thread, back from an op, waits for it at
// every period (benches/README.md measures what that cost). Between op begins a few tens of
// microseconds apart, the Python that runs is the caller the op hook records at each begin
// (python_callers.h), which a read would only see again; a read is needed where a thread runs
// Python (or a long op) for longer than the window without beginning an op. The pacer waits out
// the covered ticks with the GIL released, asking python_callers_cover at each, and returns to the
// sampler for a read only at a tick not covered, or at a deadline the sampler sets (its drains of
// the callers, which also read every thread at least that often: threads that have run no op yet
// are read only then).
#pragma once

#include <atomic>
#include <cstdint>

namespace cpuprof {

struct PacedTick {
  int64_t tick_ns;  // the tick to read at (CLOCK_MONOTONIC)
  int64_t covered;  // ticks waited out since the call, covered by op callers
  bool stopping;    // stop() was called: no read
};

class PythonReadPacer {
 public:
  // `window_ns`: how recent an op begin covers a thread (the sampler gives the interpreter's switch
  // interval, or the period if shorter: no read lands in a shorter stretch of Python anyway, the
  // GIL being handed over at the next op call or at the interval); `min_cpu_share`: the share of its time a
  // thread must run for its Python to need reading; `fill_limit`: the op-caller ring fill at which
  // the sampler must drain.
  PythonReadPacer(int64_t period_ns, int64_t window_ns, double min_cpu_share, double fill_limit);

  // Sleeps to `tick_ns`, then from tick to tick while the op callers cover every thread, until a
  // tick they do not cover, `return_by_ns`, a caller ring past the fill limit, or stop(). Call with
  // the GIL released.
  PacedTick wait(int64_t tick_ns, int64_t return_by_ns);
  // Makes a waiter return within 50 ms, and every later wait at once.
  void stop();

 private:
  const int64_t period_ns_;
  const int64_t window_ns_;
  const double min_cpu_share_;
  const double fill_limit_;
  std::atomic<bool> stopping_{false};
};

// Test hook: while set, no tick is covered (a read at every tick, as before the pacer), the
// control of the pacer's tests and benches.
void inject_python_reads_every_tick(bool on);

}  // namespace cpuprof
