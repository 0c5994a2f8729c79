// A bounded ring of op spans per dispatching thread: the optional timeline.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>

namespace cpuprof {

// One op span; its counters (exact mode) are the inclusive deltas of the team, summed over threads.
struct SpanRecord {
  uint32_t entry;
  int32_t thread_slot;
  uint16_t depth;
  int64_t start_ns;
  int64_t dur_ns;
};

// Keeps the most recent `capacity` spans of one dispatching thread. One ring per thread, so each
// has a single producer and no two writers can ever meet on a record, however small the ring.
// It is read after the session stopped.
class SpanRing {
 public:
  void init(size_t capacity, int n_events);
  bool enabled() const { return capacity_ > 0; }
  // Returns the next record (overwriting the oldest) and its counter array, to fill in place;
  // publish() then makes it visible.
  SpanRecord* claim(uint64_t** counters) {
    const size_t slot = next_.load(std::memory_order_relaxed) % capacity_;
    *counters = counters_.get() + slot * n_events_;
    return &records_[slot];
  }
  void publish() { next_.store(next_.load(std::memory_order_relaxed) + 1, std::memory_order_release); }
  uint64_t written() const { return next_.load(std::memory_order_acquire); }
  size_t capacity() const { return capacity_; }
  uint64_t dropped() const {
    const uint64_t w = written();
    return w > capacity_ ? w - capacity_ : 0;
  }
  const SpanRecord& record(size_t i) const { return records_[i]; }
  const uint64_t* counters(size_t i) const { return counters_.get() + i * n_events_; }
  int n_events() const { return n_events_; }
  size_t memory_bytes() const { return capacity_ * (sizeof(SpanRecord) + sizeof(uint64_t) * n_events_); }

 private:
  std::unique_ptr<SpanRecord[]> records_;
  std::unique_ptr<uint64_t[]> counters_;
  size_t capacity_ = 0;
  int n_events_ = 0;
  std::atomic<uint64_t> next_{0};
};

}  // namespace cpuprof
