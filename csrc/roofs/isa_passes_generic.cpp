// The roof kernels built for the compiler's baseline, on an architecture other than x86-64.
#define CPUPROF_ISA_NAMESPACE isa_generic
#define CPUPROF_ISA_NAME "generic"
#define CPUPROF_ISA_VECTOR_BYTES 16
#include "roofs/isa_passes.inc"
