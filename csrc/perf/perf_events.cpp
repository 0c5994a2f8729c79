#include "perf/perf_events.h"

#include <errno.h>
#include <sys/mount.h>
#include <time.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <fstream>
#include <sstream>

#include "common/limits.h"

namespace cpuprof {

namespace {

struct NamedConfig {
  const char* name;
  uint64_t config;
};

constexpr NamedConfig kHardware[] = {
    {"cycles", PERF_COUNT_HW_CPU_CYCLES},
    {"cpu-cycles", PERF_COUNT_HW_CPU_CYCLES},
    {"instructions", PERF_COUNT_HW_INSTRUCTIONS},
    {"ref-cycles", PERF_COUNT_HW_REF_CPU_CYCLES},
    {"cache-references", PERF_COUNT_HW_CACHE_REFERENCES},
    {"cache-misses", PERF_COUNT_HW_CACHE_MISSES},
    {"branch-instructions", PERF_COUNT_HW_BRANCH_INSTRUCTIONS},
    {"branches", PERF_COUNT_HW_BRANCH_INSTRUCTIONS},
    {"branch-misses", PERF_COUNT_HW_BRANCH_MISSES},
    {"bus-cycles", PERF_COUNT_HW_BUS_CYCLES},
    {"stalled-cycles-frontend", PERF_COUNT_HW_STALLED_CYCLES_FRONTEND},
    {"stalled-cycles-backend", PERF_COUNT_HW_STALLED_CYCLES_BACKEND},
};

constexpr NamedConfig kSoftware[] = {
    {"task-clock", PERF_COUNT_SW_TASK_CLOCK},
    {"cpu-clock", PERF_COUNT_SW_CPU_CLOCK},
    {"context-switches", PERF_COUNT_SW_CONTEXT_SWITCHES},
    {"cs", PERF_COUNT_SW_CONTEXT_SWITCHES},
    {"cpu-migrations", PERF_COUNT_SW_CPU_MIGRATIONS},
    {"migrations", PERF_COUNT_SW_CPU_MIGRATIONS},
    {"page-faults", PERF_COUNT_SW_PAGE_FAULTS},
    {"faults", PERF_COUNT_SW_PAGE_FAULTS},
    {"minor-faults", PERF_COUNT_SW_PAGE_FAULTS_MIN},
    {"major-faults", PERF_COUNT_SW_PAGE_FAULTS_MAJ},
    {"alignment-faults", PERF_COUNT_SW_ALIGNMENT_FAULTS},
    {"emulation-faults", PERF_COUNT_SW_EMULATION_FAULTS},
};

constexpr NamedConfig kCaches[] = {
    {"L1-dcache", PERF_COUNT_HW_CACHE_L1D}, {"L1-icache", PERF_COUNT_HW_CACHE_L1I},
    {"LLC", PERF_COUNT_HW_CACHE_LL},        {"dTLB", PERF_COUNT_HW_CACHE_DTLB},
    {"iTLB", PERF_COUNT_HW_CACHE_ITLB},     {"branch", PERF_COUNT_HW_CACHE_BPU},
    {"node", PERF_COUNT_HW_CACHE_NODE},
};

// Suffix -> (op, result), in perf's spelling.
struct CacheOp {
  const char* suffix;
  uint64_t op;
  uint64_t result;
};
constexpr CacheOp kCacheOps[] = {
    {"-loads", PERF_COUNT_HW_CACHE_OP_READ, PERF_COUNT_HW_CACHE_RESULT_ACCESS},
    {"-load-misses", PERF_COUNT_HW_CACHE_OP_READ, PERF_COUNT_HW_CACHE_RESULT_MISS},
    {"-stores", PERF_COUNT_HW_CACHE_OP_WRITE, PERF_COUNT_HW_CACHE_RESULT_ACCESS},
    {"-store-misses", PERF_COUNT_HW_CACHE_OP_WRITE, PERF_COUNT_HW_CACHE_RESULT_MISS},
    {"-prefetches", PERF_COUNT_HW_CACHE_OP_PREFETCH, PERF_COUNT_HW_CACHE_RESULT_ACCESS},
    {"-prefetch-misses", PERF_COUNT_HW_CACHE_OP_PREFETCH, PERF_COUNT_HW_CACHE_RESULT_MISS},
};

std::atomic<int> g_inject_errno{0};
std::atomic<bool> g_no_switch_records{false}, g_inject_no_switch_records{false};
std::atomic<int> g_inject_sampling_errno{0};  // fails only the opens that would sample every N ns
std::atomic<int> g_inject_count{0};
std::atomic<long> g_fd_ceiling{-1};  // descriptors at or above it are the program's (-1: none set)
std::atomic<long> g_fd_reserve{0};

// An fd in the program's reserve is given back: the event is refused as if at the limit.
int within_budget(int fd) {
  const long ceiling = g_fd_ceiling.load(std::memory_order_relaxed);
  if (fd >= 0 && ceiling >= 0 && fd >= ceiling) {
    ::close(fd);
    return -EMFILE;
  }
  return fd;
}
std::atomic<double> g_running_fraction{0.0};

bool read_text(const std::string& path, std::string* out) {
  std::ifstream in(path);
  if (!in) return false;
  std::stringstream buffer;
  buffer << in.rdbuf();
  *out = buffer.str();
  while (!out->empty() && (out->back() == '\n' || out->back() == ' ')) out->pop_back();
  return true;
}

bool parse_u64(const std::string& text, uint64_t* out) {
  if (text.empty()) return false;
  char* end = nullptr;
  errno = 0;
  unsigned long long v = strtoull(text.c_str(), &end, 0);
  if (errno != 0 || end == text.c_str() || *end != '\0') return false;
  *out = v;
  return true;
}

bool parse_hex(const std::string& text, uint64_t* out) {
  if (text.empty() || text.size() > 16) return false;
  char* end = nullptr;
  unsigned long long v = strtoull(text.c_str(), &end, 16);
  if (end == text.c_str() || *end != '\0') return false;
  *out = v;
  return true;
}

// Places `value` into the bits a sysfs format file names, e.g. "config:0-7,21" or "config1:0-63".
bool apply_format(const std::string& format, uint64_t value, EventSpec* spec, std::string* error) {
  auto colon = format.find(':');
  if (colon == std::string::npos) {
    *error = "malformed sysfs format '" + format + "'";
    return false;
  }
  std::string field = format.substr(0, colon);
  uint64_t* target = field == "config"    ? &spec->config
                     : field == "config1" ? &spec->config1
                     : field == "config2" ? &spec->config2
                                          : nullptr;
  if (target == nullptr) {
    *error = "unsupported sysfs format field '" + field + "'";
    return false;
  }
  std::stringstream ranges(format.substr(colon + 1));
  std::string range;
  int consumed = 0;  // bits of `value` already placed
  while (std::getline(ranges, range, ',')) {
    int lo = 0, hi = 0;
    auto dash = range.find('-');
    lo = atoi(range.substr(0, dash).c_str());
    hi = dash == std::string::npos ? lo : atoi(range.substr(dash + 1).c_str());
    if (lo < 0 || hi > 63 || hi < lo) {
      *error = "malformed sysfs bit range '" + range + "'";
      return false;
    }
    for (int bit = lo; bit <= hi; ++bit, ++consumed) {
      if (consumed < 64 && ((value >> consumed) & 1ULL)) *target |= 1ULL << bit;
    }
  }
  return true;
}

// "pmu/term=value,term=value/" or "pmu/alias/", resolved through
// <sysfs>/bus/event_source/devices/<pmu>/{type,format/*,events/*}.
ParseResult parse_pmu_event(const std::string& name, const std::string& body,
                            const std::string& sysfs_root) {
  ParseResult result;
  result.spec.name = name;
  result.spec.kind = EventKind::Pmu;
  auto slash = body.find('/');
  std::string pmu = body.substr(0, slash);
  std::string terms = body.substr(slash + 1);
  if (!terms.empty() && terms.back() == '/') terms.pop_back();
  std::string pmu_dir = sysfs_root + "/bus/event_source/devices/" + pmu;
  std::string type_text;
  uint64_t type = 0;
  if (!read_text(pmu_dir + "/type", &type_text) || !parse_u64(type_text, &type)) {
    result.error = "no PMU named '" + pmu + "' in " + sysfs_root + "/bus/event_source/devices";
    return result;
  }
  result.spec.type = static_cast<uint32_t>(type);
  // A bare alias ("msr/tsc/") expands to the terms in the PMU's events directory.
  if (terms.find('=') == std::string::npos && !terms.empty()) {
    std::string alias_terms;
    if (!read_text(pmu_dir + "/events/" + terms, &alias_terms)) {
      result.error = "PMU '" + pmu + "' has no event named '" + terms + "'";
      return result;
    }
    terms = alias_terms;
  }
  std::stringstream stream(terms);
  std::string term;
  while (std::getline(stream, term, ',')) {
    if (term.empty()) continue;
    auto eq = term.find('=');
    std::string key = term.substr(0, eq);
    uint64_t value = 1;
    if (eq != std::string::npos && !parse_u64(term.substr(eq + 1), &value)) {
      result.error = "bad value in '" + term + "' (expected a number such as 0x3c)";
      return result;
    }
    if (key == "config" || key == "config1" || key == "config2") {
      (key == "config" ? result.spec.config : key == "config1" ? result.spec.config1 : result.spec.config2) = value;
      continue;
    }
    std::string format;
    if (!read_text(pmu_dir + "/format/" + key, &format)) {
      result.error = "PMU '" + pmu + "' has no format term '" + key + "'";
      return result;
    }
    if (!apply_format(format, value, &result.spec, &result.error)) return result;
  }
  result.ok = true;
  return result;
}

// tracefs is where the kernel publishes tracepoint ids. perf mounts it when it is missing; so do
// we (as root), so a tracepoint works on a fresh boot without running perf first.
bool read_tracepoint_id(const std::string& sysfs_root, const std::string& subsystem,
                        const std::string& event, uint64_t* id) {
  const std::string rel = "/events/" + subsystem + "/" + event + "/id";
  const std::string roots[] = {sysfs_root + "/kernel/tracing", sysfs_root + "/kernel/debug/tracing"};
  std::string text;
  for (const auto& root : roots) {
    if (read_text(root + rel, &text)) return parse_u64(text, id);
  }
  if (sysfs_root == "/sys" && geteuid() == 0 &&
      mount("nodev", "/sys/kernel/tracing", "tracefs", 0, nullptr) == 0) {
    if (read_text(roots[0] + rel, &text)) return parse_u64(text, id);
  }
  return false;
}

int read_int_file(const char* path, int fallback) {
  std::string text;
  if (!read_text(path, &text)) return fallback;
  return atoi(text.c_str());
}

int seccomp_mode() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("Seccomp:", 0) == 0) return atoi(line.c_str() + 8);
  }
  return 0;
}

}  // namespace

std::vector<std::string> generic_event_names() {
  std::vector<std::string> names;
  for (const auto& e : kHardware) names.emplace_back(e.name);
  for (const auto& c : kCaches) {
    for (const auto& op : kCacheOps) names.push_back(std::string(c.name) + op.suffix);
  }
  for (const auto& e : kSoftware) names.emplace_back(e.name);
  return names;
}

ParseResult parse_event(const std::string& full_name, const std::string& sysfs_root) {
  ParseResult result;
  result.spec.name = full_name;
  std::string name = full_name;
  if (name.empty()) {
    result.error = "empty event name";
    return result;
  }
  if (name.find('/') != std::string::npos) return parse_pmu_event(full_name, name, sysfs_root);

  // "cycles:u" carries modifiers; "sched:sched_switch" is a tracepoint. Only a suffix made of
  // modifier letters is a modifier.
  auto colon = name.rfind(':');
  if (colon != std::string::npos) {
    std::string suffix = name.substr(colon + 1);
    bool is_modifier = !suffix.empty() && suffix.find_first_not_of("ukh") == std::string::npos;
    if (is_modifier) {
      name = name.substr(0, colon);
      result.spec.exclude_kernel = suffix.find('k') == std::string::npos;
      result.spec.exclude_user = suffix.find('u') == std::string::npos;
    } else {
      uint64_t id = 0;
      std::string subsystem = name.substr(0, colon);
      if (!read_tracepoint_id(sysfs_root, subsystem, suffix, &id)) {
        result.error = "no tracepoint '" + name + "' (not in tracefs; see perf list tracepoint)";
        return result;
      }
      result.spec.kind = EventKind::Tracepoint;
      result.spec.type = PERF_TYPE_TRACEPOINT;
      result.spec.config = id;
      result.ok = true;
      return result;
    }
  }
  for (const auto& e : kHardware) {
    if (name == e.name) {
      result.spec.kind = EventKind::Hardware;
      result.spec.type = PERF_TYPE_HARDWARE;
      result.spec.config = e.config;
      result.ok = true;
      return result;
    }
  }
  for (const auto& e : kSoftware) {
    if (name == e.name) {
      result.spec.kind = EventKind::Software;
      result.spec.type = PERF_TYPE_SOFTWARE;
      result.spec.config = e.config;
      result.ok = true;
      return result;
    }
  }
  for (const auto& c : kCaches) {
    size_t len = strlen(c.name);
    if (name.compare(0, len, c.name) != 0) continue;
    std::string rest = name.substr(len);
    for (const auto& op : kCacheOps) {
      if (rest == op.suffix) {
        result.spec.kind = EventKind::HardwareCache;
        result.spec.type = PERF_TYPE_HW_CACHE;
        result.spec.config = c.config | (op.op << 8) | (op.result << 16);
        result.ok = true;
        return result;
      }
    }
  }
  if (name.size() > 1 && name[0] == 'r') {
    uint64_t raw = 0;
    if (parse_hex(name.substr(1), &raw)) {
      result.spec.kind = EventKind::Raw;
      result.spec.type = PERF_TYPE_RAW;
      result.spec.config = raw;
      result.ok = true;
      return result;
    }
  }
  result.error = "unknown event '" + full_name +
                 "' (expected a perf name such as task-clock, cycles, LLC-load-misses, r003c, "
                 "pmu/event=0x3c/ or sched:sched_switch)";
  return result;
}

long reserve_fds_for_program() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) {
    g_fd_ceiling.store(-1);
    g_fd_reserve.store(0);
    return 0;
  }
  const long soft = static_cast<long>(limit.rlim_cur);
  const long reserve = std::min<long>(kFdReserveMax, std::max<long>(kFdReserveMin, soft / 4));
  g_fd_reserve.store(reserve);
  g_fd_ceiling.store(soft - reserve);
  return reserve;
}

void inject_sampling_errno(int err) { g_inject_sampling_errno.store(err, std::memory_order_release); }

bool context_switch_records() {
  return !g_no_switch_records.load(std::memory_order_acquire) &&
         !g_inject_no_switch_records.load(std::memory_order_acquire);
}

void inject_no_context_switches(bool off) { g_inject_no_switch_records.store(off, std::memory_order_release); }

void inject_open_errno(int err, int count) {
  g_inject_count.store(count, std::memory_order_relaxed);
  g_inject_errno.store(err, std::memory_order_release);
}

int perf_open(const EventSpec& spec, pid_t tid, int group_fd, uint64_t read_format, bool* user_only,
              const SampleSpec* sample, bool monotonic) {
  if (user_only) *user_only = false;
  const int sampling_refused = g_inject_sampling_errno.load(std::memory_order_acquire);
  if (sampling_refused != 0 && sample != nullptr && sample->period > 1) return -sampling_refused;
  int injected = g_inject_errno.load(std::memory_order_acquire);
  if (injected != 0) {
    int remaining = g_inject_count.load(std::memory_order_relaxed);
    if (remaining != 0) {
      if (remaining > 0) g_inject_count.fetch_sub(1, std::memory_order_relaxed);
      return -injected;
    }
  }
  perf_event_attr attr;
  memset(&attr, 0, sizeof(attr));
  attr.size = sizeof(attr);
  attr.type = spec.type;
  attr.config = spec.config;
  attr.config1 = spec.config1;
  attr.config2 = spec.config2;
  attr.read_format = read_format;
  attr.exclude_kernel = spec.exclude_kernel;
  attr.exclude_user = spec.exclude_user;
  // Only core PMUs take exclusion bits; uncore-style PMUs (msr, power) reject them with EINVAL.
  attr.exclude_hv = spec.kind == EventKind::Hardware || spec.kind == EventKind::HardwareCache ||
                    spec.kind == EventKind::Raw;
  attr.disabled = 0;
  if (monotonic) {
    attr.use_clockid = 1;
    attr.clockid = CLOCK_MONOTONIC;
  }
  if (sample != nullptr) {
    attr.sample_period = sample->period;
    attr.sample_type = sample->sample_type;
    attr.sample_stack_user = sample->stack_bytes;
    attr.sample_regs_user = sample->regs_mask;
    // The user part of the kernel's call chain follows frame pointers, which MKL, libgomp and
    // libtorch do not keep; user stacks are unwound from the copied stack instead.
    attr.exclude_callchain_user = 1;
    if (sample->context_switches && context_switch_records()) {
      attr.context_switch = 1;
      attr.task = 1;           // and an exit record: a thread's last switch out is not written
      attr.sample_id_all = 1;  // the switch records carry the thread and the time too
    }
  }
  int fd = within_budget(static_cast<int>(syscall(SYS_perf_event_open, &attr, tid, -1, group_fd, PERF_FLAG_FD_CLOEXEC)));
  if (fd >= 0) return fd;
  int err = fd == -EMFILE ? EMFILE : errno;
  if (err == EINVAL && attr.context_switch) {
    // A kernel older than 4.3 has no switch records: sample without them (the collector then
    // charges each sample's CPU to the op it lands in, as it does for a thread's first sample).
    g_no_switch_records.store(true, std::memory_order_release);
    attr.context_switch = 0;
    attr.task = 0;
    attr.sample_id_all = 0;
    fd = within_budget(static_cast<int>(syscall(SYS_perf_event_open, &attr, tid, -1, group_fd, PERF_FLAG_FD_CLOEXEC)));
    if (fd >= 0) return fd;
    err = fd == -EMFILE ? EMFILE : errno;
  }
  // perf_event_paranoid 2 forbids kernel-mode counting for non-root users; perf then counts
  // user mode only, and so do we rather than lose the event.
  if ((err == EACCES || err == EPERM) && !spec.exclude_kernel && spec.type != PERF_TYPE_TRACEPOINT) {
    attr.exclude_kernel = 1;
    fd = within_budget(static_cast<int>(syscall(SYS_perf_event_open, &attr, tid, -1, group_fd, PERF_FLAG_FD_CLOEXEC)));
    if (fd >= 0) {
      if (user_only) *user_only = true;
      return fd;
    }
    err = fd == -EMFILE ? EMFILE : errno;
  }
  return -err;
}

std::string open_error_reason(int err, const EventSpec& spec) {
  int paranoid = read_int_file("/proc/sys/kernel/perf_event_paranoid", 2);
  bool hardware = spec.kind == EventKind::Hardware || spec.kind == EventKind::HardwareCache ||
                  spec.kind == EventKind::Raw;
  switch (err) {
    case ENOENT:
    case EOPNOTSUPP:
    case ENODEV:
      if (hardware)
        return "not supported by this CPU or hypervisor (no hardware PMU is exposed to this "
               "machine; a VM needs a virtual PMU)";
      return "not supported by this kernel";
    case EACCES:
    case EPERM: {
      if (err == EPERM && seccomp_mode() == 2 && paranoid <= 2)
        return "perf_event_open is blocked by a seccomp filter (a container runtime's default "
               "profile does this; run with a profile that allows perf_event_open)";
      return "permission denied: perf_event_paranoid is " + std::to_string(paranoid) +
             (spec.kind == EventKind::Tracepoint ? " and tracepoints need -1" : "") +
             " (lower it with sysctl kernel.perf_event_paranoid, or run with CAP_PERFMON)";
    }
    case EMFILE: {
      rlimit limit{};
      getrlimit(RLIMIT_NOFILE, &limit);
      return "file-descriptor limit reached (ulimit -n is " + std::to_string(limit.rlim_cur) + ", of which " +
             std::to_string(g_fd_reserve.load()) +
             " are left to the program; one descriptor is needed per event per thread)";
    }
    case ENFILE: return "the system-wide file-descriptor limit is reached";
    case ENOSYS: return "this kernel has no perf_event_open";
    case EBUSY: return "the PMU is busy (another tool holds counters exclusively)";
    case ESRCH: return "the thread exited before its counters could be opened";
    case EINVAL:
      return hardware ? "the CPU rejected this event encoding (not supported by this CPU)"
                      : "the kernel rejected this event configuration";
    case E2BIG: return "the kernel does not accept this perf_event_attr size";
    default: return std::string("perf_event_open failed: ") + strerror(err);
  }
}

ProbeResult probe_event(const std::string& name, const std::string& sysfs_root) {
  ProbeResult probe;
  probe.name = name;
  ParseResult parsed = parse_event(name, sysfs_root);
  if (!parsed.ok) {
    probe.err = EINVAL;
    probe.reason = parsed.error;
    return probe;
  }
  probe.parsed = true;
  probe.kind = parsed.spec.kind;
  int fd = perf_open(parsed.spec, 0, -1, 0, &probe.user_only);
  if (fd < 0) {
    probe.err = -fd;
    probe.reason = open_error_reason(-fd, parsed.spec);
    return probe;
  }
  uint64_t value = 0;
  // Some hypervisors accept the open and fail the first read; that is "cannot count" too.
  if (read(fd, &value, sizeof(value)) != static_cast<ssize_t>(sizeof(value))) {
    probe.err = errno ? errno : EIO;
    probe.reason = "opened but could not be read: " + std::string(strerror(probe.err));
    close(fd);
    return probe;
  }
  close(fd);
  probe.ok = true;
  return probe;
}

ScaledCount scale_count(uint64_t raw, uint64_t time_enabled, uint64_t time_running) {
  ScaledCount out;
  if (time_running == 0) return out;  // never scheduled: unknown
  out.ran = true;
  if (time_running >= time_enabled) {
    out.value = static_cast<double>(raw);
    return out;
  }
  out.scaled = true;
  out.value = static_cast<double>(raw) * static_cast<double>(time_enabled) /
              static_cast<double>(time_running);
  return out;
}

ScaledCount scale_delta(const RawCount& before, const RawCount& after) {
  ScaledCount out;
  const uint64_t raw = after.raw > before.raw ? after.raw - before.raw : 0;
  const uint64_t enabled = after.enabled > before.enabled ? after.enabled - before.enabled : 0;
  const uint64_t running = after.running > before.running ? after.running - before.running : 0;
  if (enabled == 0) {  // no time passed for this group: whatever it counted, unscaled
    out.ran = raw > 0;
    out.value = static_cast<double>(raw);
    return out;
  }
  return scale_count(raw, enabled, running);
}

ResolvedEvents resolve_events(const std::vector<std::string>& names, const std::string& sysfs_root) {
  ResolvedEvents out;
  for (const std::string& name : names) {
    bool duplicate = false;
    for (const EventSpec& e : out.events) duplicate = duplicate || e.name == name;
    if (duplicate) continue;
    ParseResult parsed = parse_event(name, sysfs_root);
    if (!parsed.ok) {
      out.dropped.push_back({name, EINVAL, parsed.error});
      continue;
    }
    ProbeResult probe = probe_event(name, sysfs_root);
    if (!probe.ok) {
      out.dropped.push_back({name, probe.err, probe.reason});
      continue;
    }
    if (static_cast<int>(out.events.size()) >= kMaxEvents) {
      out.dropped.push_back({name, E2BIG, "more than " + std::to_string(kMaxEvents) + " events in one session"});
      continue;
    }
    if (probe.user_only) parsed.spec.exclude_kernel = true;
    out.events.push_back(parsed.spec);
  }
  return out;
}

void inject_running_fraction(double fraction) { g_running_fraction.store(fraction); }
double injected_running_fraction() { return g_running_fraction.load(std::memory_order_relaxed); }

}  // namespace cpuprof
