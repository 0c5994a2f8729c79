// Stress of the session's per-op path against the sampler and start/stop, built with a sanitizer
// by tests/integration/test_native_sanitizers.py. Several threads run nested "ops" through
// Session::begin_op/end_op (what the RecordFunction callbacks do) while the main thread starts
// and stops sessions in both modes; the sampler thread attributes and rescans all the while.
#include <atomic>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

#include "session.h"

using namespace cpuprof;

namespace {

std::atomic<bool> g_done{false};

void run_ops(int id, std::atomic<uint64_t>* ops) {
  char name[32];
  snprintf(name, sizeof(name), "op%d", id);
  while (!g_done.load(std::memory_order_relaxed)) {
    Session& session = Session::instance();
    for (int depth = 0; depth < 3; ++depth) {
      if (!session.enter()) break;
      DispatchState* state = session.dispatch_state();
      if (state) {
        session.begin_op(state, now_ns(), 7 + depth, 1000 + id * 10 + depth, depth == 0, [&](OpEntry& e) {
          strncpy(e.name, name, sizeof(e.name) - 1);
        });
      }
      session.leave();
    }
    volatile double x = 0;
    for (int i = 0; i < 2000; ++i) x = x + i * 0.5;
    for (int depth = 2; depth >= 0; --depth) {
      if (!session.enter()) break;
      DispatchState* state = session.dispatch_state();
      if (state) session.end_op(state, now_ns(), 7 + depth);
      session.leave();
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
  config.sample_interval_us = 200;
  config.span_capacity = 64;
  config.op_capacity = 32;
  for (int round = 0; round < 12; ++round) {
    config.mode = round % 2 ? CountingMode::Exact : CountingMode::Sampled;
    Session::instance().start(config);
    std::this_thread::sleep_for(std::chrono::milliseconds(40));
    std::thread checkpoint([] { (void)Session::instance().snapshot(); });  // a checkpoint while running
    (void)Session::instance().snapshot();
    checkpoint.join();
    std::thread late_snapshot([] { (void)Session::instance().snapshot(); });  // races the stop
    Session::instance().stop();
    late_snapshot.join();
    const OpTable& table = Session::instance().table();
    uint64_t calls = 0;
    for (int i = 0; i < table.capacity(); ++i) calls += table.entry(i).calls.load();
    if (calls == 0) {
      fprintf(stderr, "round %d recorded no op calls\n", round);
      return 1;
    }
  }
  g_done.store(true);
  for (auto& t : threads) t.join();
  watcher.join();
  printf("ok: %llu op loops across 12 sessions\n", static_cast<unsigned long long>(ops.load()));
  return 0;
}
