// The roof kernels built for avx512 (compiler flags in CMakeLists.txt).
#define CPUPROF_ISA_NAMESPACE isa_avx512
#define CPUPROF_ISA_NAME "avx512"
#define CPUPROF_ISA_VECTOR_BYTES 64
#include "roofs/isa_passes.inc"
