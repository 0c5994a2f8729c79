#include "perf/sample_ring.h"

#include "common/limits.h"

#include <errno.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstring>

namespace cpuprof {

namespace {
std::atomic<size_t> g_injected_page_budget{0};
}  // namespace

void inject_ring_page_budget(size_t pages) { g_injected_page_budget.store(pages); }

size_t SampleRing::pages_for(size_t data_pages) {
  size_t pages = 1;
  while (pages * 2 <= data_pages) pages *= 2;
  return pages;
}

size_t SampleRing::min_pages(size_t stack_bytes) {
  const size_t page_size = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t needed = kMinRingSamples * (stack_bytes + kSampleRecordBytesBesidesStack);
  size_t pages = 1;
  while (pages * page_size < needed) pages *= 2;
  return pages;
}

int SampleRing::map(int fd, size_t data_pages) {
  unmap();
  const size_t pages = pages_for(data_pages);
  const size_t budget = g_injected_page_budget.load(std::memory_order_relaxed);
  if (budget != 0 && pages > budget) return EPERM;
  const size_t page_size = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t bytes = (pages + 1) * page_size;
  void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) return errno;
  base_ = base;
  mapped_bytes_ = bytes;
  auto* page = static_cast<perf_event_mmap_page*>(base_);
  // Kernels before 4.1 leave data_offset/size zero: the data starts after the first page.
  data_ = static_cast<uint8_t*>(base_) + (page->data_offset ? page->data_offset : page_size);
  data_size_ = page->data_size ? page->data_size : pages * page_size;
  return 0;
}

void SampleRing::unmap() {
  if (base_ != nullptr) munmap(base_, mapped_bytes_);
  base_ = nullptr;
  mapped_bytes_ = 0;
  data_ = nullptr;
  data_size_ = 0;
}

void SampleRing::copy_out(size_t offset, void* out, size_t n) const {
  auto* dst = static_cast<uint8_t*>(out);
  const size_t first = n < data_size_ - offset ? n : data_size_ - offset;
  std::memcpy(dst, data_ + offset, first);
  if (first < n) std::memcpy(dst + first, data_, n - first);
}

}  // namespace cpuprof
