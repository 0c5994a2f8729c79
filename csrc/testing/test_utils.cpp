// cpuprof._test_utils: deterministic native workloads for the test suite (known CPU time, known
// page counts), shipped as their own module so the core's bindings hold none of them.
#include <pybind11/pybind11.h>
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
  // aligned_alloc of a large block is a fresh mmap.
  char* memory = static_cast<char*>(aligned_alloc(page, static_cast<size_t>(n_pages) * page));
  if (memory == nullptr) throw std::bad_alloc();
  for (int64_t i = 0; i < n_pages; ++i) memory[i * page] = static_cast<char>(i);
  int64_t sum = 0;
  for (int64_t i = 0; i < n_pages; ++i) sum += memory[i * page];
  free(memory);
  return sum;
}

}  // namespace

PYBIND11_MODULE(_test_utils, m) {
  m.doc() = "Deterministic native workloads for cpuprof's tests.";
  m.def("spin_for_ns", &spin_for_ns, py::arg("ns"));
  m.def("touch_fresh_pages", &touch_fresh_pages, py::arg("n_pages"));
}
