// The RecordFunction callbacks that feed every ATen op into the session.
#pragma once

#include <cstdint>

namespace cpuprof {

// Registers global callbacks for ATen ops and user regions (torch.profiler.record_function and
// cpuprof.region). `needs_inputs` makes torch box each op's inputs so shapes can be keyed (on a
// decode the boxing itself costs nothing measurable: see inject_empty_callbacks below).
void install_op_hook(bool needs_inputs);
void remove_op_hook();

// Test hook: global callbacks that do nothing, registered as the op hook is (same scopes, inputs
// boxed when `needs_inputs`), or removed when `on` is false. What torch's RecordFunction
// dispatch alone costs a workload, beside what cpuprof's callbacks and collector add
// (benches/bench_decode_profilers.py's "floor" variants).
void inject_empty_callbacks(bool on, bool needs_inputs);

// Called at every ATen op's begin (not a region's), on its thread, inside the hook's measured
// time, with the begin time and whether an op (not a region) is open on the thread:
// how the Python callers of ops are recorded (python/python_callers.h) without this unit knowing
// Python. Null: nobody observes.
using OpBeginObserver = void (*)(int64_t enter_ns, bool inside_op);
void set_op_begin_observer(OpBeginObserver observer);

}  // namespace cpuprof
