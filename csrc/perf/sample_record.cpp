#include "perf/sample_record.h"

#include <cstring>

namespace cpuprof {

namespace {

struct Reader {
  const uint8_t* p;
  const uint8_t* end;
  bool ok = true;
  uint64_t u64() {
    if (p + 8 > end) {
      ok = false;
      return 0;
    }
    uint64_t v;
    std::memcpy(&v, p, 8);
    p += 8;
    return v;
  }
  const uint8_t* skip(uint64_t bytes) {
    if (bytes > static_cast<uint64_t>(end - p)) {
      ok = false;
      return nullptr;
    }
    const uint8_t* at = p;
    p += bytes;
    return at;
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
  Reader r{record + sizeof(perf_event_header), record + size};
  out->ip = r.u64();
  const uint64_t pid_tid = r.u64();
  out->pid = static_cast<uint32_t>(pid_tid);
  out->tid = static_cast<uint32_t>(pid_tid >> 32);
  out->time = r.u64();
  out->n_values = r.u64();
  out->time_enabled = r.u64();
  out->time_running = r.u64();
  out->values = r.skip(8 * out->n_values);
  out->n_callchain = r.u64();
  out->callchain = r.skip(8 * out->n_callchain);
  const uint64_t abi = r.u64();
  out->has_user_regs = abi != PERF_SAMPLE_REGS_ABI_NONE;
  if (out->has_user_regs) {
    out->user_bp = r.u64();
    out->user_sp = r.u64();
    out->user_ip = r.u64();
  }
  const uint64_t stack_size = r.u64();
  out->stack_size = 0;
  out->stack = nullptr;
  if (stack_size) {
    const uint8_t* stack = r.skip(stack_size);
    const uint64_t dyn_size = r.u64();
    out->stack = stack;
    out->stack_size = dyn_size < stack_size ? dyn_size : stack_size;
  }
  return r.ok;
}

}  // namespace cpuprof
