// Call-frame information (DWARF CFI, .eh_frame) of the code loaded in this process, per PC.
//
// Kernel call chains follow frame pointers, and MKL, libgomp and libtorch are built without
// them, so a sample's user stack is unwound here from a copy of its stack and the CFI every
// object carries for C++ exceptions. The objects are the ones mapped into this very process:
// their .eh_frame_hdr (the PT_GNU_EH_FRAME segment) is read straight from memory, as libgcc's
// unwinder does, with a binary search of its sorted table; the rule found for each PC is
// cached, so a hot loop costs one hash lookup per frame after its first sample.
//
// Which object holds a PC comes from a sorted table of the objects' executable segments, built
// from dl_iterate_phdr and rebuilt when the loader's load/unload counts change: a stack scan asks
// about hundreds of words that are not code, and walking every loaded object (torch loads
// hundreds) for each was most of the collector's time.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

namespace cpuprof {

// How to step from a frame to its caller on x86-64, as CFI says at one PC.
struct FrameRule {
  enum class Cfa : uint8_t { Rsp, Rbp };
  enum class Reg : uint8_t { Same, AtCfaOffset, Undefined };
  Cfa cfa_reg = Cfa::Rsp;
  int32_t cfa_offset = 8;
  Reg ra = Reg::AtCfaOffset;  // the return address; Undefined marks the outermost frame
  int32_t ra_offset = -8;
  Reg rbp = Reg::Same;
  int32_t rbp_offset = 0;
};

class FrameTables {
 public:
  FrameTables();
  ~FrameTables();
  FrameTables(const FrameTables&) = delete;
  FrameTables& operator=(const FrameTables&) = delete;

  enum class Lookup : uint8_t { Found, NoObject, NoInfo };
  // The rule at `pc`. For a return address pass `pc - 1`: the call may be the last instruction
  // of its function, and the address after it can belong to the next one.
  Lookup rule_for(uint64_t pc, FrameRule* out);

  // True when `address` lies in a loaded object's code right after a call instruction: a
  // plausible return address.
  bool is_return_address(uint64_t address);

  // True when `pc` lies in the Python interpreter's own code (the object that holds its frame
  // evaluation loop): a walk can stop there, since what lies rootward of it is the interpreter's
  // recursion, whose Python frames py-spy reads and whose native frames say nothing an op path
  // does not. False in a process without a Python interpreter.
  bool in_interpreter(uint64_t pc) const {
    const Object* object = object_of(pc);
    return object != nullptr && object->interpreter;
  }

  uint64_t lookups() const { return lookups_; }
  uint64_t cache_hits() const { return hits_; }

  // Rebuilds the object table if a library was loaded or unloaded since it was built (one
  // loader call when nothing changed). The collector calls it once per pass.
  void refresh();

 private:
  struct Object {
    uint64_t start, end;  // an executable PT_LOAD segment
    const uint8_t* eh_frame_hdr;  // null: the object has no unwind table
    bool interpreter = false;     // holds the Python interpreter's frame evaluation loop
  };
  const Object* object_of(uint64_t pc) const;
  bool loader_changed(unsigned long long adds, unsigned long long subs) const {
    return adds != adds_ || subs != subs_;
  }

  // The rule at `pc` from the .eh_frame_hdr at `hdr` (of the object that contains it).
  Lookup compute(const uint8_t* hdr, uint64_t pc, FrameRule* out);

  struct CacheEntry {
    uint64_t pc = 0;  // 0: empty
    FrameRule rule;
    Lookup result = Lookup::NoInfo;
  };
  static constexpr size_t kCacheSize = 1 << 16;
  std::unique_ptr<CacheEntry[]> cache_;
  // A scan asks about the same stack words sample after sample (return addresses of the same hot
  // loops, stale pointers left in the same slots), and each answer reads code under the loader's
  // lock: answers are kept until the loaded objects change. The low bit of an entry is the answer.
  static constexpr size_t kReturnCacheSize = 1 << 14;
  std::unique_ptr<uint64_t[]> return_cache_;
  uint64_t lookups_ = 0, hits_ = 0;
  std::vector<Object> objects_;  // sorted by start
  // The interpreter's evaluation loop, looked up once, as the tables are made (on the thread that
  // starts the session), never in refresh(): dlsym takes the loader's big lock, which a dlopen
  // holds while it runs the new library's constructors, and the collector must not wait on one.
  // CPython is never unloaded, so the addresses stay true.
  uint64_t interpreter_pcs_[2] = {0, 0};
  unsigned long long adds_ = ~0ULL, subs_ = ~0ULL;  // the loader's counts when it was built
};

}  // namespace cpuprof
