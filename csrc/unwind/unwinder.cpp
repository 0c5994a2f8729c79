#include "unwind/unwinder.h"

#include <cstring>

namespace cpuprof {

namespace {

// How far a frame without CFI or frame pointer is searched for its return address.
constexpr uint64_t kMaxScanBytes = 2048;

// Reads a word of the copied stack at `address`; false when it lies outside the copy. Addresses
// come from registers and stack words that may hold anything (JIT code uses rbp as a plain
// register), so the bounds are checked as offsets: `address + 8` can wrap past 2^64.
bool read_word(uint64_t address, uint64_t sp, const uint8_t* stack, size_t stack_len, uint64_t* value) {
  if (address < sp || stack_len < 8 || address - sp > stack_len - 8) return false;
  std::memcpy(value, stack + (address - sp), 8);
  return true;
}

// Whether `ra`, found on the stack at `slot`, is the frame's real return address and not a stale
// one left in an uninitialised stack slot: the caller it names must step, by its own CFI, to
// another plausible return address (or be the outermost frame).
bool plausible_caller(uint64_t ra, uint64_t slot, uint64_t base, const uint8_t* stack, size_t stack_len,
                      FrameTables& tables) {
  FrameRule rule;
  if (tables.rule_for(ra - 1, &rule) != FrameTables::Lookup::Found) return false;
  if (rule.ra == FrameRule::Reg::Undefined) return true;
  if (rule.cfa_reg != FrameRule::Cfa::Rsp || rule.ra != FrameRule::Reg::AtCfaOffset) return true;  // needs rbp: unknown
  const uint64_t cfa = slot + 8 + static_cast<int64_t>(rule.cfa_offset);
  uint64_t next = 0;
  if (!read_word(cfa + static_cast<int64_t>(rule.ra_offset), base, stack, stack_len, &next)) return true;  // past the copy
  return next == 0 || tables.is_return_address(next);
}

}  // namespace

void unwind_user_stack(const UserRegs& regs, const uint8_t* stack, size_t stack_len, FrameTables& tables,
                       UnwindResult* out) {
  out->n = 0;
  out->by_frame_pointer = 0;
  if (regs.ip == 0 || regs.sp == 0) {
    out->stop = UnwindStop::NoUserStack;
    return;
  }
  uint64_t pc = regs.ip, sp = regs.sp, bp = regs.bp;
  const uint64_t base = regs.sp;
  bool leaf = true;
  while (true) {
    if (out->n == kMaxUnwindFrames) {
      out->stop = UnwindStop::DepthLimit;
      return;
    }
    out->pcs[out->n++] = pc;
    if (tables.in_interpreter(leaf ? pc : pc - 1)) {
      out->stop = UnwindStop::Interpreter;
      return;
    }
    FrameRule rule;
    // A return address points after its call; the call itself is what identifies the frame.
    const FrameTables::Lookup found = tables.rule_for(leaf ? pc : pc - 1, &rule);
    uint64_t cfa = 0, ra = 0, next_bp = bp;
    if (found == FrameTables::Lookup::Found) {
      if (rule.ra == FrameRule::Reg::Undefined) {
        out->stop = UnwindStop::Outermost;
        return;
      }
      cfa = (rule.cfa_reg == FrameRule::Cfa::Rsp ? sp : bp) + static_cast<int64_t>(rule.cfa_offset);
      if (rule.ra != FrameRule::Reg::AtCfaOffset ||
          !read_word(cfa + static_cast<int64_t>(rule.ra_offset), base, stack, stack_len, &ra)) {
        out->stop = UnwindStop::StackCopyEnd;
        return;
      }
      if (rule.rbp == FrameRule::Reg::AtCfaOffset &&
          !read_word(cfa + static_cast<int64_t>(rule.rbp_offset), base, stack, stack_len, &next_bp)) {
        out->stop = UnwindStop::StackCopyEnd;
        return;
      }
    } else {
      // No CFI here (JIT code, assembly without it). Code that keeps a frame pointer has pushed the
      // caller's rbp at [rbp] and the return address above it: trusted when rbp points into this
      // stack and that word is a return address. Otherwise the stack is scanned upwards for the
      // first word that is one (it points right after a call instruction in loaded code), as
      // debuggers do without CFI; the caller then has CFI of its own and needs no rbp.
      uint64_t saved_bp = 0, candidate = 0;
      if (bp >= sp && read_word(bp, base, stack, stack_len, &saved_bp) &&
          read_word(bp + 8, base, stack, stack_len, &candidate) && tables.is_return_address(candidate)) {
        ra = candidate;
        next_bp = saved_bp;
        cfa = bp + 16;
        ++out->by_frame_pointer;
      } else {
        bool found_ra = false;
        for (uint64_t at = sp; at < sp + kMaxScanBytes; at += 8) {
          if (!read_word(at, base, stack, stack_len, &candidate)) break;
          if (tables.is_return_address(candidate) && plausible_caller(candidate, at, base, stack, stack_len, tables)) {
            ra = candidate;
            cfa = at + 8;
            found_ra = true;
            break;
          }
        }
        if (!found_ra) {
          out->stop = UnwindStop::NoUnwindInfo;
          return;
        }
        // Code without CFI (JIT kernels) often uses rbp as a plain register, having pushed the
        // caller's below its return address. A caller that keeps a frame pointer needs it back:
        // among the pushed words, the one pointing above the return address at a saved-rbp /
        // return-address pair is it.
        for (uint64_t at = sp; at + 8 < cfa; at += 8) {
          uint64_t v = 0, above = 0;
          if (read_word(at, base, stack, stack_len, &v) && v >= cfa && read_word(v + 8, base, stack, stack_len, &above) &&
              tables.is_return_address(above)) {
            next_bp = v;
            break;
          }
        }
        ++out->by_scanning;
      }
    }
    if (ra == 0) {
      out->stop = UnwindStop::Outermost;
      return;
    }
    if (cfa <= sp) {  // the stack grows down: each caller's frame is above its callee's
      out->stop = UnwindStop::BadFrame;
      return;
    }
    pc = ra;
    sp = cfa;
    bp = next_bp;
    leaf = false;
  }
}

}  // namespace cpuprof
