// What a session hands out: a typed copy of everything a report needs.
//
// Taken under the session's lifecycle lock, so no reader ever touches memory that start()
// reallocates or descriptors that stop() closes. The bindings convert it to Python once, as
// typed objects and arrays (see cpuprof/_native.pyi); nothing downstream unpicks dictionaries.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "core/counting_mode.h"
#include "core/op_table.h"
#include "perf/perf_events.h"

namespace cpuprof {

struct EventSnapshot {
  std::string name;
  EventKind kind = EventKind::Software;
  bool user_only = false;  // kernel-mode counting was refused (perf_event_paranoid)
};

struct InputSnapshot {
  InputKind kind = InputKind::Other;
  std::string dtype;  // tensors: "bf16", "f32", ...
  std::vector<int64_t> sizes, strides;
  int list_len = 0;   // tensor_list: how many of the following inputs are its items
};

struct EntrySnapshot {
  uint32_t index = 0;
  EntryKind kind = EntryKind::Op;
  std::string name;
  uint32_t region = 0;  // index of the enclosing region's entry, 0 = none
  bool has_inputs = false;
  bool inputs_truncated = false;
  std::vector<InputSnapshot> inputs;
  uint64_t calls = 0, incl_ns = 0, self_ns = 0, max_ns = 0, samples = 0;
  uint64_t alloc_bytes = 0, allocs = 0, freed_bytes = 0, frees = 0;  // torch allocator reports
};

struct ThreadSnapshot {
  pid_t tid = 0;
  std::string name;
  int64_t opened_ns = 0;
  int open_errno = 0;
  bool in_team = false;
  bool dispatch = false;
  std::vector<uint64_t> totals;  // per event
  std::vector<bool> scaled, counted;
  // From /proc/self/task/<tid>/schedstat, at open and at the final read (-1: unknown, e.g. the
  // thread had exited before the session stopped).
  int64_t cpu_ns_at_open = -1, run_delay_ns_at_open = -1;
  int64_t cpu_ns_at_stop = -1, run_delay_ns_at_stop = -1;
  // Sampled mode: samples joined from this thread, samples the kernel dropped (its ring was
  // full), and why it could not be sampled at all (0: it was).
  uint64_t samples = 0, samples_lost = 0;
  int sample_errno = 0;
  // Its sample ring's data pages, as mapped and as asked for (fewer mapped: the locked-memory
  // budget refused the asked size; 0 mapped: not sampled).
  uint32_t ring_pages = 0, ring_pages_asked = 0;
};

// Sampled mode's samples, stacks and how they were obtained.
struct SamplingSnapshot {
  bool enabled = false;
  int sample_hz = 0;
  int stack_bytes = 0;
  uint64_t samples = 0;            // joined to the op timeline
  uint64_t samples_lost = 0;       // dropped by the kernel (rings full), all threads
  uint64_t unparsed = 0;           // records that did not parse
  uint64_t ambiguous_workers = 0;  // worker samples while several dispatching threads ran ops
  uint64_t late_op_events = 0;     // op events published after samples past them were joined
  uint64_t switch_records = 0;     // on/off-CPU records: the intervals CPU time is charged by
  uint64_t cpu_by_interval_ns = 0; // CPU charged to ops by those intervals
  uint64_t cpu_by_sample_ns = 0;   // CPU they did not cover, charged where a sample landed
  uint64_t op_events_dropped = 0;  // op timeline rings full
  uint64_t stacks_truncated = 0, counts_dropped = 0, timeline_dropped = 0;
  std::vector<uint64_t> unwind_stops;  // samples per UnwindStop kind
  uint64_t frames_by_frame_pointer = 0, frames_by_scanning = 0;
  // Stacks: stack i (1..n) is frames[offsets[i-1], offsets[i]), leaf first; offsets[0] = 0.
  std::vector<uint64_t> frames;
  std::vector<uint32_t> offsets;
  // Op paths: path i (1..n) is path_entries[path_offsets[i-1], path_offsets[i]), outermost first.
  std::vector<uint32_t> path_entries;
  std::vector<uint32_t> path_offsets;
  // Per (stack, op path, thread slot): samples, the CPU time they stand for, and every event's
  // deltas (flattened [count][event]); `count_entry` is the path's innermost op.
  std::vector<uint32_t> count_stack, count_path, count_entry;
  std::vector<int32_t> count_slot;
  std::vector<uint64_t> count_samples, count_cpu_ns, count_values;
  // The newest samples, oldest first.
  std::vector<int64_t> timeline_time;
  std::vector<int32_t> timeline_slot;
  std::vector<uint32_t> timeline_entry, timeline_stack, timeline_path, timeline_cpu_us;
  size_t memory_bytes = 0;
};

struct SpanSnapshot {
  std::vector<uint32_t> entry;
  std::vector<int32_t> thread_slot, depth;
  std::vector<int64_t> start_ns, dur_ns;
  std::vector<uint64_t> counters;  // [span][event], flattened
  uint64_t written = 0, dropped = 0;
};

struct SessionSnapshot {
  std::vector<EventSnapshot> events;
  CountingMode mode = CountingMode::Sampled;
  bool record_shapes = false;
  bool running = false;
  int64_t started_ns = 0, stopped_ns = 0, now_ns = 0;
  uint64_t ops_seen = 0, too_deep = 0, unattributed_ops = 0, unmatched_ends = 0, truncated_ops = 0;
  uint64_t thread_setup_failures = 0;  // a dispatching thread's buffers could not be allocated
  int64_t hook_ns = 0, discovery_cpu_ns = 0;
  uint64_t idle_reads_skipped = 0, thread_scans = 0;
  int64_t scan_setup_cpu_ns = 0;
  uint64_t discovery_ticks = 0, samples = 0;
  bool memory_reported = false;  // torch's allocator reported to the session (alloc_* are measured)
  std::vector<std::string> scaled_events;  // per-op deltas scaled for multiplexing
  std::vector<pid_t> dispatch_tids;
  int max_threads = 0;
  int threads_beyond_limit = 0;
  int op_capacity = 0;
  uint64_t ops_overflowed = 0;
  size_t memory_bytes = 0;
  size_t span_capacity = 0;
  std::vector<ThreadSnapshot> threads;  // every registered thread, in slot order
  std::vector<EntrySnapshot> entries;
  // Per-op counters of the threads listed in `counter_threads` (indices into `threads`): the
  // team. Flattened [entry][counter thread][event], in the order of `entries`.
  std::vector<int> counter_threads;
  std::vector<uint64_t> counters_self, counters_incl;
  SpanSnapshot spans;
  SamplingSnapshot sampling;
};

}  // namespace cpuprof
