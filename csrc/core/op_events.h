// The op timeline of one dispatching thread: its op begins and ends, in order, for the sampler.
//
// Samples say where a thread's CPU time went in native code; joining them by time to the op the
// thread (or the thread it works for) was running turns that into CPU per op. The dispatching
// thread writes an event at every op boundary, the collector thread reads them: one producer,
// one consumer, no lock. A full ring drops the newest events and counts them; each event carries
// its depth, so the consumer's replayed stack recovers at the next event.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <new>

namespace cpuprof {

// One op boundary and cpuprof's own callback around it. A begin: the callback ran from hook_ns,
// the op from op_ns. An end: the op ended at op_ns, the callback ran until hook_ns. Samples that
// land inside the callback are the profiler's, not the op's nor its parent's.
struct OpEvent {
  int64_t hook_ns;
  int64_t op_ns;
  uint32_t entry;   // the op's entry in the op table
  uint16_t depth;   // its frame index: a begin pushes it there, an end pops down to it
  uint8_t begin;    // 1: begin, 0: end
  uint8_t unused;
};
static_assert(sizeof(OpEvent) == 24, "op events are 24 bytes");

class OpEventRing {
 public:
  void init(size_t capacity) {
    size_t rounded = 1;
    while (rounded < capacity) rounded <<= 1;
    capacity_ = capacity ? rounded : 0;
    events_.reset(capacity_ ? new OpEvent[capacity_] : nullptr);
    head_.store(0, std::memory_order_relaxed);
    tail_.store(0, std::memory_order_relaxed);
    dropped_.store(0, std::memory_order_relaxed);
  }
  // The same, returning false (and left disabled) instead of throwing when memory is short:
  // used inside the op callbacks, where an exception must not escape.
  bool try_init(size_t capacity) noexcept {
    size_t rounded = 1;
    while (rounded < capacity) rounded <<= 1;
    OpEvent* events = new (std::nothrow) OpEvent[rounded];
    if (events == nullptr) return false;
    events_.reset(events);
    capacity_ = rounded;
    head_.store(0, std::memory_order_relaxed);
    tail_.store(0, std::memory_order_relaxed);
    dropped_.store(0, std::memory_order_relaxed);
    return true;
  }
  bool enabled() const { return capacity_ != 0; }

  // Producer (the dispatching thread): allocation-free, wait-free.
  void push(int64_t hook_ns, int64_t op_ns, uint32_t entry, int depth, bool begin) {
    const uint64_t head = head_.load(std::memory_order_relaxed);
    if (head - tail_.load(std::memory_order_acquire) >= capacity_) {
      dropped_.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    events_[head & (capacity_ - 1)] =
        OpEvent{hook_ns, op_ns, entry, static_cast<uint16_t>(depth), begin ? uint8_t{1} : uint8_t{0}, 0};
    head_.store(head + 1, std::memory_order_release);
  }

  // Consumer (the collector): the next event, if one is published, without consuming it.
  const OpEvent* peek() const {
    const uint64_t tail = tail_.load(std::memory_order_relaxed);
    if (tail == head_.load(std::memory_order_acquire)) return nullptr;
    return &events_[tail & (capacity_ - 1)];
  }
  void pop() { tail_.store(tail_.load(std::memory_order_relaxed) + 1, std::memory_order_release); }
  uint64_t dropped() const { return dropped_.load(std::memory_order_relaxed); }
  size_t memory_bytes() const { return capacity_ * sizeof(OpEvent); }
  // The time an event starts to matter: where samples stop belonging to the state before it.
  static int64_t start_of(const OpEvent& e) { return e.begin ? e.hook_ns : e.op_ns; }

 private:
  std::unique_ptr<OpEvent[]> events_;
  size_t capacity_ = 0;
  alignas(64) std::atomic<uint64_t> head_{0};
  alignas(64) std::atomic<uint64_t> tail_{0};
  std::atomic<uint64_t> dropped_{0};
};

}  // namespace cpuprof
