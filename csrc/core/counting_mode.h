// How a session's counters reach ops (see core/counting.h); crossed to Python as an enum
// (cpuprof._native.CountingMode), never as a string.
#pragma once

#include <cstdint>

#include "common/enum_list.h"

namespace cpuprof {

#define CPUPROF_COUNTING_MODES(X) \
  X(Exact, 0, "exact")            \
  X(Sampled, 1, "sampled")
enum class CountingMode : uint8_t { CPUPROF_COUNTING_MODES(CPUPROF_ENUM_VALUE) };

}  // namespace cpuprof
