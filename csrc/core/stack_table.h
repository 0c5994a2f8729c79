// Native stacks and op paths of the samples: each distinct one stored once, and per (stack,
// thread, op path) the samples and the counter deltas that landed on it; plus the newest samples
// one by one, for timelines.
//
// Written by the collector thread only (under the sampler's lock, which snapshots also take);
// every table has a fixed capacity set at start, and what does not fit is counted, not lost
// silently: a stack that does not fit is kept as its leaf alone, a path as its innermost op.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/limits.h"

namespace cpuprof {

constexpr uint32_t kEmptySequence = 0;  // the empty stack / path

// Distinct sequences (of PCs, of op entries), interned: id 1..n, 0 for the empty one.
template <typename T>
class SequenceTable {
 public:
  void init(size_t max_sequences, size_t max_items);
  uint32_t intern(const T* items, int n);  // kEmptySequence when it does not fit (and n == 1 does not)
  size_t size() const { return offsets_.size() - 1; }
  void items_of(uint32_t id, const T** items, int* n) const;
  uint64_t truncated() const { return truncated_; }
  size_t memory_bytes() const;

 private:
  size_t max_sequences_ = 0, max_items_ = 0;
  std::vector<T> items_;
  std::vector<uint32_t> offsets_;   // id -> start in items_ (one more than sequences)
  std::vector<uint64_t> hashes_;    // id -> hash
  std::vector<uint32_t> index_;     // open addressing: slot -> id (0 free)
  uint64_t truncated_ = 0;
};

struct StackCount {
  uint32_t stack = 0;
  uint32_t path = 0;  // the op path (outermost first) the sample's thread worked for
  int32_t slot = 0;
  uint32_t entry = 0;  // the innermost op of the path (or a special entry)
  uint64_t samples = 0;
  uint64_t values[kMaxEvents] = {};  // per event: the deltas these samples stand for
};

struct TimelineSample {
  int64_t time_ns;
  int32_t slot;
  uint32_t entry;
  uint32_t stack;
  uint32_t path;    // the op path, as in StackCount
  uint32_t cpu_us;  // CPU time the sample stands for (its task-clock delta), in µs
};

class StackTable {
 public:
  void init(size_t max_stacks, size_t max_frames, size_t max_counts, size_t timeline_capacity);
  uint32_t intern_stack(const uint64_t* pcs, int n) { return stacks_.intern(pcs, n); }  // leaf first
  uint32_t intern_path(const uint32_t* entries, int n) { return paths_.intern(entries, n); }  // outermost first
  void count(uint32_t stack, uint32_t path, int slot, uint32_t entry, const uint64_t* values, int n_values);
  void record(const TimelineSample& sample);

  // Read-out (under the sampler's lock).
  const SequenceTable<uint64_t>& stacks() const { return stacks_; }
  const SequenceTable<uint32_t>& paths() const { return paths_; }
  const std::vector<StackCount>& counts() const { return counts_; }
  std::vector<TimelineSample> timeline() const;  // oldest first
  uint64_t counts_dropped() const { return counts_dropped_; }
  uint64_t timeline_dropped() const {
    return timeline_written_ > timeline_.size() ? timeline_written_ - timeline_.size() : 0;
  }
  size_t memory_bytes() const;

 private:
  SequenceTable<uint64_t> stacks_;
  SequenceTable<uint32_t> paths_;
  size_t max_counts_ = 0;
  std::vector<StackCount> counts_;
  std::vector<uint32_t> count_index_;  // open addressing: slot -> index into counts_ + 1 (0 free)
  std::vector<TimelineSample> timeline_;
  size_t timeline_capacity_ = 0;
  uint64_t timeline_written_ = 0;
  uint64_t counts_dropped_ = 0;
};

}  // namespace cpuprof
