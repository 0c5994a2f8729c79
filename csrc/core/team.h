// The team: the threads whose counters an op's accounting reads.
//
// Reading a thread costs a read() (about 1 µs, and an interrupt of its CPU when it runs), and a
// process carries threads that never run (signal handlers, idle pools), so only threads that have
// done work since the session started are read. Membership only grows during a session, which
// makes two cheap representations possible at once: a bitset sized at start for "is slot s in
// the team", and an append-only list in join order, so that "the team as it was when this op
// began" is just a prefix length. Both are lock-free; joins come from the collection loop and
// from a thread's own first op.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>

namespace cpuprof {

class TeamSet {
 public:
  void reset(int max_slots) {
    n_words_ = (max_slots + 63) / 64;
    capacity_ = max_slots;
    members_.reset(new std::atomic<uint64_t>[n_words_]);
    dispatch_.reset(new std::atomic<uint64_t>[n_words_]);
    for (int i = 0; i < n_words_; ++i) {
      members_[i].store(0, std::memory_order_relaxed);
      dispatch_[i].store(0, std::memory_order_relaxed);
    }
    order_.reset(new std::atomic<int>[max_slots]);
    size_.store(0, std::memory_order_release);
  }

  // Adds `slot` (once); returns true when it was new.
  bool join(int slot) {
    if (slot < 0 || slot >= capacity_) return false;
    std::lock_guard<std::mutex> lock(join_mutex_);  // joins are rare: once per thread
    const uint64_t bit = 1ULL << (slot & 63);
    if (members_[slot >> 6].load(std::memory_order_relaxed) & bit) return false;
    const int n = size_.load(std::memory_order_relaxed);
    order_[n].store(slot, std::memory_order_relaxed);
    members_[slot >> 6].fetch_or(bit, std::memory_order_release);
    size_.store(n + 1, std::memory_order_release);
    return true;
  }
  bool contains(int slot) const {
    return slot >= 0 && slot < capacity_ &&
           ((members_[slot >> 6].load(std::memory_order_acquire) >> (slot & 63)) & 1ULL);
  }
  // Members in join order: member(i) for i < size().
  int size() const { return size_.load(std::memory_order_acquire); }
  int member(int i) const { return order_[i].load(std::memory_order_relaxed); }

  // Threads that run ops of their own: their counters belong to their own ops, never to another
  // dispatching thread's.
  void mark_dispatch(int slot) {
    if (slot >= 0 && slot < capacity_) dispatch_[slot >> 6].fetch_or(1ULL << (slot & 63), std::memory_order_release);
  }
  bool is_dispatch(int slot) const {
    return slot >= 0 && slot < capacity_ &&
           ((dispatch_[slot >> 6].load(std::memory_order_acquire) >> (slot & 63)) & 1ULL);
  }
  int capacity() const { return capacity_; }

 private:
  std::unique_ptr<std::atomic<uint64_t>[]> members_;
  std::unique_ptr<std::atomic<uint64_t>[]> dispatch_;
  std::unique_ptr<std::atomic<int>[]> order_;
  std::atomic<int> size_{0};
  int n_words_ = 0;
  int capacity_ = 0;
  std::mutex join_mutex_;
};

}  // namespace cpuprof
