// Stress of the session's per-op path against the collection loop and start/stop, built with a
// sanitizer by tests/integration/test_native_sanitizers.py. Several threads run nested "ops"
// through the same entry point the RecordFunction hook uses (with_op_stack, begin_op, end_op)
// while the main thread starts and stops sessions in both counting modes, with small thread
// slots and a small op table, and other threads take snapshots all the while; sampled rounds also
// run the kernel sampling rings, the collector's join and the unwinder.
#include <atomic>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

#include "core/collection_loop.h"
#include "core/session.h"
#include "sources/op_source.h"

using namespace cpuprof;

namespace {

std::atomic<bool> g_done{false};

void run_ops(int id, std::atomic<uint64_t>* ops) {
  char name[32];
  snprintf(name, sizeof(name), "op%d", id);
  while (!g_done.load(std::memory_order_relaxed)) {
    for (int depth = 0; depth < 3; ++depth) {
      with_op_stack(Boundary::Begin, [&](Session& session, DispatchState& state, int64_t enter_ns) {
        session.begin_op(&state, enter_ns, 7 + depth, 1000 + id * 10 + depth, depth == 0, [&](OpEntry& e) {
          strncpy(e.name, name, sizeof(e.name) - 1);
          InputWriter w(e);
          const int64_t sizes[2] = {id + 1, depth + 1}, strides[2] = {depth + 1, 1};
          w.tensor("f32", 2, sizes, strides);
          w.scalar(InputKind::Int);
        });
      });
    }
    volatile double x = 0;
    for (int i = 0; i < 2000; ++i) x = x + i * 0.5;
    for (int depth = 2; depth >= 0; --depth) {
      with_op_stack(Boundary::End, [&](Session& session, DispatchState& state, int64_t enter_ns) {
        session.end_op(&state, enter_ns, 7 + depth);
      });
    }
    ops->fetch_add(1, std::memory_order_relaxed);
  }
}

}  // namespace

int main() {
  std::atomic<uint64_t> ops{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < 3; ++i) threads.emplace_back(run_ops, i, &ops);
  // Checkpoints from another thread throughout, across every start and stop.
  std::thread watcher([] {
    while (!g_done.load(std::memory_order_relaxed)) (void)Session::instance().snapshot();
  });
  SessionConfig config;
  config.events = {"task-clock", "context-switches", "page-faults"};
  // Sampled rounds sample fast, with stacks to unwind and a small timeline and rings, so the
  // collector drains, joins and wraps all the while.
  config.sample_hz = 5000;
  config.stack_bytes = 2048;
  config.ring_pages = 8;
  config.timeline_samples = 256;
  config.span_capacity = 64;
  config.op_capacity = 32;
  // Passes every 10 ms (the default is 40): each 40 ms session then has several passes to race
  // its snapshots and stop.
  inject_collect_interval_us(10000);
  for (int round = 0; round < 12; ++round) {
    config.mode = round % 2 ? CountingMode::Exact : CountingMode::Sampled;
    // Alternate between more slots than threads and fewer (threads beyond them are counted).
    config.max_threads = round % 3 == 2 ? 3 : 70;
    Session::instance().start(config);
    std::this_thread::sleep_for(std::chrono::milliseconds(40));
    std::thread checkpoint([] { (void)Session::instance().snapshot(); });  // a checkpoint while running
    (void)Session::instance().snapshot();
    checkpoint.join();
    std::thread late_snapshot([] { (void)Session::instance().snapshot(); });  // races the stop
    Session::instance().stop();
    late_snapshot.join();
    const SessionSnapshot snap = Session::instance().snapshot();
    uint64_t calls = 0;
    for (const EntrySnapshot& e : snap.entries) calls += e.calls;
    if (config.mode == CountingMode::Sampled && snap.sampling.enabled && snap.sampling.samples == 0) {
      fprintf(stderr, "round %d: sampled mode joined no samples\n", round);
      return 1;
    }
    if (calls == 0) {
      fprintf(stderr, "round %d recorded no op calls (ops_seen %llu unattributed %llu unmatched %llu too_deep %llu truncated %llu entries %zu dispatch %zu threads %zu)\n", round, (unsigned long long)snap.ops_seen, (unsigned long long)snap.unattributed_ops, (unsigned long long)snap.unmatched_ends, (unsigned long long)snap.too_deep, (unsigned long long)snap.truncated_ops, snap.entries.size(), snap.dispatch_tids.size(), snap.threads.size());
      return 1;
    }
  }
  g_done.store(true);
  for (auto& t : threads) t.join();
  watcher.join();
  printf("ok: %llu op loops across 12 sessions\n", static_cast<unsigned long long>(ops.load()));
  return 0;
}
