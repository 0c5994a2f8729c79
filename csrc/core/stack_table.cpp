#include "core/stack_table.h"

#include <algorithm>

namespace cpuprof {

namespace {

size_t pow2_at_least(size_t n) {
  size_t p = 16;
  while (p < n) p <<= 1;
  return p;
}

uint64_t mix(uint64_t h, uint64_t v) {
  h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
  return h * 0xff51afd7ed558ccdULL;
}

}  // namespace

void StackTable::init(size_t max_stacks, size_t max_frames, size_t max_counts, size_t timeline_capacity) {
  max_stacks_ = max_stacks;
  max_frames_ = max_frames;
  max_counts_ = max_counts;
  frames_.clear();
  frames_.reserve(std::min<size_t>(max_frames, 1 << 16));
  offsets_.assign(1, 0);
  stack_hash_.assign(1, 0);
  stack_index_.assign(pow2_at_least(max_stacks * 2), 0);
  counts_.clear();
  count_index_.assign(pow2_at_least(max_counts * 2), 0);
  timeline_ = std::vector<TimelineSample>();
  timeline_.reserve(timeline_capacity);
  timeline_capacity_ = timeline_capacity;
  timeline_written_ = 0;
  stacks_truncated_ = counts_dropped_ = 0;
}

uint64_t StackTable::hash_frames(const uint64_t* pcs, int n) {
  uint64_t h = 0xcbf29ce484222325ULL ^ static_cast<uint64_t>(n);
  for (int i = 0; i < n; ++i) h = mix(h, pcs[i]);
  return h | 1;
}

uint32_t StackTable::intern(const uint64_t* pcs, int n) {
  if (n <= 0) return kNoStack;
  for (int attempt = 0; attempt < 2; ++attempt) {
    const uint64_t h = hash_frames(pcs, n);
    const size_t mask = stack_index_.size() - 1;
    for (size_t i = h & mask;; i = (i + 1) & mask) {
      const uint32_t id = stack_index_[i];
      if (id == 0) {
        // New: stored if it fits, else (second attempt) its leaf alone stands for it.
        if (n_stacks() < max_stacks_ && frames_.size() + n <= max_frames_) {
          frames_.insert(frames_.end(), pcs, pcs + n);
          offsets_.push_back(static_cast<uint32_t>(frames_.size()));
          stack_hash_.push_back(h);
          const uint32_t new_id = static_cast<uint32_t>(n_stacks());
          stack_index_[i] = new_id;
          return new_id;
        }
        break;
      }
      if (stack_hash_[id] == h && offsets_[id] - offsets_[id - 1] == static_cast<uint32_t>(n) &&
          std::equal(pcs, pcs + n, frames_.begin() + offsets_[id - 1]))
        return id;
    }
    ++stacks_truncated_;
    if (n == 1) return kNoStack;
    n = 1;  // the leaf alone: the function the CPU was in
  }
  return kNoStack;
}

void StackTable::frames_of(uint32_t stack, const uint64_t** pcs, int* n) const {
  if (stack == kNoStack || stack > n_stacks()) {
    *pcs = nullptr;
    *n = 0;
    return;
  }
  *pcs = frames_.data() + offsets_[stack - 1];
  *n = static_cast<int>(offsets_[stack] - offsets_[stack - 1]);
}

void StackTable::count(uint32_t stack, int slot, uint32_t entry, uint64_t cpu_ns) {
  const uint64_t h = mix(mix(mix(0x51ed, stack), static_cast<uint64_t>(slot)), entry);
  const size_t mask = count_index_.size() - 1;
  for (size_t i = h & mask;; i = (i + 1) & mask) {
    const uint32_t at = count_index_[i];
    if (at == 0) {
      if (counts_.size() >= max_counts_) {
        ++counts_dropped_;
        return;
      }
      counts_.push_back(StackCount{stack, slot, entry, 1, cpu_ns});
      count_index_[i] = static_cast<uint32_t>(counts_.size());
      return;
    }
    StackCount& c = counts_[at - 1];
    if (c.stack == stack && c.slot == slot && c.entry == entry) {
      ++c.samples;
      c.cpu_ns += cpu_ns;
      return;
    }
  }
}

void StackTable::record(const TimelineSample& sample) {
  if (timeline_capacity_ == 0) return;
  if (timeline_.size() < timeline_capacity_) {
    timeline_.push_back(sample);
  } else {
    timeline_[timeline_written_ % timeline_capacity_] = sample;
  }
  ++timeline_written_;
}

std::vector<TimelineSample> StackTable::timeline() const {
  std::vector<TimelineSample> out;
  if (timeline_written_ <= timeline_.size()) return timeline_;
  const size_t cap = timeline_.size();
  const size_t first = timeline_written_ % cap;
  out.reserve(cap);
  for (size_t j = 0; j < cap; ++j) out.push_back(timeline_[(first + j) % cap]);
  return out;
}

size_t StackTable::memory_bytes() const {
  return frames_.capacity() * sizeof(uint64_t) + offsets_.capacity() * sizeof(uint32_t) +
         stack_hash_.capacity() * sizeof(uint64_t) + stack_index_.capacity() * sizeof(uint32_t) +
         counts_.capacity() * sizeof(StackCount) + count_index_.capacity() * sizeof(uint32_t) +
         timeline_.capacity() * sizeof(TimelineSample);
}

}  // namespace cpuprof
