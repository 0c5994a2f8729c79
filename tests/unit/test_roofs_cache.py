"""The roofs cache: where it lives, what it reuses, and the one line it says when it cannot.

The measurement is replaced by a cheap deterministic one and the fingerprint by a fixed one, so
these tests need neither torch nor the native module.
"""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest

from cpuprof.machine import roofs
from cpuprof.model.codec import from_json, to_json
from cpuprof.model.roofs import BandwidthRoof, ComputeRoof, KernelRoof, MachineRoofs, Repeated

FINGERPRINT = {"cpu": "Test CPU 9000", "logical_cpus": "2", "memory": "23.5 GiB", "torch": "2.13.0+cpu",
               "openmp": "libgomp"}


class FakeMeasure:
    """Stands in for calibrate(): counts its calls and returns roofs derived from its arguments."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, list[int]]] = []

    def __call__(self, threads: int, cpus: list[int], dtypes=("f32", "bf16"), progress=None,
                 repetitions: int = 7) -> MachineRoofs:
        self.calls.append((threads, cpus))
        fp = roofs.fingerprint()
        rep = Repeated(best=40.0 + threads, median=39.0, spread=0.05, repetitions=repetitions)
        return MachineRoofs(
            fingerprint=fp, key=roofs.cache_key(fp, threads, cpus),
            measured=f"2025-01-01T00:00:{len(self.calls):02d}+00:00", seconds=1.5, threads=threads, cpus=sorted(cpus),
            bandwidth=[BandwidthRoof(kernel="read", gb_per_s=rep, threads=threads, array_bytes=128 << 20, node=0)],
            compute=[ComputeRoof(dtype="f32", gflop_per_s=rep, threads=threads, size=2048)],
            kernel=[KernelRoof(dtype="bf16", gb_per_s=rep, threads=threads, shape=[1, 2048, 32768])],
            errors=["f16 compute roof not measured: example"], calibration=roofs.CALIBRATION,
        )


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("CPUPROF_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def fingerprint(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    fp = dict(FINGERPRINT)
    monkeypatch.setattr(roofs, "fingerprint", lambda: dict(fp))
    return fp  # tests edit it to play another torch or runtime


@pytest.fixture
def measure(monkeypatch: pytest.MonkeyPatch, fingerprint: dict[str, str]) -> FakeMeasure:
    fake = FakeMeasure()
    monkeypatch.setattr(roofs, "calibrate", fake)
    # No probe of the memory unless a test gives one its reading (probe_reading).
    monkeypatch.setattr(roofs, "_probed", lambda cached, keep_cached, progress, warnings: None)
    return fake


def probe_reading(monkeypatch: pytest.MonkeyPatch, gb_per_s: float) -> None:
    """The probe's read kernel (the memory roof's) reads ``gb_per_s`` (the real decision, a fake measurement)."""
    rep = Repeated(best=gb_per_s, median=gb_per_s, spread=0.02, repetitions=roofs.PROBE_REPETITIONS)

    def read(kernel: str, array_bytes: int, threads: int, repetitions: int, available: int | None, progress,
              what: str = "calibrating", isa: str = "") -> BandwidthRoof:
        assert (kernel, repetitions, what) == ("read", roofs.PROBE_REPETITIONS, "probing")
        return BandwidthRoof(kernel=kernel, gb_per_s=rep, threads=threads, array_bytes=array_bytes, node=0)

    monkeypatch.setattr(roofs, "_bandwidth", read)
    monkeypatch.setattr(roofs, "_probed", PROBED)


PROBED = roofs._probed


def test_cache_path_precedence(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    monkeypatch.setenv("CPUPROF_CACHE_DIR", str(tmp_path / "a"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "b"))
    assert roofs.cache_path() == tmp_path / "a" / "roofs.json"
    monkeypatch.delenv("CPUPROF_CACHE_DIR")
    assert roofs.cache_path() == tmp_path / "b" / "cpuprof" / "roofs.json"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert roofs.cache_path() == tmp_path / "home" / ".cache" / "cpuprof" / "roofs.json"


def test_round_trip(cache_dir: Path, measure: FakeMeasure):
    assert roofs.cached(2, [0, 1]) == (None, None)
    first, warnings = roofs.ensure(2, [1, 0])
    assert warnings == [] and first.from_cache is False and measure.calls == [(2, [1, 0])]
    assert (cache_dir / "roofs.json").is_file()
    assert not [p for p in cache_dir.iterdir() if p.name != "roofs.json"]  # no temporary file left

    again, warnings = roofs.ensure(2, [0, 1])
    assert warnings == [] and again.from_cache is True and len(measure.calls) == 1
    assert to_json(again) == {**to_json(first), "from_cache": True}
    assert again.errors == ["f16 compute roof not measured: example"]

    # Another thread count or CPU list is another entry; both stay in the file.
    other, _ = roofs.ensure(1, [0])
    assert other.from_cache is False and len(measure.calls) == 2
    data = json.loads((cache_dir / "roofs.json").read_text())
    assert data["version"] == roofs.CACHE_VERSION
    assert sorted((e["threads"], e["cpus"]) for e in data["entries"]) == [(1, [0]), (2, [0, 1])]
    assert all(e["from_cache"] is False for e in data["entries"])
    assert roofs.ensure(2, [0, 1])[0].from_cache and roofs.ensure(1, [0])[0].from_cache


def test_a_quantized_kernel_roof_a_run_needs_is_added_to_its_cached_entry(cache_dir: Path, measure: FakeMeasure,
                                                                          monkeypatch: pytest.MonkeyPatch):
    measured: list[roofs.QuantKernel] = []

    def fake_kernel(kernel, weight_bytes, cached_bytes, threads, repetitions, available, progress):
        measured.append(kernel)
        rep = Repeated(best=10.0, median=9.5, spread=0.05, repetitions=repetitions)
        return KernelRoof(dtype=kernel.dtype, gb_per_s=rep, threads=threads, shape=[1, 2048, 8192 * 8],
                          weights=kernel.weights, group_size=kernel.group_size, elements_per_s=rep,
                          cached_shape=[1, 2048, 1024])

    monkeypatch.setattr(roofs, "_quant_kernel", fake_kernel)
    monkeypatch.setattr(roofs, "process_run_delay_ns", lambda *_: 0)  # a quiet machine, whatever runs beside
    int8, int4 = roofs.QuantKernel("bf16", "i8"), roofs.QuantKernel("bf16", "i4", 128)
    roofs.ensure(2, [0, 1])
    first, warnings = roofs.ensure(2, [0, 1], quant_kernels=[int8])
    assert warnings == [] and first.from_cache and measured == [int8] and len(measure.calls) == 1
    assert first.kernel_roof("bf16", "i8") is not None and first.kernel_roof("bf16") is not None
    # Cached with the entry: the next run needing it measures nothing; one needing int4 measures int4 alone.
    again, _ = roofs.ensure(2, [0, 1], quant_kernels=[int8])
    assert measured == [int8] and again.kernel_roof("bf16", "i8") is not None
    roofs.ensure(2, [0, 1], quant_kernels=[int8, int4])
    assert measured == [int8, int4]
    # Another group size replaces int4's roof (one per storage), and is measured.
    g64 = roofs.QuantKernel("bf16", "i4", 64)
    replaced, _ = roofs.ensure(2, [0, 1], quant_kernels=[g64])
    assert measured[-1] == g64 and [k.group_size for k in replaced.kernel if k.weights == "i4"] == [64]
    assert len(measure.calls) == 1  # the rest of the entry was never measured again


def test_force_measures_again(cache_dir: Path, measure: FakeMeasure):
    roofs.ensure(2, [0, 1])
    forced, warnings = roofs.ensure(2, [0, 1], force=True)
    assert forced.from_cache is False and warnings == [] and len(measure.calls) == 2
    entries = json.loads((cache_dir / "roofs.json").read_text())["entries"]
    assert len(entries) == 1 and entries[0]["measured"] == forced.measured  # replaced, not duplicated


@pytest.mark.parametrize("content, detail", [
    ("{not json", "not valid JSON"),
    ('{"version": 1, "entries": [{"key": 3}]}', "RoofsCache.entries[0]"),
    ('{"version": 99, "entries": []}', "version 99"),
    ("[]", "expected an object"),
])
def test_damaged_cache_says_why_and_measures_again(cache_dir: Path, measure: FakeMeasure, content: str,
                                                  detail: str):
    cache_dir.mkdir()
    path = cache_dir / "roofs.json"
    path.write_text(content)
    found, reason = roofs.cached(2, [0, 1])
    assert found is None and reason is not None
    assert reason.startswith(f"the roofs cache {path} is damaged (") and reason.endswith("); measuring again")
    assert detail in reason and "\n" not in reason

    measured, warnings = roofs.ensure(2, [0, 1])
    assert warnings == [reason] and measured.from_cache is False and len(measure.calls) == 1
    assert roofs.ensure(2, [0, 1])[0].from_cache  # the damaged file was replaced by a good one


def test_unreadable_cache_says_why(cache_dir: Path, measure: FakeMeasure):
    path = cache_dir / "roofs.json"
    path.mkdir(parents=True)  # a directory where the file should be: unreadable and unwritable
    found, reason = roofs.cached(2, [0, 1])
    assert found is None and reason == (f"the roofs cache cannot be used: {path} is not a regular file: it is a "
                                        "directory; cpuprof reads only regular files; measuring again")
    measured, warnings = roofs.ensure(2, [0, 1])
    assert measured.from_cache is False and warnings[0] == reason
    assert len(warnings) == 2 and warnings[1].startswith(f"cannot write the roofs cache {path} (")
    # no temporary file left (the lock file other runs' writes wait on stays, empty)
    assert sorted(p.name for p in cache_dir.iterdir()) == ["roofs.json", "roofs.json.lock"]


@pytest.mark.parametrize("field, label", [("torch", "torch"), ("openmp", "the OpenMP runtime")])
def test_other_software_is_not_used_and_says_why(cache_dir: Path, measure: FakeMeasure,
                                                 fingerprint: dict[str, str], field: str, label: str):
    roofs.ensure(2, [0, 1])
    was = fingerprint[field]
    fingerprint[field] = "2.14.0+cpu" if field == "torch" else "libiomp5"
    found, reason = roofs.cached(2, [0, 1])
    assert found is None
    now = fingerprint[field]
    assert reason == f"cached roofs were measured with {label} {was}; this is {label} {now}: measuring again"

    measured, warnings = roofs.ensure(2, [0, 1])
    assert warnings == [reason] and measured.fingerprint[field] == fingerprint[field] and len(measure.calls) == 2
    # Both are kept: switching back finds the first again.
    fingerprint[field] = was
    assert roofs.ensure(2, [0, 1])[0].from_cache


def test_another_machine_or_binding_is_simply_missing(cache_dir: Path, measure: FakeMeasure,
                                                      fingerprint: dict[str, str]):
    roofs.ensure(2, [0, 1])
    assert roofs.cached(1, [0]) == (None, None)
    assert roofs.cached(2, [2, 3]) == (None, None)
    fingerprint["cpu"] = "Another CPU"
    assert roofs.cached(2, [0, 1]) == (None, None)


def test_cache_dir_that_cannot_be_created_is_a_warning(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       measure: FakeMeasure):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("CPUPROF_CACHE_DIR", str(blocker / "cache"))  # a directory under a file
    measured, warnings = roofs.ensure(2, [0, 1])
    assert measured.memory_gb_per_s() == 42.0 and measured.from_cache is False
    assert len(warnings) == 1
    assert warnings[0].startswith(f"cannot write the roofs cache {blocker / 'cache' / 'roofs.json'} (")
    assert warnings[0].endswith("; they will be measured again next time")


def test_read_only_cache_is_a_warning_and_leaves_nothing_behind(cache_dir: Path, measure: FakeMeasure,
                                                                monkeypatch: pytest.MonkeyPatch):
    def refuse(src: str, dst: str) -> None:
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), dst)

    monkeypatch.setattr(roofs.os, "replace", refuse)  # as root, chmod cannot make a directory read-only
    measured, warnings = roofs.ensure(2, [0, 1])
    assert measured.from_cache is False
    assert warnings == [f"cannot write the roofs cache {cache_dir / 'roofs.json'} (Read-only file system); "
                        "they will be measured again next time"]
    assert list(cache_dir.iterdir()) == []


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
def test_read_only_directory_is_a_warning(cache_dir: Path, measure: FakeMeasure):
    cache_dir.mkdir()
    cache_dir.chmod(0o555)
    try:
        _, warnings = roofs.ensure(2, [0, 1])
    finally:
        cache_dir.chmod(0o755)
    assert len(warnings) == 1 and warnings[0].startswith("cannot write the roofs cache")


def test_roofs_without_memory_bandwidth_are_not_cached(cache_dir: Path, measure: FakeMeasure,
                                                       monkeypatch: pytest.MonkeyPatch):
    def no_bandwidth(*args, **kwargs) -> MachineRoofs:
        result = measure(*args, **kwargs)
        result.bandwidth = []
        result.errors = ["triad bandwidth not measured: 3 arrays of 128 MiB need more than half of ..."]
        return result

    monkeypatch.setattr(roofs, "calibrate", no_bandwidth)
    measured, warnings = roofs.ensure(2, [0, 1])
    assert measured.memory_gb_per_s() is None
    assert warnings == ["roofs without a memory bandwidth are not cached; they will be measured again next time"]
    assert not (cache_dir / "roofs.json").exists()
    from cpuprof.analysis.roofs import roofs_lines

    lines = roofs_lines(measured)
    assert "(not cached: no memory bandwidth)" in lines[0]
    assert lines[-1] == "triad bandwidth not measured: 3 arrays of 128 MiB need more than half of ..."


def test_roofs_measured_on_a_busy_machine_are_used_said_and_not_cached(cache_dir: Path, measure: FakeMeasure,
                                                                       monkeypatch: pytest.MonkeyPatch):
    """Their threads waited for a CPU 30% of the calibration: the roofs are low. This run uses them and
    its report says so; nothing is cached, so the next run measures again. A quiet calibration (2%)
    is cached as ever."""
    from cpuprof.analysis.roofs import roofs_lines

    def busy(*args, **kwargs) -> MachineRoofs:
        result = measure(*args, **kwargs)
        result.run_queue_share = 0.30
        return result

    monkeypatch.setattr(roofs, "calibrate", busy)
    measured, warnings = roofs.ensure(2, [0, 1])
    assert measured.memory_gb_per_s() is not None and not (cache_dir / "roofs.json").exists()
    (warning,) = warnings
    assert "busy while the roofs were measured" in warning and "30%" in warning and "not cached" in warning
    lines = roofs_lines(measured)
    assert "(not cached: the machine was busy)" in lines[0]
    assert any("waited for a CPU 30% of the time" in line and "measure them again" in line for line in lines)

    monkeypatch.setattr(roofs, "calibrate", measure)
    quiet, warnings = roofs.ensure(2, [0, 1])
    assert warnings == [] and (cache_dir / "roofs.json").exists() and quiet.memory_gb_per_s() is not None


def test_the_calibrations_run_queue_delay_is_read_from_schedstat(tmp_path: Path):
    """Known answer from a fake /proc/self/task: two threads' second schedstat field, summed; a thread
    whose file cannot be read is left out; nothing readable is None."""
    for tid, line in (("10", "900 250 7\n"), ("11", "50 750 3\n"), ("12", "garbage\n")):
        (tmp_path / tid).mkdir()
        (tmp_path / tid / "schedstat").write_text(line)
    assert roofs.process_run_delay_ns(tmp_path) == 1000
    assert roofs.process_run_delay_ns(tmp_path / "missing") is None
    assert isinstance(roofs.process_run_delay_ns(), int)  # this process's own, from the real kernel


def test_cache_keeps_the_newest_entries(cache_dir: Path, measure: FakeMeasure, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(roofs, "MAX_CACHE_ENTRIES", 3)
    for threads in range(1, 6):
        roofs.ensure(threads, [0])
    entries = json.loads((cache_dir / "roofs.json").read_text())["entries"]
    assert [e["threads"] for e in entries] == [3, 4, 5]


def test_key_depends_on_everything_measured():
    base = roofs.cache_key(FINGERPRINT, 2, [0, 1])
    assert base == roofs.cache_key(dict(reversed(FINGERPRINT.items())), 2, [1, 0])
    assert base != roofs.cache_key(FINGERPRINT, 1, [0, 1])
    assert base != roofs.cache_key(FINGERPRINT, 2, [0, 2])
    assert base != roofs.cache_key({**FINGERPRINT, "torch": "2.14.0"}, 2, [0, 1])


def test_cache_file_is_the_model_codecs_json(cache_dir: Path, measure: FakeMeasure):
    measured, _ = roofs.ensure(2, [0, 1])
    data = json.loads((cache_dir / "roofs.json").read_text())
    assert from_json(MachineRoofs, data["entries"][0]) == measured


def test_repeated_figures():
    rep = roofs.repeated([10.0, 12.0, 11.0, 9.0, 13.0])
    assert rep == Repeated(best=13.0, median=11.0, spread=pytest.approx(4 / 11), repetitions=5)


def test_llc_is_the_highest_level_data_or_unified_cache(tmp_path: Path):
    base = tmp_path / "sys/devices/system/cpu/cpu0/cache"
    for index, (level, kind, size) in enumerate(
        [(1, "Data", "48K"), (1, "Instruction", "32K"), (2, "Unified", "1024K"), (3, "Unified", "32768K")]
    ):
        d = base / f"index{index}"
        d.mkdir(parents=True)
        (d / "level").write_text(f"{level}\n")
        (d / "type").write_text(f"{kind}\n")
        (d / "size").write_text(f"{size}\n")
    assert roofs.llc_bytes(tmp_path) == 32 << 20
    (base / "index3" / "size").write_text("2M\n")
    assert roofs.llc_bytes(tmp_path) == 2 << 20
    assert roofs.llc_bytes(tmp_path / "nothing") is None


def test_a_cached_memory_roof_below_its_gemv_is_measured_again(cache_dir: Path, measure: FakeMeasure):
    """An entry stored before the calibration checked its bandwidth against its GEMV: its memory
    roof is a third of what the GEMV read, so it is not used, the run says why, and measures again."""
    low = measure(2, [0, 1])
    low.bandwidth[0].gb_per_s = Repeated(best=14.0, median=13.5, spread=0.05, repetitions=7)
    assert low.kernel_above_memory() is low.kernel[0]
    assert roofs.store(low) is None
    found, reason = roofs.cached(2, [0, 1])
    assert found is None and reason is not None
    assert "cached memory roof (14.0 GB/s) is below what its bf16 GEMV read from memory (42.0 GB/s)" in reason
    measured, warnings = roofs.ensure(2, [0, 1])
    assert warnings == [reason] and len(measure.calls) == 2 and not measured.from_cache
    assert measured.kernel_above_memory() is None and roofs.cached(2, [0, 1])[0] is not None


def test_an_entry_an_older_cpuprof_measured_another_way_is_measured_again(cache_dir: Path, measure: FakeMeasure):
    """Entries of older cpuprofs stay in a newer file (its version is the newest writer's): one without
    the calibration's method number measured its GEMV roofs without a decoder's head, which a decode's
    head GEMV beat by 40%, so it is not used, the run says why, and measures again."""
    assert roofs.store(measure(2, [0, 1])) is None
    path = roofs.cache_path()
    data = json.loads(path.read_text())
    del data["entries"][0]["calibration"]  # as a cpuprof before the method number wrote it
    path.write_text(json.dumps(data))
    found, reason = roofs.cached(2, [0, 1])
    assert found is None and reason is not None and "measured by an older cpuprof" in reason
    measured, warnings = roofs.ensure(2, [0, 1])
    assert warnings == [reason] and len(measure.calls) == 2 and not measured.from_cache
    again, _ = roofs.cached(2, [0, 1])
    assert again is not None and again.calibration == roofs.CALIBRATION


def test_copy_is_not_held_to_what_a_gemv_read(measure: FakeMeasure):
    """copy's counting leaves out half of what it moves: a GEMV reading 1.6 times copy's figure is
    healthy, and a calibration whose read and triad failed is not flagged for it; against the triad
    (1.5 times) and the read kernel (1.3 times: both only read) it is."""
    r = measure(2, [0, 1])
    r.bandwidth[0].kernel = "copy"
    r.bandwidth[0].gb_per_s = Repeated(best=26.0, median=25.0, spread=0.05, repetitions=7)
    assert r.kernel[0].gb_per_s.best > 1.6 * 26.0 and r.kernel_above_memory() is None
    r.bandwidth[0].kernel = "triad"
    assert r.kernel_above_memory() is r.kernel[0]
    r.bandwidth[0].kernel = "read"
    r.bandwidth[0].gb_per_s = Repeated(best=34.0, median=33.0, spread=0.05, repetitions=7)
    assert 1.2 * 34.0 < r.kernel[0].gb_per_s.best and r.kernel_above_memory() is None
    r.bandwidth[0].gb_per_s = Repeated(best=30.0, median=29.0, spread=0.05, repetitions=7)
    assert r.kernel_above_memory() is r.kernel[0]
    r.kernel[0].weights = "i8"  # a quantized kernel counts its scales and may be bound by unpacking
    assert r.kernel_above_memory() is None


def test_a_programs_run_says_why_the_cached_roofs_were_not_used(cache_dir: Path, measure: FakeMeasure):
    """`cpuprof run` never measures roofs: it uses the cached ones, and when the cache's entry cannot be
    used it says why (not that there is none) and measures nothing."""
    from types import SimpleNamespace

    from cpuprof.launch.child_run import program_context

    low = measure(2, [0, 1])
    low.bandwidth[0].gb_per_s = Repeated(best=14.0, median=13.5, spread=0.05, repetitions=7)
    assert roofs.store(low) is None
    said: list[str] = []
    run = SimpleNamespace(read_settings=lambda: None, roofs=None, progress=SimpleNamespace(done=said.append),
                          settings=SimpleNamespace(requested=SimpleNamespace(threads=2, cpus=[0, 1])))
    program_context(run)  # type: ignore[arg-type]
    assert run.roofs is None and len(measure.calls) == 1
    (note,) = said
    assert note.startswith("note: the cached memory roof (14.0 GB/s) is below what its bf16 GEMV read from memory "
                           "(42.0 GB/s), so GEMMs are not judged against them"), note


def test_a_cached_roof_the_memory_agrees_with_is_used_and_the_probe_kept_with_it(
        cache_dir: Path, measure: FakeMeasure, monkeypatch: pytest.MonkeyPatch):
    """Known answer: the fake calibration's read kernel is 42 GB/s at 2 threads; a probe reading 40 is within
    the tolerance: the cached roofs are used, and the probe is stored with them for later readers."""
    roofs.ensure(2, [0, 1])
    probe_reading(monkeypatch, 40.0)
    again, warnings = roofs.ensure(2, [0, 1])
    assert again.from_cache and warnings == [] and len(measure.calls) == 1
    assert again.probe is not None and again.probe.outcome == "agrees"
    assert (again.probe.gb_per_s, again.probe.cached_gb_per_s) == (40.0, 42.0)
    stored, _ = roofs.cached(2, [0, 1])
    assert stored is not None and stored.probe == again.probe


@pytest.mark.parametrize("reading", [21.0, 84.0])  # the cached bandwidth halved, or doubled, since
def test_a_cached_roof_the_memory_disagrees_with_is_measured_again_and_said(
        cache_dir: Path, measure: FakeMeasure, monkeypatch: pytest.MonkeyPatch, reading: float):
    roofs.ensure(2, [0, 1])
    probe_reading(monkeypatch, reading)
    fresh, warnings = roofs.ensure(2, [0, 1])
    assert not fresh.from_cache and len(measure.calls) == 2
    assert fresh.probe is not None and fresh.probe.outcome == "remeasured" and fresh.probe.gb_per_s == reading
    assert warnings == [f"a probe of the memory now read {reading:.1f} GB/s, against the cached memory roof (42.0 "
                        "GB/s, measured 2025-01-01 00:00 UTC): the memory is in another state; measuring the roofs "
                        "again"]
    assert roofs.cached(2, [0, 1])[0].measured == fresh.measured  # the new ones replaced them in the cache


def test_with_roofs_cached_a_disagreeing_roof_is_kept_and_both_figures_said(
        cache_dir: Path, measure: FakeMeasure, monkeypatch: pytest.MonkeyPatch):
    roofs.ensure(2, [0, 1])
    probe_reading(monkeypatch, 21.0)
    kept, warnings = roofs.ensure(2, [0, 1], keep_cached=True)
    assert kept.from_cache and len(measure.calls) == 1
    assert kept.probe is not None and kept.probe.outcome == "kept" and kept.memory_gb_per_s() == 42.0
    assert len(warnings) == 1 and warnings[0].startswith(
        "a probe of the memory now read 21.0 GB/s, against the cached memory roof (42.0 GB/s, measured 2025-01-01 "
        "00:00 UTC): kept (--roofs cached)")
    # Not stored with the entry: the next run, which did not ask to keep it, would report it as its own
    # and take the entry for confirmed.
    (entry, _) = roofs.cached(2, [0, 1])
    assert entry is not None and (entry.probe is None or entry.probe.outcome != "kept")
    # A quantized kernel roof measured now, in the memory's other state, is used but never stored beside it.
    kernel = roofs.QuantKernel("bf16", "i8", 0)
    monkeypatch.setattr(roofs, "measure_quant_kernels", lambda r, kernels, progress=None: r.kernel.append(
        KernelRoof(dtype="bf16", gb_per_s=Repeated(10.0, 10.0, 0.0, 7), threads=2, shape=[1, 2048, 8192],
                   weights="i8")))
    monkeypatch.setattr(roofs.QuantKernel, "measured_by", lambda self, r: r.weights == "i8")
    with_kernel, _ = roofs.ensure(2, [0, 1], keep_cached=True, quant_kernels=[kernel])
    assert any(k.weights == "i8" for k in with_kernel.kernel)
    assert not any(k.weights == "i8" for k in roofs.cached(2, [0, 1])[0].kernel)


def test_a_roof_measured_again_that_cannot_be_cached_takes_the_wrong_one_out_of_the_cache(
        cache_dir: Path, measure: FakeMeasure, monkeypatch: pytest.MonkeyPatch):
    """The probe found the cached roof wrong, and the roofs measured again were taken on a busy machine
    (used, never cached): the wrong entry is not left for the next run to take."""
    roofs.ensure(2, [0, 1])
    probe_reading(monkeypatch, 84.0)
    busy = FakeMeasure()

    def measured_busy(*args, **kwargs) -> MachineRoofs:  # noqa: ANN002, ANN003
        found = busy(*args, **kwargs)
        found.run_queue_share = 0.5
        return found

    monkeypatch.setattr(roofs, "calibrate", measured_busy)
    fresh, warnings = roofs.ensure(2, [0, 1])
    assert fresh.probe is not None and fresh.probe.outcome == "remeasured"
    assert any("busy" in w for w in warnings)
    assert roofs.cached(2, [0, 1]) == (None, None)


def test_the_probes_tolerance_is_the_cached_kernels_spread_where_that_is_wider(monkeypatch: pytest.MonkeyPatch,
                                                                              fingerprint: dict[str, str]):
    cached = FakeMeasure()(2, [0, 1])  # read 42 GB/s, spread 5%
    probe_reading(monkeypatch, 42.0 * 0.70)
    assert roofs.probe(cached).outcome == "remeasured"  # 30% below: beyond the 25% tolerance
    cached.bandwidth[0].gb_per_s.spread = 0.40  # a roof that noisy cannot say 30% is another state
    assert roofs.probe(cached).outcome == "agrees"


@pytest.mark.parametrize("outcome, said", [
    ("agrees", "agrees, the cached roofs are used"),
    ("kept", "disagrees, kept as asked (--roofs cached)"),
    ("remeasured", "disagrees (the memory is in another state), so the roofs above were measured again")])
def test_a_report_says_how_old_its_roofs_are_and_what_the_probe_read(fingerprint: dict[str, str], outcome: str,
                                                                      said: str):
    from cpuprof.analysis.roofs import roofs_lines
    from cpuprof.model.roofs import RoofProbe

    measured = FakeMeasure()(2, [0, 1])  # measured 2025-01-01T00:00:01, read 42 GB/s
    measured.from_cache = outcome != "remeasured"
    measured.probe = RoofProbe(at="2025-01-01T03:00:01+00:00", gb_per_s=21.0, seconds=0.2, cached_gb_per_s=42.0,
                               cached_measured="2025-01-01T00:00:01+00:00", outcome=outcome, kernel="read")
    lines = roofs_lines(measured, now="2025-01-01T03:00:31+00:00")
    if measured.from_cache:
        assert lines[0].startswith("from the cache (measured 2025-01-01 00:00 UTC, 3.0 h before this profile, "
                                   "in 1.5 s)")
    probe = next(line for line in lines if line.startswith("last probe of the memory"))
    assert probe == ("last probe of the memory, at 2025-01-01 03:00 UTC (30 s before this profile): the read kernel "
                     "21.0 GB/s, "
                     f"50% of the cached 42.0 GB/s (measured 2025-01-01 00:00 UTC): {said}" + (
                         ": the ceiling and every share of a roof are off by it" if outcome == "kept" else ""))


def test_an_agreeing_probe_is_kept_with_its_entry_and_a_cache_that_cannot_take_it_says_nothing(
        cache_dir: Path, measure: FakeMeasure, monkeypatch: pytest.MonkeyPatch):
    """Recording the probe is for later readers: where the cache cannot be written (a shared, read-only
    one) the run says nothing about it; where it can, only the entry's probe changes."""
    roofs.ensure(2, [0, 1])
    before = json.loads((cache_dir / "roofs.json").read_text())
    probe_reading(monkeypatch, 41.0)
    monkeypatch.setattr(roofs, "write_text", lambda *args, **kwargs: (_ for _ in ()).throw(
        PermissionError(errno.EACCES, "Permission denied")))
    used, warnings = roofs.ensure(2, [0, 1])
    assert used.from_cache and used.probe is not None and used.probe.outcome == "agrees" and warnings == []
    assert json.loads((cache_dir / "roofs.json").read_text()) == before
    monkeypatch.undo()
    monkeypatch.setenv("CPUPROF_CACHE_DIR", str(cache_dir))
    monkeypatch.setattr(roofs, "fingerprint", lambda: dict(FINGERPRINT))
    probe_reading(monkeypatch, 41.0)
    roofs.ensure(2, [0, 1])
    after = json.loads((cache_dir / "roofs.json").read_text())
    (entry,) = after["entries"]
    assert entry["probe"]["gb_per_s"] == 41.0 and {**entry, "probe": None} == before["entries"][0]


def test_a_cached_entry_rejected_for_its_own_figures_is_not_taken_for_a_probe_note():
    """The reason cached() gives for a roof below its own GEMV must reach the report; the probe's
    notes, whose figures the report's probe line gives, are the only ones left out of it."""
    assert not "the cached memory roof (14.0 GB/s) is below what its bf16 GEMV read".startswith(roofs.PROBE_NOTE)


def test_the_probe_is_not_run_where_other_processes_start_at_the_same_moment(
        cache_dir: Path, measure: FakeMeasure, monkeypatch: pytest.MonkeyPatch):
    roofs.ensure(2, [0, 1])
    probe_reading(monkeypatch, 21.0)  # it would disagree
    used, warnings = roofs.ensure(2, [0, 1], probe_memory=False)
    assert used.from_cache and used.probe is None and warnings == [] and len(measure.calls) == 1


def test_roofs_measured_or_confirmed_moments_ago_are_not_probed_again_by_a_launcher(fingerprint: dict[str, str]):
    """run's launcher starts no probing child for roofs measured, or confirmed by a probe, within the
    time a probe holds; a probe kept despite disagreeing confirms nothing."""
    import datetime

    from cpuprof.model.roofs import RoofProbe

    def ago(seconds: float) -> str:
        then = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(seconds=seconds)
        return then.isoformat(timespec="seconds")

    entry = FakeMeasure()(2, [0, 1])
    entry.measured = ago(3600)
    assert roofs.confirmed_within(entry, 120) is None
    entry.probe = RoofProbe(at=ago(30), gb_per_s=41.0, seconds=0.2, cached_gb_per_s=42.0,
                            cached_measured=entry.measured, outcome="agrees")
    assert roofs.confirmed_within(entry, 120) == pytest.approx(30, abs=2)
    entry.probe.outcome = "kept"
    assert roofs.confirmed_within(entry, 120) is None
    entry.measured = ago(5)
    assert roofs.confirmed_within(entry, 120) == pytest.approx(5, abs=2)


@pytest.mark.parametrize(("reading", "outcome", "said"), [
    (40.0, "agrees", "the memory stayed in the state it was judged against"),
    (70.0, "changed", "the memory changed state during the run, so every share of the memory roof and the ceiling"),
    (20.0, "changed", "the memory changed state during the run")])
def test_a_long_run_probes_the_memory_at_its_end_and_says_a_change(monkeypatch: pytest.MonkeyPatch, reading: float,
                                                                   outcome: str, said: str):
    """Known answer: the roofs' read kernel is 42 GB/s (spread 5%); at the end of the run the memory
    reads 40 (within the 25% tolerance), 70 or 20 (another state, either way)."""
    from cpuprof.analysis.roofs import roofs_lines

    used = FakeMeasure()(2, [0, 1])
    probe_reading(monkeypatch, reading)
    end = roofs.probe_at_end(used)
    assert end is not None and end.outcome == outcome and end.kernel == "read"
    assert end.cached_gb_per_s == 42.0 and end.gb_per_s == reading
    used.end_probe = end
    line = next(line for line in roofs_lines(used) if line.startswith("at the end of the run"))
    assert f"(the read kernel) read {reading:.1f} GB/s" in line and said in line
