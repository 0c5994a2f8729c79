// cpuprof._native.testing: the test hooks (see testing/test_hooks.h). Nothing here is used by
// cpuprof itself; tests and benches reach them as `_native.testing.<hook>`.
#include "testing/test_hooks.h"

#include <pybind11/stl.h>

#include <string>
#include <tuple>

#include "core/collection_loop.h"
#include "core/counting.h"
#include "core/session.h"
#include "perf/perf_events.h"
#include "perf/sample_record.h"
#include "perf/sample_ring.h"
#include "perf/thread_counters.h"
#include "python/python_callers.h"
#include "python/python_read_pacer.h"
#include "sources/memory_hook.h"
#include "sources/op_hook.h"

namespace py = pybind11;

namespace cpuprof {

void bind_test_hooks(py::module_& native) {
  // A module of its own, importable by name once _native is (stubtest checks it against
  // cpuprof/_native_testing.pyi), and an attribute of _native for everyone else.
  auto t = py::reinterpret_steal<py::module_>(PyModule_New("cpuprof._native_testing"));
  if (!t) throw py::error_already_set();
  t.doc() = "Test hooks of cpuprof's native core: fault injection and checking modes, not for profiling.";
  native.attr("testing") = t;
  py::module_::import("sys").attr("modules")["cpuprof._native_testing"] = t;

  t.def("inject_open_errno", &inject_open_errno, py::arg("errno"), py::arg("count") = -1,
        "Test hook: the next `count` perf_event_open calls fail with `errno` (count < 0: all; errno 0 clears).");
  t.def("inject_sampling_errno", &inject_sampling_errno, py::arg("errno"),
        "Test hook: every open of a sampling event fails with `errno` (0 clears); counting still works.");
  t.def("inject_ring_page_budget", &inject_ring_page_budget, py::arg("pages"),
        "Test hook: sample rings of more than `pages` data pages fail to map with EPERM (0 clears).");
  t.def("inject_no_context_switches", &inject_no_context_switches, py::arg("off"),
        "Test hook: sampling events get no switch records, as on a kernel older than 4.3 (False restores).");
  t.def("inject_collect_delay_us", &inject_collect_delay_us, py::arg("delay_us"),
        "Test hook: every collector period but the final one takes this many microseconds longer (0 clears).");
  t.def("inject_collect_spin_us", &inject_collect_spin_us, py::arg("spin_us"),
        "Test hook: every collector period but the final one spends this many microseconds of CPU busy (0 clears).");
  t.def("inject_collect_interval_us", &inject_collect_interval_us, py::arg("interval_us"),
        "Test hook: the collector's period, in microseconds, for sessions started from now on (0: the default).");
  t.def("inject_hook_spin_ns", &inject_hook_spin_ns, py::arg("ns"),
        "Test hook: every op callback spends this many nanoseconds busy inside cpuprof's hook time (0 clears).");
  t.def("inject_running_fraction", &inject_running_fraction, py::arg("fraction"),
        "Test hook: report groups as running this fraction of their enabled time (0 clears).");
  t.def("inject_eager_workers", &inject_eager_workers, py::arg("eager"),
        "Test hook: sessions started from now on settle every OpenMP worker at every op boundary (False restores).");
  t.def("inject_read_sleeping_members", &inject_read_sleeping_members, py::arg("on"),
        "Test hook: exact-mode sessions started from now on read the clock of a team member asleep since its "
        "last read at every op boundary (False restores).");
  t.def("inject_read_running_members", &inject_read_running_members, py::arg("on"),
        "Test hook: exact-mode sessions started from now on read the clock of a team member (the calling thread "
        "included) on its CPU since its last read at every op boundary, instead of carrying it (False restores).");
  t.def("inject_frozen_switch_positions", &inject_frozen_switch_positions, py::arg("on"),
        "Test hook: every thread's switch ring says it is on its CPU with no record since (False restores).");
  t.def("verify_saved_reads", &verify_saved_reads, py::arg("on"),
        "Test hook: exact mode makes every clock read it saves anyway and compares (resets the counts).");
  t.def(
      "saved_read_stats",
      []() {
        const SavedReadStats s = saved_read_stats();
        return py::dict(py::arg("parked") = s.parked, py::arg("moved_reads") = s.moved_reads,
                        py::arg("moved_episodes") = s.moved_episodes, py::arg("max_moved_ns") = s.max_moved_ns,
                        py::arg("carried") = s.carried, py::arg("carried_other") = s.carried_other,
                        py::arg("carried_unchecked") = s.carried_unchecked, py::arg("carried_error_ns") = s.carried_error_ns,
                        py::arg("max_carried_error_ns") = s.max_carried_error_ns,
                        py::arg("carried_off") = s.carried_off);
      },
      "What verify_saved_reads counted: reads saved for members off their CPU (parked), those whose clock had "
      "moved, their episodes (a member's reads at one switch position) and the largest movement one hid; reads "
      "carried for members on their CPU (carried_other: of members other than the calling thread; carried_unchecked: "
      "whose checking read was interrupted), and over the checked ones the total and largest difference from a read "
      "at the same moment and how many differed by more than 2 us (carried_off).");
  t.def("inject_thread_setup_failures", &inject_thread_setup_failures, py::arg("count"),
        "Test hook: the next `count` dispatching threads' buffer allocations fail (0 clears).");
  t.def(
      "parse_sample_record",
      [](py::bytes record) -> py::object {
        const std::string bytes = record;
        ParsedSample sample;
        if (!parse_sample(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), &sample)) return py::none();
        py::list callchain;
        for (uint64_t i = 0; i < sample.n_callchain; ++i) callchain.append(sample.chain(i));
        py::list values;
        for (uint64_t i = 0; i < sample.n_values; ++i) values.append(sample.value(i));
        py::dict out;
        out["ip"] = sample.ip;
        out["pid"] = sample.pid;
        out["tid"] = sample.tid;
        out["time"] = sample.time;
        out["values"] = values;
        out["callchain"] = callchain;
        out["has_user_regs"] = sample.has_user_regs;
        out["stack_size"] = sample.stack_size;
        return out;
      },
      py::arg("record"),
      "Parses one PERF_RECORD_SAMPLE (header included) as the collector does: a dict, or None when malformed.");
  t.def(
      "scale_delta",
      [](std::tuple<uint64_t, uint64_t, uint64_t> before, std::tuple<uint64_t, uint64_t, uint64_t> after) {
        ScaledCount c = scale_delta({std::get<0>(before), std::get<1>(before), std::get<2>(before)},
                                    {std::get<0>(after), std::get<1>(after), std::get<2>(after)});
        return py::make_tuple(c.value, c.scaled, c.ran);
      },
      py::arg("before"), py::arg("after"),
      "(raw, time_enabled, time_running) at two reads -> (scaled delta, scaled, ran)");
  t.def(
      "scale_count",
      [](uint64_t raw, uint64_t enabled, uint64_t running) {
        ScaledCount c = scale_count(raw, enabled, running);
        return py::make_tuple(c.value, c.scaled, c.ran);
      },
      py::arg("raw"), py::arg("time_enabled"), py::arg("time_running"));
  t.def("inject_empty_callbacks", &inject_empty_callbacks, py::arg("on"), py::arg("needs_inputs") = false,
        "Test hook: RecordFunction callbacks that do nothing (inputs boxed if needs_inputs), for the dispatch floor.");
  t.def("inject_no_memory_reports", &inject_no_memory_reports, py::arg("off"),
        "Test hook: while on, torch's allocator is told nothing is profiled (no allocation reports).");
  t.def("inject_no_python_callers", &inject_no_python_callers, py::arg("on"),
        "Test hook: while on, start_python_callers records nothing (runs joined by the sampler's reads alone).");
  t.def("inject_python_reads_every_tick", &inject_python_reads_every_tick, py::arg("on"),
        "Test hook: while on, the read pacer covers no tick (a read every period, as before it).");
}

}  // namespace cpuprof
