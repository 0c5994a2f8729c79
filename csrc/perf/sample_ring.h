// The kernel's ring of sample records for one perf event (its mmap'd buffer).
//
// The kernel writes records at data_head; the reader consumes them from data_tail and publishes
// the new tail, so the kernel can reuse the space. Records are read in place, or copied into a
// scratch buffer when one wraps around the end of the ring. When the ring is full the kernel
// drops samples and later writes a PERF_RECORD_LOST saying how many: never a silent loss.
#pragma once

#include <linux/perf_event.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace cpuprof {

// Test hook: maps of more than `pages` data pages fail with EPERM, as past an unprivileged
// user's locked-memory budget (0 clears).
void inject_ring_page_budget(size_t pages);

class SampleRing {
 public:
  SampleRing() = default;
  SampleRing(const SampleRing&) = delete;
  SampleRing& operator=(const SampleRing&) = delete;
  ~SampleRing() { unmap(); }

  // Maps the ring of `fd` with 2^k data pages (`data_pages` rounded down to a power of two);
  // returns 0 or an errno (EPERM: over perf_event_mlock_kb for an unprivileged user).
  int map(int fd, size_t data_pages);
  // The data pages map() maps for `data_pages`: the power of two at or below it (at least one).
  static size_t pages_for(size_t data_pages);
  // The fewest data pages (a power of two) that hold kMinRingSamples samples copying
  // `stack_bytes` of user stack: a ring is never mapped smaller.
  static size_t min_pages(size_t stack_bytes);
  void unmap();
  bool mapped() const { return base_ != nullptr; }
  size_t bytes() const { return mapped_bytes_; }
  size_t data_size() const { return data_size_; }
  // Bytes consumed so far: a position that only grows, so equal positions mean nothing consumed
  // in between.
  uint64_t tail() const {
    if (base_ == nullptr) return 0;
    return __atomic_load_n(&static_cast<const perf_event_mmap_page*>(base_)->data_tail, __ATOMIC_ACQUIRE);
  }
  // Bytes written so far (the kernel's position).
  uint64_t head() const {
    if (base_ == nullptr) return 0;
    return __atomic_load_n(&static_cast<const perf_event_mmap_page*>(base_)->data_head, __ATOMIC_ACQUIRE);
  }
  // Bytes written and not yet consumed.
  uint64_t pending() const {
    if (base_ == nullptr) return 0;
    auto* page = static_cast<const perf_event_mmap_page*>(base_);
    return __atomic_load_n(&page->data_head, __ATOMIC_ACQUIRE) - __atomic_load_n(&page->data_tail, __ATOMIC_RELAXED);
  }

  // Calls visit(header, record) for each record in order; `record` is contiguous and valid only
  // during the call. A visit that returns false leaves that record unconsumed (it is read again
  // next time). A record that wraps is copied into `scratch`; one larger than `scratch` is passed
  // as nullptr (a reader that needs every record's bytes gives 64 KiB: a record's size is 16 bits).
  template <typename Visit>
  void consume(std::vector<uint8_t>& scratch, Visit&& visit) {
    if (base_ == nullptr) return;
    auto* page = static_cast<perf_event_mmap_page*>(base_);
    const uint64_t head = __atomic_load_n(&page->data_head, __ATOMIC_ACQUIRE);
    uint64_t tail = __atomic_load_n(&page->data_tail, __ATOMIC_RELAXED);
    while (tail < head) {
      const size_t offset = static_cast<size_t>(tail & (data_size_ - 1));
      perf_event_header header;
      copy_out(offset, &header, sizeof(header));
      if (header.size < sizeof(header) || tail + header.size > head) break;  // torn or partial
      const uint8_t* record;
      if (offset + header.size <= data_size_) {
        record = data_ + offset;
      } else if (header.size <= scratch.size()) {
        copy_out(offset, scratch.data(), header.size);
        record = scratch.data();
      } else {
        record = nullptr;
      }
      if (!visit(header, record)) break;
      tail += header.size;
    }
    __atomic_store_n(&page->data_tail, tail, __ATOMIC_RELEASE);
  }

 private:
  void copy_out(size_t offset, void* out, size_t n) const;
  void* base_ = nullptr;
  size_t mapped_bytes_ = 0;
  uint8_t* data_ = nullptr;
  size_t data_size_ = 0;
};

}  // namespace cpuprof
