// cpuprof's OMPT tool (see ompt_tool.h for what it measures and how to drive it).
//
// Every callback starts with one relaxed load of the control word and returns when recording is
// off. After a thread's first event the hot path takes no lock and allocates nothing: each
// thread writes only its own tables (single writer, so counters are plain relaxed load + store),
// and the reader only ever loads.
//
// The tool is two files around the tables they share (ompt_state.h): ompt_callbacks.cpp, the
// runtime's side (ompt_start_tool, the callbacks, which record), and this one, the profiler's
// side: the C API of ompt_tool.h that enables, resets and reads the tables, and the state that
// both sides share.
#include "ompt/ompt_tool.h"

#include <atomic>
#include <cstring>
#include <mutex>

#include "ompt/ompt_state.h"

namespace cpuprof {
namespace ompt {

// The state both sides share (ompt_state.h says what each is).
std::atomic<uint64_t> g_control{0};
std::atomic<uint32_t (*)(void)> g_current_op{nullptr};
std::atomic<ThreadState*> g_threads[kMaxThreads];
std::atomic<int> g_thread_count{0};
std::atomic<uint64_t> g_threads_beyond{0};
int g_initialized = 0;
unsigned g_omp_version = 0;
char g_runtime_version[256];
int g_callback_results[CPUPROF_OMPT_CALLBACK_COUNT];

namespace {

std::mutex g_control_mutex;  // writers of g_control only

const char* const kKindNames[CPUPROF_OMPT_KIND_COUNT] = {
    "barrier-implicit", "barrier-explicit", "barrier-reduction", "barrier-other", "taskwait",
    "taskgroup",        "lock",             "critical",          "ordered",       "atomic",
    "nest-lock",        "other-mutex",      "idle"};
const char* const kCallbackNames[CPUPROF_OMPT_CALLBACK_COUNT] = {
    "thread_begin",     "thread_end",    "parallel_begin", "parallel_end",  "implicit_task",
    "sync_region_wait", "mutex_acquire", "mutex_acquired", "mutex_released"};

}  // namespace
}  // namespace ompt
}  // namespace cpuprof

using namespace cpuprof::ompt;

CPUPROF_OMPT_EXPORT int cpuprof_ompt_abi(void) { return CPUPROF_OMPT_ABI; }

CPUPROF_OMPT_EXPORT void cpuprof_ompt_attach(uint32_t (*current_op)(void)) {
  g_current_op.store(current_op, std::memory_order_release);
}

CPUPROF_OMPT_EXPORT void cpuprof_ompt_enable(int on) {
  std::lock_guard<std::mutex> lock(g_control_mutex);
  uint64_t control = g_control.load(std::memory_order_relaxed);
  if (on && !(control & 1)) {
    uint64_t epoch = (epoch_of(control) + 1) & 0x7fffffffu;
    control = (control & ~uint64_t(0xffffffffu)) | (epoch << 1) | 1;
  } else if (!on) {
    control &= ~uint64_t(1);
  }
  g_control.store(control, std::memory_order_release);
}

CPUPROF_OMPT_EXPORT void cpuprof_ompt_reset(void) {
  std::lock_guard<std::mutex> lock(g_control_mutex);
  uint64_t control = g_control.load(std::memory_order_relaxed);
  uint32_t next = gen_of(control) + 1;
  if (next == kRenewing) next = 0;  // after 2^32 - 1 resets: the marker is never a generation
  uint64_t gen = next;
  // A new epoch too: waits open across the reset belong to the old tables.
  uint64_t epoch = (epoch_of(control) + 1) & 0x7fffffffu;
  g_control.store((gen << 32) | (epoch << 1) | (control & 1), std::memory_order_release);
}
namespace cpuprof {
namespace ompt {
namespace {

// Visits the threads whose tables belong to the current generation: `read(s)` reads a thread's
// tables, and `discard()` drops what that read took when the owner renewed the tables meanwhile
// (a reset between the reader's check and its read): the generation is read again after the
// tables, as a seqlock's reader does, so no reading ever mixes two generations.
template <class Read, class Discard>
void for_each_current(Read read, Discard discard) {
  uint32_t gen = gen_of(g_control.load(std::memory_order_acquire));
  int n = g_thread_count.load(std::memory_order_acquire);
  if (n > kMaxThreads) n = kMaxThreads;
  for (int i = 0; i < n; i++) {
    ThreadState* s = g_threads[i].load(std::memory_order_acquire);
    if (!s || __atomic_load_n(&s->gen, __ATOMIC_ACQUIRE) != gen) continue;
    read(s);  // with acquire loads only: none of them can move after the check below
    if (__atomic_load_n(&s->gen, __ATOMIC_RELAXED) != gen) discard();
  }
}

}  // namespace
}  // namespace ompt
}  // namespace cpuprof

CPUPROF_OMPT_EXPORT void cpuprof_ompt_get_status(struct cpuprof_ompt_status* out) {
  std::memset(out, 0, sizeof(*out));
  out->abi = CPUPROF_OMPT_ABI;
  out->initialized = g_initialized;
  out->enabled = int(g_control.load(std::memory_order_relaxed) & 1);
  out->omp_version = g_omp_version;
  std::memcpy(out->runtime_version, g_runtime_version, sizeof(out->runtime_version) - 1);
  std::memcpy(out->callbacks, g_callback_results, sizeof(out->callbacks));
  out->threads_beyond_limit = g_threads_beyond.load(std::memory_order_relaxed);
  uint64_t threads = 0, dropped = 0, uncut = 0;  // the sums before the thread being read
  for_each_current(
      [&](ThreadState* s) {
        threads = out->threads, dropped = out->records_dropped, uncut = out->waits_uncut;
        out->threads++;
        out->records_dropped += load_acquire(s->dropped);
        out->waits_uncut += load_acquire(s->uncut);
      },
      [&] { out->threads = threads, out->records_dropped = dropped, out->waits_uncut = uncut; });
}

CPUPROF_OMPT_EXPORT long cpuprof_ompt_read_waits(struct cpuprof_ompt_wait* out, long capacity) {
  long n = 0, n_before = 0;
  for_each_current([&](ThreadState* s) {
    n_before = n;
    for (const WaitSlot& slot : s->waits) {
      uint64_t key = __atomic_load_n(&slot.key, __ATOMIC_ACQUIRE);
      if (key == 0) continue;
      if (n < capacity) {
        cpuprof_ompt_wait& w = out[n];
        w.tid = s->tid;
        w.op = uint32_t(key >> 8);
        w.kind = int32_t(key & 0xff);
        w.reserved = 0;
        w.count = load_acquire(slot.count);
        w.wall_ns = load_acquire(slot.wall_ns);
        w.cpu_ns = load_acquire(slot.cpu_ns);
      }
      n++;
    }
  }, [&] { n = n_before; });
  return n;
}

CPUPROF_OMPT_EXPORT long cpuprof_ompt_read_work(struct cpuprof_ompt_work* out, long capacity) {
  long n = 0, n_before = 0;
  for_each_current([&](ThreadState* s) {
    n_before = n;
    for (const WorkSlot& slot : s->work) {
      uint64_t key = __atomic_load_n(&slot.key, __ATOMIC_ACQUIRE);
      if (key == 0) continue;
      if (n < capacity) {
        cpuprof_ompt_work& w = out[n];
        w.tid = s->tid;
        w.op = uint32_t(key);
        w.parallel_regions = load_acquire(slot.v[kRegions]);
        w.team_threads = load_acquire(slot.v[kTeamThreads]);
        w.parallel_ns = load_acquire(slot.v[kParallelNs]);
        w.implicit_tasks = load_acquire(slot.v[kTasks]);
        w.implicit_task_ns = load_acquire(slot.v[kTaskNs]);
        w.lock_acquisitions = load_acquire(slot.v[kLocks]);
      }
      n++;
    }
  }, [&] { n = n_before; });
  return n;
}

CPUPROF_OMPT_EXPORT const char* cpuprof_ompt_kind_name(int kind) {
  return kind >= 0 && kind < CPUPROF_OMPT_KIND_COUNT ? kKindNames[kind] : nullptr;
}

CPUPROF_OMPT_EXPORT const char* cpuprof_ompt_callback_name(int callback) {
  return callback >= 0 && callback < CPUPROF_OMPT_CALLBACK_COUNT ? kCallbackNames[callback] : nullptr;
}
