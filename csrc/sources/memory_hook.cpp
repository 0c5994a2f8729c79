// The reporter is a c10::MemoryReportingInfoBase pushed as the thread's PROFILER_STATE debug
// info: c10's CPU allocator asks `memoryProfilingEnabled()` on every allocation and, when true,
// reports (pointer, size) on allocation and (pointer, -size) on free. That is the one place torch
// reports allocator traffic; sharing it is what keeps our bytes equal to torch.profiler's.
#include "sources/memory_hook.h"

#include <c10/core/Allocator.h>
#include <c10/util/ThreadLocalDebugInfo.h>

#include <atomic>
#include <memory>
#include <thread>

#include "sources/op_source.h"

namespace cpuprof {

namespace {

std::atomic<bool> g_no_memory_reports{false};

class SessionMemoryReporter final : public c10::MemoryReportingInfoBase {
 public:
  bool memoryProfilingEnabled() const override {
    return Session::instance().running() && !g_no_memory_reports.load(std::memory_order_relaxed);
  }

  void reportMemoryUsage(void* /*ptr*/, int64_t alloc_size, size_t /*total_allocated*/,
                         size_t /*total_reserved*/, c10::Device device) override {
    if (!device.is_cpu()) return;
    Session& session = Session::instance();
    if (!session.enter()) return;
    Session::Guard guard{session};
    session.record_allocation(alloc_size);
  }
};

// The thread that installed the reporter, and the reporter itself: only that thread can pop it.
thread_local bool t_installed = false;

}  // namespace

void inject_no_memory_reports(bool off) { g_no_memory_reports.store(off); }

bool install_memory_hook() {
  if (t_installed) return true;
  if (c10::ThreadLocalDebugInfo::get(c10::DebugInfoKind::PROFILER_STATE) != nullptr) return false;
  c10::ThreadLocalDebugInfo::_push(c10::DebugInfoKind::PROFILER_STATE, std::make_shared<SessionMemoryReporter>());
  t_installed = true;
  return true;
}

void remove_memory_hook() {
  if (!t_installed) return;
  auto* top = c10::ThreadLocalDebugInfo::get(c10::DebugInfoKind::PROFILER_STATE);
  if (dynamic_cast<SessionMemoryReporter*>(top) == nullptr) return;
  try {
    c10::ThreadLocalDebugInfo::_pop(c10::DebugInfoKind::PROFILER_STATE);
    t_installed = false;
  } catch (...) {
    // Another debug info was pushed above ours (a torch.profiler started inside our session):
    // ours stays below it, inert until the next session.
  }
}

}  // namespace cpuprof
