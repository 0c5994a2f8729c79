// The only file that knows about Python. Everything here converts between the C++ core and
// plain Python objects; no accounting happens on this side.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "op_hook.h"
#include "perf_events.h"
#include "session.h"

namespace py = pybind11;
using namespace cpuprof;

namespace {

py::dict probe_to_dict(const ProbeResult& p) {
  py::dict d;
  d["name"] = p.name;
  d["ok"] = p.ok;
  d["errno"] = p.err;
  d["errno_name"] = p.err ? std::string(strerrorname_np(p.err) ? strerrorname_np(p.err) : "") : "";
  d["reason"] = p.reason;
  d["kind"] = p.kind;
  return d;
}

py::list start_session(const std::vector<std::string>& events, const std::string& mode, bool record_shapes,
                       int sample_interval_us, int op_capacity, size_t span_capacity, int max_threads,
                       const std::string& sysfs_root) {
  SessionConfig config;
  config.events = events;
  if (mode == "exact") {
    config.mode = CountingMode::Exact;
  } else if (mode == "sampled") {
    config.mode = CountingMode::Sampled;
  } else {
    throw py::value_error("mode must be 'exact' or 'sampled', not '" + mode + "'");
  }
  config.record_shapes = record_shapes;
  config.sample_interval_us = sample_interval_us;
  config.op_capacity = op_capacity;
  config.span_capacity = span_capacity;
  config.max_threads = max_threads;
  config.sysfs_root = sysfs_root;
  std::vector<DroppedEvent> dropped;
  {
    py::gil_scoped_release release;  // the sampler's first scan takes a moment
    dropped = Session::instance().start(config);
  }
  install_op_hook(record_shapes);
  py::list out;
  for (const DroppedEvent& d : dropped) {
    py::dict item;
    item["name"] = d.name;
    item["errno"] = d.err;
    item["reason"] = d.reason;
    out.append(item);
  }
  return out;
}

void stop_session() {
  remove_op_hook();
  py::gil_scoped_release release;
  Session::instance().stop();
}

py::dict snapshot() {
  Session& s = Session::instance();
  const int n_events = static_cast<int>(s.events().size());
  py::dict out;
  py::list events;
  for (const EventSpec& e : s.events()) {
    py::dict item;
    item["name"] = e.name;
    item["kind"] = event_kind_name(e.kind);
    events.append(item);
  }
  out["events"] = events;
  out["mode"] = s.config().mode == CountingMode::Exact ? "exact" : "sampled";
  out["record_shapes"] = s.config().record_shapes;
  out["sample_interval_us"] = s.config().sample_interval_us;
  out["running"] = s.running();
  out["started_ns"] = s.started_ns();
  out["stopped_ns"] = s.stopped_ns();
  out["now_ns"] = now_ns();
  out["ops_seen"] = s.ops_seen();
  out["too_deep"] = s.too_deep();
  out["unattributed_ops"] = s.unattributed_threads();
  out["hook_ns"] = s.hook_ns();
  out["sampler_cpu_ns"] = s.sampler_cpu_ns();
  out["sampler_ticks"] = s.sampler_ticks();
  out["dispatch_threads"] = s.dispatch_threads();
  py::list dispatch_tids;
  for (int i = 0; i < std::min(s.dispatch_threads(), kMaxDispatchThreads); ++i) {
    dispatch_tids.append(Session::instance().pool_state(i)->tid);
  }
  out["dispatch_tids"] = dispatch_tids;
  out["threads_beyond_limit"] = s.registry().dropped_threads();
  const OpTable& table = s.table();
  out["op_capacity"] = table.capacity();
  out["ops_overflowed"] = table.overflowed();
  const int n_dispatch = std::min(s.dispatch_threads(), kMaxDispatchThreads);
  size_t span_bytes = 0;
  for (int d = 0; d < n_dispatch; ++d) span_bytes += s.spans(d).memory_bytes();
  out["memory_bytes"] = table.memory_bytes() + span_bytes;

  std::vector<ThreadSnapshot> threads = s.thread_snapshots();
  const int n_slots = std::min<int>(static_cast<int>(threads.size()), table.n_thread_slots());
  py::list thread_list;
  for (const ThreadSnapshot& t : threads) {
    py::dict item;
    item["tid"] = t.tid;
    item["name"] = t.name;
    item["opened_ns"] = t.opened_ns;
    item["open_errno"] = t.open_errno;
    item["totals"] = t.totals;
    py::list scaled, counted;
    for (int e = 0; e < n_events; ++e) {
      scaled.append(bool((t.scaled >> e) & 1u));
      counted.append(bool((t.counted >> e) & 1u));
    }
    item["scaled"] = scaled;
    item["counted"] = counted;
    thread_list.append(item);
  }
  out["threads"] = thread_list;

  py::list entries;
  for (int i = 0; i < table.capacity(); ++i) {
    const OpEntry& e = table.entry(i);
    if (e.key.load() == 0 || !e.ready.load(std::memory_order_acquire)) continue;
    const uint64_t calls = e.calls.load();
    // Per-thread counters as [slot][event], only for slots that exist.
    py::list incl, self;
    bool any_counts = false;
    for (int slot = 0; slot < n_slots; ++slot) {
      py::list incl_row, self_row;
      for (int ev = 0; ev < n_events; ++ev) {
        uint64_t a = table.counter_value(i, slot, ev, false);
        uint64_t b = table.counter_value(i, slot, ev, true);
        any_counts = any_counts || a || b;
        incl_row.append(a);
        self_row.append(b);
      }
      incl.append(incl_row);
      self.append(self_row);
    }
    if (calls == 0 && !any_counts && e.samples.load() == 0) continue;
    py::dict item;
    item["index"] = i;
    item["kind"] = e.kind == EntryKind::Op ? "op" : e.kind == EntryKind::Region ? "region" : "special";
    item["name"] = std::string(e.name);
    item["shapes"] = std::string(e.shapes);
    item["region"] = e.region;
    item["calls"] = calls;
    item["incl_ns"] = e.incl_ns.load();
    item["self_ns"] = e.self_ns.load();
    item["max_ns"] = e.max_ns.load();
    item["samples"] = e.samples.load();
    item["counters_incl"] = incl;
    item["counters_self"] = self;
    entries.append(item);
  }
  out["entries"] = entries;

  // Merge the per-thread rings, oldest first within each; the Python side orders by time.
  size_t n_spans = 0;
  uint64_t spans_written = 0, spans_dropped = 0;
  for (int d = 0; d < n_dispatch; ++d) {
    const SpanRing& ring = s.spans(d);
    if (!ring.enabled()) continue;
    n_spans += std::min<uint64_t>(ring.written(), ring.capacity());
    spans_written += ring.written();
    spans_dropped += ring.dropped();
  }
  const int width = std::max(n_events, 1);
  py::array_t<uint32_t> entry_arr(n_spans);
  py::array_t<int32_t> slot_arr(n_spans), depth_arr(n_spans);
  py::array_t<int64_t> start_arr(n_spans), dur_arr(n_spans);
  py::array_t<uint64_t> counter_arr({static_cast<py::ssize_t>(n_spans), static_cast<py::ssize_t>(width)});
  {
    auto en = entry_arr.mutable_unchecked<1>();
    auto sl = slot_arr.mutable_unchecked<1>();
    auto dp = depth_arr.mutable_unchecked<1>();
    auto st = start_arr.mutable_unchecked<1>();
    auto du = dur_arr.mutable_unchecked<1>();
    auto co = counter_arr.mutable_unchecked<2>();
    size_t k = 0;
    for (int d = 0; d < n_dispatch; ++d) {
      const SpanRing& ring = s.spans(d);
      if (!ring.enabled()) continue;
      const uint64_t written = ring.written();
      const size_t kept = std::min<uint64_t>(written, ring.capacity());
      // After a wrap the oldest record sits at the next write position.
      const size_t first = written > ring.capacity() ? written % ring.capacity() : 0;
      for (size_t j = 0; j < kept; ++j, ++k) {
        const size_t i = (first + j) % ring.capacity();
        const SpanRecord& r = ring.record(i);
        en(k) = r.entry;
        sl(k) = r.thread_slot == 0xffff ? -1 : r.thread_slot;
        dp(k) = r.depth;
        st(k) = r.start_ns;
        du(k) = r.dur_ns;
        for (int ev = 0; ev < width; ++ev) co(k, ev) = ev < n_events ? ring.counters(i)[ev] : 0;
      }
    }
  }
  py::dict spans;
  spans["entry"] = entry_arr;
  spans["thread_slot"] = slot_arr;
  spans["depth"] = depth_arr;
  spans["start_ns"] = start_arr;
  spans["dur_ns"] = dur_arr;
  spans["counters"] = counter_arr;
  spans["written"] = spans_written;
  spans["capacity"] = s.span_capacity();
  spans["dropped"] = spans_dropped;
  out["spans"] = spans;
  return out;
}

// Deterministic native workloads for tests: known CPU time, known page counts.
double spin_for_ns(int64_t ns) {
  py::gil_scoped_release release;
  const int64_t end = now_ns() + ns;
  volatile double x = 1.0;
  while (now_ns() < end) {
    for (int i = 0; i < 1000; ++i) x = x * 1.0000001 + 1e-9;
  }
  return x;
}

int64_t touch_fresh_pages(int64_t n_pages) {
  py::gil_scoped_release release;
  const long page = sysconf(_SC_PAGESIZE);
  char* memory = static_cast<char*>(aligned_alloc(page, static_cast<size_t>(n_pages) * page));
  if (memory == nullptr) throw std::bad_alloc();
  // aligned_alloc of a large block is a fresh mmap: every first touch is a page fault.
  for (int64_t i = 0; i < n_pages; ++i) memory[i * page] = static_cast<char>(i);
  int64_t sum = 0;
  for (int64_t i = 0; i < n_pages; ++i) sum += memory[i * page];
  free(memory);
  return sum;
}

}  // namespace

PYBIND11_MODULE(_native, m) {
  m.doc() = "cpuprof's C++ core: perf_event_open counters around every ATen op, on every thread.";
  m.attr("built_torch_version") = CPUPROF_TORCH_VERSION;
  m.attr("max_events") = kMaxEvents;
  m.attr("max_threads") = kMaxThreads;
  m.attr("max_depth") = kMaxDepth;

  m.def("generic_event_names", &generic_event_names);
  m.def(
      "parse_event",
      [](const std::string& name, const std::string& sysfs_root) {
        ParseResult r = parse_event(name, sysfs_root);
        py::dict d;
        d["ok"] = r.ok;
        d["error"] = r.error;
        d["kind"] = event_kind_name(r.spec.kind);
        d["type"] = r.spec.type;
        d["config"] = r.spec.config;
        d["config1"] = r.spec.config1;
        d["config2"] = r.spec.config2;
        d["exclude_kernel"] = r.spec.exclude_kernel;
        d["exclude_user"] = r.spec.exclude_user;
        return d;
      },
      py::arg("name"), py::arg("sysfs_root") = "/sys");
  m.def(
      "probe_event",
      [](const std::string& name, const std::string& sysfs_root) { return probe_to_dict(probe_event(name, sysfs_root)); },
      py::arg("name"), py::arg("sysfs_root") = "/sys");
  m.def(
      "open_error_reason",
      [](int err, const std::string& name) {
        ParseResult r = parse_event(name);
        return open_error_reason(err, r.spec);
      },
      py::arg("errno"), py::arg("name"));
  m.def("inject_open_errno", &inject_open_errno, py::arg("errno"), py::arg("count") = -1,
        "Test hook: the next `count` perf_event_open calls fail with `errno` (count < 0: all; errno 0 clears).");
  m.def("inject_running_fraction", &inject_running_fraction, py::arg("fraction"),
        "Test hook: report groups as running this fraction of their enabled time (0 clears).");
  m.def(
      "scale_count",
      [](uint64_t raw, uint64_t enabled, uint64_t running) {
        ScaledCount c = scale_count(raw, enabled, running);
        return py::make_tuple(c.value, c.scaled, c.ran);
      },
      py::arg("raw"), py::arg("time_enabled"), py::arg("time_running"));
  m.def("start", &start_session, py::arg("events"), py::arg("mode") = "sampled", py::arg("record_shapes") = true,
        py::arg("sample_interval_us") = 1000, py::arg("op_capacity") = 2048, py::arg("span_capacity") = 0,
        py::arg("max_threads") = kMaxThreads, py::arg("sysfs_root") = "/sys");
  m.def("stop", &stop_session);
  m.def("running", [] { return Session::instance().running(); });
  m.def("snapshot", &snapshot);
  m.def("now_ns", &now_ns);
  m.def("gettid", [] { return static_cast<int>(syscall(SYS_gettid)); });
  m.def("spin_for_ns", &spin_for_ns, py::arg("ns"));
  m.def("touch_fresh_pages", &touch_fresh_pages, py::arg("n_pages"));
}
