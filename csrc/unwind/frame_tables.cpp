#include "unwind/frame_tables.h"

#include <dlfcn.h>
#include <elf.h>
#include <link.h>

#include <algorithm>
#include <cstring>


namespace cpuprof {

namespace {

// DWARF pointer encodings (DW_EH_PE_*), as .eh_frame_hdr and augmentations use them.
constexpr uint8_t kPeOmit = 0xff;
constexpr uint8_t kPeFormatMask = 0x0f;
constexpr uint8_t kPeApplMask = 0x70;
constexpr uint8_t kPeIndirect = 0x80;
constexpr uint8_t kPeAbsptr = 0x00, kPeUleb = 0x01, kPeUdata2 = 0x02, kPeUdata4 = 0x03, kPeUdata8 = 0x04;
constexpr uint8_t kPeSleb = 0x09, kPeSdata2 = 0x0a, kPeSdata4 = 0x0b, kPeSdata8 = 0x0c;
constexpr uint8_t kPePcrel = 0x10, kPeDatarel = 0x30;

// x86-64 DWARF register numbers.
constexpr int kRegRbp = 6, kRegRsp = 7, kRegRa = 16;

// A cursor over CFI bytes in memory; reading past `end` fails instead of running off.
struct Cursor {
  const uint8_t* p;
  const uint8_t* end;
  bool ok = true;

  template <typename T>
  T fixed() {
    if (p + sizeof(T) > end) {
      ok = false;
      return T{};
    }
    T v;
    std::memcpy(&v, p, sizeof(T));
    p += sizeof(T);
    return v;
  }
  uint64_t uleb() {
    uint64_t result = 0;
    int shift = 0;
    while (p < end && shift < 64) {
      const uint8_t byte = *p++;
      result |= static_cast<uint64_t>(byte & 0x7f) << shift;
      shift += 7;
      if (!(byte & 0x80)) return result;
    }
    ok = false;
    return result;
  }
  int64_t sleb() {
    int64_t result = 0;
    int shift = 0;
    uint8_t byte = 0;
    while (p < end && shift < 64) {
      byte = *p++;
      result |= static_cast<int64_t>(byte & 0x7f) << shift;
      shift += 7;
      if (!(byte & 0x80)) {
        if (shift < 64 && (byte & 0x40)) result |= -(static_cast<int64_t>(1) << shift);
        return result;
      }
    }
    ok = false;
    return result;
  }
  // An encoded pointer; `datarel_base` is the start of .eh_frame_hdr for datarel encodings.
  uint64_t pointer(uint8_t encoding, uint64_t datarel_base = 0) {
    if (encoding == kPeOmit) return 0;
    const uint64_t here = reinterpret_cast<uint64_t>(p);
    uint64_t value = 0;
    switch (encoding & kPeFormatMask) {
      case kPeAbsptr: value = fixed<uint64_t>(); break;
      case kPeUleb: value = uleb(); break;
      case kPeUdata2: value = fixed<uint16_t>(); break;
      case kPeUdata4: value = fixed<uint32_t>(); break;
      case kPeUdata8: value = fixed<uint64_t>(); break;
      case kPeSleb: value = static_cast<uint64_t>(sleb()); break;
      case kPeSdata2: value = static_cast<uint64_t>(static_cast<int64_t>(fixed<int16_t>())); break;
      case kPeSdata4: value = static_cast<uint64_t>(static_cast<int64_t>(fixed<int32_t>())); break;
      case kPeSdata8: value = static_cast<uint64_t>(fixed<int64_t>()); break;
      default: ok = false; return 0;
    }
    switch (encoding & kPeApplMask) {
      case 0: break;
      case kPePcrel: value += here; break;
      case kPeDatarel: value += datarel_base; break;
      default: ok = false; return 0;  // textrel/funcrel/aligned: not used on x86-64 Linux
    }
    if (encoding & kPeIndirect) {
      if (value == 0) {
        ok = false;
        return 0;
      }
      std::memcpy(&value, reinterpret_cast<const void*>(value), sizeof(value));
    }
    return value;
  }
};

// Rules for the registers an x86-64 unwind needs, while a CFA program runs.
struct RuleState {
  int cfa_reg = kRegRsp;
  int64_t cfa_offset = 8;
  bool cfa_is_expression = false;
  FrameRule::Reg ra = FrameRule::Reg::AtCfaOffset;
  int64_t ra_offset = -8;
  FrameRule::Reg rbp = FrameRule::Reg::Same;
  int64_t rbp_offset = 0;
  bool unsupported = false;  // a rule this unwinder cannot follow (expressions, other registers)
};

void set_offset(RuleState& s, uint64_t reg, int64_t offset) {
  if (reg == kRegRa) {
    s.ra = FrameRule::Reg::AtCfaOffset;
    s.ra_offset = offset;
  } else if (reg == kRegRbp) {
    s.rbp = FrameRule::Reg::AtCfaOffset;
    s.rbp_offset = offset;
  }
}

void set_same(RuleState& s, const RuleState& initial, uint64_t reg, bool restore) {
  if (reg == kRegRa) {
    s.ra = restore ? initial.ra : FrameRule::Reg::Same;
    s.ra_offset = initial.ra_offset;
  } else if (reg == kRegRbp) {
    s.rbp = restore ? initial.rbp : FrameRule::Reg::Same;
    s.rbp_offset = initial.rbp_offset;
  }
}

void set_undefined(RuleState& s, uint64_t reg) {
  if (reg == kRegRa) s.ra = FrameRule::Reg::Undefined;
  if (reg == kRegRbp) s.rbp = FrameRule::Reg::Undefined;
}

// Runs CFA instructions until the row that covers `target` (or the end). `initial` is the state
// after the CIE's instructions, which DW_CFA_restore goes back to.
bool run_program(Cursor c, uint64_t loc, uint64_t target, uint64_t code_align, int64_t data_align,
                 const RuleState& initial, RuleState* state) {
  RuleState saved[8];
  int n_saved = 0;
  while (c.ok && c.p < c.end) {
    const uint8_t op = *c.p++;
    const uint8_t high = op & 0xc0, low = op & 0x3f;
    if (high == 0x40) {  // DW_CFA_advance_loc
      loc += low * code_align;
      if (loc > target) return true;
      continue;
    }
    if (high == 0x80) {  // DW_CFA_offset
      set_offset(*state, low, static_cast<int64_t>(c.uleb()) * data_align);
      continue;
    }
    if (high == 0xc0) {  // DW_CFA_restore
      set_same(*state, initial, low, true);
      continue;
    }
    switch (op) {
      case 0x00: break;  // nop
      case 0x01: loc = c.pointer(kPeAbsptr); if (loc > target) return true; break;  // set_loc
      case 0x02: loc += c.fixed<uint8_t>() * code_align; if (loc > target) return true; break;
      case 0x03: loc += c.fixed<uint16_t>() * code_align; if (loc > target) return true; break;
      case 0x04: loc += c.fixed<uint32_t>() * code_align; if (loc > target) return true; break;
      case 0x05: {  // offset_extended
        const uint64_t reg = c.uleb();
        set_offset(*state, reg, static_cast<int64_t>(c.uleb()) * data_align);
        break;
      }
      case 0x06: set_same(*state, initial, c.uleb(), true); break;  // restore_extended
      case 0x07: set_undefined(*state, c.uleb()); break;             // undefined
      case 0x08: set_same(*state, initial, c.uleb(), false); break;  // same_value
      case 0x09: {  // register: reg saved in another register
        const uint64_t reg = c.uleb();
        c.uleb();
        if (reg == kRegRa || reg == kRegRbp) state->unsupported = true;
        break;
      }
      case 0x0a:  // remember_state
        if (n_saved < 8) saved[n_saved++] = *state; else state->unsupported = true;
        break;
      case 0x0b:  // restore_state
        if (n_saved > 0) *state = saved[--n_saved]; else state->unsupported = true;
        break;
      case 0x0c:  // def_cfa
        state->cfa_reg = static_cast<int>(c.uleb());
        state->cfa_offset = static_cast<int64_t>(c.uleb());
        state->cfa_is_expression = false;
        break;
      case 0x0d: state->cfa_reg = static_cast<int>(c.uleb()); state->cfa_is_expression = false; break;
      case 0x0e: state->cfa_offset = static_cast<int64_t>(c.uleb()); break;
      case 0x0f: {  // def_cfa_expression (PLT stubs, signal trampolines): not followed
        const uint64_t len = c.uleb();
        c.p += std::min<uint64_t>(len, static_cast<uint64_t>(c.end - c.p));
        state->cfa_is_expression = true;
        break;
      }
      case 0x10: case 0x16: {  // expression, val_expression
        const uint64_t reg = c.uleb();
        const uint64_t len = c.uleb();
        c.p += std::min<uint64_t>(len, static_cast<uint64_t>(c.end - c.p));
        if (reg == kRegRa || reg == kRegRbp) state->unsupported = true;
        break;
      }
      case 0x11: {  // offset_extended_sf
        const uint64_t reg = c.uleb();
        set_offset(*state, reg, c.sleb() * data_align);
        break;
      }
      case 0x12:  // def_cfa_sf
        state->cfa_reg = static_cast<int>(c.uleb());
        state->cfa_offset = c.sleb() * data_align;
        state->cfa_is_expression = false;
        break;
      case 0x13: state->cfa_offset = c.sleb() * data_align; break;  // def_cfa_offset_sf
      case 0x14: case 0x15: {  // val_offset(_sf): the register's value is CFA+offset
        const uint64_t reg = c.uleb();
        if (op == 0x14) c.uleb(); else c.sleb();
        if (reg == kRegRa || reg == kRegRbp) state->unsupported = true;
        break;
      }
      case 0x2e: c.uleb(); break;  // GNU_args_size
      case 0x2f: {                 // GNU_negative_offset_extended
        const uint64_t reg = c.uleb();
        set_offset(*state, reg, -static_cast<int64_t>(c.uleb()) * data_align);
        break;
      }
      default: return false;  // an opcode this unwinder does not know: no rule
    }
  }
  return c.ok;
}

}  // namespace

FrameTables::FrameTables() : cache_(new CacheEntry[kCacheSize]), return_cache_(new uint64_t[kReturnCacheSize]()) {
  // Looked up by address, not by library name: CPython may be linked into the executable itself.
  const char* symbols[] = {"_PyEval_EvalFrameDefault", "PyEval_EvalFrameDefault"};
  for (size_t i = 0; i < 2; ++i) interpreter_pcs_[i] = reinterpret_cast<uint64_t>(dlsym(RTLD_DEFAULT, symbols[i]));
  refresh();
}
FrameTables::~FrameTables() = default;

void FrameTables::refresh() {
  struct Counts {
    unsigned long long adds = 0, subs = 0;
  } counts;
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* data) -> int {
        auto* c = static_cast<Counts*>(data);
        c->adds = info->dlpi_adds;
        c->subs = info->dlpi_subs;
        return 1;  // the counts are the same in every entry: the first one says
      },
      &counts);
  if (!loader_changed(counts.adds, counts.subs)) return;
  struct Build {
    std::vector<Object>* objects;
    unsigned long long adds = 0, subs = 0;
  } build{&objects_};
  objects_.clear();
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* data) -> int {
        auto* b = static_cast<Build*>(data);
        b->adds = info->dlpi_adds;
        b->subs = info->dlpi_subs;
        const uint8_t* hdr = nullptr;
        for (int i = 0; i < info->dlpi_phnum; ++i) {
          const ElfW(Phdr)& ph = info->dlpi_phdr[i];
          if (ph.p_type == PT_GNU_EH_FRAME) hdr = reinterpret_cast<const uint8_t*>(info->dlpi_addr + ph.p_vaddr);
        }
        for (int i = 0; i < info->dlpi_phnum; ++i) {
          const ElfW(Phdr)& ph = info->dlpi_phdr[i];
          if (ph.p_type == PT_LOAD && (ph.p_flags & PF_X) && ph.p_memsz > 0)
            b->objects->push_back(Object{info->dlpi_addr + ph.p_vaddr, info->dlpi_addr + ph.p_vaddr + ph.p_memsz, hdr});
        }
        return 0;
      },
      &build);
  std::sort(objects_.begin(), objects_.end(), [](const Object& x, const Object& y) { return x.start < y.start; });
  for (const uint64_t at : interpreter_pcs_) {
    if (at == 0) continue;
    for (Object& object : objects_) {
      if (at >= object.start && at < object.end) object.interpreter = true;
    }
  }
  adds_ = build.adds;
  subs_ = build.subs;
  // Cached answers may name unloaded code, or call "no object" what a new library now holds.
  for (size_t i = 0; i < kCacheSize; ++i) cache_[i].pc = 0;
  std::fill_n(return_cache_.get(), kReturnCacheSize, 0);
}

const FrameTables::Object* FrameTables::object_of(uint64_t pc) const {
  auto it = std::upper_bound(objects_.begin(), objects_.end(), pc,
                             [](uint64_t value, const Object& o) { return value < o.start; });
  if (it == objects_.begin()) return nullptr;
  --it;
  return pc < it->end ? &*it : nullptr;
}

FrameTables::Lookup FrameTables::rule_for(uint64_t pc, FrameRule* out) {
  ++lookups_;
  const size_t slot = static_cast<size_t>((pc * 0x9e3779b97f4a7c15ULL) >> 48) & (kCacheSize - 1);
  CacheEntry& entry = cache_[slot];
  if (entry.pc == pc) {
    ++hits_;
    *out = entry.rule;
    return entry.result;
  }
  // A PC outside every object is JIT code (oneDNN's kernels) or not code at all.
  Lookup result = Lookup::NoObject;
  if (const Object* object = object_of(pc)) {
    if (object->eh_frame_hdr == nullptr) {
      result = Lookup::NoInfo;
    } else {
      // The CFI is read inside dl_iterate_phdr's first callback: the loader's lock is held, so no
      // dlclose can unmap the tables meanwhile, and the counts say whether the table is current.
      struct Read {
        FrameTables* self;
        const uint8_t* hdr;
        uint64_t pc;
        FrameRule* out;
        Lookup result = Lookup::NoObject;
        bool stale = false;
      } read{this, object->eh_frame_hdr, pc, out};
      dl_iterate_phdr(
          [](dl_phdr_info* info, size_t, void* data) -> int {
            auto* r = static_cast<Read*>(data);
            r->stale = r->self->loader_changed(info->dlpi_adds, info->dlpi_subs);
            if (!r->stale) r->result = r->self->compute(r->hdr, r->pc, r->out);
            return 1;
          },
          &read);
      if (read.stale) {
        refresh();  // a library came or went: look again in the new table (next time)
        return Lookup::NoInfo;
      }
      result = read.result;
    }
  }
  entry.pc = pc;
  entry.rule = *out;
  entry.result = result;
  return result;
}

bool FrameTables::is_return_address(uint64_t address) {
  if (address < 4096) return false;
  // In an object's code (most words a scan asks about are not), so its bytes are mapped; they are
  // read under the loader's lock, with the table known current, so no dlclose can unmap them.
  const Object* object = object_of(address - 1);
  if (object == nullptr || address - 7 < object->start) return false;  // a call's bytes lie before it
  // Entries hold the address shifted left by one, with the answer in the low bit (a user-space
  // address has its top bit clear, so nothing is lost).
  uint64_t& cached = return_cache_[static_cast<size_t>((address * 0x9e3779b97f4a7c15ULL) >> 50) & (kReturnCacheSize - 1)];
  if (cached >> 1 == address) return (cached & 1) != 0;
  struct Check {
    const FrameTables* self;
    const uint8_t* p;
    bool stale = false, call = false;
  } check{this, reinterpret_cast<const uint8_t*>(address)};
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* data) -> int {
        auto* c = static_cast<Check*>(data);
        c->stale = c->self->loader_changed(info->dlpi_adds, info->dlpi_subs);
        if (c->stale) return 1;
        const uint8_t* p = c->p;
        if (p[-5] == 0xe8) {  // call rel32
          c->call = true;
          return 1;
        }
        // call r/m64: FF /2, with a ModRM byte (and maybe SIB and displacement) after the opcode.
        for (int len = 2; len <= 7; ++len) {
          if (p[-len] == 0xff && ((p[-len + 1] >> 3) & 7) == 2) c->call = true;
        }
        return 1;
      },
      &check);
  if (check.stale) {
    refresh();
    return check.call;
  }
  cached = (address << 1) | (check.call ? 1 : 0);
  return check.call;
}

FrameTables::Lookup FrameTables::compute(const uint8_t* hdr, uint64_t pc, FrameRule* out) {
  const uint64_t base = reinterpret_cast<uint64_t>(hdr);
  // version, eh_frame_ptr encoding, fde_count encoding, table encoding
  if (hdr[0] != 1) return Lookup::NoInfo;
  const uint8_t count_enc = hdr[2], table_enc = hdr[3];
  Cursor c{hdr + 4, hdr + 4 + 16};
  c.pointer(hdr[1], base);  // eh_frame_ptr: not needed, the table points at FDEs directly
  const uint64_t count = c.pointer(count_enc, base);
  // The binary search table needs fixed-size datarel sdata4 entries, which every toolchain emits.
  if (!c.ok || table_enc != (kPeDatarel | kPeSdata4) || count == 0) return Lookup::NoInfo;
  const int32_t* table = reinterpret_cast<const int32_t*>(c.p);
  size_t lo = 0, hi = count;
  while (hi - lo > 1) {
    const size_t mid = (lo + hi) / 2;
    if (base + static_cast<int64_t>(table[2 * mid]) <= pc) lo = mid; else hi = mid;
  }
  const uint64_t start = base + static_cast<int64_t>(table[2 * lo]);
  if (pc < start) return Lookup::NoInfo;
  const uint8_t* fde = reinterpret_cast<const uint8_t*>(base + static_cast<int64_t>(table[2 * lo + 1]));

  // The FDE: length, CIE pointer, then (per the CIE) initial location, range, augmentation, program.
  uint32_t len32;
  std::memcpy(&len32, fde, 4);
  if (len32 == 0 || len32 == 0xffffffff) return Lookup::NoInfo;  // terminator / 64-bit DWARF
  const uint8_t* fde_end = fde + 4 + len32;
  int32_t cie_offset;
  std::memcpy(&cie_offset, fde + 4, 4);
  const uint8_t* cie = fde + 4 - cie_offset;
  uint32_t cie_len;
  std::memcpy(&cie_len, cie, 4);
  if (cie_len == 0 || cie_len == 0xffffffff) return Lookup::NoInfo;
  Cursor cc{cie + 8, cie + 4 + cie_len};  // after length and CIE id
  const uint8_t version = cc.fixed<uint8_t>();
  const char* augmentation = reinterpret_cast<const char*>(cc.p);
  while (cc.p < cc.end && *cc.p) ++cc.p;
  ++cc.p;
  const uint64_t code_align = cc.uleb();
  const int64_t data_align = cc.sleb();
  const uint64_t ra_reg = version == 1 ? cc.fixed<uint8_t>() : cc.uleb();
  uint8_t fde_enc = kPeAbsptr;
  bool has_z = augmentation[0] == 'z';
  const uint8_t* cie_program = cc.p;
  if (has_z) {
    const uint64_t aug_len = cc.uleb();
    const uint8_t* aug_end = cc.p + aug_len;
    for (const char* a = augmentation + 1; *a && cc.ok; ++a) {
      if (*a == 'R') {
        fde_enc = cc.fixed<uint8_t>();
      } else if (*a == 'P') {
        const uint8_t enc = cc.fixed<uint8_t>();
        cc.pointer(enc & ~kPeIndirect);  // the personality routine: not needed, not followed
      } else if (*a == 'L') {
        cc.fixed<uint8_t>();
      } else if (*a == 'S' || *a == 'B') {
        // signal frame / branch protection: nothing to read
      } else {
        break;  // unknown augmentation: its data is skipped by the length
      }
    }
    cc.p = aug_end;
    cie_program = aug_end;
  } else if (augmentation[0] != '\0') {
    return Lookup::NoInfo;  // pre-'z' augmentations (eh): too old to matter
  }
  if (!cc.ok || ra_reg != static_cast<uint64_t>(kRegRa)) return Lookup::NoInfo;

  Cursor fc{fde + 8, fde_end};
  const uint64_t pc_begin = fc.pointer(fde_enc);
  const uint64_t pc_range = fc.pointer(fde_enc & kPeFormatMask);
  if (!fc.ok || pc < pc_begin || pc >= pc_begin + pc_range) return Lookup::NoInfo;
  if (has_z) fc.p += fc.uleb();

  RuleState initial;
  if (!run_program(Cursor{cie_program, cie + 4 + cie_len}, pc_begin, UINT64_MAX, code_align, data_align, RuleState{},
                   &initial))
    return Lookup::NoInfo;
  RuleState state = initial;
  if (!run_program(fc, pc_begin, pc, code_align, data_align, initial, &state)) return Lookup::NoInfo;
  if (state.unsupported || state.cfa_is_expression || (state.cfa_reg != kRegRsp && state.cfa_reg != kRegRbp))
    return Lookup::NoInfo;
  out->cfa_reg = state.cfa_reg == kRegRsp ? FrameRule::Cfa::Rsp : FrameRule::Cfa::Rbp;
  out->cfa_offset = static_cast<int32_t>(state.cfa_offset);
  out->ra = state.ra;
  out->ra_offset = static_cast<int32_t>(state.ra_offset);
  out->rbp = state.rbp;
  out->rbp_offset = static_cast<int32_t>(state.rbp_offset);
  return Lookup::Found;
}

}  // namespace cpuprof
