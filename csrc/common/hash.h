// One hash combiner for the core's keys: op keys, interned stacks and op paths.
#pragma once

#include <cstdint>

namespace cpuprof {

inline uint64_t mix_hash(uint64_t h, uint64_t v) {
  h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
  return h * 0xff51afd7ed558ccdULL;
}

}  // namespace cpuprof
