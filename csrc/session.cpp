#include "session.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <stdexcept>

#include "sampler.h"

namespace cpuprof {

namespace {

struct ThreadBinding {
  DispatchState* state = nullptr;
  uint64_t generation = 0;
};
thread_local ThreadBinding t_binding;

}  // namespace

Session& Session::instance() {
  static Session* session = new Session();  // never destroyed: callbacks may outlive statics
  return *session;
}

std::vector<DroppedEvent> Session::start(const SessionConfig& config) {
  std::lock_guard<std::mutex> lock(lifecycle_);
  if (running_.load()) throw std::runtime_error("a cpuprof session is already running");
  config_ = config;
  events_.clear();
  std::vector<DroppedEvent> dropped;
  for (const std::string& name : config.events) {
    bool duplicate = false;
    for (const EventSpec& e : events_) duplicate = duplicate || e.name == name;
    if (duplicate) continue;
    ParseResult parsed = parse_event(name, config.sysfs_root);
    if (!parsed.ok) {
      dropped.push_back({name, EINVAL, parsed.error});
      continue;
    }
    ProbeResult probe = probe_event(name, config.sysfs_root);
    if (!probe.ok) {
      dropped.push_back({name, probe.err, probe.reason});
      continue;
    }
    if (static_cast<int>(events_.size()) >= kMaxEvents) {
      dropped.push_back({name, E2BIG, "more than 16 events in one session"});
      continue;
    }
    events_.push_back(parsed.spec);
  }
  const int n_events = static_cast<int>(events_.size());
  for (int e = 0; e < kMaxEvents; ++e) {
    cpu_clock_event_[e] = e < n_events && events_[e].kind == EventKind::Software &&
                          (events_[e].config == PERF_COUNT_SW_TASK_CLOCK || events_[e].config == PERF_COUNT_SW_CPU_CLOCK);
  }
  n_slots_ = std::clamp(config.max_threads, 1, kMaxThreads);
  table_.init(config.op_capacity, n_slots_, n_events);
  const size_t stride = static_cast<size_t>(n_slots_) * std::max(n_events, 1);
  for (auto& state : pool_) {
    if (!state) state = std::make_unique<DispatchState>();
    state->tid = 0;
    state->slot = -1;
    state->local_depth = 0;
    state->depth.store(0);
    state->hook_ns.store(0);
    state->last_begin_ns.store(0);
    if (config.mode == CountingMode::Exact) {
      // new[] without value-initialisation: pages are touched only by threads that use them.
      state->start_counts.reset(new uint64_t[kMaxDepth * stride + stride]);
      state->child_counts.reset(new uint64_t[kMaxDepth * stride]);
    } else {
      state->start_counts.reset();
      state->child_counts.reset();
    }
  }
  pool_used_.store(0);
  team_mask_.store(0);
  ops_seen_.store(0);
  too_deep_.store(0);
  no_state_.store(0);
  generation_.fetch_add(1);
  registry_.configure(events_, 0);
  sampler_ = std::make_unique<Sampler>(*this, config.sample_interval_us,
                                       config.mode == CountingMode::Sampled);
  sampler_->start();
  started_ns_ = now_ns();
  stopped_ns_ = 0;
  running_.store(true, std::memory_order_seq_cst);
  return dropped;
}

void Session::stop() {
  std::lock_guard<std::mutex> lock(lifecycle_);
  if (!running_.load()) return;
  running_.store(false, std::memory_order_seq_cst);
  // Callbacks that entered before the flag flipped finish before anything is torn down.
  while (in_flight_.load(std::memory_order_acquire) != 0) std::this_thread::yield();
  stopped_ns_ = now_ns();
  sampler_->stop();  // final read: thread totals end here
  registry_.close_all();
}

DispatchState* Session::dispatch_state() {
  const uint64_t generation = generation_.load(std::memory_order_relaxed);
  if (t_binding.generation == generation) return t_binding.state;
  t_binding.generation = generation;
  t_binding.state = nullptr;
  const int index = pool_used_.fetch_add(1, std::memory_order_relaxed);
  if (index >= kMaxDispatchThreads) {
    pool_used_.store(kMaxDispatchThreads, std::memory_order_relaxed);
    return nullptr;
  }
  DispatchState* state = pool_[index].get();
  state->tid = static_cast<pid_t>(syscall(SYS_gettid));
  // Counters for this thread now, not at the sampler's next scan, so its first ops count.
  state->slot = registry_.ensure(state->tid);
  join_team(state->slot);
  state->spans.init(config_.span_capacity, static_cast<int>(events_.size()));
  t_binding.state = state;
  return state;
}

void Session::read_all(uint64_t* out, uint64_t team) {
  const int n_events = static_cast<int>(events_.size());
  const int registered = std::min(registry_.size(), n_slots_);
  uint32_t scaled = 0, counted = 0;
  for (int slot = 0; slot < registered; ++slot) {
    if ((team >> slot) & 1ULL) {
      registry_.slot(slot).counters.read(out + slot * n_events, &scaled, &counted);
    } else {
      // Not read at begin, not read at end: a zero delta, never a false one.
      std::memset(out + slot * n_events, 0, sizeof(uint64_t) * n_events);
    }
  }
  // Slots opened later start counting from zero, so zero is their value at this instant.
  std::memset(out + registered * n_events, 0, sizeof(uint64_t) * (n_slots_ - registered) * n_events);
}

void Session::end_op(DispatchState* state, int64_t enter_ns) {
  if (state->local_depth == 0) return;  // an op that began before this session
  const int d = --state->local_depth;
  if (d >= kMaxDepth) return;
  ops_seen_.fetch_add(1, std::memory_order_relaxed);
  Frame& frame = state->frames[d];
  const int64_t hook_inside = state->hook_ns.load(std::memory_order_relaxed) - frame.hook_ns_at_start;
  const int64_t dur = std::max<int64_t>(0, enter_ns - frame.start_ns - hook_inside);
  const int64_t self = std::max<int64_t>(0, dur - frame.child_ns);
  if (d > 0) state->frames[d - 1].child_ns += dur;
  OpEntry& entry = table_.entry(frame.entry);
  entry.calls.fetch_add(1, std::memory_order_relaxed);
  entry.incl_ns.fetch_add(static_cast<uint64_t>(dur), std::memory_order_relaxed);
  entry.self_ns.fetch_add(static_cast<uint64_t>(self), std::memory_order_relaxed);
  uint64_t seen_max = entry.max_ns.load(std::memory_order_relaxed);
  while (static_cast<uint64_t>(dur) > seen_max &&
         !entry.max_ns.compare_exchange_weak(seen_max, static_cast<uint64_t>(dur), std::memory_order_relaxed)) {
  }
  uint64_t* span_counters = nullptr;
  if (state->spans.enabled()) {
    SpanRecord* span = state->spans.claim(&span_counters);
    span->entry = frame.entry;
    span->thread_slot = static_cast<uint16_t>(state->slot < 0 ? 0xffff : state->slot);
    span->depth = static_cast<uint16_t>(d);
    span->start_ns = frame.start_ns;
    span->dur_ns = dur;
    std::memset(span_counters, 0, sizeof(uint64_t) * state->spans.n_events());
  }
  if (config_.mode == CountingMode::Exact) {
    const int n_events = static_cast<int>(events_.size());
    const size_t stride = static_cast<size_t>(n_slots_) * n_events;
    uint64_t* now_counts = state->start_counts.get() + kMaxDepth * stride;  // scratch row
    read_all(now_counts, frame.team);
    const uint64_t* start = state->start_counts.get() + d * stride;
    const uint64_t* children = state->child_counts.get() + d * stride;
    uint64_t* parent = d > 0 ? state->child_counts.get() + (d - 1) * stride : nullptr;
    // This thread's CPU clocks also ran during the nested ops' callbacks (our reads); that time is
    // known exactly, so it is taken out, as it is from the wall time.
    const size_t own_first = state->slot >= 0 && state->slot < n_slots_ ? static_cast<size_t>(state->slot) * n_events : stride;
    for (size_t i = 0; i < stride; ++i) {
      uint64_t incl = now_counts[i] > start[i] ? now_counts[i] - start[i] : 0;
      if (i >= own_first && i < own_first + n_events && cpu_clock_event_[i - own_first]) {
        incl = incl > static_cast<uint64_t>(hook_inside) ? incl - hook_inside : 0;
      }
      if (incl == 0) continue;
      const int slot = static_cast<int>(i / n_events);
      const int event = static_cast<int>(i % n_events);
      const uint64_t self_count = incl > children[i] ? incl - children[i] : 0;
      table_.counter(frame.entry, slot, event, false).fetch_add(incl, std::memory_order_relaxed);
      if (self_count) table_.counter(frame.entry, slot, event, true).fetch_add(self_count, std::memory_order_relaxed);
      if (parent) parent[i] += incl;
      if (span_counters) span_counters[event] += incl;
    }
  }
  state->depth.store(d, std::memory_order_release);
  const int64_t exit_ns = now_ns();
  state->hook_ns.store(state->hook_ns.load(std::memory_order_relaxed) + (exit_ns - enter_ns),
                       std::memory_order_relaxed);
}

std::vector<ThreadSnapshot> Session::thread_snapshots() const {
  std::vector<ThreadSnapshot> out;
  const int n = registry_.size();
  const int n_events = static_cast<int>(events_.size());
  for (int slot = 0; slot < n; ++slot) {
    const ThreadSlot& s = registry_.slot(slot);
    ThreadSnapshot snap{s.tid, s.name, s.opened_ns, s.open_errno, {}, 0, 0};
    snap.totals.resize(n_events);
    if (running_.load() && s.counters.is_open()) {
      s.counters.read(snap.totals.data(), &snap.scaled, &snap.counted);
    } else if (sampler_) {
      std::copy(sampler_->last_values(slot), sampler_->last_values(slot) + n_events, snap.totals.begin());
      snap.scaled = sampler_->scaled(slot);
      snap.counted = sampler_->counted(slot);
    }
    out.push_back(std::move(snap));
  }
  return out;
}

int64_t Session::hook_ns() const {
  int64_t total = 0;
  const int n = std::min(pool_used_.load(), kMaxDispatchThreads);
  for (int i = 0; i < n; ++i) total += pool_[i]->hook_ns.load(std::memory_order_relaxed);
  return total;
}

int64_t Session::sampler_cpu_ns() const { return sampler_ ? sampler_->cpu_ns() : 0; }
uint64_t Session::sampler_ticks() const { return sampler_ ? sampler_->ticks() : 0; }

}  // namespace cpuprof
