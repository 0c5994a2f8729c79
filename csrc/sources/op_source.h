// What every op source does first: enter the session, find the calling thread's op stack.
//
// Sources (the RecordFunction hook, user regions, and later the OMPT tool) call into the session
// from arbitrary threads at arbitrary times, including while it starts or stops. The session's
// enter/leave pair keeps stop() from tearing anything down under a callback; this helper is the
// one place that pairs them, so no source can forget the leave on some path.
#pragma once

#include <cstdint>

#include "common/clock.h"
#include "core/session.h"

namespace cpuprof {

// Runs `body(session, state, enter_ns)` when a session runs and the calling thread has an op
// stack; `enter_ns` is taken first, so the source's own work counts as profiler overhead. An op
// that begins on a thread beyond the op stacks is counted (once, at its begin).
enum class Boundary { Begin, End };
template <typename Body>
inline void with_op_stack(Boundary boundary, Body&& body) {
  Session& session = Session::instance();
  if (!session.enter()) return;
  Session::Guard guard{session};
  const int64_t enter_ns = now_ns();
  if (const int64_t spin = g_injected_hook_spin_ns.load(std::memory_order_relaxed); spin > 0) {
    while (now_ns() < enter_ns + spin) {
    }
  }
  DispatchState* state = session.dispatch_state(boundary == Boundary::Begin);
  if (state == nullptr) {
    if (boundary == Boundary::Begin) session.count_unattributed();
    return;
  }
  body(session, *state, enter_ns);
}

}  // namespace cpuprof
