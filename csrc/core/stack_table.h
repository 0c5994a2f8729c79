// Native stacks of the samples: each distinct stack stored once, and per (stack, thread, op) the
// samples and CPU time that landed on it; plus the newest samples one by one, for timelines.
//
// Written by the collector thread only (under the sampler's lock, which snapshots also take);
// every table has a fixed capacity set at start, and what does not fit is counted, not lost
// silently: a stack that does not fit is kept as its leaf alone.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace cpuprof {

constexpr uint32_t kNoStack = 0;  // a sample without a usable stack

struct StackCount {
  uint32_t stack = 0;
  int32_t slot = 0;
  uint32_t entry = 0;
  uint64_t samples = 0;
  uint64_t cpu_ns = 0;
};

struct TimelineSample {
  int64_t time_ns;
  int32_t slot;
  uint32_t entry;
  uint32_t stack;
  uint32_t cpu_us;  // CPU time the sample stands for (its task-clock delta), in µs
};

class StackTable {
 public:
  void init(size_t max_stacks, size_t max_frames, size_t max_counts, size_t timeline_capacity);
  uint32_t intern(const uint64_t* pcs, int n);  // leaf first
  void count(uint32_t stack, int slot, uint32_t entry, uint64_t cpu_ns);
  void record(const TimelineSample& sample);

  // Read-out (under the sampler's lock).
  size_t n_stacks() const { return offsets_.size() - 1; }  // ids 1..n; 0 is kNoStack
  void frames_of(uint32_t stack, const uint64_t** pcs, int* n) const;
  const std::vector<StackCount>& counts() const { return counts_; }
  std::vector<TimelineSample> timeline() const;  // oldest first
  uint64_t stacks_truncated() const { return stacks_truncated_; }
  uint64_t counts_dropped() const { return counts_dropped_; }
  uint64_t timeline_dropped() const { return timeline_written_ > timeline_.size() ? timeline_written_ - timeline_.size() : 0; }
  size_t memory_bytes() const;

 private:
  static uint64_t hash_frames(const uint64_t* pcs, int n);
  size_t max_stacks_ = 0, max_frames_ = 0, max_counts_ = 0;
  std::vector<uint64_t> frames_;      // every stack's PCs, back to back
  std::vector<uint32_t> offsets_;     // stack id -> start in frames_ (one more than stacks)
  std::vector<uint64_t> stack_hash_;  // stack id -> hash
  std::vector<uint32_t> stack_index_; // open addressing: hash slot -> stack id (0 free)
  std::vector<StackCount> counts_;
  std::vector<uint32_t> count_index_; // open addressing: slot -> index into counts_ + 1 (0 free)
  std::vector<TimelineSample> timeline_;
  size_t timeline_capacity_ = 0;
  uint64_t timeline_written_ = 0;
  uint64_t stacks_truncated_ = 0, counts_dropped_ = 0;
};

}  // namespace cpuprof
