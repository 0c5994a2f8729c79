// The roof kernels built for sse2 (compiler flags in CMakeLists.txt).
#define CPUPROF_ISA_NAMESPACE isa_sse2
#define CPUPROF_ISA_NAME "sse2"
#define CPUPROF_ISA_VECTOR_BYTES 16
#include "roofs/isa_passes.inc"
