#include "perf/thread_counters.h"

#include "perf/sample_record.h"

#include "common/clock.h"
#include "common/limits.h"

#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

namespace cpuprof {

namespace {

constexpr uint64_t kReadFormat =
    PERF_FORMAT_GROUP | PERF_FORMAT_TOTAL_TIME_ENABLED | PERF_FORMAT_TOTAL_TIME_RUNNING;
constexpr int kHardwareGroupSize = 4;

bool is_cpu_clock(const EventSpec& spec) {
  return spec.kind == EventKind::Software &&
         (spec.config == PERF_COUNT_SW_TASK_CLOCK || spec.config == PERF_COUNT_SW_CPU_CLOCK);
}

bool is_context_switches(const EventSpec& spec) {
  return spec.kind == EventKind::Software && spec.config == PERF_COUNT_SW_CONTEXT_SWITCHES;
}

bool is_core_hardware(EventKind kind) {
  return kind == EventKind::Hardware || kind == EventKind::HardwareCache || kind == EventKind::Raw;
}

}  // namespace

int ThreadCounters::open(pid_t tid, const std::vector<EventSpec>& events, int* first_errno,
                         const Sampling* sampling, bool count_by_ring) {
  close();
  *first_errno = 0;
  sampling_errno_ = 0;
  sampled_ = false;
  ring_pages_asked_ = ring_pages_mapped_ = 0;
  int opened = 0;
  SampleSpec spec_sample;
  if (sampling != nullptr) {
    spec_sample.period = sampling->period_ns;
    spec_sample.sample_type = kSampleType;
    spec_sample.regs_mask = kSampleRegsMask;
    spec_sample.stack_bytes = sampling->stack_bytes;
    spec_sample.context_switches = true;
  }
  int software_group = -1;
  int hardware_group = -1;
  const int n = static_cast<int>(events.size()) < kMaxEvents ? static_cast<int>(events.size()) : kMaxEvents;
  n_events_ = n;
  for (int i = 0; i < n; ++i) {
    const EventSpec& spec = events[i];
    if (count_by_ring && !is_cpu_clock(spec) &&
        (spec.kind == EventKind::Software || spec.kind == EventKind::Tracepoint) &&
        open_ring_count(spec, tid, i, is_context_switches(spec) && switch_ring_ < 0)) {
      ++opened;
      continue;
    }
    int* group_slot = nullptr;
    if (spec.kind == EventKind::Software || spec.kind == EventKind::Tracepoint) {
      group_slot = &software_group;
    } else if (is_core_hardware(spec.kind)) {
      if (hardware_group >= 0 && groups_[hardware_group].n >= kHardwareGroupSize) hardware_group = -1;
      group_slot = &hardware_group;
    }
    int group_index = group_slot ? *group_slot : -1;
    int leader = group_index >= 0 ? groups_[group_index].leader_fd : -1;
    // The software group samples: its leader (task-clock, always the first event) with the
    // sample spec, all its members on the same clock (the kernel requires it).
    const bool in_sampling_group = sampling != nullptr && group_slot == &software_group && sampling_errno_ == 0;
    bool samples_here = in_sampling_group && leader < 0;
    int fd = perf_open(spec, tid, leader, kReadFormat, nullptr, samples_here ? &spec_sample : nullptr,
                       in_sampling_group);
    if (fd < 0 && samples_here) {
      // Sampling refused (seccomp, an old kernel's sample_type limits): count without it.
      sampling_errno_ = -fd;
      samples_here = false;
      fd = perf_open(spec, tid, leader, kReadFormat);
    }
    if (fd < 0) {
      if (*first_errno == 0) *first_errno = -fd;
      continue;
    }
    if (samples_here) {
      // Past the user's locked-memory budget (perf_event_mlock_kb per CPU, then RLIMIT_MEMLOCK)
      // a smaller ring still samples. Below a collector period of samples it overflows at every
      // pass while its thread is busy; what it drops is counted as lost, which beats no samples.
      // A ring that cannot hold two samples takes (nearly) none: never asked or shrunk below that.
      const size_t holds_two = SampleRing::min_pages(sampling->stack_bytes);
      const size_t asked = SampleRing::pages_for(std::max(sampling->ring_pages, holds_two));
      const size_t smallest = std::max(kMinRingPages, holds_two);
      ring_pages_asked_ = asked;
      int err = ring_.map(fd, asked);
      for (size_t pages = asked / 2; (err == EPERM || err == ENOMEM) && pages >= smallest; pages /= 2) {
        err = ring_.map(fd, pages);
      }
      if (err != 0) {
        // The ring could not be mapped even at its smallest: the event samples into nothing, so
        // it is reopened as a plain counter.
        sampling_errno_ = err;
        ::close(fd);
        fd = perf_open(spec, tid, leader, kReadFormat);
        if (fd < 0) {
          if (*first_errno == 0) *first_errno = -fd;
          continue;
        }
      }
    }
    fds_[n_fds_++] = fd;
    if (group_index < 0) {
      group_index = n_groups_++;
      groups_[group_index].leader_fd = fd;
      groups_[group_index].n = 0;
      if (group_slot) *group_slot = group_index;
      if (samples_here && ring_.mapped()) {
        sample_group_ = group_index;
        sampled_ = true;
        ring_pages_mapped_ = ring_.data_size() / static_cast<size_t>(sysconf(_SC_PAGESIZE));
      }
    }
    Group& group = groups_[group_index];
    group.event_index[group.n++] = i;
    group_mask_ |= 1u << i;
    if (is_cpu_clock(spec)) cpu_clock_counted_ = true;
    ++opened;
  }
  if (count_by_ring && switch_ring_ < 0 && opened > 0) open_switch_ring(tid);
  if (switch_ring_ >= 0) note_if_asleep(tid);
  return opened;
}

namespace {

// The state letter of /proc/self/task/<tid>/stat ('R', 'S', 'D', ...), or 0.
char thread_state(pid_t tid) {
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/self/task/%d/stat", static_cast<int>(tid));
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  char buffer[512];
  const ssize_t n = ::read(fd, buffer, sizeof(buffer) - 1);
  ::close(fd);
  if (n <= 0) return 0;
  buffer[n] = '\0';
  const char* paren = std::strrchr(buffer, ')');  // the name may hold spaces and parentheses
  return paren != nullptr && paren[1] == ' ' ? paren[2] : 0;
}

}  // namespace

// A thread asleep when its events open writes no switch record until it wakes, so nothing would
// say it is off its CPU. The kernel's state says so, if no record came between the open and the
// state's read (one that did has its own say) and the thread's CPU clock did not move across both:
// a thread shows S from just before it calls into the scheduler, and one woken in that moment
// never switches out, but then its clock runs.
void ThreadCounters::note_if_asleep(pid_t tid) {
  const RingCount& r = ring_counts_[switch_ring_];
  const clockid_t clock = thread_cpu_clock(tid);
  uint64_t before = 0, after = 0;
  if (!read_clock_ns(clock, &before)) return;
  const char state = thread_state(tid);
  if (state != 'S' && state != 'D' && state != 'T' && state != 't') return;
  if (r.busy.exchange(true, std::memory_order_acquire)) return;
  const bool quiet = r.ring.tail() == 0 && r.ring.head() == 0;
  if (quiet && read_clock_ns(clock, &after) && after == before) {
    r.cpu_state = CpuState::Off;
    r.switch_state.store(pack_switch_state(0, CpuState::Off), std::memory_order_release);
  }
  r.busy.store(false, std::memory_order_release);
}

// Without context-switches among the events, a dummy event (it counts nothing) carries the switch
// records alone: a ring in place of the one context-switches would have had. Best effort: without
// it every read of the thread's clock is a system call.
void ThreadCounters::open_switch_ring(pid_t tid) {
  if (n_ring_counts_ >= kMaxEvents || !context_switch_records()) return;
  static const EventSpec dummy = [] {
    EventSpec spec;
    spec.name = "dummy";
    spec.type = PERF_TYPE_SOFTWARE;
    spec.config = PERF_COUNT_SW_DUMMY;
    return spec;
  }();
  open_ring_count(dummy, tid, -1, true);
}

bool ThreadCounters::open_ring_count(const EventSpec& spec, pid_t tid, int event, bool with_switches) {
  SampleSpec every{};
  every.period = 1;
  every.sample_type = 0;  // a bare header per occurrence: 8 bytes (switch records too)
  every.context_switches = with_switches && context_switch_records();
  const int fd = perf_open(spec, tid, -1, kReadFormat, nullptr, &every);
  if (fd < 0) return false;
  RingCount& r = ring_counts_[n_ring_counts_];
  // One data page holds 512 occurrences between two reads; more are lost and reported as lost,
  // which counts them too. Over the locked-memory limit, the event is read() instead.
  if (r.ring.map(fd, 1) != 0) {
    ::close(fd);
    return false;
  }
  r.event = event;
  r.fd = fd;
  r.count.store(0, std::memory_order_relaxed);
  r.seen = 0;
  r.correction = 0;
  r.busy.store(false, std::memory_order_relaxed);
  r.scratch.clear();  // only headers are read: records are never copied out
  // perf_open drops the switch records on a kernel that refuses them (it says so afterwards).
  r.tracks_switches = every.context_switches && context_switch_records();
  r.cpu_state = CpuState::Unknown;  // until its first switch record
  r.switch_state.store(pack_switch_state(0, CpuState::Unknown), std::memory_order_release);
  if (r.tracks_switches) switch_ring_ = n_ring_counts_;
  ++n_ring_counts_;
  if (event >= 0) ring_mask_ |= 1u << event;
  return true;
}

uint64_t ThreadCounters::ring_count(const RingCount& r) const {
  // Nothing new (the common case, read at every op boundary): two loads, no lock.
  if (r.ring.pending() == 0) return r.count.load(std::memory_order_acquire);
  if (r.busy.exchange(true, std::memory_order_acquire)) return r.count.load(std::memory_order_acquire);
  auto& ring = const_cast<SampleRing&>(r.ring);
  // Full (short of the largest record, a LOST one): the kernel may be dropping records.
  const bool full = ring.pending() + 32 > ring.data_size();
  ring.consume(r.scratch, [&](const perf_event_header& header, const uint8_t*) {
    if (header.type == PERF_RECORD_SAMPLE) {
      ++r.seen;
    } else if (header.type == PERF_RECORD_SWITCH) {
      r.cpu_state = (header.misc & PERF_RECORD_MISC_SWITCH_OUT) != 0 ? CpuState::Off : CpuState::On;
    } else {
      r.cpu_state = CpuState::Unknown;  // lost records (the read() below counts those) or an exit
    }
    return true;
  });
  // A full ring drops records, a switch in among them (its LOST record comes only later), so the
  // last record read says nothing sure of the thread's state: unknown until its next switch.
  if (full) r.cpu_state = CpuState::Unknown;
  // Published after the consumed tail: a reader that finds the two disagree knows a consume is
  // under way and the state not yet final.
  if (r.tracks_switches) r.switch_state.store(pack_switch_state(ring.tail(), r.cpu_state), std::memory_order_release);
  if (full && r.event >= 0) {  // the dummy counts nothing: no read() to correct it
    uint64_t buffer[4];  // PERF_FORMAT_GROUP of one: nr, time_enabled, time_running, value
    if (::read(r.fd, buffer, sizeof(buffer)) == static_cast<ssize_t>(sizeof(buffer)))
      r.correction = static_cast<int64_t>(buffer[3]) - static_cast<int64_t>(r.seen);
  }
  const int64_t total = static_cast<int64_t>(r.seen) + r.correction;
  const uint64_t count = total > 0 ? static_cast<uint64_t>(total) : 0;
  r.count.store(count, std::memory_order_release);
  r.busy.store(false, std::memory_order_release);
  return count;
}

namespace {
std::atomic<bool> g_frozen_switch_positions{false};
}

void inject_frozen_switch_positions(bool on) { g_frozen_switch_positions.store(on); }

bool ThreadCounters::switch_position(uint64_t* position, CpuState* cpu_state) const {
  if (switch_ring_ < 0) return false;
  if (g_frozen_switch_positions.load(std::memory_order_relaxed)) {
    *position = 1;
    *cpu_state = CpuState::On;
    return true;
  }
  const RingCount& r = ring_counts_[switch_ring_];
  if (r.ring.pending() != 0) ring_count(r);
  // The state, then the tail, then the head, each loaded once: a reader that consumed since (the
  // collector, another dispatching thread) moved the tail first and the state after, so a stale
  // state never matches the tail, and records written since show as a head past it.
  const uint64_t state = r.switch_state.load(std::memory_order_acquire);
  const uint64_t tail = r.ring.tail();
  const uint64_t head = r.ring.head();
  if ((state >> 2) != tail + 1 || head != tail) return false;
  *position = state >> 2;
  *cpu_state = static_cast<CpuState>(state & 3);
  return true;
}

bool ThreadCounters::activity_position(uint64_t* position) const {
  const bool sample_switches = ring_.mapped() && context_switch_records();
  // Without its CPU clock counted, a thread that stayed on its CPU reads as unchanged.
  if (!cpu_clock_counted_ || (switch_ring_ < 0 && !sample_switches)) return false;
  uint64_t written = ring_.head();  // heads only grow: their sum moves with any record
  for (int k = 0; k < n_ring_counts_; ++k) written += ring_counts_[k].ring.head();
  *position = written;
  return true;
}

void ThreadCounters::read_rings(RawCount* values, uint32_t* counted) const {
  for (int k = 0; k < n_ring_counts_; ++k) {
    const RingCount& r = ring_counts_[k];
    if (r.event < 0) {  // the switch records' dummy counts nothing, but is drained with the rest
      ring_count(r);
      continue;
    }
    // Counted whenever it is open: an event that never happened is a true zero. Enabled and
    // running are equal, so the value is never scaled.
    values[r.event] = RawCount{ring_count(r), 1, 1};
    *counted |= 1u << r.event;
  }
}

bool ThreadCounters::read_raw(RawCount* values, uint32_t* counted) const {
  *counted = 0;
  // Every output is written: an event that failed to open here, or a failed read, is zero and
  // not counted, never whatever the caller's buffer held.
  for (int i = 0; i < n_events_; ++i) values[i] = RawCount{};
  read_rings(values, counted);
  return read_groups(values, counted) || n_ring_counts_ > 0;
}

bool ThreadCounters::read_groups(RawCount* values, uint32_t* counted) const {
  // Layout of a PERF_FORMAT_GROUP read without IDs: nr, time_enabled, time_running, value[nr].
  uint64_t buffer[3 + kMaxEvents];
  for (int i = 0; i < n_events_; ++i) {
    if (group_mask_ & (1u << i)) {
      values[i] = RawCount{};
      *counted &= ~(1u << i);
    }
  }
  const double fraction = injected_running_fraction();
  bool any = false;
  for (int g = 0; g < n_groups_; ++g) {
    const Group& group = groups_[g];
    ssize_t got = ::read(group.leader_fd, buffer, sizeof(uint64_t) * (3 + group.n));
    if (got < static_cast<ssize_t>(sizeof(uint64_t) * 3)) continue;
    uint64_t nr = buffer[0] < static_cast<uint64_t>(group.n) ? buffer[0] : group.n;
    const uint64_t enabled = buffer[1];
    uint64_t running = buffer[2];
    if (fraction > 0.0 && fraction < 1.0) running = static_cast<uint64_t>(static_cast<double>(enabled) * fraction);
    for (uint64_t k = 0; k < nr; ++k) {
      uint64_t raw = buffer[3 + k];
      if (fraction > 0.0 && fraction < 1.0) raw = static_cast<uint64_t>(static_cast<double>(raw) * fraction);
      const int index = group.event_index[k];
      values[index] = RawCount{raw, enabled, running};
      if (running == 0) continue;  // never scheduled yet: not counted
      *counted |= 1u << index;
      any = true;
    }
  }
  return any;
}

bool ThreadCounters::read(uint64_t* values, uint32_t* scaled, uint32_t* counted) const {
  RawCount raw[kMaxEvents];
  *scaled = 0;
  const bool any = read_raw(raw, counted);
  for (int i = 0; i < n_events_; ++i) {
    const ScaledCount count = scale_count(raw[i].raw, raw[i].enabled, raw[i].running);
    values[i] = count.ran ? static_cast<uint64_t>(std::llround(count.value)) : 0;
    if (count.scaled) *scaled |= 1u << i;
  }
  return any;
}

void ThreadCounters::close() {
  ring_.unmap();
  sample_group_ = -1;
  for (int i = 0; i < n_fds_; ++i) ::close(fds_[i]);
  n_fds_ = 0;
  n_groups_ = 0;
  for (int k = 0; k < n_ring_counts_; ++k) {
    RingCount& r = ring_counts_[k];
    r.ring.unmap();
    if (r.fd >= 0) ::close(r.fd);
    r.fd = -1;
    r.event = -1;
    r.tracks_switches = false;
  }
  n_ring_counts_ = 0;
  switch_ring_ = -1;
  ring_mask_ = group_mask_ = 0;
  cpu_clock_counted_ = false;
}

}  // namespace cpuprof
