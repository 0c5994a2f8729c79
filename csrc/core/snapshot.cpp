// Session::snapshot(): assembles the typed copy handed to the bindings.
#include <algorithm>
#include <cstring>

#include "core/session.h"

namespace cpuprof {

namespace {

std::vector<InputSnapshot> describe_inputs(const OpEntry& e) {
  std::vector<InputSnapshot> inputs;
  for (int i = 0; i < e.n_inputs && i < kMaxKeyInputs; ++i) {
    const InputDesc& d = e.inputs[i];
    InputSnapshot in;
    in.kind = d.kind;
    in.dtype = std::string(d.dtype, strnlen(d.dtype, sizeof(d.dtype)));
    in.list_len = d.list_len;
    if (d.kind == InputKind::Tensor && d.dims_at + d.ndim <= kMaxKeyDims) {
      in.sizes.assign(e.sizes + d.dims_at, e.sizes + d.dims_at + d.ndim);
      in.strides.assign(e.strides + d.dims_at, e.strides + d.dims_at + d.ndim);
    }
    inputs.push_back(std::move(in));
  }
  return inputs;
}

}  // namespace

SessionSnapshot Session::snapshot() {
  std::lock_guard<std::mutex> lock(lifecycle_);
  SessionSnapshot out;
  const int n_events = static_cast<int>(context_.events.size());
  for (const EventSpec& e : context_.events) {
    out.events.push_back({e.name, e.kind, e.exclude_kernel && !e.exclude_user});
  }
  out.mode = config_.mode;
  out.record_shapes = config_.record_shapes;
  out.running = running_.load();
  out.started_ns = started_ns_;
  out.stopped_ns = stopped_ns_;
  out.now_ns = now_ns();
  out.ops_seen = ops_seen_.load();
  out.too_deep = too_deep_.load();
  out.unattributed_ops = no_state_.load();
  out.thread_setup_failures = setup_failures_.load();
  out.unmatched_ends = unmatched_.load();
  out.truncated_ops = truncated_;
  out.hook_ns = hook_ns();
  out.discovery_cpu_ns = collection_ ? collection_->cpu_ns() : 0;
  out.idle_reads_skipped = collection_ ? collection_->idle_reads_skipped() : 0;
  out.thread_scans = collection_ ? collection_->scans() : 0;
  out.scan_setup_cpu_ns = registry_.scan_setup_cpu_ns();
  out.discovery_ticks = collection_ ? collection_->ticks() : 0;
  out.samples = counting_ ? counting_->samples() : 0;
  out.memory_reported = memory_reported_.load(std::memory_order_relaxed);
  const uint32_t scaled = context_.scaled_events.load();
  for (int e = 0; e < n_events; ++e) {
    if ((scaled >> e) & 1u) out.scaled_events.push_back(context_.events[e].name);
  }
  const int n_states = std::min(pool_used_.load(), kMaxDispatchThreads);
  for (int i = 0; i < n_states; ++i) {
    if (pool_[i]->ready.load(std::memory_order_acquire)) out.dispatch_tids.push_back(pool_[i]->tid);
  }
  out.max_threads = config_.max_threads;
  out.threads_beyond_limit = registry_.threads_beyond_limit();
  out.op_capacity = table_.capacity();
  out.ops_overflowed = table_.overflowed();
  out.span_capacity = config_.span_capacity;

  // Threads. While running, the collection thread's arrays are its own: read the counters live.
  const int n_threads = registry_.size();
  for (int slot = 0; slot < n_threads; ++slot) {
    const ThreadSlot& s = registry_.slot(slot);
    ThreadSnapshot t;
    t.tid = s.tid;
    t.name = s.name;
    t.opened_ns = s.opened_ns;
    t.open_errno = s.open_errno;
    t.in_team = team_.contains(slot);
    t.dispatch = team_.is_dispatch(slot);
    t.totals.assign(n_events, 0);
    uint32_t scaled_mask = 0, counted_mask = 0;
    if (out.running) {
      if (s.counters.is_open()) s.counters.read(t.totals.data(), &scaled_mask, &counted_mask);
    } else {
      std::copy(s.last_values, s.last_values + n_events, t.totals.begin());
      scaled_mask = s.last_scaled;
      counted_mask = s.last_counted;
    }
    for (int e = 0; e < n_events; ++e) {
      t.scaled.push_back((scaled_mask >> e) & 1u);
      t.counted.push_back((counted_mask >> e) & 1u);
    }
    if (s.sched_at_open.ok) {
      t.cpu_ns_at_open = s.sched_at_open.cpu_ns;
      t.run_delay_ns_at_open = s.sched_at_open.run_delay_ns;
    }
    const SchedStat at_stop = out.running ? read_schedstat(s.tid) : s.sched_at_stop;
    if (at_stop.ok) {
      t.cpu_ns_at_stop = at_stop.cpu_ns;
      t.run_delay_ns_at_stop = at_stop.run_delay_ns;
    }
    out.threads.push_back(std::move(t));
  }

  // Entries, and the per-op counters of the team's threads.
  for (int slot = 0; slot < n_threads; ++slot) {
    if (team_.contains(slot) && table_.slot_ready(slot)) out.counter_threads.push_back(slot);
  }
  const size_t width = out.counter_threads.size() * n_events;
  size_t memory = table_.memory_bytes();
  for (int i = 0; i < table_.capacity(); ++i) {
    const OpEntry& e = table_.entry(i);
    if (e.key.load() == 0 || !e.ready.load(std::memory_order_acquire)) continue;
    const size_t row = out.counters_self.size();
    out.counters_self.resize(row + width);
    out.counters_incl.resize(row + width);
    bool any_counts = false;
    for (size_t k = 0; k < out.counter_threads.size(); ++k) {
      for (int ev = 0; ev < n_events; ++ev) {
        const uint64_t self = table_.counter_value(i, out.counter_threads[k], ev, true);
        const uint64_t incl = table_.counter_value(i, out.counter_threads[k], ev, false);
        out.counters_self[row + k * n_events + ev] = self;
        out.counters_incl[row + k * n_events + ev] = incl;
        any_counts = any_counts || self || incl;
      }
    }
    const uint64_t calls = e.calls.load();
    const uint64_t samples = e.samples.load();
    const uint64_t allocs = e.allocs.load(), frees = e.frees.load();
    if (calls == 0 && !any_counts && samples == 0 && allocs == 0 && frees == 0) {
      out.counters_self.resize(row);
      out.counters_incl.resize(row);
      continue;
    }
    EntrySnapshot item;
    item.index = static_cast<uint32_t>(i);
    item.kind = e.kind;
    item.name = std::string(e.name, strnlen(e.name, sizeof(e.name)));
    item.region = e.region;
    item.has_inputs = e.has_inputs;
    item.inputs_truncated = e.inputs_truncated;
    if (e.has_inputs) item.inputs = describe_inputs(e);
    item.calls = calls;
    item.incl_ns = e.incl_ns.load();
    item.self_ns = e.self_ns.load();
    item.max_ns = e.max_ns.load();
    item.samples = samples;
    item.allocs = allocs;
    item.alloc_bytes = e.alloc_bytes.load();
    item.frees = frees;
    item.freed_bytes = e.freed_bytes.load();
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
      out.spans.thread_slot.push_back(r.thread_slot);
      out.spans.depth.push_back(r.depth);
      out.spans.start_ns.push_back(r.start_ns);
      out.spans.dur_ns.push_back(r.dur_ns);
      out.spans.counters.insert(out.spans.counters.end(), ring.counters(i), ring.counters(i) + n_events);
    }
  }
  if (counting_) counting_->fill_snapshot(&out);
  out.memory_bytes = memory + out.sampling.memory_bytes;
  return out;
}

}  // namespace cpuprof
