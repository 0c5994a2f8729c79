// The unwinder against hostile input: register values and stack words that are not what a
// well-behaved frame would hold. JIT kernels use rbp as a plain register, so a sample's rbp (and
// any word on its stack) can be anything, near zero or near 2^64; the unwinder reads only the
// copy of the stack it was given and the code of loaded objects, whatever the values.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "unwind/frame_tables.h"
#include "unwind/unwinder.h"

using namespace cpuprof;

namespace {

// A function of this binary, so that some words are return addresses with CFI behind them.
__attribute__((noinline)) uint64_t code_address() { return reinterpret_cast<uint64_t>(&code_address) + 16; }

uint64_t hostile_word(std::mt19937_64& rng, uint64_t sp, size_t len, uint64_t code) {
  switch (rng() % 8) {
    case 0: return UINT64_MAX - (rng() % 64);           // wraps when 8 or 16 is added
    case 1: return rng() % 4096;                        // near zero
    case 2: return sp + (rng() % (len + 64)) - 32;      // around the copy, in and out of it
    case 3: return code + (rng() % 256);                // inside this binary's code
    case 4: return sp - (rng() % 4096);                 // below the copy
    case 5: return static_cast<uint64_t>(INT64_MAX) + (rng() % 64) - 32;  // sign boundary
    default: return rng();
  }
}

}  // namespace

int main() {
  FrameTables tables;
  std::mt19937_64 rng(12345);
  const uint64_t code = code_address();
  uint64_t frames = 0;
  for (int round = 0; round < 200000; ++round) {
    const size_t len = 8 * (rng() % 64);
    // Exactly `len` bytes, so a read one past the copy is an out-of-bounds read.
    std::vector<uint8_t> stack(len);
    const uint64_t sp = round % 3 == 0 ? UINT64_MAX - len - (rng() % 32) : 0x7ff000000000ULL + 8 * (rng() % 4096);
    for (size_t at = 0; at + 8 <= len; at += 8) {
      const uint64_t word = hostile_word(rng, sp, len, code);
      std::memcpy(stack.data() + at, &word, 8);
    }
    UserRegs regs{round % 5 == 0 ? code : hostile_word(rng, sp, len, code), sp, hostile_word(rng, sp, len, code)};
    UnwindResult result;
    unwind_user_stack(regs, len ? stack.data() : nullptr, len, tables, &result);
    if (result.n < 0 || result.n > kMaxUnwindFrames) {
      std::printf("bad frame count %d\n", result.n);
      return 1;
    }
    frames += static_cast<uint64_t>(result.n);
  }
  std::printf("ok: %llu frames from 200000 hostile stacks\n", static_cast<unsigned long long>(frames));
  return 0;
}
