// The RecordFunction callbacks that feed every ATen op into the session.
#pragma once

#include <cstdint>

namespace cpuprof {

// Registers global callbacks for ATen ops and user regions (torch.profiler.record_function and
// cpuprof.region). `needs_inputs` makes torch box each op's inputs so shapes can be keyed; it is
// the main cost of record_shapes, as in torch.profiler.
void install_op_hook(bool needs_inputs);
void remove_op_hook();

// Called at every ATen op's begin (not a region's), on its thread, inside the hook's measured
// time, with the begin time and whether an op (not a region) is open on the thread:
// how the Python callers of ops are recorded (python/python_callers.h) without this unit knowing
// Python. Null: nobody observes.
using OpBeginObserver = void (*)(int64_t enter_ns, bool inside_op);
void set_op_begin_observer(OpBeginObserver observer);

}  // namespace cpuprof
