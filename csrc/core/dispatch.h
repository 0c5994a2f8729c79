// The op stack of one dispatching thread (a thread that runs ATen ops).
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>

#include "core/op_events.h"
#include "core/span_ring.h"
#include "common/limits.h"

namespace cpuprof {

struct Frame {
  uintptr_t id;   // the RecordFunction's address: ends are matched to begins by it
  bool done;      // ended out of order (asyncio, generators); popped once frames above it end
  uint32_t entry;
  uint32_t child_region;  // region in force for this op's children
  int64_t start_ns;
  int64_t child_ns;       // inclusive time of direct children
  int64_t hook_ns_at_start;
  int team_at_begin;      // exact mode: team members (in join order) read when the op began
};

// Owned by its thread on the op path; other threads read it only once `ready`, and then only
// its atomics and its span ring.
struct DispatchState {
  std::atomic<bool> ready{false};  // set (release) once tid and slot are written
  int index = 0;                   // in the session's pool: strategies keep per-state buffers by it
  pid_t tid = 0;
  int slot = -1;                   // registry slot of this thread
  int local_depth = 0;             // may exceed kMaxDepth; frames beyond it are not recorded
  int unprepared_depth = 0;        // ops open since a begin found the buffers unallocatable
  std::atomic<int64_t> hook_ns{0};
  Frame frames[kMaxDepth];
  SpanRing spans;  // sized when the session starts: allocation once per thread, not per op
  OpEventRing events;  // sampled mode: the op timeline, sized on the thread's first op
};

}  // namespace cpuprof
