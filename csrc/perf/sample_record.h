// Reading the PERF_RECORD_SAMPLE records cpuprof's sampling events write.
#pragma once

#include <linux/perf_event.h>

#include <cstddef>
#include <cstdint>

namespace cpuprof {

// What cpuprof asks each sample to carry: thread, time, IP, the group's counter values, the
// kernel call chain, and the user registers and stack for unwinding.
constexpr uint64_t kSampleType = PERF_SAMPLE_IP | PERF_SAMPLE_TID | PERF_SAMPLE_TIME | PERF_SAMPLE_READ |
                                 PERF_SAMPLE_CALLCHAIN | PERF_SAMPLE_REGS_USER | PERF_SAMPLE_STACK_USER;
// x86-64 user registers an unwind needs (perf_regs.h: BP 6, SP 7, IP 8), in mask order.
constexpr uint64_t kSampleRegsMask = (1ULL << 6) | (1ULL << 7) | (1ULL << 8);

// The kernel's markers between the parts of a call chain (PERF_CONTEXT_*).
constexpr uint64_t kContextKernel = static_cast<uint64_t>(-128);
constexpr uint64_t kContextUser = static_cast<uint64_t>(-512);
constexpr uint64_t kContextMax = static_cast<uint64_t>(-4095);

struct ParsedSample {
  uint64_t ip = 0;
  uint32_t pid = 0, tid = 0;
  uint64_t time = 0;
  uint64_t n_values = 0;  // the group's counters, in group order (after enabled/running times)
  uint64_t time_enabled = 0, time_running = 0;
  const uint8_t* values = nullptr;
  uint64_t n_callchain = 0;
  const uint8_t* callchain = nullptr;
  bool has_user_regs = false;
  uint64_t user_bp = 0, user_sp = 0, user_ip = 0;
  uint64_t stack_size = 0;  // bytes copied (dyn_size: the part that was really on the stack)
  const uint8_t* stack = nullptr;

  uint64_t value(uint64_t i) const;
  uint64_t chain(uint64_t i) const;
};

// Parses a record written with kSampleType / kSampleRegsMask, whose read format is
// PERF_FORMAT_GROUP | TOTAL_TIME_ENABLED | TOTAL_TIME_RUNNING. False when it does not fit.
bool parse_sample(const uint8_t* record, size_t size, ParsedSample* out);

}  // namespace cpuprof
