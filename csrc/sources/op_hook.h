// The RecordFunction callbacks that feed every ATen op into the session.
#pragma once

namespace cpuprof {

// Registers global callbacks for ATen ops and user regions (torch.profiler.record_function and
// cpuprof.region). `needs_inputs` makes torch box each op's inputs so shapes can be keyed; it is
// the main cost of record_shapes, as in torch.profiler.
void install_op_hook(bool needs_inputs);
void remove_op_hook();

}  // namespace cpuprof
