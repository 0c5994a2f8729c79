// Sampled counting's reading of the rings (see sampled_counting.cpp): every period the collector
// empties each sampled thread's ring into records that wait, in memory, for the op timeline to
// catch up with them; a sample's counters become deltas since the thread's previous sample and its
// copied user stack becomes an interned native stack. Apart from the joining because it is the one
// part that reads the kernel's record layout and unwinds stacks; the rest sees only Pending records.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/sampled_counting_impl.h"
#include "unwind/unwinder.h"

namespace cpuprof {
namespace detail {

void SampledCounting::drain_rings() {
  ThreadRegistry& registry = *ctx_.registry;
  const int n_slots = std::min(registry.size(), options_.max_slots);
  for (int slot = 0; slot < n_slots; ++slot) {
    ThreadSlot& thread = registry.mutable_slot(slot);
    if (!thread.counters.sampling()) {
      // A thread without a sample ring (sampling refused, the locked-memory budget spent, its
      // counters refused) tells nobody what it creates.
      uncovered_ = true;
      continue;
    }
    thread.counters.ring().consume(scratch_, [&](const perf_event_header& header, const uint8_t* record) {
      if (header.type == PERF_RECORD_FORK) {
        creation_seen_ = true;  // a profiled thread created one (attr.task writes it to the creator's ring)
        return true;
      }
      if (header.type == PERF_RECORD_LOST) {
        creation_seen_ = true;
        if (header.size < sizeof(header) + 16) {
          ++unparsed_;
          return true;
        }
        uint64_t lost = 0;
        std::memcpy(&lost, record + sizeof(header) + 8, sizeof(lost));  // {id, lost}, then sample_id
        lost_of_[slot] += lost;
        // Its switch records may be among the lost: the thread's state is unknown from here.
        if (header.size >= sizeof(header) + 32) queue_record(slot, RecordKind::Lost, record, sizeof(header) + 24);
        return true;
      }
      if (header.type == PERF_RECORD_SWITCH) {
        // No body; with sample_id_all its trailer is kSampleType's sample_id: {pid, tid}, time.
        const auto kind = (header.misc & PERF_RECORD_MISC_SWITCH_OUT) ? RecordKind::SwitchOut : RecordKind::SwitchIn;
        if (header.size >= sizeof(header) + 16) {
          queue_record(slot, kind, record, sizeof(header) + 8);
        } else {
          ++unparsed_;
        }
        return true;
      }
      if (header.type == PERF_RECORD_EXIT) {
        // {pid, ppid, tid, ptid, time}: a thread's last switch out is never written, its exit is.
        if (header.size >= sizeof(header) + 24) {
          queue_record(slot, RecordKind::Exit, record, sizeof(header) + 16);
        } else {
          ++unparsed_;
        }
        return true;
      }
      if (header.type != PERF_RECORD_SAMPLE) return true;  // throttle and the like
      ParsedSample sample;
      if (!parse_sample(record, header.size, &sample)) {
        ++unparsed_;
        return true;
      }
      read_sample(slot, thread, sample);
      return true;
    });
  }
}

// A record of the thread's run state, stamped at `time_offset` on the samples' clock.
void SampledCounting::queue_record(int slot, RecordKind kind, const uint8_t* record, size_t time_offset) {
  uint64_t time = 0;
  std::memcpy(&time, record + time_offset, sizeof(time));
  Pending p;
  p.time = static_cast<int64_t>(time);
  p.slot = slot;
  p.kind = kind;
  p.stack = 0;
  p.n_deltas = 0;
  pending_.push_back(p);
  if (kind != RecordKind::Lost) ++switch_records_;
}

void SampledCounting::read_sample(int slot, const ThreadSlot& thread, const ParsedSample& sample) {
  Pending p;
  p.time = static_cast<int64_t>(sample.time);
  p.slot = slot;
  p.kind = RecordKind::Sample;
  p.n_deltas = static_cast<uint32_t>(ctx_.n_events());
  std::fill_n(p.deltas, kMaxEvents, 0);
  RawCount* last = &last_[static_cast<size_t>(slot) * kMaxEvents];
  const int n_values = std::min<int>(static_cast<int>(sample.n_values), thread.counters.sample_values());
  for (int i = 0; i < n_values; ++i) {
    const int event = thread.counters.sample_value_event(i);
    const RawCount now{sample.value(static_cast<uint64_t>(i)), sample.time_enabled, sample.time_running};
    const ScaledCount delta = scale_delta(last[event], now);
    last[event] = now;
    if (delta.scaled) ctx_.scaled_events.fetch_or(1u << event, std::memory_order_relaxed);
    p.deltas[event] = static_cast<uint64_t>(std::llround(delta.value));
  }
  p.stack = unwind(sample);
  pending_.push_back(p);
}

// The sample's native stack, leaf first: kernel frames (the kernel's call chain), then user
// frames unwound from the copied stack.
uint32_t SampledCounting::unwind(const ParsedSample& sample) {
  uint64_t pcs[kMaxUnwindFrames * 2];
  int n = 0;
  for (uint64_t i = 0; i < sample.n_callchain && n < kMaxUnwindFrames; ++i) {
    const uint64_t pc = sample.chain(i);
    if (pc >= kContextMax) continue;  // PERF_CONTEXT_* markers
    pcs[n++] = pc;
  }
  UnwindResult result;
  UserRegs regs;
  if (sample.has_user_regs) regs = UserRegs{sample.user_ip, sample.user_sp, sample.user_bp};
  unwind_user_stack(regs, sample.stack, sample.stack ? sample.stack_size : 0, frames_, &result);
  ++unwind_stops_[static_cast<int>(result.stop)];
  by_frame_pointer_ += static_cast<uint64_t>(result.by_frame_pointer);
  by_scanning_ += static_cast<uint64_t>(result.by_scanning);
  for (int i = 0; i < result.n && n < kMaxUnwindFrames * 2; ++i) pcs[n++] = result.pcs[i];
  if (n == 0 && sample.ip) pcs[n++] = sample.ip;  // at least where the CPU was
  return stacks_.intern_stack(pcs, n);
}

}  // namespace detail

}  // namespace cpuprof
