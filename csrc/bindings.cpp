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

void install_hook_with_shapes() { install_op_hook(true); }
void install_hook_without_shapes() { install_op_hook(false); }

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
    dropped = Session::instance().start(config, record_shapes ? install_hook_with_shapes : install_hook_without_shapes);
  }
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
  py::gil_scoped_release release;
  Session::instance().stop(remove_op_hook);
}

py::dict snapshot() {
  SessionSnapshot snap;
  {
    py::gil_scoped_release release;  // copied under the session's lock, converted after
    snap = Session::instance().snapshot();
  }
  const int n_events = static_cast<int>(snap.events.size());
  py::dict out;
  py::list events;
  for (const EventSpec& e : snap.events) {
    py::dict item;
    item["name"] = e.name;
    item["kind"] = event_kind_name(e.kind);
    item["user_only"] = e.exclude_kernel && !e.exclude_user;
    events.append(item);
  }
  out["events"] = events;
  out["mode"] = snap.mode == CountingMode::Exact ? "exact" : "sampled";
  out["record_shapes"] = snap.record_shapes;
  out["sample_interval_us"] = snap.sample_interval_us;
  out["running"] = snap.running;
  out["started_ns"] = snap.started_ns;
  out["stopped_ns"] = snap.stopped_ns;
  out["now_ns"] = snap.now_ns;
  out["ops_seen"] = snap.ops_seen;
  out["too_deep"] = snap.too_deep;
  out["unattributed_ops"] = snap.unattributed_ops;
  out["unmatched_ends"] = snap.unmatched_ends;
  out["truncated_ops"] = snap.truncated;
  out["hook_ns"] = snap.hook_ns;
  out["sampler_cpu_ns"] = snap.sampler_cpu_ns;
  out["sampler_ticks"] = snap.sampler_ticks;
  out["samples"] = snap.samples;
  py::list scaled_events;
  for (int e = 0; e < n_events; ++e) {
    if ((snap.scaled_events >> e) & 1u) scaled_events.append(snap.events[e].name);
  }
  out["scaled_events"] = scaled_events;
  out["dispatch_tids"] = snap.dispatch_tids;
  out["threads_beyond_limit"] = snap.threads_beyond_limit;
  out["op_capacity"] = snap.op_capacity;
  out["ops_overflowed"] = snap.ops_overflowed;
  out["memory_bytes"] = snap.memory_bytes;

  py::list thread_list;
  for (const ThreadSnapshot& t : snap.threads) {
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
  for (const EntrySnapshot& e : snap.entries) {
    py::list incl, self;  // [slot][event]
    for (int slot = 0; slot < snap.n_slots; ++slot) {
      py::list incl_row, self_row;
      for (int ev = 0; ev < n_events; ++ev) {
        incl_row.append(e.incl[slot * n_events + ev]);
        self_row.append(e.self[slot * n_events + ev]);
      }
      incl.append(incl_row);
      self.append(self_row);
    }
    py::dict item;
    item["index"] = e.index;
    item["kind"] = e.kind == EntryKind::Op ? "op" : e.kind == EntryKind::Region ? "region" : "special";
    item["name"] = e.name;
    item["shapes"] = e.shapes;
    item["region"] = e.region;
    item["calls"] = e.calls;
    item["incl_ns"] = e.incl_ns;
    item["self_ns"] = e.self_ns;
    item["max_ns"] = e.max_ns;
    item["samples"] = e.samples;
    item["counters_incl"] = incl;
    item["counters_self"] = self;
    entries.append(item);
  }
  out["entries"] = entries;

  const SpanSnapshot& sp = snap.spans;
  const py::ssize_t n_spans = static_cast<py::ssize_t>(sp.entry.size());
  const int width = std::max(n_events, 1);
  py::array_t<uint64_t> counters({n_spans, static_cast<py::ssize_t>(width)});
  auto co = counters.mutable_unchecked<2>();
  for (py::ssize_t k = 0; k < n_spans; ++k) {
    for (int ev = 0; ev < width; ++ev) co(k, ev) = ev < n_events ? sp.counters[k * n_events + ev] : 0;
  }
  py::dict spans;
  spans["entry"] = py::array_t<uint32_t>(n_spans, sp.entry.data());
  spans["thread_slot"] = py::array_t<int32_t>(n_spans, sp.thread_slot.data());
  spans["depth"] = py::array_t<int32_t>(n_spans, sp.depth.data());
  spans["start_ns"] = py::array_t<int64_t>(n_spans, sp.start_ns.data());
  spans["dur_ns"] = py::array_t<int64_t>(n_spans, sp.dur_ns.data());
  spans["counters"] = counters;
  spans["written"] = sp.written;
  spans["capacity"] = snap.span_capacity;
  spans["dropped"] = sp.dropped;
  out["spans"] = spans;
  return out;
}

// Regions straight into the session, without a RecordFunction: a Python record_function costs
// ~8 µs per use, this ~0.3 µs. `id` tells concurrent regions apart until they end.
void region_begin(const std::string& name, uintptr_t id) {
  Session& session = Session::instance();
  if (!session.enter()) return;
  Session::Guard guard{session};
  const int64_t enter_ns = now_ns();
  DispatchState* state = session.dispatch_state();
  if (state == nullptr) {
    session.count_unattributed();
    return;
  }
  session.begin_op(state, enter_ns, id, hash_name(name.c_str()), true, [&](OpEntry& entry) {
    strncpy(entry.name, name.c_str(), sizeof(entry.name) - 1);
  });
}

void region_end(uintptr_t id) {
  Session& session = Session::instance();
  if (!session.enter()) return;
  Session::Guard guard{session};
  const int64_t enter_ns = now_ns();
  DispatchState* state = session.dispatch_state();
  if (state != nullptr) session.end_op(state, enter_ns, id);
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
      "scale_delta",
      [](std::tuple<uint64_t, uint64_t, uint64_t> before, std::tuple<uint64_t, uint64_t, uint64_t> after) {
        ScaledCount c = scale_delta({std::get<0>(before), std::get<1>(before), std::get<2>(before)},
                                    {std::get<0>(after), std::get<1>(after), std::get<2>(after)});
        return py::make_tuple(c.value, c.scaled, c.ran);
      },
      py::arg("before"), py::arg("after"),
      "(raw, time_enabled, time_running) at two reads -> (scaled delta, scaled, ran)");
  m.def(
      "scale_count",
      [](uint64_t raw, uint64_t enabled, uint64_t running) {
        ScaledCount c = scale_count(raw, enabled, running);
        return py::make_tuple(c.value, c.scaled, c.ran);
      },
      py::arg("raw"), py::arg("time_enabled"), py::arg("time_running"));
  m.def("start", &start_session, py::arg("events"), py::arg("mode") = "sampled", py::arg("record_shapes") = true,
        py::arg("sample_interval_us") = 4000, py::arg("op_capacity") = 2048, py::arg("span_capacity") = 0,
        py::arg("max_threads") = kMaxThreads, py::arg("sysfs_root") = "/sys");
  m.def("stop", &stop_session);
  m.def("region_begin", &region_begin, py::arg("name"), py::arg("id"));
  m.def("region_end", &region_end, py::arg("id"));
  m.def("running", [] { return Session::instance().running(); });
  m.def("snapshot", &snapshot);
  m.def("now_ns", &now_ns);
  m.def("gettid", [] { return static_cast<int>(syscall(SYS_gettid)); });
  m.def("spin_for_ns", &spin_for_ns, py::arg("ns"));
  m.def("touch_fresh_pages", &touch_fresh_pages, py::arg("n_pages"));
}
