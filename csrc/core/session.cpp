#include "core/session.h"

#include <pthread.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <new>
#include <stdexcept>
#include <thread>

namespace cpuprof {

namespace {

struct ThreadBinding {
  DispatchState* state = nullptr;
  uint64_t generation = 0;
};
thread_local ThreadBinding t_binding;

std::atomic<int> g_inject_setup_failures{0};

// Takes one injected failure, if any are left.
bool injected_setup_failure() {
  int left = g_inject_setup_failures.load(std::memory_order_relaxed);
  while (left > 0 && !g_inject_setup_failures.compare_exchange_weak(left, left - 1, std::memory_order_relaxed)) {
  }
  return left > 0;
}

// perf opens one fd per event per thread; like perf, use the hard limit rather than fail at the
// soft one (often 1024) and starve the profiled program of descriptors.
void raise_fd_limit() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur < limit.rlim_max) {
    limit.rlim_cur = limit.rlim_max;
    setrlimit(RLIMIT_NOFILE, &limit);
  }
  reserve_fds_for_program();
}

void check_config(const SessionConfig& config) {
  if (config.op_capacity < kMinOpCapacity || config.op_capacity > kMaxOpCapacity)
    throw std::invalid_argument("op_capacity must be between " + std::to_string(kMinOpCapacity) + " and " +
                                std::to_string(kMaxOpCapacity));
  // Events as asked for (an upper bound of those that open), so the check holds before start.
  const int64_t events = std::max<int64_t>(1, static_cast<int64_t>(config.events.size()));
  const int64_t keys = OpTable::rounded_capacity(config.op_capacity);
  if (keys * events > kMaxOpCountersPerThread)
    throw std::invalid_argument("op capacity " + std::to_string(config.op_capacity) + " (" + std::to_string(keys) +
                                " keys) with " + std::to_string(events) + " events needs " +
                                std::to_string(keys * events) + " counters per thread; at most " +
                                std::to_string(kMaxOpCountersPerThread) +
                                " (op capacity x events), so a thread's counters stay within 16 MiB");
  if (config.span_capacity > static_cast<size_t>(kMaxSpanCapacity))
    throw std::invalid_argument("span capacity must be at most " + std::to_string(kMaxSpanCapacity));
  if (config.max_threads < 1 || config.max_threads > kMaxThreadsLimit)
    throw std::invalid_argument("max_threads must be between 1 and " + std::to_string(kMaxThreadsLimit));
  if (config.sample_hz < kMinSampleHz || config.sample_hz > kMaxSampleHz)
    throw std::invalid_argument("sample rate must be between " + std::to_string(kMinSampleHz) + " and " +
                                std::to_string(kMaxSampleHz) + " Hz");
  if (config.stack_bytes < 0 || config.stack_bytes > kMaxStackBytes || config.stack_bytes % 8)
    throw std::invalid_argument("stack bytes must be a multiple of 8 up to " + std::to_string(kMaxStackBytes));
  if (config.ring_pages < 1 || config.ring_pages > (1 << 16))
    throw std::invalid_argument("ring pages must be between 1 and 65536");
}

}  // namespace

void inject_thread_setup_failures(int count) { g_inject_setup_failures.store(count > 0 ? count : 0); }

std::atomic<int64_t> g_injected_hook_spin_ns{0};
void inject_hook_spin_ns(int64_t ns) { g_injected_hook_spin_ns.store(ns > 0 ? ns : 0); }

Session& Session::instance() {
  static Session* session = [] {
    Session* s = new Session();  // never destroyed: callbacks may outlive statics
    pthread_atfork(nullptr, nullptr, [] { Session::instance().after_fork_in_child(); });
    return s;
  }();
  return *session;
}

void Session::after_fork_in_child() {
  // The child has none of the parent's other threads: no collection thread, no callbacks in
  // flight, maybe a mutex some other thread held at fork. Profiling simply stops in the child.
  running_.store(false);
  in_flight_.store(0);
  (void)collection_.release();  // its thread does not exist here; joining it would hang
  new (&lifecycle_) std::mutex();
  registry_.reset_after_fork();
}

std::vector<DroppedEvent> Session::start(const SessionConfig& config, void (*on_started)()) {
  std::lock_guard<std::mutex> lock(lifecycle_);
  if (running_.load()) throw std::runtime_error("a cpuprof session is already running");
  check_config(config);
  raise_fd_limit();
  config_ = config;
  ResolvedEvents resolved = resolve_events(config.events, config.sysfs_root);
  const std::vector<EventSpec>& events = resolved.events;
  const int n_events = static_cast<int>(events.size());
  context_.events = events;
  for (int e = 0; e < kMaxEvents; ++e) {
    context_.cpu_clock_event[e] = e < n_events && events[e].kind == EventKind::Software &&
                                  (events[e].config == PERF_COUNT_SW_TASK_CLOCK ||
                                   events[e].config == PERF_COUNT_SW_CPU_CLOCK);
  }
  context_.scaled_events.store(0);
  context_.registry = &registry_;
  context_.table = &table_;
  context_.team = &team_;
  table_.init(config.op_capacity, config.max_threads, n_events);
  team_.reset(config.max_threads);
  for (int i = 0; i < kMaxDispatchThreads; ++i) {
    if (!pool_[i]) pool_[i] = std::make_unique<DispatchState>();
    DispatchState& state = *pool_[i];
    state.ready.store(false);
    state.index = i;
    state.tid = 0;
    state.slot = -1;
    state.local_depth = 0;
    state.unprepared_depth = 0;
    state.hook_ns.store(0);
    state.spans.init(config.span_capacity, n_events);
    state.events.init(0);  // sized on the thread's first op, in sampled mode
  }
  pool_used_.store(0);
  ops_seen_.store(0);
  too_deep_.store(0);
  memory_reported_.store(false);
  no_state_.store(0);
  setup_failures_.store(0);
  unmatched_.store(0);
  truncated_ = 0;
  generation_.fetch_add(1);
  ThreadCounters::Sampling sampling;
  sampling.period_ns = 1000000000ULL / static_cast<uint64_t>(config.sample_hz);
  sampling.stack_bytes = static_cast<uint32_t>(config.stack_bytes);
  sampling.ring_pages = static_cast<size_t>(config.ring_pages);
  const bool sampled = config.mode == CountingMode::Sampled;
  registry_.configure(events, config.max_threads, sampled ? &sampling : nullptr, /*count_by_ring=*/!sampled);
  registry_.set_own_threads(config.own_threads);
  CountingOptions options;
  options.mode = config.mode;
  options.sample_hz = config.sample_hz;
  options.stack_bytes = config.stack_bytes;
  options.timeline_samples = config.timeline_samples;
  options.max_slots = config.max_threads;
  options.states = pool_;
  options.states_used = &pool_used_;
  counting_ = make_counting_strategy(context_, options);
  CountingStrategy* counting = counting_.get();
  collection_ = std::make_unique<CollectionLoop>(registry_, team_, table_,
                                                [counting](int64_t now, bool final) { return counting->collect(now, final); });
  collection_->start();
  started_ns_ = now_ns();
  stopped_ns_ = 0;
  running_.store(true, std::memory_order_seq_cst);
  if (on_started) on_started();
  return resolved.dropped;
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
  for (int i = 0; i < n_states; ++i) truncated_ += std::min(pool_[i]->local_depth, kMaxDepth);
  counting_->stop(stopped_ns_);
  collection_->stop();  // final read: thread totals end here
  registry_.close_all();
}

DispatchState* Session::dispatch_state(bool op_begins) {
  const uint64_t generation = generation_.load(std::memory_order_relaxed);
  if (t_binding.generation == generation) {
    DispatchState* state = t_binding.state;
    // Ready from the thread's first op on, unless its buffers could not be allocated then. The op
    // whose begin failed, and the ops inside it, are not recorded; the next op after it retries.
    if (state == nullptr || state->ready.load(std::memory_order_relaxed)) return state;
    if (!op_begins) {
      if (state->unprepared_depth > 0) --state->unprepared_depth;
      return nullptr;
    }
    if (state->unprepared_depth == 0) {
      if (DispatchState* prepared = prepare_dispatch_state(state)) return prepared;
    }
    ++state->unprepared_depth;
    return nullptr;
  }
  t_binding.generation = generation;
  t_binding.state = nullptr;
  const int index = pool_used_.fetch_add(1, std::memory_order_relaxed);
  if (index >= kMaxDispatchThreads) {
    pool_used_.store(kMaxDispatchThreads, std::memory_order_relaxed);
    return nullptr;
  }
  DispatchState* state = pool_[index].get();
  state->tid = static_cast<pid_t>(syscall(SYS_gettid));
  t_binding.state = state;
  DispatchState* prepared = prepare_dispatch_state(state);
  if (prepared == nullptr && op_begins) state->unprepared_depth = 1;
  return prepared;
}

DispatchState* Session::prepare_dispatch_state(DispatchState* state) noexcept {
  // Everything the thread's ops will need is allocated here, before an op is pushed on its stack,
  // so an allocation that fails leaves no frame half-pushed: the op goes unrecorded (counted as
  // unattributed by the source, and here) and the thread's next op tries again. Until then the
  // state is not `ready`, so the collector and snapshots do not look at it.
  bool allocated = !injected_setup_failure();
  if (allocated && config_.mode == CountingMode::Sampled && !state->events.enabled()) {
    allocated = state->events.try_init(kOpEventCapacity);
  }
  if (allocated) allocated = counting_->prepare_thread(*state);
  if (!allocated) {
    setup_failures_.fetch_add(1, std::memory_order_relaxed);
    return nullptr;
  }
  // Counters for this thread now, not at the collection loop's next scan, so its first ops count.
  state->slot = registry_.ensure(state->tid);
  if (state->slot >= 0) {
    table_.reserve_slots(state->slot + 1);
    team_.mark_dispatch(state->slot);
    if (table_.slot_ready(state->slot)) team_.join(state->slot);
  }
  state->ready.store(true, std::memory_order_release);
  return state;
}

uint32_t Session::current_entry() const {
  if (!running() || t_binding.generation != generation_.load(std::memory_order_relaxed)) return 0;
  const DispatchState* state = t_binding.state;
  if (state == nullptr) return 0;
  const int depth = state->local_depth;
  return depth > 0 && depth <= kMaxDepth ? state->frames[depth - 1].entry : 0;
}

void Session::record_allocation(int64_t bytes) {
  // Only a thread that already runs ops has an op to charge; any other thread's allocation (an
  // OpenMP worker's scratch) is charged outside ops without making the thread a dispatching one.
  uint32_t entry = kOutsideEntry;
  if (t_binding.generation == generation_.load(std::memory_order_relaxed) && t_binding.state != nullptr) {
    const DispatchState* state = t_binding.state;
    const int depth = state->local_depth;
    if (depth > 0 && depth <= kMaxDepth) entry = state->frames[depth - 1].entry;
  }
  OpEntry& e = table_.entry(entry);
  if (bytes >= 0) {
    e.alloc_bytes.fetch_add(static_cast<uint64_t>(bytes), std::memory_order_relaxed);
    e.allocs.fetch_add(1, std::memory_order_relaxed);
  } else {
    e.freed_bytes.fetch_add(static_cast<uint64_t>(-bytes), std::memory_order_relaxed);
    e.frees.fetch_add(1, std::memory_order_relaxed);
  }
  memory_reported_.store(true, std::memory_order_relaxed);
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
  Frame& frame = state->frames[d];
  const int64_t hook_inside = state->hook_ns.load(std::memory_order_relaxed) - frame.hook_ns_at_start;
  const int64_t dur = std::max<int64_t>(0, enter_ns - frame.start_ns - hook_inside);
  // The strategy first: exact mode reads the calling thread's clock here, and every instruction
  // before it would land in the op's CPU time.
  uint64_t span_counts[kMaxEvents] = {};
  counting_->end_op(*state, d, enter_ns, hook_inside, dur, state->spans.enabled() ? span_counts : nullptr);
  ops_seen_.fetch_add(1, std::memory_order_relaxed);
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
  if (state->spans.enabled()) {
    uint64_t* span_counters = nullptr;
    SpanRecord* span = state->spans.claim(&span_counters);
    span->entry = frame.entry;
    span->thread_slot = state->slot;
    span->depth = static_cast<uint16_t>(d);
    span->start_ns = frame.start_ns;
    span->dur_ns = dur;
    std::copy_n(span_counts, state->spans.n_events(), span_counters);
    state->spans.publish();
  }
  frame.done = true;
  const uint32_t ended_entry = frame.entry;
  while (state->local_depth > 0 && state->frames[state->local_depth - 1].done) --state->local_depth;
  const int64_t exit_ns = now_ns();
  state->hook_ns.store(state->hook_ns.load(std::memory_order_relaxed) + (exit_ns - enter_ns),
                       std::memory_order_relaxed);
  counting_->ended(*state, ended_entry, d, enter_ns, exit_ns);
}

int64_t Session::hook_ns() const {
  int64_t total = 0;
  const int n = std::min(pool_used_.load(), kMaxDispatchThreads);
  for (int i = 0; i < n; ++i) total += pool_[i]->hook_ns.load(std::memory_order_relaxed);
  return total;
}

}  // namespace cpuprof
