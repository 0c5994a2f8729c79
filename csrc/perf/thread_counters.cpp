#include "perf/thread_counters.h"

#include "perf/sample_record.h"

#include <unistd.h>

#include <cmath>
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
        (spec.kind == EventKind::Software || spec.kind == EventKind::Tracepoint) && open_ring_count(spec, tid, i)) {
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
      const int err = ring_.map(fd, sampling->ring_pages);
      if (err != 0) {
        // The ring could not be mapped (over perf_event_mlock_kb for an unprivileged user): the
        // event samples into nothing, so it is reopened as a plain counter.
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
      }
    }
    Group& group = groups_[group_index];
    group.event_index[group.n++] = i;
    group_mask_ |= 1u << i;
    ++opened;
  }
  return opened;
}

bool ThreadCounters::open_ring_count(const EventSpec& spec, pid_t tid, int event) {
  SampleSpec every{};
  every.period = 1;
  every.sample_type = 0;  // a bare header per occurrence: 8 bytes
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
  ++n_ring_counts_;
  ring_mask_ |= 1u << event;
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
    if (header.type == PERF_RECORD_SAMPLE) ++r.seen;  // PERF_RECORD_LOST: the read() below counts those
    return true;
  });
  if (full) {
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

void ThreadCounters::read_rings(RawCount* values, uint32_t* counted) const {
  for (int k = 0; k < n_ring_counts_; ++k) {
    const RingCount& r = ring_counts_[k];
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
  }
  n_ring_counts_ = 0;
  ring_mask_ = group_mask_ = 0;
}

}  // namespace cpuprof
