// The loops of the roof kernels, compiled once per instruction set (isa_passes.inc, built by
// isa_passes_<isa>.cpp with that ISA's compiler flags) and chosen at run time: a roof kernel built
// for the baseline x86-64 alone would read memory with 16-byte loads on a machine with 64-byte ones,
// and its figure would be the compiler's, not the machine's.
#pragma once

#include <cstdint>
#include <string>

namespace cpuprof {

// The triad's scalar: a[i] = b[i] + kTriadScalar * c[i] (its result is checked against it).
constexpr double kTriadScalar = 3.0;

struct StreamArrays {
  double* a;
  double* b;
  double* c;
  int64_t count;  // elements in each array
  int threads;
};

// One instruction set's passes. Every pass runs on an OpenMP team of `threads` with a static
// schedule, so a thread streams the same pages each pass (first-touched by it).
struct IsaPasses {
  const char* name;  // "avx512", "avx2", "sse2"; "generic" off x86-64
  int vector_bytes;  // the widest vector its loops use
  void (*copy)(const StreamArrays&);
  void (*triad)(const StreamArrays&);
  double (*read)(const StreamArrays&);  // the sum of array a: only reads
  // `iterations` rounds of independent fused multiply-adds on f32 vectors held in registers on each
  // thread of a team of `threads` (no memory traffic): the cores' own arithmetic peak. Returns a
  // value computed from every accumulator so the loop cannot be dropped, and the team size the runtime
  // gave in `team`.
  float (*fma)(int64_t iterations, int threads, int* team);
  int64_t fma_flops_per_iteration;  // per thread: accumulators x lanes x 2
};

// The passes for `isa` ("avx512", "avx2", "sse2"); nullptr for an unknown name.
const IsaPasses* isa_passes(const std::string& isa);

// The widest instruction set this CPU runs that is no wider than `at_most` ("" for no limit).
// Throws std::invalid_argument for an unknown `at_most`.
std::string best_isa(const std::string& at_most);

}  // namespace cpuprof
