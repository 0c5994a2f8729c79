// How a session's counters reach ops (see core/counting.h); crossed to Python as an enum
// (cpuprof._native.CountingMode), never as a string.
#pragma once

#include <cstdint>

namespace cpuprof {

enum class CountingMode : uint8_t { Exact = 0, Sampled = 1 };

}  // namespace cpuprof
