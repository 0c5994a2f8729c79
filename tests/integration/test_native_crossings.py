"""What crosses between the C++ core and Python comes from one source: every enum the core binds
(made from one X-macro list per enum, csrc/common/enum_list.h) has the profile model's name for each
of its values (native.KIND_NAMES), and the limits are limits.h's, read by one reader."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from cpuprof import _build_info, _limits_header, native

ROOT = Path(__file__).resolve().parents[2]
LIMITS_H = ROOT / "csrc" / "common" / "limits.h"

# The names saved profiles hold: frozen, so that profiles written before still load and compare.
SAVED_NAMES = {
    "CountingMode": {"exact", "sampled"},
    "EntryKind": {"op", "region", "special"},
    "InputKind": {"tensor", "tensor_list", "none", "int", "float", "bool", "int_list", "other", "unknown_shape",
                  "undefined"},
    "EventKind": {"hardware", "hardware-cache", "software", "raw", "pmu", "tracepoint"},
    "UnwindStop": {"outermost frame", "end of the copied stack", "no unwind information", "implausible frame",
                   "depth limit", "no user registers", "Python interpreter"},
}


def bound_enums() -> dict[str, type]:
    nat = native.load()
    return {name: obj for name, obj in vars(nat).items()
            if isinstance(obj, type) and isinstance(getattr(obj, "__members__", None), dict)}


def test_every_kind_the_core_binds_has_a_name_in_the_model():
    """A value added to a C++ enum is bound at once (its X-macro list); this fails until Python
    says what the profile calls it, rather than the value being dropped or saved under a C++ name."""
    enums = bound_enums()
    assert set(enums) == set(native.KIND_NAMES), "an enum bound by the core without names in native.KIND_NAMES"
    for name, enum in enums.items():
        members = enum.__members__
        missing = set(members) - set(native.KIND_NAMES[name])
        assert not missing, f"{name}: {sorted(missing)} have no name in native.KIND_NAMES"
        assert set(native.KIND_NAMES[name]) == set(members), f"{name}: names for values the core does not have"
        names = [native.kind_name(member) for member in members.values()]
        assert len(set(names)) == len(names), f"{name}: two values saved under one name"


def test_the_saved_names_are_the_ones_profiles_already_hold():
    assert {name: set(table.values()) for name, table in native.KIND_NAMES.items()} == SAVED_NAMES


def test_unwind_stops_are_counted_by_kind_not_by_position():
    nat = native.load()
    stops = nat.UnwindStop.__members__.values()
    assert sorted(int(stop) for stop in stops) == list(range(len(stops)))  # the core's counts are indexed by them
    assert native.kind_name(nat.UnwindStop.interpreter) == "Python interpreter"


def test_kinds_cross_as_enums():
    nat = native.load()
    assert nat.parse_event("task-clock").kind == nat.EventKind.software
    assert native.kind_name(nat.parse_event("L1-dcache-load-misses").kind) == "hardware-cache"
    assert nat.probe_event("no-such-event").kind is None


def test_the_limits_come_from_limits_h_by_one_reader():
    limits = _limits_header.read_limits_header(LIMITS_H.read_text())
    assert native.load().limits == _build_info.LIMITS == limits
    assert {"kMinRingPages", "kMinRingSamples", "kSampleRecordBytesBesidesStack"} <= set(limits)


@pytest.mark.parametrize("line", ["constexpr int kTwice = 2 * 8;", "constexpr double kRatio = 0.5;",
                                  "constexpr int kSplit =", "constexpr int kMaxEvents = 3;"])
def test_a_limit_the_reader_cannot_take_fails_the_build(tmp_path: Path, line: str):
    """A limits.h line the reader would skip would be a limit missing from Python: the build stops."""
    header = tmp_path / "limits.h"
    header.write_text(LIMITS_H.read_text().replace("}  // namespace cpuprof", f"{line}\n}}  // namespace cpuprof"))
    result = subprocess.run([sys.executable, _limits_header.__file__, str(header), str(tmp_path / "limits.py.txt"),
                             str(tmp_path / "limits_table.h")], capture_output=True, text=True, timeout=60)
    assert result.returncode == 1, result.stderr
    assert "limits.h:" in result.stderr and not (tmp_path / "limits_table.h").exists()


def test_the_generated_table_checks_each_value_against_the_compiler(tmp_path: Path):
    result = subprocess.run([sys.executable, _limits_header.__file__, str(LIMITS_H), str(tmp_path / "limits.py.txt"),
                             str(tmp_path / "limits_table.h")], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    table = (tmp_path / "limits_table.h").read_text()
    for name, value in _build_info.LIMITS.items():
        assert f"static_assert({name} == {value}LL" in table and f'{{"{name}", ' in table
    assert eval("{" + (tmp_path / "limits.py.txt").read_text() + "}") == _build_info.LIMITS
