// What both sides of cpuprof's OMPT tool share (private to the tool): the per-thread tables the
// callbacks write (ompt_callbacks.cpp) and the C API reads (ompt_tool.cpp), the control word, and
// the single-writer loads and stores the two sides use on them.
#pragma once

#include <time.h>

#include <atomic>
#include <cstdint>

#include "ompt/ompt_tool.h"

#define CPUPROF_OMPT_EXPORT extern "C" __attribute__((visibility("default")))

namespace cpuprof {
namespace ompt {

constexpr int kMaxThreads = CPUPROF_OMPT_MAX_THREADS;
constexpr uint32_t kWaitSlots = CPUPROF_OMPT_WAIT_SLOTS;
constexpr uint32_t kWorkSlots = CPUPROF_OMPT_WORK_SLOTS;
static_assert((kWaitSlots & (kWaitSlots - 1)) == 0 && (kWorkSlots & (kWorkSlots - 1)) == 0,
              "table sizes are masks");
// Probing gives up here rather than scanning a nearly full table on every event.
constexpr uint32_t kMaxProbes = 64;
// Regions a primary can fork before a record is reused: a worker looks its region up again only
// when it is next forked, and the seq check catches a record reused in between.
constexpr int kRegionRing = 64;
// Nested implicit tasks tracked per thread; a deeper one (or a pile of tasks whose end came while
// recording was off) starts the stack over.
constexpr int kMaxFrames = 16;
// Waits open at once on one thread (a taskwait in a task run while waiting at a barrier).
constexpr int kMaxOpenWaits = 4;

// Single-writer counters: the owner thread loads and stores, the reader only loads.
template <class T>
inline T load(const T& x) {
  return __atomic_load_n(&x, __ATOMIC_RELAXED);
}
template <class T>
inline void store(T& x, T v) {
  __atomic_store_n(&x, v, __ATOMIC_RELAXED);
}
inline void bump(uint64_t& x, uint64_t v) { store(x, load(x) + v); }
// The reader's loads of another thread's tables and the owner's clearing stores: ordered
// against the thread's `gen`, so a read that overlaps a clearing is seen to (for_each_current).
template <class T>
inline T load_acquire(const T& x) {
  return __atomic_load_n(&x, __ATOMIC_ACQUIRE);
}
inline void clear_release(uint64_t& x) { __atomic_store_n(&x, uint64_t(0), __ATOMIC_RELEASE); }

inline uint64_t wall_now() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1000000000ull + uint64_t(ts.tv_nsec);
}
inline uint64_t cpu_now() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return uint64_t(ts.tv_sec) * 1000000000ull + uint64_t(ts.tv_nsec);
}

struct WaitSlot {
  uint64_t key;  // op << 8 | kind; 0 = empty (op 0 is never recorded)
  uint64_t count, wall_ns, cpu_ns;
};

enum WorkField { kRegions, kTeamThreads, kParallelNs, kTasks, kTaskNs, kLocks, kWorkFields };
struct WorkSlot {
  uint64_t key;  // op
  uint64_t v[kWorkFields];
};

// A parallel region, owned by the thread that forked it and shared with its team through
// parallel_data; records are never freed, so a stale pointer still reads harmlessly.
struct Region {
  uint64_t seq;      // which fork this record describes now
  uint64_t join_ns;  // when the primary left the region, i.e. its join barrier completed; 0: not yet
  uint64_t begin_ns;
  uint32_t op;
  uint32_t epoch;
};

struct Frame {  // an implicit task this thread runs
  uint64_t id;  // also kept in the task's task_data, to pair the end with this begin
  Region* region;
  uint64_t seq;
  uint64_t begin_ns;
  uint64_t end_ns;  // set when the barrier's end was cut from the idle time after it
  uint32_t op;
  uint32_t epoch;
  bool primary;
};

struct OpenWait {
  uint64_t wall0, cpu0;
  uint64_t frame_id;  // the task it waits in (0: none)
  uint32_t op;
  uint32_t epoch;
  int kind;
  int raw;  // the runtime's own kind, to pair the end with the begin
};

struct alignas(64) ThreadState {
  int32_t tid;
  uint32_t gen;  // the reset generation the tables belong to (release-stored after clearing)
  uint64_t dropped;
  uint64_t uncut;
  // Owner-only from here on.
  uint64_t next_frame_id;
  uint64_t next_seq;
  int depth;
  int open_waits;
  bool mutex_open;
  OpenWait mutex;
  OpenWait waits_open[kMaxOpenWaits];
  Frame frames[kMaxFrames];
  Region ring[kRegionRing];
  WorkSlot work[kWorkSlots];
  WaitSlot waits[kWaitSlots];
};

// enabled (bit 0) | epoch (bits 1-31) | reset generation (bits 32-63): one load tells a callback
// whether to record, whether its thread's tables are stale, and whether an open wait still counts.
extern std::atomic<uint64_t> g_control;
// The rest of the state the two sides share (all of it defined in ompt_tool.cpp).
extern std::atomic<uint32_t (*)(void)> g_current_op;
extern std::atomic<ThreadState*> g_threads[kMaxThreads];
extern std::atomic<int> g_thread_count;
extern std::atomic<uint64_t> g_threads_beyond;
extern int g_initialized;
extern unsigned g_omp_version;
extern char g_runtime_version[256];
extern int g_callback_results[CPUPROF_OMPT_CALLBACK_COUNT];

inline uint32_t gen_of(uint64_t control) { return uint32_t(control >> 32); }
inline uint32_t epoch_of(uint64_t control) { return uint32_t(control >> 1) & 0x7fffffffu; }

// A thread's `gen` while its owner clears its tables: never a generation a reset hands out.
constexpr uint32_t kRenewing = 0xffffffffu;

}  // namespace ompt
}  // namespace cpuprof
