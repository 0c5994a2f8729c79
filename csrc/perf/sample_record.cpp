#include "perf/sample_record.h"

#include <cstring>

namespace cpuprof {

namespace {

// Every length a record states is checked against the bytes left before anything is read
// through it: the kernel writes well-formed records, but a record torn by a ring wrap or a
// corrupt header must fail to parse, never read past the record (8 * n wraps for n >= 2^61).
struct Reader {
  const uint8_t* p;
  const uint8_t* end;
  bool ok = true;
  uint64_t left() const { return static_cast<uint64_t>(end - p); }
  uint64_t u64() {
    if (!ok || left() < 8) {
      ok = false;
      return 0;
    }
    uint64_t v;
    std::memcpy(&v, p, 8);
    p += 8;
    return v;
  }
  const uint8_t* skip(uint64_t bytes) {
    if (!ok || bytes > left()) {
      ok = false;
      return nullptr;
    }
    const uint8_t* at = p;
    p += bytes;
    return at;
  }
  // `count` 8-byte words, without computing 8 * count (which can wrap).
  const uint8_t* words(uint64_t count) {
    if (!ok || count > left() / 8) {
      ok = false;
      return nullptr;
    }
    return skip(count * 8);
  }
};

}  // namespace

uint64_t ParsedSample::value(uint64_t i) const {
  uint64_t v;
  std::memcpy(&v, values + 8 * i, 8);
  return v;
}

uint64_t ParsedSample::chain(uint64_t i) const {
  uint64_t v;
  std::memcpy(&v, callchain + 8 * i, 8);
  return v;
}

bool parse_sample(const uint8_t* record, size_t size, ParsedSample* out) {
  *out = ParsedSample{};
  if (record == nullptr || size < sizeof(perf_event_header)) return false;
  Reader r{record + sizeof(perf_event_header), record + size};
  out->ip = r.u64();
  const uint64_t pid_tid = r.u64();
  out->pid = static_cast<uint32_t>(pid_tid);
  out->tid = static_cast<uint32_t>(pid_tid >> 32);
  out->time = r.u64();
  const uint64_t n_values = r.u64();
  out->time_enabled = r.u64();
  out->time_running = r.u64();
  out->values = r.words(n_values);
  const uint64_t n_callchain = r.u64();
  out->callchain = r.words(n_callchain);
  const uint64_t abi = r.u64();
  out->has_user_regs = abi != PERF_SAMPLE_REGS_ABI_NONE;
  if (out->has_user_regs) {
    out->user_bp = r.u64();
    out->user_sp = r.u64();
    out->user_ip = r.u64();
  }
  const uint64_t stack_size = r.u64();
  if (stack_size) {
    const uint8_t* stack = r.skip(stack_size);
    const uint64_t dyn_size = r.u64();
    out->stack = stack;
    out->stack_size = dyn_size < stack_size ? dyn_size : stack_size;
  }
  if (!r.ok) {
    // Nothing of a record that does not parse may be used: no lengths that point past it.
    *out = ParsedSample{};
    return false;
  }
  out->n_values = n_values;
  out->n_callchain = n_callchain;
  return true;
}

}  // namespace cpuprof
