// cpuprof._test_utils: deterministic native workloads for the test suite (known CPU time, known
// page counts), shipped as their own module so the core's bindings hold none of them.
#include <pybind11/pybind11.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdlib>
#include <new>

#include "common/clock.h"

namespace py = pybind11;

namespace {

// Busy for `ns` of wall time on the calling thread, without the GIL.
double spin_for_ns(int64_t ns) {
  py::gil_scoped_release release;
  const int64_t end = cpuprof::now_ns() + ns;
  volatile double x = 1.0;
  while (cpuprof::now_ns() < end) {
    for (int i = 0; i < 1000; ++i) x = x * 1.0000001 + 1e-9;
  }
  return x;
}

// Touches `n_pages` pages never touched before: every first touch is a page fault.
int64_t touch_fresh_pages(int64_t n_pages) {
  py::gil_scoped_release release;
  const long page = sysconf(_SC_PAGESIZE);
  const size_t bytes = static_cast<size_t>(n_pages) * static_cast<size_t>(page);
  // A mapping of its own, never malloc: glibc's dynamic mmap threshold may serve a large block
  // from memory an earlier test already touched, and a huge page would fault 512 pages at once.
  void* mapped = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mapped == MAP_FAILED) throw std::bad_alloc();
  madvise(mapped, bytes, MADV_NOHUGEPAGE);
  char* memory = static_cast<char*>(mapped);
  for (int64_t i = 0; i < n_pages; ++i) memory[i * page] = static_cast<char>(i);
  int64_t sum = 0;
  for (int64_t i = 0; i < n_pages; ++i) sum += memory[i * page];
  munmap(mapped, bytes);
  return sum;
}

}  // namespace

PYBIND11_MODULE(_test_utils, m) {
  m.doc() = "Deterministic native workloads for cpuprof's tests.";
  m.def("spin_for_ns", &spin_for_ns, py::arg("ns"));
  m.def("touch_fresh_pages", &touch_fresh_pages, py::arg("n_pages"));
}
