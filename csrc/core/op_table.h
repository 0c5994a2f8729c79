// Bounded aggregates per op key.
//
// The key is (op name, inputs, enclosing region). Inputs are kept structured (kind, dtype,
// sizes, strides), not as text: analyses that need dims (FLOPs, bytes moved) read them as
// numbers. A key's description is written once, when it is first seen; every later call only
// hashes and bumps atomics, so the steady state allocates nothing and takes no lock. When the
// table is full, new keys fall into one overflow entry and the profile says how many did.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <type_traits>

#include "common/enum_list.h"
#include "common/limits.h"

namespace cpuprof {

// Both cross to Python as enums (common/enum_list.h), named there as the profile names them.
#define CPUPROF_ENTRY_KINDS(X) \
  X(Op, 0, "op")               \
  X(Region, 1, "region")       \
  X(Special, 2, "special")
enum class EntryKind : uint8_t { CPUPROF_ENTRY_KINDS(CPUPROF_ENUM_VALUE) };

#define CPUPROF_INPUT_KINDS(X)                                                            \
  X(Tensor, 1, "tensor")                                                                  \
  X(TensorList, 2, "tensor_list") /* followed by `list_len` Tensor inputs, its items */   \
  X(None, 3, "none")                                                                      \
  X(Int, 4, "int")                                                                        \
  X(Float, 5, "float")                                                                    \
  X(Bool, 6, "bool")                                                                      \
  X(IntList, 7, "int_list")                                                               \
  X(Other, 8, "other")                                                                    \
  /* a tensor whose sizes cannot be read without calling out (nested, symbolic) */        \
  X(UnknownShape, 9, "unknown_shape")                                                     \
  X(Undefined, 10, "undefined") /* an undefined tensor */
enum class InputKind : uint8_t { CPUPROF_INPUT_KINDS(CPUPROF_ENUM_VALUE) };

struct InputDesc {
  InputKind kind;
  uint8_t ndim;      // Tensor: dims, at sizes[dims_at..], strides[dims_at..]
  uint8_t dims_at;
  uint8_t list_len;  // TensorList: items that follow
  char dtype[8];     // Tensor/UnknownShape: "bf16", "f32", ...
};

// The first cache line holds what every call touches: the key (read at its begin) and the call
// totals (added at its end). On a decode each GEMV streams tens of MB through the caches between
// two ops, so every line an op's callbacks touch is a miss; with the totals 1 KB after the key
// there were two. (Allocation reports touch the counters at the end, only when torch allocates.)
struct alignas(64) OpEntry {
  std::atomic<uint64_t> key{0};    // 0 = free
  std::atomic<uint64_t> calls{0};
  std::atomic<uint64_t> incl_ns{0};
  std::atomic<uint64_t> self_ns{0};
  std::atomic<uint64_t> max_ns{0};
  std::atomic<uint64_t> samples{0};  // sampled mode: deadlines that found this op innermost
  std::atomic<uint32_t> ready{0};  // description written
  EntryKind kind = EntryKind::Op;
  uint32_t region = 0;             // entry index of the enclosing region, 0 = none
  char name[kMaxOpNameBytes] = {0};
  uint8_t n_inputs = 0;
  bool inputs_truncated = false;  // more inputs or dims than fit: the rest are not described
  bool has_inputs = false;        // inputs were recorded (record_shapes and readable)
  InputDesc inputs[kMaxKeyInputs] = {};
  int64_t sizes[kMaxKeyDims] = {};
  int64_t strides[kMaxKeyDims] = {};
  // torch's allocator reports (c10 memory reporting), charged to the innermost open op of the
  // thread that allocated: what torch.profiler's profile_memory sees, per key.
  std::atomic<uint64_t> alloc_bytes{0};
  std::atomic<uint64_t> allocs{0};
  std::atomic<uint64_t> freed_bytes{0};
  std::atomic<uint64_t> frees{0};
};
static_assert(std::is_standard_layout_v<OpEntry>, "offsetof below needs a standard-layout entry");
static_assert(offsetof(OpEntry, samples) + sizeof(uint64_t) <= 64, "an op's key and totals share one cache line");

// Fixed entries, so reports can find them by index.
constexpr uint32_t kOverflowEntry = 0;  // keys that did not fit
constexpr uint32_t kOutsideEntry = 1;   // counts taken while no op was running
constexpr uint32_t kProfilerEntry = 2;  // sampled mode: samples inside cpuprof's own callbacks
constexpr uint32_t kFirstOpEntry = 3;

// Builds an entry's input description in place; used once per key, by the op source.
class InputWriter {
 public:
  explicit InputWriter(OpEntry& entry) : entry_(entry) {
    entry_.n_inputs = 0;
    entry_.inputs_truncated = false;
    entry_.has_inputs = true;
  }
  // Returns false (and marks the entry truncated) when the input does not fit.
  bool tensor(const char* dtype, int ndim, const int64_t* sizes, const int64_t* strides);
  bool scalar(InputKind kind);
  bool unknown_shape(const char* dtype);
  // Opens a list of `n` tensors; the next `n` tensor() calls are its items.
  bool tensor_list(int n);

 private:
  InputDesc* next();
  OpEntry& entry_;
  int dims_used_ = 0;
};

class OpTable {
 public:
  // `n_events` counters per (entry, thread slot); slots are allocated in blocks as threads
  // appear (reserve_slots), so a table sized for thousands of threads costs nothing until used.
  void init(int capacity, int max_slots, int n_events);
  // The entries a table asked for `capacity` keys has: a power of two, for mask probing.
  static int rounded_capacity(int capacity) {
    int rounded = 16;
    while (rounded < capacity) rounded <<= 1;
    return rounded;
  }
  void reset();

  // Returns the entry for `hash`, inserting it with the description `fill` writes when new.
  template <typename Fill>
  uint32_t find_or_insert(uint64_t hash, Fill&& fill) {
    hash |= 1;  // 0 marks a free entry
    const uint32_t mask = static_cast<uint32_t>(capacity_ - 1);
    uint32_t index = static_cast<uint32_t>(hash ^ (hash >> 29)) & mask;
    for (int probe = 0; probe < kMaxProbe; ++probe, index = (index + 1) & mask) {
      if (index < kFirstOpEntry) continue;
      OpEntry& entry = entries_[index];
      uint64_t seen = entry.key.load(std::memory_order_acquire);
      if (seen == hash) return index;
      if (seen == 0) {
        if (used_.load(std::memory_order_relaxed) >= capacity_ * 3 / 4) break;
        uint64_t expected = 0;
        if (entry.key.compare_exchange_strong(expected, hash, std::memory_order_acq_rel)) {
          used_.fetch_add(1, std::memory_order_relaxed);
          fill(entry);
          entry.ready.store(1, std::memory_order_release);
          return index;
        }
        if (expected == hash) return index;
      }
    }
    overflowed_.fetch_add(1, std::memory_order_relaxed);
    return kOverflowEntry;
  }

  OpEntry& entry(uint32_t index) { return entries_[index]; }
  const OpEntry& entry(uint32_t index) const { return entries_[index]; }
  int capacity() const { return capacity_; }
  int n_events() const { return n_events_; }
  uint64_t overflowed() const { return overflowed_.load(std::memory_order_relaxed); }

  // Makes counters exist for slots [0, n). Called when threads are registered, before any of
  // them can be charged; allocates at most once per 64 threads, never on the per-op path.
  void reserve_slots(int n);
  bool slot_ready(int slot) const {
    return slot >= 0 && slot < max_slots_ &&
           blocks_[slot / kSlotsPerBlock].load(std::memory_order_acquire) != nullptr;
  }

  // Counter totals per (entry, thread slot, event), inclusive and self. The slot must be ready.
  std::atomic<uint64_t>& counter(uint32_t entry, int slot, int event, bool self) {
    return blocks_[slot / kSlotsPerBlock].load(std::memory_order_acquire)[cell(entry, slot, event, self)];
  }
  uint64_t counter_value(uint32_t entry, int slot, int event, bool self) const {
    const std::atomic<uint64_t>* block = blocks_[slot / kSlotsPerBlock].load(std::memory_order_acquire);
    return block ? block[cell(entry, slot, event, self)].load(std::memory_order_relaxed) : 0;
  }

  size_t memory_bytes() const;

 private:
  static constexpr int kMaxProbe = 64;
  static constexpr int kSlotsPerBlock = 64;
  size_t cell(uint32_t entry, int slot, int event, bool self) const {
    return ((static_cast<size_t>(entry) * kSlotsPerBlock + slot % kSlotsPerBlock) * n_events_ + event) * 2 + self;
  }
  struct FreeDeleter {
    void operator()(std::atomic<uint64_t>* p) const { std::free(p); }
  };
  std::unique_ptr<OpEntry[]> entries_;
  // calloc, not new[]: the kernel hands out zero pages lazily, so a block costs resident memory
  // only for the (entry, thread) cells an op actually touches.
  std::unique_ptr<std::unique_ptr<std::atomic<uint64_t>[], FreeDeleter>[]> owned_blocks_;
  std::unique_ptr<std::atomic<std::atomic<uint64_t>*>[]> blocks_;
  int capacity_ = 0;
  int max_slots_ = 0;
  int n_blocks_ = 0;
  int n_events_ = 1;
  std::mutex reserve_mutex_;
  std::atomic<int> used_{0};
  std::atomic<uint64_t> overflowed_{0};
};

}  // namespace cpuprof
