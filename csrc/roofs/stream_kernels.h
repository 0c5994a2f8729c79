// STREAM-style memory bandwidth kernels, the measured memory roof of a profile.
//
// Native rather than numpy or torch: their element-wise kernels allocate temporaries, run their
// own threading and count traffic differently; STREAM's figures are what people compare against,
// so these follow its rules (one array per operand, every array far larger than the caches, the
// bytes of the named arrays counted, write-allocate traffic not).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace cpuprof {

// Runs `kernel` ("copy": c[i] = a[i]; "triad": a[i] = b[i] + s * c[i]; "read": the sum of a[i]) over arrays of
// `array_bytes` bytes each, on an OpenMP team of `threads`, and returns the wall seconds of each
// of `repetitions` passes (a first, untimed pass warms caches, TLBs and the thread team).
// Throws std::invalid_argument for an unknown kernel, zero threads or repetitions, or arrays
// smaller than one element; std::bad_alloc (with the sizes in its message) when the arrays cannot
// be allocated or would not fit in physical memory; std::runtime_error when the runtime gives a
// smaller team than asked or the results are wrong. `isa` picks the build of the loops ("avx512",
// "avx2", "sse2"; "" for the widest this CPU runs); one this CPU cannot run is invalid_argument.
std::vector<double> stream_seconds(const std::string& kernel, size_t array_bytes, int threads, int repetitions,
                                   const std::string& isa);

// Seconds of each of `repetitions` runs of `iterations` rounds of register-only f32 FMAs on every
// thread of a team of `threads` (a first, untimed run starts the team): the arithmetic peak the
// cores reach with `isa`'s vectors, as likwid-bench's peakflops measures it.
std::vector<double> fma_seconds(const std::string& isa, int threads, int64_t iterations, int repetitions);

// Floating-point operations one thread does per iteration of fma_seconds' loop with `isa`.
int64_t fma_flops_per_iteration(const std::string& isa);

// The instruction set the roof kernels use: the widest this CPU runs, no wider than `at_most`.
std::string roofs_isa(const std::string& at_most);

}  // namespace cpuprof
