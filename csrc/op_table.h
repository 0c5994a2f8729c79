// Bounded aggregates per op key, and a bounded ring of op spans.
//
// The key is (op name, input shapes and dtypes, enclosing region). Its text is formatted once,
// into fixed buffers, when the key is first seen; every later call only hashes and bumps atomics,
// so the steady state allocates nothing and takes no lock. When the table is full, new keys fall
// into one overflow entry and the profile says how many were folded there.
#pragma once

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>

namespace cpuprof {

enum class EntryKind : uint8_t { Op = 0, Region = 1, Special = 2 };

struct OpEntry {
  std::atomic<uint64_t> key{0};     // 0 = free
  std::atomic<uint32_t> ready{0};   // text written
  EntryKind kind = EntryKind::Op;
  uint32_t region = 0;              // entry index of the enclosing region, 0 = none
  char name[96] = {0};
  char shapes[224] = {0};
  std::atomic<uint64_t> calls{0};
  std::atomic<uint64_t> incl_ns{0};
  std::atomic<uint64_t> self_ns{0};
  std::atomic<uint64_t> max_ns{0};
  std::atomic<uint64_t> samples{0};  // sampler ticks that found this op innermost (sampled mode)
};

// Fixed entries, so reports can find them by index.
constexpr uint32_t kOverflowEntry = 0;  // keys that did not fit
constexpr uint32_t kOutsideEntry = 1;   // sampled counts taken while no op was running

class OpTable {
 public:
  void init(int capacity, int n_thread_slots, int n_events);
  void reset();

  // Returns the entry for `hash`, inserting it with the text `fill` writes when it is new.
  template <typename Fill>
  uint32_t find_or_insert(uint64_t hash, Fill&& fill) {
    hash |= 1;  // 0 marks a free entry
    const uint32_t mask = static_cast<uint32_t>(capacity_ - 1);
    uint32_t index = static_cast<uint32_t>(hash ^ (hash >> 29)) & mask;
    for (int probe = 0; probe < max_probe_; ++probe, index = (index + 1) & mask) {
      if (index <= kOutsideEntry) continue;
      OpEntry& entry = entries_[index];
      uint64_t seen = entry.key.load(std::memory_order_acquire);
      if (seen == hash) return index;
      if (seen == 0) {
        if (used_.load(std::memory_order_relaxed) >= capacity_ * 3 / 4) break;
        uint64_t expected = 0;
        if (entry.key.compare_exchange_strong(expected, hash, std::memory_order_acq_rel)) {
          used_.fetch_add(1, std::memory_order_relaxed);
          fill(entry);
          entry.ready.store(1, std::memory_order_release);
          return index;
        }
        if (expected == hash) return index;
      }
    }
    overflowed_.fetch_add(1, std::memory_order_relaxed);
    return kOverflowEntry;
  }

  OpEntry& entry(uint32_t index) { return entries_[index]; }
  const OpEntry& entry(uint32_t index) const { return entries_[index]; }
  int capacity() const { return capacity_; }
  int n_events() const { return n_events_; }
  int n_thread_slots() const { return n_thread_slots_; }
  uint64_t overflowed() const { return overflowed_.load(std::memory_order_relaxed); }

  // Counter totals per (entry, thread slot, event), inclusive and self.
  std::atomic<uint64_t>& counter(uint32_t entry, int slot, int event, bool self) {
    return counters_[((static_cast<size_t>(entry) * n_thread_slots_ + slot) * n_events_ + event) * 2 + self];
  }
  uint64_t counter_value(uint32_t entry, int slot, int event, bool self) const {
    return counters_[((static_cast<size_t>(entry) * n_thread_slots_ + slot) * n_events_ + event) * 2 + self]
        .load(std::memory_order_relaxed);
  }

  size_t memory_bytes() const;

 private:
  std::unique_ptr<OpEntry[]> entries_;
  struct FreeDeleter {
    void operator()(std::atomic<uint64_t>* p) const { std::free(p); }
  };
  // calloc, not new[]: the kernel hands out zero pages lazily, so a large table costs resident
  // memory only for the (entry, thread) cells an op actually touches.
  std::unique_ptr<std::atomic<uint64_t>[], FreeDeleter> counters_;
  int capacity_ = 0;
  int max_probe_ = 64;
  int n_thread_slots_ = 0;
  int n_events_ = 0;
  std::atomic<int> used_{0};
  std::atomic<uint64_t> overflowed_{0};
};

// One op span with the inclusive counter deltas of the whole team, summed over threads.
struct SpanRecord {
  uint32_t entry;
  uint16_t thread_slot;
  uint16_t depth;
  int64_t start_ns;
  int64_t dur_ns;
};

// Keeps the most recent `capacity` spans of one dispatching thread. One ring per thread, so each
// has a single producer and no two writers can ever meet on a record, however small the ring.
// It is read after the session stopped (or as a best-effort checkpoint while it runs).
class SpanRing {
 public:
  void init(size_t capacity, int n_events);
  bool enabled() const { return capacity_ > 0; }
  // Returns the next record (overwriting the oldest) and its counter array, to fill in place;
  // publish() then makes it visible, so a checkpoint never reads a half-written record.
  SpanRecord* claim(uint64_t** counters) {
    const size_t slot = next_.load(std::memory_order_relaxed) % capacity_;
    *counters = counters_.get() + slot * n_events_;
    return &records_[slot];
  }
  void publish() { next_.store(next_.load(std::memory_order_relaxed) + 1, std::memory_order_release); }
  uint64_t written() const { return next_.load(std::memory_order_acquire); }
  size_t capacity() const { return capacity_; }
  uint64_t dropped() const { uint64_t w = written(); return w > capacity_ ? w - capacity_ : 0; }
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
