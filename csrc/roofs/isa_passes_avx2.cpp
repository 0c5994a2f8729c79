// The roof kernels built for avx2 (compiler flags in CMakeLists.txt).
#define CPUPROF_ISA_NAMESPACE isa_avx2
#define CPUPROF_ISA_NAME "avx2"
#define CPUPROF_ISA_VECTOR_BYTES 32
#include "roofs/isa_passes.inc"
