// The runtime's side of cpuprof's OMPT tool (see ompt_tool.h for what it measures): the entry
// point the OpenMP runtime calls (ompt_start_tool), the registration of the callbacks, and the
// callbacks themselves, which record each thread's regions and waits into its own tables. Apart
// from ompt_tool.cpp, the profiler's side (enable, reset, read), because all of this runs on the
// OpenMP threads, inside the runtime's own calls, where the hot path must take no lock and
// allocate nothing; the tables both sides use are in ompt_state.h.
#include <omp-tools.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>

#include "ompt/ompt_state.h"

namespace cpuprof {
namespace ompt {
namespace {

thread_local ThreadState* t_state = nullptr;
char g_no_state;  // t_state points here for threads that got no table

std::atomic<int> g_started{0};

inline ThreadState* no_state() { return reinterpret_cast<ThreadState*>(&g_no_state); }

// The tables start out zero, so a thread whose generation is current needs no clearing.
ThreadState* adopt() {
  int index = g_thread_count.fetch_add(1, std::memory_order_relaxed);
  void* memory = nullptr;
  if (index >= kMaxThreads || posix_memalign(&memory, 64, sizeof(ThreadState)) != 0) {
    g_threads_beyond.fetch_add(1, std::memory_order_relaxed);
    t_state = no_state();
    return t_state;
  }
  auto* state = static_cast<ThreadState*>(memory);
  std::memset(static_cast<void*>(state), 0, sizeof(ThreadState));
  state->tid = int32_t(syscall(SYS_gettid));
  state->next_frame_id = 1;
  __atomic_store_n(&state->gen, gen_of(g_control.load(std::memory_order_relaxed)), __ATOMIC_RELAXED);
  g_threads[index].store(state, std::memory_order_release);
  t_state = state;
  return state;
}

// The owner clears its own tables after a reset, so no thread ever writes another's. A reader may
// be reading these tables meanwhile (one that took the generation before the reset), so the
// zeros go through the same atomic stores the counters use, never a memset, and `gen` says
// "renewing" throughout: the reader checks it after reading and discards what it read then
// (a seqlock; see still_current()).
void renew(ThreadState* s, uint32_t gen) {
  // Release stores: a reader that sees any zero of this clearing also sees the marker before it.
  __atomic_store_n(&s->gen, kRenewing, __ATOMIC_RELAXED);
  for (WorkSlot& slot : s->work) {
    clear_release(slot.key);
    for (uint64_t& v : slot.v) clear_release(v);
  }
  for (WaitSlot& slot : s->waits) {
    clear_release(slot.key);
    clear_release(slot.count);
    clear_release(slot.wall_ns);
    clear_release(slot.cpu_ns);
  }
  clear_release(s->dropped);
  clear_release(s->uncut);
  s->open_waits = 0;
  s->mutex_open = false;
  __atomic_store_n(&s->gen, gen, __ATOMIC_RELEASE);
}

// The calling thread's state when recording, else null.
inline ThreadState* enter(uint32_t* epoch) {
  uint64_t control = g_control.load(std::memory_order_relaxed);
  if (!(control & 1)) return nullptr;
  ThreadState* s = t_state;
  if (__builtin_expect(s == nullptr, 0)) s = adopt();
  if (s == no_state()) return nullptr;
  if (__builtin_expect(__atomic_load_n(&s->gen, __ATOMIC_RELAXED) != gen_of(control), 0))
    renew(s, gen_of(control));
  *epoch = epoch_of(control);
  return s;
}

inline uint32_t current_op_or_outside() {
  auto fn = g_current_op.load(std::memory_order_acquire);
  uint32_t op = fn ? fn() : 0;
  return op ? op : CPUPROF_OMPT_OUTSIDE_OP;
}

inline uint32_t slot_hash(uint64_t key, uint32_t mask) {
  return uint32_t((key * 0x9E3779B97F4A7C15ull) >> 40) & mask;
}

template <class Slot>
Slot* find_slot(ThreadState* s, Slot* table, uint32_t size, uint64_t key) {
  uint32_t mask = size - 1, h = slot_hash(key, mask);
  for (uint32_t i = 0; i < kMaxProbes; i++) {
    Slot& slot = table[(h + i) & mask];
    uint64_t k = load(slot.key);
    if (k == key) return &slot;
    if (k == 0) {
      // Published before its counters move; a reader may see it with zeros, never torn.
      __atomic_store_n(&slot.key, key, __ATOMIC_RELEASE);
      return &slot;
    }
  }
  bump(s->dropped, 1);
  return nullptr;
}

void record_wait(ThreadState* s, uint32_t op, int kind, uint64_t wall, uint64_t cpu) {
  if (op == 0) return;  // a region that began before recording did: its op is unknown
  WaitSlot* w = find_slot(s, s->waits, kWaitSlots, (uint64_t(op) << 8) | uint64_t(kind));
  if (!w) return;
  bump(w->count, 1);
  bump(w->wall_ns, wall);
  bump(w->cpu_ns, cpu < wall ? cpu : wall);
}

void record_work(ThreadState* s, uint32_t op, WorkField field, uint64_t value) {
  if (op == 0) return;
  WorkSlot* w = find_slot(s, s->work, kWorkSlots, op);
  if (w) bump(w->v[field], value);
}

inline Frame* top_frame(ThreadState* s) {
  return s->depth > 0 && s->depth <= kMaxFrames ? &s->frames[s->depth - 1] : nullptr;
}

inline Frame* find_frame(ThreadState* s, uint64_t id) {
  int n = s->depth < kMaxFrames ? s->depth : kMaxFrames;
  for (int i = n - 1; i >= 0; i--)
    if (s->frames[i].id == id) return &s->frames[i];
  return nullptr;
}

// The op a wait is charged to: its region's (0 when the region began before recording did, and
// then it is not recorded), or outside any region the thread's own.
inline uint32_t wait_op(ThreadState* s) {
  Frame* f = top_frame(s);
  return f ? f->op : current_op_or_outside();
}

int wait_kind(ompt_sync_region_t kind) {
  switch (int(kind)) {
    case 2:  // ompt_sync_region_barrier_implicit (deprecated in 5.1, still sent by older runtimes)
    case ompt_sync_region_barrier_implicit_workshare:
    case ompt_sync_region_barrier_implicit_parallel:
      return CPUPROF_OMPT_BARRIER_IMPLICIT;
    case ompt_sync_region_barrier_explicit:
      return CPUPROF_OMPT_BARRIER_EXPLICIT;
    case ompt_sync_region_reduction:
      return CPUPROF_OMPT_BARRIER_REDUCTION;
    case ompt_sync_region_taskwait:
      return CPUPROF_OMPT_TASKWAIT;
    case ompt_sync_region_taskgroup:
      return CPUPROF_OMPT_TASKGROUP;
    default:
      return CPUPROF_OMPT_BARRIER_OTHER;
  }
}

inline bool is_join_barrier(int raw) { return raw == 2 || raw == ompt_sync_region_barrier_implicit_parallel; }

int mutex_kind(ompt_mutex_t kind) {
  switch (kind) {
    case ompt_mutex_lock:
    case ompt_mutex_test_lock:
      return CPUPROF_OMPT_LOCK;
    case ompt_mutex_nest_lock:
    case ompt_mutex_test_nest_lock:
      return CPUPROF_OMPT_NEST_LOCK;
    case ompt_mutex_critical:
      return CPUPROF_OMPT_CRITICAL;
    case ompt_mutex_atomic:
      return CPUPROF_OMPT_ATOMIC;
    case ompt_mutex_ordered:
      return CPUPROF_OMPT_ORDERED;
    default:
      return CPUPROF_OMPT_OTHER_MUTEX;
  }
}

// parallel_data carries the region to the team: a Region* (aligned, low bit 0), or, when the
// forking thread has no table to keep the record in, the op itself as op << 1 | 1.
inline void decode_region(const ompt_data_t* data, Region** region, uint32_t* op) {
  uint64_t value = data ? data->value : 0;
  if (value & 1) {
    *region = nullptr;
    *op = uint32_t(value >> 1);
  } else {
    *region = reinterpret_cast<Region*>(data ? data->ptr : nullptr);
    *op = *region ? load((*region)->op) : 0;
  }
}

// Callbacks.

void on_thread_begin(ompt_thread_t, ompt_data_t*) {
  // The thread's one allocation, made here even while recording is off so that no wait or
  // region ever pays for it; threads that began before the tool are adopted at their first event.
  if (!t_state) adopt();
}

void on_thread_end(ompt_data_t*) {}

void on_parallel_begin(ompt_data_t*, const ompt_frame_t*, ompt_data_t* parallel_data, unsigned, int,
                       const void*) {
  if (!(g_control.load(std::memory_order_relaxed) & 1)) return;
  uint32_t epoch;
  ThreadState* s = enter(&epoch);
  // The encountering thread is inside the op that forks the region; its team is not.
  uint32_t op = current_op_or_outside();
  if (!s) {
    parallel_data->value = (uint64_t(op) << 1) | 1;
    return;
  }
  uint64_t seq = ++s->next_seq;
  Region* r = &s->ring[seq % kRegionRing];
  __atomic_store_n(&r->join_ns, uint64_t(0), __ATOMIC_RELAXED);
  store(r->op, op);
  store(r->epoch, epoch);
  store(r->begin_ns, wall_now());
  __atomic_store_n(&r->seq, seq, __ATOMIC_RELEASE);
  parallel_data->ptr = r;
}

void on_parallel_end(ompt_data_t* parallel_data, ompt_data_t*, int, const void*) {
  uint32_t epoch;
  ThreadState* s = enter(&epoch);
  if (!s) return;
  Region* r;
  uint32_t op;
  decode_region(parallel_data, &r, &op);
  if (r && r >= s->ring && r < s->ring + kRegionRing && r->epoch == epoch)
    record_work(s, op, kParallelNs, wall_now() - r->begin_ns);
}

void on_implicit_task(ompt_scope_endpoint_t endpoint, ompt_data_t* parallel_data, ompt_data_t* task_data,
                      unsigned actual_parallelism, unsigned index, int flags) {
  if (flags & ompt_task_initial) return;  // spans the thread's life, not a region
  uint32_t epoch;
  ThreadState* s = enter(&epoch);
  if (!s) return;
  if (endpoint == ompt_scope_begin) {
    uint64_t now = wall_now();
    if (s->depth >= kMaxFrames) {
      // Frames whose end never came (recording was off then) would otherwise pile up.
      s->depth = 0;
    }
    Frame& f = s->frames[s->depth++];
    f.id = s->next_frame_id++;
    decode_region(parallel_data, &f.region, &f.op);
    f.seq = f.region ? __atomic_load_n(&f.region->seq, __ATOMIC_ACQUIRE) : 0;
    f.begin_ns = now;
    f.end_ns = 0;
    f.epoch = epoch;
    f.primary = index == 0;
    task_data->value = f.id;
    record_work(s, f.op, kTasks, 1);
    if (f.primary && f.region && load(f.region->epoch) == epoch) {
      record_work(s, f.op, kRegions, 1);
      record_work(s, f.op, kTeamThreads, actual_parallelism);
    }
    return;
  }
  Frame* f = find_frame(s, task_data->value);
  if (!f) return;
  uint64_t now = wall_now();
  if (f->primary && f->region && load(f->region->seq) == f->seq && load(f->region->join_ns) == 0) {
    // Runtimes that name the closing barrier only "implicit" (not "implicit_parallel") get it
    // marked here, a callback later than its wait's end.
    __atomic_store_n(&f->region->join_ns, now, __ATOMIC_RELEASE);
  }
  uint64_t end = f->end_ns ? f->end_ns : now;
  if (f->epoch == epoch && end > f->begin_ns) record_work(s, f->op, kTaskNs, end - f->begin_ns);
  s->depth = int(f - s->frames);
}

void on_sync_region_wait(ompt_sync_region_t kind, ompt_scope_endpoint_t endpoint, ompt_data_t*, ompt_data_t*,
                         const void*) {
  uint32_t epoch;
  ThreadState* s = enter(&epoch);
  if (!s) return;
  if (endpoint == ompt_scope_begin) {
    // Waits whose end was missed while recording was off can never close: the newest open wait
    // is the youngest, so if it is from an old epoch, all are.
    if (s->open_waits > 0 && s->waits_open[s->open_waits - 1].epoch != epoch) s->open_waits = 0;
    if (s->open_waits >= kMaxOpenWaits) return;
    OpenWait& w = s->waits_open[s->open_waits++];
    Frame* f = top_frame(s);
    w.kind = wait_kind(kind);
    w.raw = int(kind);
    w.op = wait_op(s);
    w.frame_id = f ? f->id : 0;
    w.epoch = epoch;
    // Wall first, CPU second here and the reverse at the end: the CPU interval lies inside the
    // wall interval, so cpu <= wall up to the clocks' own resolution.
    w.wall0 = wall_now();
    w.cpu0 = cpu_now();
    return;
  }
  int open = s->open_waits - 1;
  while (open >= 0 && s->waits_open[open].raw != int(kind)) open--;
  if (open < 0) return;
  OpenWait w = s->waits_open[open];
  s->open_waits = open;
  if (w.epoch != epoch) return;
  uint64_t cpu1 = cpu_now();
  uint64_t wall1 = wall_now();
  uint64_t wall = wall1 - w.wall0, cpu = cpu1 - w.cpu0;
  Frame* f = w.frame_id ? find_frame(s, w.frame_id) : nullptr;
  if (f && f->primary && f->region && w.raw == ompt_sync_region_barrier_implicit_parallel &&
      load(f->region->seq) == f->seq) {
    // The primary leaves the closing barrier once the whole team has arrived: from here on the
    // workers wait for nothing but their next region.
    __atomic_store_n(&f->region->join_ns, wall1, __ATOMIC_RELEASE);
  }
  if (f && !f->primary && f->region && is_join_barrier(w.raw)) {
    uint64_t join = __atomic_load_n(&f->region->join_ns, __ATOMIC_ACQUIRE);
    uint64_t seq = __atomic_load_n(&f->region->seq, __ATOMIC_ACQUIRE);
    if (seq == f->seq && join != 0 && join < wall1) {
      uint64_t cut = join > w.wall0 ? join : w.wall0;
      uint64_t barrier_wall = cut - w.wall0;
      // The runtime spins first and sleeps after KMP_BLOCKTIME, so the CPU time is the barrier's
      // first and the idle part gets what is left.
      uint64_t barrier_cpu = cpu < barrier_wall ? cpu : barrier_wall;
      record_wait(s, w.op, CPUPROF_OMPT_BARRIER_IMPLICIT, barrier_wall, barrier_cpu);
      record_wait(s, CPUPROF_OMPT_OUTSIDE_OP, CPUPROF_OMPT_IDLE, wall1 - cut, cpu - barrier_cpu);
      f->end_ns = cut;
      return;
    }
    if (w.raw == ompt_sync_region_barrier_implicit_parallel) bump(s->uncut, 1);
  }
  record_wait(s, w.op, w.kind, wall, cpu);
}

void on_mutex_acquire(ompt_mutex_t kind, unsigned, unsigned, ompt_wait_id_t, const void*) {
  uint32_t epoch;
  ThreadState* s = enter(&epoch);
  if (!s) return;
  OpenWait& w = s->mutex;
  w.kind = mutex_kind(kind);
  w.raw = int(kind);
  w.op = wait_op(s);
  w.epoch = epoch;
  w.wall0 = wall_now();
  w.cpu0 = cpu_now();
  s->mutex_open = true;
}

void on_mutex_acquired(ompt_mutex_t kind, ompt_wait_id_t, const void*) {
  uint32_t epoch;
  ThreadState* s = enter(&epoch);
  if (!s || !s->mutex_open) return;
  s->mutex_open = false;
  const OpenWait& w = s->mutex;
  if (w.epoch != epoch || w.raw != int(kind)) return;
  uint64_t cpu1 = cpu_now();
  uint64_t wall1 = wall_now();
  record_wait(s, w.op, w.kind, wall1 - w.wall0, cpu1 - w.cpu0);
  if (w.kind != CPUPROF_OMPT_ATOMIC) record_work(s, w.op, kLocks, 1);
}

// Registered so the status shows whether the runtime reports releases; hold times are not kept.
void on_mutex_released(ompt_mutex_t, ompt_wait_id_t, const void*) {}

int initialize(ompt_function_lookup_t lookup, int, ompt_data_t*) {
  auto set_callback = reinterpret_cast<ompt_set_callback_t>(lookup("ompt_set_callback"));
  if (!set_callback) return 0;
  struct {
    int index;
    ompt_callbacks_t event;
    ompt_callback_t fn;
  } const wanted[] = {
      {CPUPROF_OMPT_CB_THREAD_BEGIN, ompt_callback_thread_begin, reinterpret_cast<ompt_callback_t>(&on_thread_begin)},
      {CPUPROF_OMPT_CB_THREAD_END, ompt_callback_thread_end, reinterpret_cast<ompt_callback_t>(&on_thread_end)},
      {CPUPROF_OMPT_CB_PARALLEL_BEGIN, ompt_callback_parallel_begin,
       reinterpret_cast<ompt_callback_t>(&on_parallel_begin)},
      {CPUPROF_OMPT_CB_PARALLEL_END, ompt_callback_parallel_end, reinterpret_cast<ompt_callback_t>(&on_parallel_end)},
      {CPUPROF_OMPT_CB_IMPLICIT_TASK, ompt_callback_implicit_task,
       reinterpret_cast<ompt_callback_t>(&on_implicit_task)},
      {CPUPROF_OMPT_CB_SYNC_REGION_WAIT, ompt_callback_sync_region_wait,
       reinterpret_cast<ompt_callback_t>(&on_sync_region_wait)},
      {CPUPROF_OMPT_CB_MUTEX_ACQUIRE, ompt_callback_mutex_acquire,
       reinterpret_cast<ompt_callback_t>(&on_mutex_acquire)},
      {CPUPROF_OMPT_CB_MUTEX_ACQUIRED, ompt_callback_mutex_acquired,
       reinterpret_cast<ompt_callback_t>(&on_mutex_acquired)},
      {CPUPROF_OMPT_CB_MUTEX_RELEASED, ompt_callback_mutex_released,
       reinterpret_cast<ompt_callback_t>(&on_mutex_released)},
  };
  for (const auto& w : wanted) g_callback_results[w.index] = int(set_callback(w.event, w.fn));
  g_initialized = 1;
  return 1;  // keep the tool active even if some callbacks are refused: the status says which
}

void finalize(ompt_data_t*) {}  // tables outlive the runtime: they are read after it shuts down

ompt_start_tool_result_t g_start_result = {&initialize, &finalize, {0}};

}  // namespace
}  // namespace ompt
}  // namespace cpuprof

using namespace cpuprof::ompt;

CPUPROF_OMPT_EXPORT ompt_start_tool_result_t* ompt_start_tool(unsigned int omp_version, const char* runtime_version) {
  // A second runtime in the process gets no tool: the tables describe one runtime's threads.
  if (g_started.exchange(1)) return nullptr;
  g_omp_version = omp_version;
  if (runtime_version) {
    std::strncpy(g_runtime_version, runtime_version, sizeof(g_runtime_version) - 1);
  }
  return &g_start_result;
}
