// cpuprof's OMPT tool: OpenMP barrier, lock and idle waits per thread and ATen op.
//
// A shared library of its own (libcpuprof_ompt.so), with no torch and no Python in it, because
// the OpenMP runtime has to dlopen it itself when it starts: a runtime that supports OMPT
// (Intel's libiomp5, LLVM's libomp) calls `ompt_start_tool` in every library named by
// OMP_TOOL_LIBRARIES (with OMP_TOOL=enabled). GNU libgomp never does, so under libgomp this
// library is simply never loaded.
//
// The profiler reaches the copy the runtime loaded (dlopen with RTLD_NOLOAD) and drives it
// through the C API below; every struct is flat and fixed-size so ctypes can mirror it.
//
// What the figures mean:
// - A wait is one OMPT sync_region_wait (barriers, taskwait, taskgroup) or mutex_acquire ->
//   mutex_acquired interval, with its wall time (CLOCK_MONOTONIC) and the thread's own CPU time
//   over it (CLOCK_THREAD_CPUTIME_ID): cpu is spinning, wall - cpu is asleep (or runnable but
//   not running), which is what KMP_BLOCKTIME trades.
// - Waits are charged to the op of the parallel region the thread works in: the encountering
//   thread's innermost ATen op when it forked the region, as returned by the function given
//   to cpuprof_ompt_attach. Outside any region, a lock wait is charged to the calling thread's
//   own current op, or to op 1 ("outside ATen ops").
// - Intel's and LLVM's runtimes report the end of a worker's implicit barrier only when the
//   worker is next forked (or exits), so OMPT's own interval runs on through the time the
//   worker sat idle in the thread pool. The tool cuts it where the team's primary thread left
//   the region (the moment the barrier completed): the part before is the barrier wait, charged
//   to the region's op; the part after is CPUPROF_OMPT_IDLE, charged to op 1. The thread's CPU
//   time is read only at the two ends, so it is split on the runtime's own policy (spin first,
//   sleep once KMP_BLOCKTIME has passed): the barrier part gets min(cpu, its wall time), the
//   idle part the rest. Waits the tool could not cut (the primary's record was gone) are whole
//   barrier waits, counted in waits_uncut.
// - For the same reason a worker's last barrier before a read is missing from it until the
//   worker is forked again (or exits); a session that ends with one more region loses nothing.
// - Reading the thread's CPU clock is a system call (about 0.5 us here), made at both ends of
//   each wait: waits of a few microseconds are mostly that, and their cpu share reads low.
#pragma once

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// Bumped whenever a struct or the meaning of a field below changes.
#define CPUPROF_OMPT_ABI 1

// Threads with their own tables; later threads are counted in threads_beyond_limit.
#define CPUPROF_OMPT_MAX_THREADS 512
// (op, kind) wait slots and op work slots per thread; what does not fit is records_dropped.
#define CPUPROF_OMPT_WAIT_SLOTS 2048
#define CPUPROF_OMPT_WORK_SLOTS 1024
// The op id for time outside any ATen op (the core's kOutsideEntry).
#define CPUPROF_OMPT_OUTSIDE_OP 1

// Wait kinds, in the order of cpuprof.model.contention.WAIT_KINDS (names from
// cpuprof_ompt_kind_name).
enum cpuprof_ompt_kind {
  CPUPROF_OMPT_BARRIER_IMPLICIT = 0,  // end of a parallel region or of a worksharing construct
  CPUPROF_OMPT_BARRIER_EXPLICIT,
  CPUPROF_OMPT_BARRIER_REDUCTION,
  CPUPROF_OMPT_BARRIER_OTHER,  // unclassified by the runtime (GNU-compiled barriers under libiomp5)
  CPUPROF_OMPT_TASKWAIT,
  CPUPROF_OMPT_TASKGROUP,
  CPUPROF_OMPT_LOCK,
  CPUPROF_OMPT_CRITICAL,
  CPUPROF_OMPT_ORDERED,
  CPUPROF_OMPT_ATOMIC,
  CPUPROF_OMPT_NEST_LOCK,
  CPUPROF_OMPT_OTHER_MUTEX,
  CPUPROF_OMPT_IDLE,  // a worker in the thread pool between two regions
  CPUPROF_OMPT_KIND_COUNT
};

// The callbacks the tool asks for, in the order of cpuprof_ompt_status.callbacks.
enum cpuprof_ompt_callback {
  CPUPROF_OMPT_CB_THREAD_BEGIN = 0,
  CPUPROF_OMPT_CB_THREAD_END,
  CPUPROF_OMPT_CB_PARALLEL_BEGIN,
  CPUPROF_OMPT_CB_PARALLEL_END,
  CPUPROF_OMPT_CB_IMPLICIT_TASK,
  CPUPROF_OMPT_CB_SYNC_REGION_WAIT,
  CPUPROF_OMPT_CB_MUTEX_ACQUIRE,
  CPUPROF_OMPT_CB_MUTEX_ACQUIRED,
  CPUPROF_OMPT_CB_MUTEX_RELEASED,
  CPUPROF_OMPT_CALLBACK_COUNT
};

struct cpuprof_ompt_status {
  int32_t abi;          // CPUPROF_OMPT_ABI
  int32_t initialized;  // the runtime called ompt_start_tool and then the tool's initializer
  int32_t enabled;
  uint32_t omp_version;  // the OpenMP API version the runtime passed to ompt_start_tool (e.g. 201611)
  char runtime_version[256];  // the runtime's own version string, NUL-terminated
  // ompt_set_result_t of each callback's registration (0: not tried, 1: error, 2: never,
  // 3: sometimes, 4: sometimes_paired, 5: always).
  int32_t callbacks[CPUPROF_OMPT_CALLBACK_COUNT];
  uint64_t threads;               // threads with tables since the last reset
  uint64_t threads_beyond_limit;  // threads that got no table (ever, in this process)
  uint64_t records_dropped;       // events whose (op, kind) or op slot found no room in the table
  uint64_t waits_uncut;           // worker barrier waits not split from the idle time after them
};

struct cpuprof_ompt_wait {
  int32_t tid;  // Linux thread id
  uint32_t op;
  int32_t kind;  // enum cpuprof_ompt_kind
  int32_t reserved;
  uint64_t count;
  uint64_t wall_ns;
  uint64_t cpu_ns;
};

struct cpuprof_ompt_work {
  int32_t tid;
  uint32_t op;
  uint64_t parallel_regions;  // forked by this thread as the primary
  uint64_t team_threads;      // sum of those regions' actual team sizes
  uint64_t parallel_ns;       // wall time from parallel_begin to parallel_end on the primary
  uint64_t implicit_tasks;
  uint64_t implicit_task_ns;  // from the task's start until its team's barrier completed
  uint64_t lock_acquisitions;  // locks, nest locks, critical and ordered sections (not atomics)
};

// The library also exports ompt_start_tool, the runtime's entry point (omp-tools.h).

int cpuprof_ompt_abi(void);
// The function that returns the calling thread's innermost running ATen op (0: none). It must be
// callable from any thread at any time, cheaply, without locks. NULL detaches (every region is
// then charged to op 1).
void cpuprof_ompt_attach(uint32_t (*current_op)(void));
// Records only while enabled; each enable starts a new epoch, so a wait that began before it is
// never paired with an end after it.
void cpuprof_ompt_enable(int on);
// Forgets every record. Call while no parallel region runs and no read is in progress: each
// thread clears its own tables at its next event, and tables not yet cleared are not read.
void cpuprof_ompt_reset(void);
void cpuprof_ompt_get_status(struct cpuprof_ompt_status* out);
// Copy up to `capacity` records into `out` and return how many there are (call again with a
// larger array if that is more than `capacity`). Read while disabled for figures that hold still.
long cpuprof_ompt_read_waits(struct cpuprof_ompt_wait* out, long capacity);
long cpuprof_ompt_read_work(struct cpuprof_ompt_work* out, long capacity);
// Names for the enums above (NULL when out of range).
const char* cpuprof_ompt_kind_name(int kind);
const char* cpuprof_ompt_callback_name(int callback);

#ifdef __cplusplus
}
#endif
