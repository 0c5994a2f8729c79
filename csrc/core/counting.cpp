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

void CountingContext::charge(uint32_t entry, const DispatchState* state, int innermost, int slot, int event,
                             uint64_t delta) {
  table->counter(entry, slot, event, true).fetch_add(delta, std::memory_order_relaxed);
  if (state == nullptr || innermost < 0) {
    table->counter(entry, slot, event, false).fetch_add(delta, std::memory_order_relaxed);
    return;
  }
  for (int d = 0; d <= innermost; ++d) {
    const uint32_t e = state->frames[d].entry;
    bool seen = false;  // an entry on the stack twice (recursion) is charged once inclusively
    for (int k = 0; k < d && !seen; ++k) seen = state->frames[k].entry == e;
    if (!seen) table->counter(e, slot, event, false).fetch_add(delta, std::memory_order_relaxed);
  }
}

}  // namespace cpuprof
