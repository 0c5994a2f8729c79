#include "core/stack_table.h"

#include <algorithm>

#include "common/hash.h"

namespace cpuprof {

namespace {

size_t pow2_at_least(size_t n) {
  size_t p = 16;
  while (p < n) p <<= 1;
  return p;
}

}  // namespace

template <typename T>
void SequenceTable<T>::init(size_t max_sequences, size_t max_items) {
  max_sequences_ = max_sequences;
  max_items_ = max_items;
  items_.clear();
  items_.reserve(std::min<size_t>(max_items, 1 << 16));
  offsets_.assign(1, 0);
  hashes_.assign(1, 0);
  index_.assign(pow2_at_least(max_sequences * 2), 0);
  truncated_ = 0;
}

template <typename T>
uint32_t SequenceTable<T>::intern(const T* items, int n) {
  if (n <= 0) return kEmptySequence;
  for (int attempt = 0; attempt < 2; ++attempt) {
    uint64_t h = 0xcbf29ce484222325ULL ^ static_cast<uint64_t>(n);
    for (int i = 0; i < n; ++i) h = mix_hash(h, static_cast<uint64_t>(items[i]));
    h |= 1;
    const size_t mask = index_.size() - 1;
    for (size_t i = h & mask;; i = (i + 1) & mask) {
      const uint32_t id = index_[i];
      if (id == 0) {
        if (size() < max_sequences_ && items_.size() + n <= max_items_) {
          items_.insert(items_.end(), items, items + n);
          offsets_.push_back(static_cast<uint32_t>(items_.size()));
          hashes_.push_back(h);
          const uint32_t new_id = static_cast<uint32_t>(size());
          index_[i] = new_id;
          return new_id;
        }
        break;
      }
      if (hashes_[id] == h && offsets_[id] - offsets_[id - 1] == static_cast<uint32_t>(n) &&
          std::equal(items, items + n, items_.begin() + offsets_[id - 1]))
        return id;
    }
    ++truncated_;
    if (n == 1) return kEmptySequence;
    // What stands for it: a stack's leaf (the function the CPU was in), a path's innermost op.
    items = sizeof(T) == sizeof(uint64_t) ? items : items + (n - 1);
    n = 1;
  }
  return kEmptySequence;
}

template <typename T>
void SequenceTable<T>::items_of(uint32_t id, const T** items, int* n) const {
  if (id == kEmptySequence || id > size()) {
    *items = nullptr;
    *n = 0;
    return;
  }
  *items = items_.data() + offsets_[id - 1];
  *n = static_cast<int>(offsets_[id] - offsets_[id - 1]);
}

template <typename T>
size_t SequenceTable<T>::memory_bytes() const {
  return items_.capacity() * sizeof(T) + offsets_.capacity() * sizeof(uint32_t) + hashes_.capacity() * sizeof(uint64_t) +
         index_.capacity() * sizeof(uint32_t);
}

template class SequenceTable<uint64_t>;
template class SequenceTable<uint32_t>;

void StackTable::init(size_t max_stacks, size_t max_frames, size_t max_counts, size_t timeline_capacity) {
  stacks_.init(max_stacks, max_frames);
  paths_.init(max_stacks, max_stacks * 8);
  max_counts_ = max_counts;
  counts_.clear();
  count_index_.assign(pow2_at_least(max_counts * 2), 0);
  timeline_ = std::vector<TimelineSample>();
  timeline_.reserve(timeline_capacity);
  timeline_capacity_ = timeline_capacity;
  timeline_written_ = 0;
  counts_dropped_ = 0;
}

void StackTable::count(uint32_t stack, uint32_t path, int slot, uint32_t entry, const uint64_t* values, int n_values) {
  const uint64_t h = mix_hash(mix_hash(mix_hash(mix_hash(0x51ed, stack), path), static_cast<uint64_t>(slot)), entry);
  const size_t mask = count_index_.size() - 1;
  for (size_t i = h & mask;; i = (i + 1) & mask) {
    const uint32_t at = count_index_[i];
    StackCount* c = nullptr;
    if (at == 0) {
      if (counts_.size() >= max_counts_) {
        ++counts_dropped_;
        return;
      }
      counts_.push_back(StackCount{});
      c = &counts_.back();
      c->stack = stack;
      c->path = path;
      c->slot = slot;
      c->entry = entry;
      count_index_[i] = static_cast<uint32_t>(counts_.size());
    } else {
      StackCount& existing = counts_[at - 1];
      if (existing.stack != stack || existing.path != path || existing.slot != slot || existing.entry != entry) continue;
      c = &existing;
    }
    ++c->samples;
    for (int e = 0; e < n_values && e < kMaxEvents; ++e) c->values[e] += values[e];
    return;
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
  if (timeline_written_ <= timeline_.size()) return timeline_;
  std::vector<TimelineSample> out;
  const size_t cap = timeline_.size();
  const size_t first = timeline_written_ % cap;
  out.reserve(cap);
  for (size_t j = 0; j < cap; ++j) out.push_back(timeline_[(first + j) % cap]);
  return out;
}

size_t StackTable::memory_bytes() const {
  return stacks_.memory_bytes() + paths_.memory_bytes() + counts_.capacity() * sizeof(StackCount) +
         count_index_.capacity() * sizeof(uint32_t) + timeline_.capacity() * sizeof(TimelineSample);
}

}  // namespace cpuprof
