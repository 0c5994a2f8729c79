#include <stdexcept>

#include "roofs/isa_passes.h"

namespace cpuprof {

#if defined(__x86_64__)
namespace isa_avx512 {
extern const IsaPasses kPasses;
}
namespace isa_avx2 {
extern const IsaPasses kPasses;
}
namespace isa_sse2 {
extern const IsaPasses kPasses;
}
#else
namespace isa_generic {
extern const IsaPasses kPasses;
}
#endif

namespace {

// Widest first; the last is always supported.
struct Level {
  const char* name;
  bool (*supported)();
  const IsaPasses* passes;
};

bool always() { return true; }

#if defined(__x86_64__)
// __builtin_cpu_supports reports an extension only where the OS saves its registers (XCR0), so a
// kernel that masks AVX-512 out of its context is not offered it.
bool has_avx512() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
         __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx2") &&
         __builtin_cpu_supports("fma");
}
bool has_avx2() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

// sse2 is part of x86-64 itself.
const Level kLevels[] = {
    {"avx512", &has_avx512, &isa_avx512::kPasses},
    {"avx2", &has_avx2, &isa_avx2::kPasses},
    {"sse2", &always, &isa_sse2::kPasses},
};
#else
const Level kLevels[] = {{"generic", &always, &isa_generic::kPasses}};
#endif

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
    std::string known;
    for (const Level& level : kLevels) known += std::string(known.empty() ? "" : ", ") + level.name;
    throw std::invalid_argument("unknown instruction set '" + at_most + "' (known here: " + known + ")");
  }
  for (const Level& level : kLevels) {
    if (at_most == level.name) allowed = true;
    if (allowed && level.supported()) return level.name;
  }
  return kLevels[sizeof(kLevels) / sizeof(kLevels[0]) - 1].name;
}

}  // namespace cpuprof
