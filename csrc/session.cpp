#include "session.h"

#include <pthread.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <new>
#include <stdexcept>

#include "sampler.h"

namespace cpuprof {

namespace {

struct ThreadBinding {
  DispatchState* state = nullptr;
  uint64_t generation = 0;
};
thread_local ThreadBinding t_binding;

constexpr int kMaxOpCapacity = 1 << 20;
constexpr size_t kMaxSpanCapacity = size_t{1} << 24;

// perf opens one fd per event per thread; like perf, use the hard limit rather than fail at the
// soft one (often 1024) and starve the profiled program of descriptors.
void raise_fd_limit() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur < limit.rlim_max) {
    limit.rlim_cur = limit.rlim_max;
    setrlimit(RLIMIT_NOFILE, &limit);
  }
}

}  // namespace

Session& Session::instance() {
  static Session* session = [] {
    Session* s = new Session();  // never destroyed: callbacks may outlive statics
    pthread_atfork(nullptr, nullptr, [] { Session::instance().after_fork_in_child(); });
    return s;
  }();
  return *session;
}

void Session::after_fork_in_child() {
  // The child has none of the parent's other threads: no sampler, no callbacks in flight, maybe
  // a mutex some other thread held at fork. Profiling simply stops in the child.
  running_.store(false);
  in_flight_.store(0);
  (void)sampler_.release();  // its thread does not exist here; joining it would hang
  new (&lifecycle_) std::mutex();
  registry_.reset_after_fork();
}

std::vector<DroppedEvent> Session::start(const SessionConfig& config, void (*on_started)()) {
  std::lock_guard<std::mutex> lock(lifecycle_);
  if (running_.load()) throw std::runtime_error("a cpuprof session is already running");
  if (config.op_capacity < 16 || config.op_capacity > kMaxOpCapacity)
    throw std::invalid_argument("op_capacity must be between 16 and " + std::to_string(kMaxOpCapacity));
  if (config.span_capacity > kMaxSpanCapacity)
    throw std::invalid_argument("span capacity must be at most " + std::to_string(kMaxSpanCapacity));
  raise_fd_limit();
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
    // The probe fell back to user mode only: open it that way everywhere, and say so.
    if (probe.user_only) parsed.spec.exclude_kernel = true;
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
    state->ready.store(false);
    state->tid = 0;
    state->slot = -1;
    state->local_depth = 0;
    state->hook_ns.store(0);
    // new[] without value-initialisation: pages are touched only by threads that use them, and
    // sizing everything here keeps allocation off the op path entirely.
    if (config.mode == CountingMode::Exact) {
      state->start_counts.reset(new RawCount[kMaxDepth * stride + stride]);
      state->child_counts.reset(new uint64_t[kMaxDepth * stride]);
    } else {
      state->start_counts.reset();
      state->child_counts.reset();
    }
    state->spans.init(config.span_capacity, n_events);
  }
  pool_used_.store(0);
  team_mask_.store(0);
  dispatch_mask_.store(0);
  ops_seen_.store(0);
  too_deep_.store(0);
  no_state_.store(0);
  unmatched_.store(0);
  truncated_ = 0;
  samples_.store(0);
  sample_interval_ns_ = static_cast<int64_t>(std::max(config.sample_interval_us, 50)) * 1000;
  std::memset(sample_last_, 0, sizeof(sample_last_));  // counters open at zero
  std::memset(sample_carry_, 0, sizeof(sample_carry_));
  std::memset(sample_read_ns_, 0, sizeof(sample_read_ns_));
  scaled_events_.store(0);
  generation_.fetch_add(1);
  registry_.configure(events_, 0);
  sampler_ = std::make_unique<Sampler>(*this);
  sampler_->start();
  started_ns_ = now_ns();
  next_sample_ns_.store(started_ns_ + sample_interval_ns_);
  stopped_ns_ = 0;
  running_.store(true, std::memory_order_seq_cst);
  if (on_started) on_started();
  return dropped;
}

void Session::stop(void (*on_stopping)()) {
  std::lock_guard<std::mutex> lock(lifecycle_);
  if (!running_.load()) return;
  if (on_stopping) on_stopping();
  running_.store(false, std::memory_order_seq_cst);
  // Callbacks that entered before the flag flipped finish before anything is torn down.
  while (in_flight_.load(std::memory_order_seq_cst) != 0) std::this_thread::yield();
  stopped_ns_ = now_ns();
  // Ops still open on any thread get no call and no time: counted, so the report says so.
  const int n_states = std::min(pool_used_.load(), kMaxDispatchThreads);
  for (int i = 0; i < n_states; ++i) {
    truncated_ += std::min(pool_[i]->local_depth, kMaxDepth);
  }
  // What the team did since the last sample has no op to go to: it closes the books as
  // "outside", so that ops plus outside add up to the threads' totals.
  if (config_.mode == CountingMode::Sampled) sample(nullptr, -1, stopped_ns_);
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
  if (state->slot >= 0 && state->slot < 64) {
    dispatch_mask_.fetch_or(1ULL << state->slot, std::memory_order_relaxed);
    join_team(state->slot);
  }
  state->ready.store(true, std::memory_order_release);
  t_binding.state = state;
  return state;
}

int Session::read_all(RawCount* out, uint64_t team, int own, bool own_first) {
  const int n_events = static_cast<int>(events_.size());
  const int registered = std::min(registry_.size(), n_slots_);
  uint32_t counted = 0;
  const bool read_own = own >= 0 && own < registered && ((team >> own) & 1ULL);
  if (read_own && own_first) registry_.slot(own).counters.read_raw(out + own * n_events, &counted);
  for (int slot = 0; slot < registered; ++slot) {
    if (slot == own && read_own) continue;
    if ((team >> slot) & 1ULL) {
      registry_.slot(slot).counters.read_raw(out + slot * n_events, &counted);
    } else {
      // Not read at begin, not read at end: a zero delta, never a false one.
      std::fill_n(out + slot * n_events, n_events, RawCount{});
    }
  }
  if (read_own && !own_first) registry_.slot(own).counters.read_raw(out + own * n_events, &counted);
  return registered;
}

void Session::end_op(DispatchState* state, int64_t enter_ns, uintptr_t id) {
  if (state->local_depth == 0) {
    unmatched_.fetch_add(1, std::memory_order_relaxed);  // began before this session
    return;
  }
  if (state->local_depth > kMaxDepth) {  // an end of an unrecorded deep op comes first
    --state->local_depth;
    return;
  }
  // Usually the top frame; asyncio tasks and generators can end an outer scope first.
  int d = state->local_depth - 1;
  while (d >= 0 && (state->frames[d].id != id || state->frames[d].done)) --d;
  if (d < 0) {
    unmatched_.fetch_add(1, std::memory_order_relaxed);  // began on another thread or session
    return;
  }
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
  SpanRecord* span = nullptr;
  if (state->spans.enabled()) {
    span = state->spans.claim(&span_counters);
    span->entry = frame.entry;
    span->thread_slot = static_cast<uint16_t>(state->slot < 0 ? 0xffff : state->slot);
    span->depth = static_cast<uint16_t>(d);
    span->start_ns = frame.start_ns;
    span->dur_ns = dur;
    std::memset(span_counters, 0, sizeof(uint64_t) * state->spans.n_events());
  }
  if (config_.mode == CountingMode::Sampled) {
    maybe_sample(state, d, enter_ns);  // this op is the innermost one running at this instant
  } else {
    const int n_events = static_cast<int>(events_.size());
    const size_t stride = static_cast<size_t>(n_slots_) * n_events;
    RawCount* now_counts = state->start_counts.get() + kMaxDepth * stride;  // scratch row
    const int registered_now = read_all(now_counts, frame.team, state->slot, /*own_first=*/true);
    const RawCount* start = state->start_counts.get() + d * stride;
    const uint64_t* children = state->child_counts.get() + d * stride;
    uint64_t* parent = d > 0 ? state->child_counts.get() + (d - 1) * stride : nullptr;
    // Slots registered after this op began started counting from zero, inside the op.
    const size_t used = static_cast<size_t>(registered_now) * n_events;
    const size_t read_at_begin = static_cast<size_t>(frame.registered) * n_events;
    const RawCount zero{};
    for (size_t i = 0; i < used; ++i) {
      const int slot = static_cast<int>(i / n_events);
      const int event = static_cast<int>(i % n_events);
      uint64_t incl;
      if ((frame.team >> slot) & 1ULL) {
        const ScaledCount delta = scale_delta(i < read_at_begin ? start[i] : zero, now_counts[i]);
        incl = static_cast<uint64_t>(std::llround(delta.value));
        if (delta.scaled) scaled_events_.fetch_or(1u << event, std::memory_order_relaxed);
        // CPU clocks also ran during the nested ops' callbacks (our reads): on this thread, and
        // on the team's workers, which spin between parallel regions while the dispatching
        // thread is in our hook. That time is known exactly; it is taken out, as from the wall.
        // Never below what the children claimed: a worker asleep during our hook spent nothing.
        if (cpu_clock_event_[event]) {
          incl = incl > static_cast<uint64_t>(hook_inside) ? incl - hook_inside : 0;
          if (incl < children[i]) incl = children[i];
        }
      } else {
        // A thread that joined the team after this op began was read only by its children:
        // what they saw is what this op can claim.
        incl = children[i];
      }
      if (incl == 0) continue;
      const uint64_t self_count = incl > children[i] ? incl - children[i] : 0;
      table_.counter(frame.entry, slot, event, false).fetch_add(incl, std::memory_order_relaxed);
      if (self_count) table_.counter(frame.entry, slot, event, true).fetch_add(self_count, std::memory_order_relaxed);
      if (parent) parent[i] += incl;
      if (span_counters) span_counters[event] += incl;
    }
  }
  if (span) state->spans.publish();
  frame.done = true;
  while (state->local_depth > 0 && state->frames[state->local_depth - 1].done) --state->local_depth;
  const int64_t exit_ns = now_ns();
  state->hook_ns.store(state->hook_ns.load(std::memory_order_relaxed) + (exit_ns - enter_ns),
                       std::memory_order_relaxed);
}

void Session::charge(uint32_t entry, const DispatchState* state, int innermost, int slot, int event,
                     uint64_t delta) {
  table_.counter(entry, slot, event, true).fetch_add(delta, std::memory_order_relaxed);
  if (innermost < 0) {
    table_.counter(entry, slot, event, false).fetch_add(delta, std::memory_order_relaxed);
    return;
  }
  for (int d = 0; d <= innermost; ++d) {
    const uint32_t e = state->frames[d].entry;
    bool seen = false;  // an entry on the stack twice (recursion) is charged once inclusively
    for (int k = 0; k < d && !seen; ++k) seen = state->frames[k].entry == e;
    if (!seen) table_.counter(e, slot, event, false).fetch_add(delta, std::memory_order_relaxed);
  }
}

void Session::sample(DispatchState* state, int innermost, int64_t now) {
  bool expected = false;
  if (!sampling_.compare_exchange_strong(expected, true, std::memory_order_acquire)) return;
  // Deadlines stay on a fixed grid. Every deadline passed since the last sample fell inside the
  // op running now (an op boundary after any of them would have sampled), so this op is owed
  // one interval for each of them: a 30 ms op is charged 30 ms, not 4.
  const int64_t due = next_sample_ns_.load(std::memory_order_relaxed);
  const int64_t crossed = due <= now ? 1 + (now - due) / sample_interval_ns_ : 1;
  next_sample_ns_.store(due + crossed * sample_interval_ns_, std::memory_order_relaxed);
  const int64_t covered = crossed * sample_interval_ns_;
  if (innermost >= kMaxDepth) innermost = kMaxDepth - 1;
  const uint32_t entry = state != nullptr && innermost >= 0 ? state->frames[innermost].entry : kOutsideEntry;
  // This thread and the threads that serve no op of their own (OpenMP workers): theirs is the
  // work of the op running here. Other dispatching threads are read when they sample.
  const int own = state != nullptr ? state->slot : -1;
  uint64_t team = team_mask_.load(std::memory_order_relaxed) & ~dispatch_mask_.load(std::memory_order_relaxed);
  if (own >= 0 && own < 64) team |= 1ULL << own;
  if (state == nullptr) team = team_mask_.load(std::memory_order_relaxed);  // the final flush
  const int n_events = static_cast<int>(events_.size());
  const int registered = std::min(registry_.size(), n_slots_);
  RawCount values[kMaxEvents];
  for (int slot = 0; slot < registered; ++slot) {
    if (!((team >> slot) & 1ULL)) continue;
    uint32_t counted = 0;
    registry_.slot(slot).counters.read_raw(values, &counted);
    const int64_t gap = now - (sample_read_ns_[slot] ? sample_read_ns_[slot] : started_ns_);
    for (int e = 0; e < n_events; ++e) {
      if (!((counted >> e) & 1u)) continue;
      const ScaledCount delta = scale_delta(sample_last_[slot][e], values[e]);
      sample_last_[slot][e] = values[e];
      if (delta.scaled) scaled_events_.fetch_or(1u << e, std::memory_order_relaxed);
      // A sample lands at the first op boundary after a deadline, so it tends to end a long
      // op, and its gap then also covers ops before the deadline: charging the whole gap to it
      // would favour long ops. It is charged the deadlines' share of the gap at the gap's
      // average rate; the rest carries to the next sample (and at stop to "outside"), so the
      // totals still add up.
      const uint64_t available = static_cast<uint64_t>(std::llround(delta.value)) + sample_carry_[slot][e];
      uint64_t value = available;
      if (state != nullptr && gap > covered) {
        value = static_cast<uint64_t>(static_cast<double>(available) * covered / gap);
      }
      sample_carry_[slot][e] = available - value;
      if (value) charge(entry, state, state != nullptr ? innermost : -1, slot, e, value);
    }
    sample_read_ns_[slot] = now;
  }
  // The deadlines this op was caught running at: the weight behind its statistical counts.
  table_.entry(entry).samples.fetch_add(static_cast<uint64_t>(crossed), std::memory_order_relaxed);
  samples_.fetch_add(1, std::memory_order_relaxed);
  sampling_.store(false, std::memory_order_release);
}

std::vector<ThreadSnapshot> Session::thread_snapshots() const {
  std::lock_guard<std::mutex> lock(const_cast<std::mutex&>(lifecycle_));
  return thread_snapshots_locked();
}

std::vector<ThreadSnapshot> Session::thread_snapshots_locked() const {
  std::vector<ThreadSnapshot> out;
  const int n = registry_.size();
  const int n_events = static_cast<int>(events_.size());
  for (int slot = 0; slot < n; ++slot) {
    const ThreadSlot& s = registry_.slot(slot);
    ThreadSnapshot snap{s.tid, s.name, s.opened_ns, s.open_errno, {}, 0, 0};
    snap.totals.resize(n_events);
    if (running_.load()) {
      // Live counters; the sampler's arrays belong to its thread until stop() has joined it.
      if (s.counters.is_open()) s.counters.read(snap.totals.data(), &snap.scaled, &snap.counted);
    } else if (sampler_) {
      std::copy(sampler_->last_values(slot), sampler_->last_values(slot) + n_events, snap.totals.begin());
      snap.scaled = sampler_->scaled(slot);
      snap.counted = sampler_->counted(slot);
    }
    out.push_back(std::move(snap));
  }
  return out;
}

SessionSnapshot Session::snapshot() {
  std::lock_guard<std::mutex> lock(lifecycle_);
  SessionSnapshot out;
  out.events = events_;
  out.mode = config_.mode;
  out.record_shapes = config_.record_shapes;
  out.sample_interval_us = config_.sample_interval_us;
  out.running = running_.load();
  out.started_ns = started_ns_;
  out.stopped_ns = stopped_ns_;
  out.now_ns = now_ns();
  out.ops_seen = ops_seen_.load();
  out.too_deep = too_deep_.load();
  out.unattributed_ops = no_state_.load();
  out.unmatched_ends = unmatched_.load();
  out.truncated = truncated_;
  out.hook_ns = hook_ns();
  out.sampler_cpu_ns = sampler_cpu_ns();
  out.sampler_ticks = sampler_ticks();
  out.samples = samples_.load();
  out.scaled_events = scaled_events_.load();
  const int n_states = std::min(pool_used_.load(), kMaxDispatchThreads);
  for (int i = 0; i < n_states; ++i) {
    if (pool_[i]->ready.load(std::memory_order_acquire)) out.dispatch_tids.push_back(pool_[i]->tid);
  }
  out.threads_beyond_limit = registry_.dropped_threads();
  out.op_capacity = table_.capacity();
  out.ops_overflowed = table_.overflowed();
  out.span_capacity = config_.span_capacity;
  out.threads = thread_snapshots_locked();
  const int n_events = static_cast<int>(events_.size());
  out.n_slots = std::min<int>(static_cast<int>(out.threads.size()), table_.n_thread_slots());
  size_t memory = table_.memory_bytes();
  for (int i = 0; i < table_.capacity(); ++i) {
    const OpEntry& e = table_.entry(i);
    if (e.key.load() == 0 || !e.ready.load(std::memory_order_acquire)) continue;
    EntrySnapshot item{static_cast<uint32_t>(i), e.kind, e.name, e.shapes, e.region, e.calls.load(),
                       e.incl_ns.load(), e.self_ns.load(), e.max_ns.load(), e.samples.load(), {}, {}};
    bool any_counts = false;
    for (int slot = 0; slot < out.n_slots; ++slot) {
      for (int ev = 0; ev < n_events; ++ev) {
        item.incl.push_back(table_.counter_value(i, slot, ev, false));
        item.self.push_back(table_.counter_value(i, slot, ev, true));
        any_counts = any_counts || item.incl.back() || item.self.back();
      }
    }
    if (item.calls == 0 && !any_counts && item.samples == 0) continue;
    out.entries.push_back(std::move(item));
  }
  // Spans: each dispatching thread's ring, oldest first. Only once stopped: while running, the
  // producer overwrites the oldest records, so a checkpoint carries the aggregates, not the
  // timeline.
  for (int d = 0; d < n_states && !out.running; ++d) {
    if (!pool_[d]->ready.load(std::memory_order_acquire)) continue;
    const SpanRing& ring = pool_[d]->spans;
    if (!ring.enabled()) continue;
    memory += ring.memory_bytes();
    const uint64_t written = ring.written();
    const size_t kept = std::min<uint64_t>(written, ring.capacity());
    const size_t first = written > ring.capacity() ? written % ring.capacity() : 0;
    out.spans.written += written;
    out.spans.dropped += ring.dropped();
    for (size_t j = 0; j < kept; ++j) {
      const size_t i = (first + j) % ring.capacity();
      const SpanRecord& r = ring.record(i);
      out.spans.entry.push_back(r.entry);
      out.spans.thread_slot.push_back(r.thread_slot == 0xffff ? -1 : r.thread_slot);
      out.spans.depth.push_back(r.depth);
      out.spans.start_ns.push_back(r.start_ns);
      out.spans.dur_ns.push_back(r.dur_ns);
      out.spans.counters.insert(out.spans.counters.end(), ring.counters(i), ring.counters(i) + n_events);
    }
  }
  out.memory_bytes = memory;
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
