#include <stdexcept>

#include "roofs/isa_passes.h"

namespace cpuprof {

namespace isa_avx512 {
extern const IsaPasses kPasses;
}
namespace isa_avx2 {
extern const IsaPasses kPasses;
}
namespace isa_sse2 {
extern const IsaPasses kPasses;
}

namespace {

// Widest first. sse2 is part of x86-64 itself.
struct Level {
  const char* name;
  bool (*supported)();
  const IsaPasses* passes;
};

bool has_avx512() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
         __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512bw");
}
bool has_avx2() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}
bool always() { return true; }

const Level kLevels[] = {
    {"avx512", &has_avx512, &isa_avx512::kPasses},
    {"avx2", &has_avx2, &isa_avx2::kPasses},
    {"sse2", &always, &isa_sse2::kPasses},
};

}  // namespace

const IsaPasses* isa_passes(const std::string& isa) {
  for (const Level& level : kLevels) {
    if (isa == level.name) return level.passes;
  }
  return nullptr;
}

std::string best_isa(const std::string& at_most) {
  bool allowed = at_most.empty();
  if (!allowed && isa_passes(at_most) == nullptr) {
    throw std::invalid_argument("unknown instruction set '" + at_most + "' (known: avx512, avx2, sse2)");
  }
  for (const Level& level : kLevels) {
    if (at_most == level.name) allowed = true;
    if (allowed && level.supported()) return level.name;
  }
  return "sse2";
}

}  // namespace cpuprof
