#include "core/counting.h"

namespace cpuprof {

std::unique_ptr<CountingStrategy> make_exact_counting(CountingContext& context, const CountingOptions& options);
std::unique_ptr<CountingStrategy> make_sampled_counting(CountingContext& context, const CountingOptions& options);

std::unique_ptr<CountingStrategy> make_counting_strategy(CountingContext& context, const CountingOptions& options) {
  switch (options.mode) {
    case CountingMode::Exact: return make_exact_counting(context, options);
    case CountingMode::Sampled: return make_sampled_counting(context, options);
  }
  return nullptr;
}

void CountingContext::charge(const uint32_t* path, int depth, int slot, int event, uint64_t delta) {
  if (depth <= 0) {
    table->counter(kOutsideEntry, slot, event, true).fetch_add(delta, std::memory_order_relaxed);
    table->counter(kOutsideEntry, slot, event, false).fetch_add(delta, std::memory_order_relaxed);
    return;
  }
  table->counter(path[depth - 1], slot, event, true).fetch_add(delta, std::memory_order_relaxed);
  for (int d = 0; d < depth; ++d) {
    bool seen = false;  // an entry on the stack twice (recursion) is charged once inclusively
    for (int k = 0; k < d && !seen; ++k) seen = path[k] == path[d];
    if (!seen) table->counter(path[d], slot, event, false).fetch_add(delta, std::memory_order_relaxed);
  }
}

}  // namespace cpuprof
