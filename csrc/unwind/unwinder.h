// Walks a sampled thread's user stack from its registers and a copy of its stack memory.
//
// Each frame is stepped with the CFI rule for its PC (FrameTables); a frame without one (JIT
// code, hand-written assembly) is stepped by its frame pointer when that points into the copy,
// or else by the first return address found scanning the stack above it.
// The walk stops at the outermost frame (whose CFI marks the return address undefined), at the
// first frame in the Python interpreter, at the end of the copied stack, or at the first frame
// neither method can step, and says which. Stopping at the interpreter is most of the walk's
// saving on a thread that runs Python: its stack is kilobytes of the evaluation loop calling
// itself, walked frame by frame at every sample to say nothing the op path and py-spy do not.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/enum_list.h"
#include "unwind/frame_tables.h"

namespace cpuprof {

constexpr int kMaxUnwindFrames = 128;

// Why a walk stopped; crosses to Python as an enum (common/enum_list.h), the counts keyed by it.
#define CPUPROF_UNWIND_STOPS(X)                                                                        \
  X(Outermost, 0, "outermost")             /* the whole stack: thread start or main */                 \
  X(StackCopyEnd, 1, "stack_copy_end")     /* the copied stack ended before the outermost frame */     \
  /* a frame without CFI and without a usable frame pointer (JIT code, ...) */                         \
  X(NoUnwindInfo, 2, "no_unwind_info")                                                                 \
  /* an implausible step (a stack pointer that does not grow, address 0) */                            \
  X(BadFrame, 3, "bad_frame")                                                                          \
  X(DepthLimit, 4, "depth_limit")                                                                      \
  /* the sample has no user registers (a kernel thread, or not recorded) */                            \
  X(NoUserStack, 5, "no_user_stack")                                                                   \
  /* reached the Python interpreter: rootward is its recursion, py-spy's to read */                    \
  X(Interpreter, 6, "interpreter")
enum class UnwindStop : uint8_t { CPUPROF_UNWIND_STOPS(CPUPROF_ENUM_VALUE) };
constexpr int kUnwindStopKinds = 0 CPUPROF_UNWIND_STOPS(CPUPROF_ENUM_COUNT);

struct UserRegs {
  uint64_t ip = 0, sp = 0, bp = 0;
};

struct UnwindResult {
  int n = 0;
  uint64_t pcs[kMaxUnwindFrames];  // leaf first; the caller frames hold return addresses
  UnwindStop stop = UnwindStop::NoUserStack;
  int by_frame_pointer = 0;  // frames stepped by frame pointer, not CFI
  int by_scanning = 0;       // frames whose return address was found by scanning the stack
};

// `stack` holds `stack_len` bytes copied from address `regs.sp` upwards.
void unwind_user_stack(const UserRegs& regs, const uint8_t* stack, size_t stack_len, FrameTables& tables,
                       UnwindResult* out);

}  // namespace cpuprof
