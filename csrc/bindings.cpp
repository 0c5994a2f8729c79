// The native module's API, and with testing/test_hooks.cpp (its test hooks, a submodule of their
// own) the only files that know about pybind11: typed views of the core's results, and its entry
// points (python/python_stacks.cpp reads the interpreter's frames through CPython's own API).
// No accounting happens on this side; every class here mirrors a C++ struct field for field
// (see cpuprof/_native.pyi).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/clock.h"
#include "core/session.h"
#include "core/collection_loop.h"
#include "common/limits.h"
#include "limits_table.h"
#include "perf/perf_events.h"
#include "python/python_callers.h"
#include "python/python_read_pacer.h"
#include "python/python_stacks.h"
#include "roofs/stream_kernels.h"
#include "sources/memory_hook.h"
#include "sources/op_hook.h"
#include "sources/regions.h"
#include "testing/test_hooks.h"
#include "unwind/unwinder.h"

namespace py = pybind11;
using namespace cpuprof;

namespace {

// The allocator's reports come through the starting thread's debug info: installed beside the op
// hook, on the thread that starts the session.
void install_hook_with_shapes() {
  install_op_hook(true);
  install_memory_hook();
}
void install_hook_without_shapes() {
  install_op_hook(false);
  install_memory_hook();
}
// Handed to the OMPT tool (its own library, loaded by the OpenMP runtime) as a plain function
// pointer: the op each parallel region is forked for.
extern "C" uint32_t cpuprof_current_op_entry() { return Session::instance().current_entry(); }

void remove_hooks() {
  remove_op_hook();
  remove_memory_hook();
}

std::vector<DroppedEvent> start_session(const std::vector<std::string>& events, CountingMode mode,
                                        bool record_shapes, int sample_hz, int stack_bytes, size_t timeline_samples,
                                        int ring_pages, int op_capacity, size_t span_capacity, int max_threads,
                                        const std::string& sysfs_root, const std::vector<pid_t>& own_threads) {
  SessionConfig config;
  config.events = events;
  config.mode = mode;
  config.record_shapes = record_shapes;
  config.sample_hz = sample_hz;
  config.stack_bytes = stack_bytes;
  config.timeline_samples = timeline_samples;
  config.ring_pages = ring_pages;
  config.op_capacity = op_capacity;
  config.span_capacity = span_capacity;
  config.max_threads = max_threads;
  config.sysfs_root = sysfs_root;
  config.own_threads = own_threads;
  py::gil_scoped_release release;  // the collection loop's first scan takes a moment
  return Session::instance().start(config, record_shapes ? install_hook_with_shapes : install_hook_without_shapes);
}

void stop_session() {
  py::gil_scoped_release release;
  Session::instance().stop(remove_hooks);
}

// A sampler's frame reader (python/python_stacks.h): its table lives as long as this object.
class PythonFrameReader {
 public:
  PythonFrameReader() : table_(new_python_frame_table()) {}
  ~PythonFrameReader() { free_python_frame_table(table_); }  // pybind11 deallocates with the GIL held
  PythonFrameReader(const PythonFrameReader&) = delete;
  PythonFrameReader& operator=(const PythonFrameReader&) = delete;

  py::list read(unsigned long skip_ident) {
    PyObject* threads = read_python_stacks(table_, skip_ident);
    if (threads == nullptr) throw py::error_already_set();
    return py::reinterpret_steal<py::list>(threads);
  }
  py::list frames(Py_ssize_t first) {
    PyObject* frames = python_frame_table(table_, first);
    if (frames == nullptr) throw py::error_already_set();
    return py::reinterpret_steal<py::list>(frames);
  }

 private:
  PythonFrameTable* table_;
};

SessionSnapshot take_snapshot() {
  py::gil_scoped_release release;  // copied under the session's lock
  return Session::instance().snapshot();
}

template <typename T>
py::array_t<T> array(const std::vector<T>& values, std::vector<py::ssize_t> shape) {
  py::array_t<T> out(shape);
  if (!values.empty()) std::memcpy(out.mutable_data(), values.data(), values.size() * sizeof(T));
  return out;
}

py::array_t<uint64_t> counters(const SessionSnapshot& s, const std::vector<uint64_t>& flat) {
  return array(flat, {static_cast<py::ssize_t>(s.entries.size()), static_cast<py::ssize_t>(s.counter_threads.size()),
                      static_cast<py::ssize_t>(s.events.size())});
}

// Generated from limits.h with _build_info.py's dict (limits_table.h, CMakeLists.txt): a limit
// added there is here without a line of this file.
py::dict limits() {
  py::dict d;
  for (const LimitEntry& limit : kLimitTable) d[limit.name] = limit.value;
  return d;
}

}  // namespace

PYBIND11_MODULE(_native, m) {
  m.doc() = "cpuprof's C++ core: perf_event_open counters around every ATen op, on every thread.";
  m.attr("built_torch_version") = CPUPROF_TORCH_VERSION;
  m.attr("limits") = limits();

  // Every kind crosses as an enum, bound from the list its C++ enum is made from
  // (common/enum_list.h): a misspelt mode fails where Python names it, and a kind added in C++
  // reaches Python without a line here (cpuprof/native.py names each as the profile saves it).
#define CPUPROF_BIND_ENUM_VALUE(cpp_name, number, py_name) kinds.value(py_name, Kind::cpp_name);
#define CPUPROF_BIND_ENUM(Type, LIST)        \
  {                                          \
    using Kind = Type;                       \
    py::enum_<Kind> kinds(m, #Type);         \
    LIST(CPUPROF_BIND_ENUM_VALUE)            \
  }
  CPUPROF_BIND_ENUM(CountingMode, CPUPROF_COUNTING_MODES)
  CPUPROF_BIND_ENUM(EntryKind, CPUPROF_ENTRY_KINDS)
  CPUPROF_BIND_ENUM(InputKind, CPUPROF_INPUT_KINDS)
  CPUPROF_BIND_ENUM(EventKind, CPUPROF_EVENT_KINDS)
  CPUPROF_BIND_ENUM(UnwindStop, CPUPROF_UNWIND_STOPS)
#undef CPUPROF_BIND_ENUM
#undef CPUPROF_BIND_ENUM_VALUE

  py::class_<DroppedEvent>(m, "DroppedEvent")
      .def_readonly("name", &DroppedEvent::name)
      .def_readonly("errno", &DroppedEvent::err)
      .def_readonly("reason", &DroppedEvent::reason);
  py::class_<ProbeResult>(m, "ProbeResult")
      .def_readonly("name", &ProbeResult::name)
      .def_readonly("ok", &ProbeResult::ok)
      .def_readonly("errno", &ProbeResult::err)
      .def_property_readonly("errno_name",
                             [](const ProbeResult& p) {
                               const char* name = p.err ? strerrorname_np(p.err) : nullptr;
                               return std::string(name ? name : "");
                             })
      .def_readonly("reason", &ProbeResult::reason)
      .def_property_readonly("kind",  // None when the name is no event
                             [](const ProbeResult& p) { return p.parsed ? py::cast(p.kind) : py::none(); })
      .def_readonly("user_only", &ProbeResult::user_only);
  py::class_<ParseResult>(m, "ParseResult")
      .def_readonly("ok", &ParseResult::ok)
      .def_readonly("error", &ParseResult::error)
      .def_property_readonly("kind", [](const ParseResult& r) { return r.spec.kind; })
      .def_property_readonly("type", [](const ParseResult& r) { return r.spec.type; })
      .def_property_readonly("config", [](const ParseResult& r) { return r.spec.config; })
      .def_property_readonly("config1", [](const ParseResult& r) { return r.spec.config1; })
      .def_property_readonly("config2", [](const ParseResult& r) { return r.spec.config2; })
      .def_property_readonly("exclude_kernel", [](const ParseResult& r) { return r.spec.exclude_kernel; })
      .def_property_readonly("exclude_user", [](const ParseResult& r) { return r.spec.exclude_user; });

  py::class_<EventSnapshot>(m, "EventSnapshot")
      .def_readonly("name", &EventSnapshot::name)
      .def_readonly("kind", &EventSnapshot::kind)
      .def_readonly("user_only", &EventSnapshot::user_only);
  py::class_<InputSnapshot>(m, "InputSnapshot")
      .def_readonly("kind", &InputSnapshot::kind)
      .def_readonly("dtype", &InputSnapshot::dtype)
      .def_readonly("sizes", &InputSnapshot::sizes)
      .def_readonly("strides", &InputSnapshot::strides)
      .def_readonly("list_len", &InputSnapshot::list_len);
  py::class_<EntrySnapshot>(m, "EntrySnapshot")
      .def_readonly("index", &EntrySnapshot::index)
      .def_readonly("kind", &EntrySnapshot::kind)
      .def_readonly("name", &EntrySnapshot::name)
      .def_readonly("region", &EntrySnapshot::region)
      .def_readonly("has_inputs", &EntrySnapshot::has_inputs)
      .def_readonly("inputs_truncated", &EntrySnapshot::inputs_truncated)
      .def_readonly("inputs", &EntrySnapshot::inputs)
      .def_readonly("calls", &EntrySnapshot::calls)
      .def_readonly("incl_ns", &EntrySnapshot::incl_ns)
      .def_readonly("self_ns", &EntrySnapshot::self_ns)
      .def_readonly("max_ns", &EntrySnapshot::max_ns)
      .def_readonly("samples", &EntrySnapshot::samples)
      .def_readonly("alloc_bytes", &EntrySnapshot::alloc_bytes)
      .def_readonly("allocs", &EntrySnapshot::allocs)
      .def_readonly("freed_bytes", &EntrySnapshot::freed_bytes)
      .def_readonly("frees", &EntrySnapshot::frees);
  py::class_<ThreadSnapshot>(m, "ThreadSnapshot")
      .def_readonly("tid", &ThreadSnapshot::tid)
      .def_readonly("name", &ThreadSnapshot::name)
      .def_readonly("opened_ns", &ThreadSnapshot::opened_ns)
      .def_readonly("open_errno", &ThreadSnapshot::open_errno)
      .def_readonly("in_team", &ThreadSnapshot::in_team)
      .def_readonly("dispatch", &ThreadSnapshot::dispatch)
      .def_readonly("totals", &ThreadSnapshot::totals)
      .def_readonly("scaled", &ThreadSnapshot::scaled)
      .def_readonly("counted", &ThreadSnapshot::counted)
      .def_readonly("cpu_ns_at_open", &ThreadSnapshot::cpu_ns_at_open)
      .def_readonly("run_delay_ns_at_open", &ThreadSnapshot::run_delay_ns_at_open)
      .def_readonly("cpu_ns_at_stop", &ThreadSnapshot::cpu_ns_at_stop)
      .def_readonly("run_delay_ns_at_stop", &ThreadSnapshot::run_delay_ns_at_stop)
      .def_readonly("samples", &ThreadSnapshot::samples)
      .def_readonly("samples_lost", &ThreadSnapshot::samples_lost)
      .def_readonly("sample_errno", &ThreadSnapshot::sample_errno)
      .def_readonly("ring_pages", &ThreadSnapshot::ring_pages)
      .def_readonly("ring_pages_asked", &ThreadSnapshot::ring_pages_asked);
  py::class_<SamplingSnapshot>(m, "SamplingSnapshot")
      .def_readonly("enabled", &SamplingSnapshot::enabled)
      .def_readonly("sample_hz", &SamplingSnapshot::sample_hz)
      .def_readonly("stack_bytes", &SamplingSnapshot::stack_bytes)
      .def_readonly("samples", &SamplingSnapshot::samples)
      .def_readonly("samples_lost", &SamplingSnapshot::samples_lost)
      .def_readonly("unparsed", &SamplingSnapshot::unparsed)
      .def_readonly("ambiguous_workers", &SamplingSnapshot::ambiguous_workers)
      .def_readonly("late_op_events", &SamplingSnapshot::late_op_events)
      .def_readonly("switch_records", &SamplingSnapshot::switch_records)
      .def_readonly("cpu_by_interval_ns", &SamplingSnapshot::cpu_by_interval_ns)
      .def_readonly("cpu_by_sample_ns", &SamplingSnapshot::cpu_by_sample_ns)
      .def_readonly("op_events_dropped", &SamplingSnapshot::op_events_dropped)
      .def_readonly("stacks_truncated", &SamplingSnapshot::stacks_truncated)
      .def_readonly("counts_dropped", &SamplingSnapshot::counts_dropped)
      .def_readonly("timeline_dropped", &SamplingSnapshot::timeline_dropped)
      .def_property_readonly("unwind_stops",  // {UnwindStop: samples}, every kind
                             [](const SamplingSnapshot& s) {
                               py::dict stops;
                               for (size_t i = 0; i < s.unwind_stops.size(); ++i) {
                                 stops[py::cast(static_cast<UnwindStop>(i))] = s.unwind_stops[i];
                               }
                               return stops;
                             })
      .def_readonly("frames_by_frame_pointer", &SamplingSnapshot::frames_by_frame_pointer)
      .def_readonly("frames_by_scanning", &SamplingSnapshot::frames_by_scanning)
      .def_property_readonly("frames", [](const SamplingSnapshot& s) { return array(s.frames, {static_cast<py::ssize_t>(s.frames.size())}); })
      .def_property_readonly("offsets", [](const SamplingSnapshot& s) { return array(s.offsets, {static_cast<py::ssize_t>(s.offsets.size())}); })
      .def_property_readonly("path_entries", [](const SamplingSnapshot& s) { return array(s.path_entries, {static_cast<py::ssize_t>(s.path_entries.size())}); })
      .def_property_readonly("path_offsets", [](const SamplingSnapshot& s) { return array(s.path_offsets, {static_cast<py::ssize_t>(s.path_offsets.size())}); })
      .def_property_readonly("count_path", [](const SamplingSnapshot& s) { return array(s.count_path, {static_cast<py::ssize_t>(s.count_path.size())}); })
      .def_property_readonly("count_values", [](const SamplingSnapshot& s) {
        const auto n = static_cast<py::ssize_t>(s.count_stack.size());
        return array(s.count_values, {n, n ? static_cast<py::ssize_t>(s.count_values.size()) / n : 0});
      })
      .def_property_readonly("count_stack", [](const SamplingSnapshot& s) { return array(s.count_stack, {static_cast<py::ssize_t>(s.count_stack.size())}); })
      .def_property_readonly("count_slot", [](const SamplingSnapshot& s) { return array(s.count_slot, {static_cast<py::ssize_t>(s.count_slot.size())}); })
      .def_property_readonly("count_entry", [](const SamplingSnapshot& s) { return array(s.count_entry, {static_cast<py::ssize_t>(s.count_entry.size())}); })
      .def_property_readonly("count_samples", [](const SamplingSnapshot& s) { return array(s.count_samples, {static_cast<py::ssize_t>(s.count_samples.size())}); })
      .def_property_readonly("count_cpu_ns", [](const SamplingSnapshot& s) { return array(s.count_cpu_ns, {static_cast<py::ssize_t>(s.count_cpu_ns.size())}); })
      .def_property_readonly("timeline_time", [](const SamplingSnapshot& s) { return array(s.timeline_time, {static_cast<py::ssize_t>(s.timeline_time.size())}); })
      .def_property_readonly("timeline_slot", [](const SamplingSnapshot& s) { return array(s.timeline_slot, {static_cast<py::ssize_t>(s.timeline_slot.size())}); })
      .def_property_readonly("timeline_entry", [](const SamplingSnapshot& s) { return array(s.timeline_entry, {static_cast<py::ssize_t>(s.timeline_entry.size())}); })
      .def_property_readonly("timeline_stack", [](const SamplingSnapshot& s) { return array(s.timeline_stack, {static_cast<py::ssize_t>(s.timeline_stack.size())}); })
      .def_property_readonly("timeline_path", [](const SamplingSnapshot& s) { return array(s.timeline_path, {static_cast<py::ssize_t>(s.timeline_path.size())}); })
      .def_property_readonly("timeline_cpu_us", [](const SamplingSnapshot& s) { return array(s.timeline_cpu_us, {static_cast<py::ssize_t>(s.timeline_cpu_us.size())}); })
      .def_readonly("memory_bytes", &SamplingSnapshot::memory_bytes);
  py::class_<SpanSnapshot>(m, "SpanSnapshot")
      .def_property_readonly("entry", [](const SpanSnapshot& s) {
        return array(s.entry, {static_cast<py::ssize_t>(s.entry.size())});
      })
      .def_property_readonly("thread_slot", [](const SpanSnapshot& s) {
        return array(s.thread_slot, {static_cast<py::ssize_t>(s.thread_slot.size())});
      })
      .def_property_readonly("depth", [](const SpanSnapshot& s) {
        return array(s.depth, {static_cast<py::ssize_t>(s.depth.size())});
      })
      .def_property_readonly("start_ns", [](const SpanSnapshot& s) {
        return array(s.start_ns, {static_cast<py::ssize_t>(s.start_ns.size())});
      })
      .def_property_readonly("dur_ns", [](const SpanSnapshot& s) {
        return array(s.dur_ns, {static_cast<py::ssize_t>(s.dur_ns.size())});
      })
      .def_readonly("written", &SpanSnapshot::written)
      .def_readonly("dropped", &SpanSnapshot::dropped);
  py::class_<SessionSnapshot>(m, "SessionSnapshot")
      .def_readonly("events", &SessionSnapshot::events)
      .def_readonly("mode", &SessionSnapshot::mode)
      .def_readonly("record_shapes", &SessionSnapshot::record_shapes)
      .def_readonly("running", &SessionSnapshot::running)
      .def_readonly("started_ns", &SessionSnapshot::started_ns)
      .def_readonly("stopped_ns", &SessionSnapshot::stopped_ns)
      .def_readonly("now_ns", &SessionSnapshot::now_ns)
      .def_readonly("ops_seen", &SessionSnapshot::ops_seen)
      .def_readonly("too_deep", &SessionSnapshot::too_deep)
      .def_readonly("unattributed_ops", &SessionSnapshot::unattributed_ops)
      .def_readonly("unmatched_ends", &SessionSnapshot::unmatched_ends)
      .def_readonly("truncated_ops", &SessionSnapshot::truncated_ops)
      .def_readonly("thread_setup_failures", &SessionSnapshot::thread_setup_failures)
      .def_readonly("hook_ns", &SessionSnapshot::hook_ns)
      .def_readonly("discovery_cpu_ns", &SessionSnapshot::discovery_cpu_ns)
      .def_readonly("discovery_ticks", &SessionSnapshot::discovery_ticks)
      .def_readonly("idle_reads_skipped", &SessionSnapshot::idle_reads_skipped)
      .def_readonly("thread_scans", &SessionSnapshot::thread_scans)
      .def_readonly("scan_setup_cpu_ns", &SessionSnapshot::scan_setup_cpu_ns)
      .def_readonly("samples", &SessionSnapshot::samples)
      .def_readonly("memory_reported", &SessionSnapshot::memory_reported)
      .def_readonly("scaled_events", &SessionSnapshot::scaled_events)
      .def_readonly("dispatch_tids", &SessionSnapshot::dispatch_tids)
      .def_readonly("max_threads", &SessionSnapshot::max_threads)
      .def_readonly("threads_beyond_limit", &SessionSnapshot::threads_beyond_limit)
      .def_readonly("op_capacity", &SessionSnapshot::op_capacity)
      .def_readonly("ops_overflowed", &SessionSnapshot::ops_overflowed)
      .def_readonly("memory_bytes", &SessionSnapshot::memory_bytes)
      .def_readonly("span_capacity", &SessionSnapshot::span_capacity)
      .def_readonly("threads", &SessionSnapshot::threads)
      .def_readonly("entries", &SessionSnapshot::entries)
      .def_readonly("counter_threads", &SessionSnapshot::counter_threads)
      .def_property_readonly("counters_self", [](const SessionSnapshot& s) { return counters(s, s.counters_self); })
      .def_property_readonly("counters_incl", [](const SessionSnapshot& s) { return counters(s, s.counters_incl); })
      .def_readonly("spans", &SessionSnapshot::spans)
      .def_readonly("sampling", &SessionSnapshot::sampling)
      .def_property_readonly("span_counters", [](const SessionSnapshot& s) {
        const auto n = static_cast<py::ssize_t>(s.spans.entry.size());
        return array(s.spans.counters, {n, static_cast<py::ssize_t>(s.events.size())});
      });

  m.def("generic_event_names", &generic_event_names);
  m.def("parse_event", &parse_event, py::arg("name"), py::arg("sysfs_root") = "/sys");
  m.def("probe_event", &probe_event, py::arg("name"), py::arg("sysfs_root") = "/sys");
  m.def(
      "open_error_reason",
      [](int err, const std::string& name) { return open_error_reason(err, parse_event(name).spec); },
      py::arg("errno"), py::arg("name"));
  m.def("start", &start_session, py::arg("events"), py::arg("mode"), py::arg("record_shapes"),
        py::arg("sample_hz"), py::arg("stack_bytes"), py::arg("timeline_samples"), py::arg("ring_pages"),
        py::arg("op_capacity"), py::arg("span_capacity"), py::arg("max_threads"), py::arg("sysfs_root") = "/sys",
        py::arg("own_threads") = std::vector<pid_t>{});
  m.def("stop", &stop_session);
  m.def("collect_interval_us", &collect_interval_us, "The collector's period sessions started now use.");
  m.def("region_begin", &region_begin, py::arg("name"), py::arg("id"));
  m.def("region_end", &region_end, py::arg("id"));
  m.def("running", [] { return Session::instance().running(); });
  m.def("snapshot", &take_snapshot);
  m.def("now_ns", &now_ns);
  m.def("current_op_entry_address", [] { return reinterpret_cast<uintptr_t>(&cpuprof_current_op_entry); },
        "Address of a C function uint32_t(void): the calling thread's innermost op entry, 0 if none.");
  m.def("current_op_entry", &cpuprof_current_op_entry);
  m.def("gettid", [] { return static_cast<int>(syscall(SYS_gettid)); });
  m.def("python_stacks_supported", &python_stacks_supported);
  py::class_<PythonFrameReader>(m, "PythonFrameReader",
                                "Every Python thread's stack, read natively (the caller holds the GIL); its own "
                                "table of frame ids.")
      .def(py::init<>())
      .def("read", &PythonFrameReader::read, py::arg("skip_ident"),
           "[(ident, native id, bytes of uint32 frame ids root first)] of every thread but skip_ident.")
      .def("frames", &PythonFrameReader::frames, py::arg("first") = 0,
           "[(qualified name, file, line)] of the frame ids from first on.");
  m.def("python_callers_supported", &python_callers_supported);
  m.def("start_python_callers", &start_python_callers,
        "Records each op's Python caller from now on (python/python_callers.h); before the session starts.");
  m.def("stop_python_callers", &stop_python_callers, "Stops recording op callers; after the session stopped.");
  m.def("release_python_callers", &release_python_callers, "Frees the op callers' rings and table once drained.");
  py::class_<PythonReadPacer>(m, "PythonReadPacer",
                              "When the in-process sampler reads: ticks the op callers cover are waited out "
                              "(python/python_read_pacer.h).")
      .def(py::init<int64_t, int64_t, double, double>(), py::arg("period_ns"), py::arg("window_ns"),
           py::arg("min_cpu_share"), py::arg("fill_limit"))
      .def(
          "wait",
          [](PythonReadPacer& pacer, int64_t tick_ns, int64_t return_by_ns) {
            PacedTick tick;
            {
              py::gil_scoped_release release;
              tick = pacer.wait(tick_ns, return_by_ns);
            }
            return py::make_tuple(tick.tick_ns, tick.covered, tick.stopping);
          },
          py::arg("tick_ns"), py::arg("return_by_ns"),
          "(tick ns, ticks covered, stopping): sleeps to the first tick the op callers do not cover, "
          "return_by_ns, a caller ring to drain, or stop().")
      .def("stop", &PythonReadPacer::stop, "Wakes a waiter; every later wait returns at once.");
  m.def(
      "drain_python_callers",
      [] {
        PyObject* drained = drain_python_callers();
        if (drained == nullptr) throw py::error_already_set();
        return py::reinterpret_steal<py::list>(drained);
      },
      "[(OS thread id, bytes of (int64 ns, uint32 chain, uint32 0) records, changes lost)] since the last drain.");
  m.def("python_callers_fill", &python_callers_fill,
        "How full the fullest thread's op-caller ring is, 0 to 1 (memory loads only).");
  m.def(
      "python_caller_chains",
      [](Py_ssize_t first) {
        PyObject* chains = python_caller_chains(first);
        if (chains == nullptr) throw py::error_already_set();
        return py::reinterpret_steal<py::list>(chains);
      },
      py::arg("first") = 0, "[[(qualified name, file, line) root first]] of the chain ids from first on.");
  m.def(
      "stream_seconds",
      [](const std::string& kernel, size_t array_bytes, int threads, int repetitions, const std::string& isa) {
        py::gil_scoped_release release;  // a calibration runs for seconds; other Python threads keep going
        return stream_seconds(kernel, array_bytes, threads, repetitions, isa);
      },
      py::arg("kernel"), py::arg("array_bytes"), py::arg("threads"), py::arg("repetitions"), py::arg("isa") = "",
      "Seconds of each pass of a STREAM-style 'copy', 'triad' or 'read' over arrays of array_bytes each.");
  m.def(
      "fma_seconds",
      [](const std::string& isa, int threads, int64_t iterations, int repetitions) {
        py::gil_scoped_release release;
        return fma_seconds(isa, threads, iterations, repetitions);
      },
      py::arg("isa"), py::arg("threads"), py::arg("iterations"), py::arg("repetitions"),
      "Seconds of each run of a register-only f32 FMA loop on every thread of a team.");
  m.def("fma_flops_per_iteration", &fma_flops_per_iteration, py::arg("isa"),
        "Floating-point operations per thread per iteration of fma_seconds' loop.");
  m.def("roofs_isa", &roofs_isa, py::arg("at_most") = "",
        "The instruction set of the roof kernels: the widest this CPU runs, no wider than at_most.");

  bind_test_hooks(m);  // apart from the API: cpuprof._native.testing (testing/test_hooks.cpp)
}
