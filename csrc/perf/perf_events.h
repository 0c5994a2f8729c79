// Event specs by name, opening them with perf_event_open, and reading them.
//
// Pure C++ (no torch, no Python): the unit that knows the kernel's perf ABI. Every failure is
// turned into an errno plus a sentence a user can act on, because "perf_event_open: EACCES"
// tells nobody whether to change perf_event_paranoid, leave a container or raise ulimit -n.
#pragma once

#include <linux/perf_event.h>
#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "common/enum_list.h"

namespace cpuprof {

// Crosses to Python as an enum (common/enum_list.h), named there as the profile names it.
#define CPUPROF_EVENT_KINDS(X)              \
  X(Hardware, 0, "hardware")                \
  X(HardwareCache, 1, "hardware_cache")     \
  X(Software, 2, "software")                \
  X(Raw, 3, "raw")                          \
  X(Pmu, 4, "pmu")                          \
  X(Tracepoint, 5, "tracepoint")
enum class EventKind : uint8_t { CPUPROF_EVENT_KINDS(CPUPROF_ENUM_VALUE) };

struct EventSpec {
  std::string name;  // as the user wrote it, e.g. "cycles:u" or "sched:sched_switch"
  EventKind kind = EventKind::Software;
  uint32_t type = 0;  // perf_event_attr.type
  uint64_t config = 0, config1 = 0, config2 = 0;
  bool exclude_kernel = false;
  bool exclude_user = false;
};

struct ParseResult {
  bool ok = false;
  EventSpec spec;
  std::string error;  // one line: why the name is not an event here
};

// Parses every syntax perf accepts that cpuprof supports: generic hardware and software names,
// hardware cache names ("LLC-load-misses"), raw "rNNNN", "pmu/event=..,umask=../" and
// "pmu/named-event/" resolved through sysfs, and "subsystem:tracepoint". A ":u"/":k" suffix
// restricts to user or kernel mode. `sysfs_root` is "/sys" except in tests that give a fake tree.
ParseResult parse_event(const std::string& name, const std::string& sysfs_root = "/sys");

// The names parse_event knows without sysfs, for `doctor` and error messages.
std::vector<std::string> generic_event_names();

// Why an event could not be opened, as one sentence. Reads perf_event_paranoid, the seccomp
// mode and RLIMIT_NOFILE so the sentence names the setting that is in the way.
std::string open_error_reason(int err, const EventSpec& spec);

// What turns a counting event into the sampling leader of its group (see SampleRing).
struct SampleSpec {
  uint64_t period = 0;        // in the event's unit: nanoseconds of CPU for task-clock
  uint64_t sample_type = 0;   // PERF_SAMPLE_* bits
  uint32_t stack_bytes = 0;   // user stack copied with each sample (PERF_SAMPLE_STACK_USER)
  uint64_t regs_mask = 0;     // user registers recorded with each sample (PERF_SAMPLE_REGS_USER)
  // Also write a PERF_RECORD_SWITCH, stamped like the samples, each time the thread goes on or
  // off a CPU: the collector then knows when a thread ran, not only where it was every period.
  bool context_switches = false;
};

// perf_event_open, returning the fd or -errno. Fault injection (for tests of the error paths)
// makes the next `count` calls fail with `err`; count < 0 means every call until cleared.
// `user_only`, when given, is set when the kernel refused kernel-mode counting and the event was
// opened for user mode only (perf_event_paranoid >= 2 without CAP_PERFMON). `sample`, when given,
// makes the event sample; `monotonic` stamps its samples (and, for a group, every member must
// agree) with CLOCK_MONOTONIC, the op timeline's clock.
int perf_open(const EventSpec& spec, pid_t tid, int group_fd, uint64_t read_format, bool* user_only = nullptr,
              const SampleSpec* sample = nullptr, bool monotonic = false);
void inject_open_errno(int err, int count);
// Fault injection: every open of a time-sampling event fails with `err` (0 clears), as under a
// seccomp filter or paranoid level that refuses sampling; counting still works.
void inject_sampling_errno(int err);
// Whether sampling events get switch and exit records (PERF_RECORD_SWITCH, Linux 4.3): false once
// the kernel refused them, or while a test turned them off (as an older kernel would).
bool context_switch_records();
void inject_no_context_switches(bool off);
// Sets aside the last descriptors under the current RLIMIT_NOFILE for the profiled program
// (perf_open refuses them with EMFILE); returns how many.
long reserve_fds_for_program();

struct ProbeResult {
  std::string name;
  bool ok = false;
  int err = 0;
  std::string reason;  // empty when ok
  bool parsed = false;  // the name is an event: `kind` says which
  EventKind kind = EventKind::Software;
  bool user_only = false;  // counted in user mode only: kernel-mode counting was refused
};

// Opens the event on the calling thread, reads it once and closes it.
ProbeResult probe_event(const std::string& name, const std::string& sysfs_root = "/sys");

// Multiplexed counts are scaled by time_enabled / time_running, as perf stat does. A count
// whose group never ran is unknown, not zero: the caller gets `ran == false`.
struct ScaledCount {
  double value = 0;
  bool scaled = false;
  bool ran = false;
};
ScaledCount scale_count(uint64_t raw, uint64_t time_enabled, uint64_t time_running);

// One event's reading: its raw count and its group's enabled/running times, all cumulative.
struct RawCount {
  uint64_t raw = 0;
  uint64_t enabled = 0;
  uint64_t running = 0;
};

// The count between two readings, scaled for multiplexing as perf stat -I does: by the enabled
// and running time of that interval, not of the whole run. A difference of cumulative scaled
// counts is wrong when the running fraction changes (it can even go negative). An interval in
// which the group never ran is unknown: `ran` is false and the value 0.
ScaledCount scale_delta(const RawCount& before, const RawCount& after);

// For tests of the scaling path on machines without a PMU (software events never multiplex):
// reports time_running as this fraction of time_enabled and the raw values scaled down to
// match, as the kernel would for a group that was scheduled that fraction of the time.
void inject_running_fraction(double fraction);
double injected_running_fraction();

struct DroppedEvent {
  std::string name;
  int err = 0;
  std::string reason;
};

struct ResolvedEvents {
  std::vector<EventSpec> events;     // openable here, in the order asked, duplicates removed
  std::vector<DroppedEvent> dropped;  // with the reason each cannot be counted
};

// Parses and probes each name: what this machine cannot count is dropped with its reason, and an
// event whose kernel-mode counting was refused is kept in user mode only (as perf does).
ResolvedEvents resolve_events(const std::vector<std::string>& names, const std::string& sysfs_root = "/sys");

}  // namespace cpuprof
