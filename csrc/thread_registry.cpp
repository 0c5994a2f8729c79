#include "thread_registry.h"

#include <dirent.h>
#include <fcntl.h>
#include <time.h>
#include <unistd.h>

#include <cstdlib>
#include <new>
#include <cstring>

namespace cpuprof {

int64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
}

void ThreadRegistry::configure(const std::vector<EventSpec>& events, pid_t exclude_tid) {
  std::lock_guard<std::mutex> lock(mutex_);
  events_ = events;
  exclude_tid_ = exclude_tid;
  size_.store(0, std::memory_order_release);
  dropped_.store(0);
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
  for (int i = 0; i < n; ++i) {
    if (slots_[i]->tid == tid) return i;
  }
  if (n >= kMaxThreads) return -1;
  if (!slots_[n]) slots_[n] = std::make_unique<ThreadSlot>();
  ThreadSlot& slot = *slots_[n];
  slot.counters.close();
  slot.tid = tid;
  memset(slot.name, 0, sizeof(slot.name));
  char path[64];
  snprintf(path, sizeof(path), "/proc/self/task/%d/comm", static_cast<int>(tid));
  int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    ssize_t got = ::read(fd, slot.name, sizeof(slot.name) - 1);
    if (got > 0 && slot.name[got - 1] == '\n') slot.name[got - 1] = '\0';
    ::close(fd);
  }
  // sum_exec_runtime from schedstat: a thread that has already run (an OpenMP worker of an
  // earlier parallel region) joins the team at once, not after its next burst of work is seen.
  snprintf(path, sizeof(path), "/proc/self/task/%d/schedstat", static_cast<int>(tid));
  slot.has_run = false;
  fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    char text[64] = {0};
    // More than a thread spends being created: a worker that has done real work.
    if (::read(fd, text, sizeof(text) - 1) > 0) slot.has_run = strtoull(text, nullptr, 10) > 1000000;
    ::close(fd);
  }
  slot.opened_ns = now_ns();
  slot.counters.open(tid, events_, &slot.open_errno);
  size_.store(n + 1, std::memory_order_release);
  return n;
}

int ThreadRegistry::ensure(pid_t tid) {
  std::lock_guard<std::mutex> lock(mutex_);
  return add_locked(tid);
}

int ThreadRegistry::scan() {
  // Thread ids are read before taking the lock so the directory walk never blocks the op path.
  pid_t tids[256];
  int n_tids = 0;
  DIR* dir = opendir("/proc/self/task");
  if (dir == nullptr) return 0;
  while (dirent* entry = readdir(dir)) {
    if (entry->d_name[0] < '0' || entry->d_name[0] > '9') continue;
    if (n_tids < 256) tids[n_tids++] = static_cast<pid_t>(atoi(entry->d_name));
  }
  closedir(dir);
  std::lock_guard<std::mutex> lock(mutex_);
  int added = 0;
  int unmonitored = 0;
  for (int i = 0; i < n_tids; ++i) {
    if (tids[i] == exclude_tid_) continue;
    const int before = size_.load(std::memory_order_relaxed);
    const int slot = add_locked(tids[i]);
    if (slot < 0) ++unmonitored;
    else if (slot == before) ++added;
  }
  // The most threads seen at once beyond kMaxThreads, not a running total over scans.
  if (unmonitored > dropped_.load(std::memory_order_relaxed)) dropped_.store(unmonitored);
  return added;
}

void ThreadRegistry::reset_after_fork() {
  new (&mutex_) std::mutex();
  const int n = size_.load(std::memory_order_relaxed);
  for (int i = 0; i < n; ++i) slots_[i]->counters.close();
  size_.store(0, std::memory_order_release);
}

void ThreadRegistry::close_all() {
  std::lock_guard<std::mutex> lock(mutex_);
  const int n = size_.load(std::memory_order_relaxed);
  for (int i = 0; i < n; ++i) slots_[i]->counters.close();
}

}  // namespace cpuprof
