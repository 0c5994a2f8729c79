#include "core/thread_registry.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>

#include "common/clock.h"

namespace cpuprof {

SchedStat read_schedstat(pid_t tid) {
  SchedStat stat;
  char path[64];
  snprintf(path, sizeof(path), "/proc/self/task/%d/schedstat", static_cast<int>(tid));
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return stat;
  char text[96] = {0};
  const ssize_t got = ::read(fd, text, sizeof(text) - 1);
  ::close(fd);
  if (got <= 0) return stat;
  long long cpu = 0, delay = 0, slices = 0;
  if (sscanf(text, "%lld %lld %lld", &cpu, &delay, &slices) == 3) {
    stat = {true, cpu, delay, slices};
  }
  return stat;
}

void ThreadRegistry::configure(const std::vector<EventSpec>& events, int max_threads,
                               const ThreadCounters::Sampling* sampling, bool count_by_ring) {
  std::lock_guard<std::mutex> lock(mutex_);
  events_ = events;
  sampled_ = sampling != nullptr;
  count_by_ring_ = count_by_ring;
  if (sampling != nullptr) sampling_ = *sampling;
  // Slots are reused across sessions (their counters are closed at stop); resized only here,
  // while no session runs and so nothing reads them.
  slots_.resize(max_threads);
  scan_setup_cpu_ns_.store(0);
  known_tids_.clear();
  known_tids_.reserve(max_threads);
  size_.store(0, std::memory_order_release);
  beyond_limit_.store(0);
}

int ThreadRegistry::find(pid_t tid) const {
  const int n = size();
  for (int i = 0; i < n; ++i) {
    if (slots_[i]->tid == tid) return i;
  }
  return -1;
}

int ThreadRegistry::add_locked(pid_t tid) {
  const int n = size_.load(std::memory_order_relaxed);
  const auto known = std::lower_bound(known_tids_.begin(), known_tids_.end(), tid);
  if (known != known_tids_.end() && *known == tid) return find(tid);
  if (n >= static_cast<int>(slots_.size())) return -1;
  if (!slots_[n]) slots_[n] = std::make_unique<ThreadSlot>();
  ThreadSlot& slot = *slots_[n];
  slot.counters.close();
  slot.tid = tid;
  slot.cpu_clock = thread_cpu_clock(tid);
  memset(slot.name, 0, sizeof(slot.name));
  memset(slot.last_values, 0, sizeof(slot.last_values));
  slot.last_scaled = slot.last_counted = 0;
  slot.sched_at_stop = SchedStat{};
  slot.quiet_at_read = false;
  slot.activity_at_read = 0;
  char path[64];
  snprintf(path, sizeof(path), "/proc/self/task/%d/comm", static_cast<int>(tid));
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    const ssize_t got = ::read(fd, slot.name, sizeof(slot.name) - 1);
    if (got > 0 && slot.name[got - 1] == '\n') slot.name[got - 1] = '\0';
    ::close(fd);
  }
  // A thread that has already run (an OpenMP worker of an earlier parallel region) joins the
  // team at once, not after its next burst of work is seen.
  slot.sched_at_open = read_schedstat(tid);
  slot.has_run = slot.sched_at_open.ok && slot.sched_at_open.cpu_ns > kJoinedWorkerCpuNs;
  slot.opened_ns = now_ns();
  // Rings are kernel memory: threads past the first 64 (idle pools, mostly) get smaller ones, and
  // a busy one among them loses samples, counted, rather than the process running out of memory.
  // 32 pages still hold a default collector period at the default rate and stack.
  ThreadCounters::Sampling sampling = sampling_;
  if (n >= 64) sampling.ring_pages = std::min<size_t>(sampling.ring_pages, 32);
  slot.counters.open(tid, events_, &slot.open_errno, sampled_ ? &sampling : nullptr, count_by_ring_);
  known_tids_.insert(known, tid);  // within the capacity configure() reserved: no allocation
  size_.store(n + 1, std::memory_order_release);
  return n;
}

int ThreadRegistry::ensure(pid_t tid) {
  std::lock_guard<std::mutex> lock(mutex_);
  return add_locked(tid);
}

int ThreadRegistry::scan(pid_t exclude_tid) {
  // Thread ids are read before taking the lock, so the directory walk never blocks a thread's
  // first op; every thread is listed, however many there are.
  std::vector<pid_t> tids;
  // The directory stays open between scans and is re-read from its start: opening it resolves
  // /proc/self and walks the path, which was most of a scan's cost.
  if (task_dir_fd_ < 0) task_dir_fd_ = ::open("/proc/self/task", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (task_dir_fd_ < 0 || lseek(task_dir_fd_, 0, SEEK_SET) != 0) return 0;
  alignas(8) char buffer[8192];
  while (true) {
    const long got = syscall(SYS_getdents64, task_dir_fd_, buffer, sizeof(buffer));
    if (got <= 0) break;
    for (long at = 0; at < got;) {
      const auto* entry = reinterpret_cast<const dirent64*>(buffer + at);
      at += entry->d_reclen;
      if (entry->d_name[0] < '0' || entry->d_name[0] > '9') continue;
      const pid_t tid = static_cast<pid_t>(atoi(entry->d_name));
      if (tid != exclude_tid && std::find(own_threads_.begin(), own_threads_.end(), tid) == own_threads_.end())
        tids.push_back(tid);
    }
  }
  std::lock_guard<std::mutex> lock(mutex_);
  const int64_t setup_from = thread_cpu_ns();
  int added = 0;
  int beyond = 0;
  for (pid_t tid : tids) {
    if (std::binary_search(known_tids_.begin(), known_tids_.end(), tid)) continue;
    const int before = size_.load(std::memory_order_relaxed);
    const int slot = add_locked(tid);
    if (slot < 0) {
      ++beyond;
    } else if (slot == before) {
      ++added;
    }
  }
  if (beyond > beyond_limit_.load(std::memory_order_relaxed)) beyond_limit_.store(beyond);
  if (added > 0) scan_setup_cpu_ns_.fetch_add(thread_cpu_ns() - setup_from, std::memory_order_relaxed);
  return added;
}

void ThreadRegistry::reset_after_fork() {
  new (&mutex_) std::mutex();
  if (task_dir_fd_ >= 0) ::close(task_dir_fd_);  // the parent's task directory
  task_dir_fd_ = -1;
  const int n = size_.load(std::memory_order_relaxed);
  for (int i = 0; i < n; ++i) slots_[i]->counters.close();
  known_tids_.clear();
  size_.store(0, std::memory_order_release);
}

void ThreadRegistry::close_all() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (task_dir_fd_ >= 0) ::close(task_dir_fd_);
  task_dir_fd_ = -1;
  const int n = size_.load(std::memory_order_relaxed);
  for (int i = 0; i < n; ++i) slots_[i]->counters.close();
}

}  // namespace cpuprof
