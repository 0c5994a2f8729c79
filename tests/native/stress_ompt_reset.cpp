// Stress of the OMPT tool's tables against resets and reads, built with ThreadSanitizer by
// tests/integration/test_native_sanitizers.py. Threads record lock waits through the tool's own
// callbacks (as the OpenMP runtime calls them) while the main thread resets the tables, which
// each owner renews at its next callback, and reads them the way the Python reader does, all the
// while. A renewal that cleared the tables with plain writes under the reader's atomic loads was
// a data race (a reader that took the generation before a reset read the tables while their owner
// cleared them).
#include <atomic>
#include <cstdio>
#include <thread>
#include <vector>

// The callbacks live in an anonymous namespace of the tool's runtime side: this driver includes
// that unit and is built with the tool's other units (test_native_sanitizers.py).
#include "ompt/ompt_callbacks.cpp"

using namespace cpuprof::ompt;

namespace {

std::atomic<bool> g_done{false};

void record_waits(std::atomic<uint64_t>* recorded) {
  while (!g_done.load(std::memory_order_relaxed)) {
    on_mutex_acquire(ompt_mutex_lock, 0, 0, 0, nullptr);
    on_mutex_acquired(ompt_mutex_lock, 0, nullptr);
    on_sync_region_wait(ompt_sync_region_barrier_explicit, ompt_scope_begin, nullptr, nullptr, nullptr);
    on_sync_region_wait(ompt_sync_region_barrier_explicit, ompt_scope_end, nullptr, nullptr, nullptr);
    recorded->fetch_add(1, std::memory_order_relaxed);
  }
}

}  // namespace

int main() {
  cpuprof_ompt_enable(1);
  std::atomic<uint64_t> recorded{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) threads.emplace_back(record_waits, &recorded);
  std::vector<cpuprof_ompt_wait> waits(4096);
  std::vector<cpuprof_ompt_work> work(4096);
  long reads = 0, rows = 0;
  // Until every thread has recorded many waits: the reads must meet tables being renewed.
  while (recorded.load(std::memory_order_relaxed) < 40000 || reads < 2000) {
    if (reads % 16 == 0) cpuprof_ompt_reset();
    cpuprof_ompt_status status;
    cpuprof_ompt_get_status(&status);
    rows += cpuprof_ompt_read_waits(waits.data(), static_cast<long>(waits.size()));
    rows += cpuprof_ompt_read_work(work.data(), static_cast<long>(work.size()));
    ++reads;
    std::this_thread::yield();
  }
  g_done.store(true);
  for (auto& t : threads) t.join();
  if (rows == 0) {
    std::printf("no records were ever read: the stress did not exercise the reader\n");
    return 1;
  }
  std::printf("ok: %ld reads, %ld rows, %llu waits recorded\n", reads, rows,
              static_cast<unsigned long long>(recorded.load()));
  return 0;
}
