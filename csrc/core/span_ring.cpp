#include "core/span_ring.h"

namespace cpuprof {

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
