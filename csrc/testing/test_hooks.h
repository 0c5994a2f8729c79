// The test hooks of the native module (fault injection, checking modes, the core's pure parsers
// called on hand-made input), apart from its API: bound as their own module,
// cpuprof._native.testing (also importable as cpuprof._native_testing once _native is, typed by
// cpuprof/_native_testing.pyi). They live in _native because they set the very state its
// session reads; _test_utils, a module of its own, holds the deterministic workloads.
#pragma once

#include <pybind11/pybind11.h>

namespace cpuprof {

void bind_test_hooks(pybind11::module_& native);

}  // namespace cpuprof
