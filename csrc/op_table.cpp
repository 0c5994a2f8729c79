#include "op_table.h"

namespace cpuprof {

void OpTable::init(int capacity, int n_thread_slots, int n_events) {
  int rounded = 16;
  while (rounded < capacity) rounded <<= 1;  // power of two for mask probing
  capacity_ = rounded;
  n_thread_slots_ = n_thread_slots;
  n_events_ = n_events > 0 ? n_events : 1;
  entries_ = std::make_unique<OpEntry[]>(capacity_);
  counters_.reset(static_cast<std::atomic<uint64_t>*>(std::calloc(
      static_cast<size_t>(capacity_) * n_thread_slots_ * n_events_ * 2, sizeof(std::atomic<uint64_t>))));
  reset();
}

void OpTable::reset() {
  used_.store(2);
  overflowed_.store(0);
  std::strcpy(entries_[kOverflowEntry].name, "[other ops: op table full]");
  entries_[kOverflowEntry].kind = EntryKind::Special;
  entries_[kOverflowEntry].key.store(~0ULL);
  entries_[kOverflowEntry].ready.store(1);
  std::strcpy(entries_[kOutsideEntry].name, "[outside ATen ops]");
  entries_[kOutsideEntry].kind = EntryKind::Special;
  entries_[kOutsideEntry].key.store(~1ULL);
  entries_[kOutsideEntry].ready.store(1);
}

size_t OpTable::memory_bytes() const {
  return static_cast<size_t>(capacity_) * sizeof(OpEntry) +
         static_cast<size_t>(capacity_) * n_thread_slots_ * n_events_ * 2 * sizeof(uint64_t);
}

void SpanRing::init(size_t capacity, int n_events) {
  capacity_ = capacity;
  n_events_ = n_events > 0 ? n_events : 1;
  next_.store(0);
  if (capacity_ == 0) {
    records_.reset();
    counters_.reset();
    return;
  }
  // new[] without value-initialisation: only the records a thread writes become resident.
  records_.reset(new SpanRecord[capacity_]);
  counters_.reset(new uint64_t[capacity_ * n_events_]);
}

}  // namespace cpuprof
