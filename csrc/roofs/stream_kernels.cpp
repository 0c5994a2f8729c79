#include "roofs/stream_kernels.h"

#include "roofs/isa_passes.h"

#include <omp.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>
#include <utility>

namespace cpuprof {

namespace {

// 2 MiB: arrays start on a huge-page boundary, so transparent huge pages (where enabled) can back
// them from the first byte and TLB misses do not depend on where malloc happened to put them.
constexpr size_t kAlignment = size_t{2} << 20;
constexpr double kA = 1.0, kB = 2.0, kC = 0.5;

// bad_alloc becomes MemoryError in Python; the plain one says nothing about how much was asked.
class ArrayAllocError : public std::bad_alloc {
 public:
  explicit ArrayAllocError(std::string message) : message_(std::move(message)) {}
  const char* what() const noexcept override { return message_.c_str(); }

 private:
  std::string message_;
};

struct FreeDeleter {
  void operator()(double* p) const { std::free(p); }
};
using Array = std::unique_ptr<double[], FreeDeleter>;

std::string mib(size_t bytes) { return std::to_string(bytes >> 20) + " MiB"; }

Array allocate(size_t bytes, size_t arrays) {
  void* p = nullptr;
  if (posix_memalign(&p, kAlignment, bytes) != 0 || p == nullptr) {
    throw ArrayAllocError("cannot allocate " + std::to_string(arrays) + " arrays of " + mib(bytes) +
                          " each for the bandwidth kernels");
  }
  return Array(static_cast<double*>(p));
}

// The arrays each kernel needs: read streams a; copy writes c from a; triad writes a from b and c.
size_t arrays_of(const std::string& kernel) {
  if (kernel == "triad") return 3;
  if (kernel == "copy") return 2;
  if (kernel == "read") return 1;
  throw std::invalid_argument("stream kernel must be 'copy', 'triad' or 'read', not '" + kernel + "'");
}

const IsaPasses& passes_for(const std::string& isa) {
  const std::string chosen = best_isa(isa);
  if (!isa.empty() && chosen != isa) {
    throw std::invalid_argument("this CPU cannot run the " + isa + " kernels");
  }
  return *isa_passes(chosen);
}

}  // namespace

std::vector<double> stream_seconds(const std::string& kernel, size_t array_bytes, int threads, int repetitions,
                                   const std::string& isa) {
  const size_t n_arrays = arrays_of(kernel);
  const bool triad = kernel == "triad", read = kernel == "read";
  const IsaPasses& passes = passes_for(isa);
  if (threads < 1) throw std::invalid_argument("threads must be at least 1, not " + std::to_string(threads));
  if (repetitions < 1) {
    throw std::invalid_argument("repetitions must be at least 1, not " + std::to_string(repetitions));
  }
  const size_t n = array_bytes / sizeof(double);
  if (n == 0) throw std::invalid_argument("array_bytes must hold at least one double");
  if (n > static_cast<size_t>(std::numeric_limits<int64_t>::max()) / n_arrays / sizeof(double)) {
    throw ArrayAllocError("arrays of " + std::to_string(array_bytes) + " bytes cannot be addressed");
  }
  const size_t bytes = (n * sizeof(double) + kAlignment - 1) / kAlignment * kAlignment;
  // Checked before touching anything: with overcommit, an allocation far beyond the machine's
  // memory can succeed and the first touch then gets the process killed instead of an error.
  const long pages = sysconf(_SC_PHYS_PAGES), page_size = sysconf(_SC_PAGESIZE);
  if (pages > 0 && page_size > 0 && n_arrays * bytes > static_cast<size_t>(pages) * static_cast<size_t>(page_size)) {
    throw ArrayAllocError(std::to_string(n_arrays) + " arrays of " + mib(bytes) + " each exceed the physical memory (" +
                          mib(static_cast<size_t>(pages) * static_cast<size_t>(page_size)) + ")");
  }

  Array a = allocate(bytes, n_arrays);
  Array b = triad ? allocate(bytes, n_arrays) : Array();
  Array c = read ? Array() : allocate(bytes, n_arrays);
  double* __restrict__ pa = a.get();
  double* __restrict__ pb = b.get();
  double* __restrict__ pc = c.get();
  const int64_t count = static_cast<int64_t>(n);

  // First touch with the kernels' own static schedule: each page is faulted in by the thread that
  // later streams it, so under a local memory policy it sits on that thread's node.
  int team = 0;
#pragma omp parallel num_threads(threads)
  {
#pragma omp single
    team = omp_get_num_threads();
#pragma omp for schedule(static)
    for (int64_t i = 0; i < count; ++i) {
      pa[i] = kA;
      if (pb) pb[i] = kB;
      if (pc) pc[i] = kC;
    }
  }
  // A smaller team (OMP_THREAD_LIMIT, nested parallelism, dynamic adjustment) would be measured
  // and reported as the bandwidth of `threads`.
  if (team != threads) {
    throw std::runtime_error("the OpenMP runtime ran " + std::to_string(team) + " threads of the " +
                             std::to_string(threads) + " asked (OMP_THREAD_LIMIT or OMP_DYNAMIC?)");
  }

  const StreamArrays arrays{pa, pb, pc, count, threads};
  double read_sum = 0.0;
  std::vector<double> seconds;
  seconds.reserve(static_cast<size_t>(repetitions));
  for (int pass = 0; pass <= repetitions; ++pass) {
    const auto start = std::chrono::steady_clock::now();
    if (triad) {
      passes.triad(arrays);
    } else if (read) {
      read_sum = passes.read(arrays);
    } else {
      passes.copy(arrays);
    }
    const auto stop = std::chrono::steady_clock::now();
    if (pass > 0) seconds.push_back(std::chrono::duration<double>(stop - start).count());
  }

  // Reading every result keeps the compiler from dropping passes whose output nobody used, and
  // catches a kernel that did not do its work (STREAM checks its arrays the same way).
  const double expected = triad ? kB + kTriadScalar * kC : kA;
  double sum = read_sum;
  if (!read) {
    const double* out = triad ? pa : pc;
#pragma omp parallel for schedule(static) num_threads(threads) reduction(+ : sum)
    for (int64_t i = 0; i < count; ++i) sum += out[i];
  }
  const double want = expected * static_cast<double>(count);
  if (!(std::fabs(sum - want) <= 1e-9 * want)) {
    throw std::runtime_error("stream " + kernel + " produced wrong results (sum " + std::to_string(sum) +
                             ", expected " + std::to_string(want) + ")");
  }
  return seconds;
}

std::vector<double> fma_seconds(const std::string& isa, int threads, int64_t iterations, int repetitions) {
  const IsaPasses& passes = passes_for(isa);
  if (threads < 1) throw std::invalid_argument("threads must be at least 1, not " + std::to_string(threads));
  if (iterations < 1 || repetitions < 1) {
    throw std::invalid_argument("iterations and repetitions must be at least 1");
  }
  std::vector<double> seconds;
  seconds.reserve(static_cast<size_t>(repetitions));
  float sink = 0.0f;
  for (int pass = 0; pass <= repetitions; ++pass) {
    int team = 0;
    const auto start = std::chrono::steady_clock::now();
    sink += passes.fma(iterations, threads, &team);
    const auto stop = std::chrono::steady_clock::now();
    // Its FLOPs are counted for `threads`: a smaller team would be reported as a higher peak.
    if (team != threads) {
      throw std::runtime_error("the OpenMP runtime ran " + std::to_string(team) + " threads of the " +
                               std::to_string(threads) + " asked (OMP_THREAD_LIMIT or OMP_DYNAMIC?)");
    }
    if (pass > 0) seconds.push_back(std::chrono::duration<double>(stop - start).count());
  }
  // The chains decay towards a finite fixed point; anything else means the loop did not run as built.
  if (!std::isfinite(sink)) throw std::runtime_error("the FMA loop produced a non-finite result");
  return seconds;
}

int64_t fma_flops_per_iteration(const std::string& isa) { return passes_for(isa).fma_flops_per_iteration; }

std::string roofs_isa(const std::string& at_most) { return best_isa(at_most); }

}  // namespace cpuprof
