"""The speedscope export, against speedscope's own published JSON schema and hand-built stacks
whose profiles, frames and weights are known."""

from __future__ import annotations

import copy
import io
import json
import random
import shutil
import subprocess
import tarfile
from typing import Any

import pytest

from cpuprof.analysis.flame import FlameFrame, FlameStack
from cpuprof.exports import speedscope

jsonschema = pytest.importorskip("jsonschema")

SPEEDSCOPE = "speedscope@1.25.0"
SCHEMA_IN_PACKAGE = "package/dist/release/file-format-schema.json"


@pytest.fixture(scope="session")
def schema(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """speedscope's file-format schema, as shipped in its npm package (not a copy kept here, which
    could drift from what speedscope actually accepts)."""
    npm = shutil.which("npm")
    if npm is None:
        pytest.skip(f"npm is not on PATH: cannot fetch {SPEEDSCOPE} for its file-format schema")
    root = tmp_path_factory.mktemp("speedscope")
    try:
        subprocess.run([npm, "pack", SPEEDSCOPE], cwd=root, capture_output=True, text=True, timeout=120, check=True)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as e:
        detail = getattr(e, "stderr", None) or str(e)
        pytest.skip(f"npm pack {SPEEDSCOPE} failed (no registry access?): {str(detail).strip()[-300:]}")
    tarballs = list(root.glob("speedscope-*.tgz"))
    if len(tarballs) != 1:
        pytest.skip(f"npm pack {SPEEDSCOPE} left {[t.name for t in tarballs]} in {root}")
    with tarfile.open(tarballs[0]) as tar:
        member = tar.extractfile(SCHEMA_IN_PACKAGE)
        assert member is not None, f"{SCHEMA_IN_PACKAGE} is not a file in {tarballs[0].name}"
        loaded: dict[str, Any] = json.load(member)
    return loaded


@pytest.fixture(scope="session")
def validator(schema: dict[str, Any]) -> Any:
    # The schema says draft-07 and reaches its definitions through "$ref": "#/definitions/...";
    # a validator of the draft it names resolves those against the schema itself.
    assert schema["$schema"] == "http://json-schema.org/draft-07/schema#"
    jsonschema.Draft7Validator.check_schema(schema)
    return jsonschema.Draft7Validator(schema)


def thread(index: int, role: str = "dispatch", name: str = "MainThread") -> FlameFrame:
    return FlameFrame(f"[T{index} {role} {name}]", "thread")


T0, T1, T2 = thread(0), thread(1, "worker", "omp-1"), thread(2, "worker", "omp-2")
FWD = FlameFrame("forward (modeling_llama.py:123)", "python")
MLP = FlameFrame("mlp", "region")
LINEAR = FlameFrame("aten::linear", "op")
MM = FlameFrame("aten::mm", "op")
GEMM = FlameFrame("sgemm_kernel", "compute")
WAIT = FlameFrame("__kmp_wait", "openmp")


def stack(*frames: FlameFrame, weight: float, thread: int) -> FlameStack:
    return FlameStack(frames=tuple(frames), weight=weight, thread=thread)


def sample_stacks() -> list[FlameStack]:
    """Three threads, given out of thread order: T0 dispatches, T1 and T2 are OpenMP workers."""
    return [
        stack(T1, MLP, LINEAR, MM, WAIT, weight=2, thread=1),
        stack(T0, FWD, MLP, LINEAR, MM, GEMM, weight=5, thread=0),
        stack(T1, MLP, LINEAR, MM, GEMM, weight=7, thread=1),
        stack(T0, FWD, MLP, weight=1, thread=0),
        stack(T2, MLP, LINEAR, MM, GEMM, weight=4, thread=2),
    ]


def built(stacks: list[FlameStack], unit: str = "samples") -> dict[str, Any]:
    return speedscope.build(stacks, name="run.cpuprof", unit=unit, exporter="cpuprof 0.2.0")


def decoded(doc: dict[str, Any], profile: dict[str, Any]) -> list[tuple[tuple[str, ...], Any]]:
    """A profile's samples as (frame names, weight), the names read back out of shared.frames."""
    frames = doc["shared"]["frames"]
    pairs = zip(profile["samples"], profile["weights"], strict=True)
    return [(tuple(frames[i]["name"] for i in sample), w) for sample, w in pairs]


def profile_named(doc: dict[str, Any], name: str) -> dict[str, Any]:
    matches = [p for p in doc["profiles"] if p["name"] == name]
    assert len(matches) == 1, [p["name"] for p in doc["profiles"]]
    return matches[0]


@pytest.mark.parametrize("unit", ["samples", "nanoseconds", "page-faults"])
@pytest.mark.parametrize("case", ["three threads", "one thread", "thread root only", "empty"])
def test_documents_validate_against_speedscopes_schema(validator, case, unit):
    stacks = {
        "three threads": sample_stacks(),
        "one thread": [s for s in sample_stacks() if s.thread == 0],
        "thread root only": [stack(T0, weight=3, thread=0), stack(T1, weight=0.5, thread=1)],
        "empty": [],
    }[case]
    doc = built(stacks, unit)
    validator.validate(doc)
    assert speedscope.check_indices(doc) == []
    # The file write() produces is the same document.
    out = io.StringIO()
    speedscope.write(stacks, out, name="run.cpuprof", unit=unit, exporter="cpuprof 0.2.0")
    assert json.loads(out.getvalue()) == doc


def test_schema_validation_rejects_a_broken_document(validator):
    """The schema check is not vacuous: documents speedscope would not read fail it."""
    doc = built(sample_stacks())
    validator.validate(doc)

    bogus_type = copy.deepcopy(doc)
    bogus_type["profiles"][1]["type"] = "bogus"
    with pytest.raises(jsonschema.ValidationError):
        validator.validate(bogus_type)

    # cpuprof's own unit name is not one of speedscope's: passing it through would break the file.
    raw_unit = copy.deepcopy(doc)
    raw_unit["profiles"][0]["unit"] = "samples"
    with pytest.raises(jsonschema.ValidationError):
        validator.validate(raw_unit)

    no_weights = copy.deepcopy(doc)
    del no_weights["profiles"][0]["weights"]
    with pytest.raises(jsonschema.ValidationError):
        validator.validate(no_weights)

    frame_without_name = copy.deepcopy(doc)
    del frame_without_name["shared"]["frames"][0]["name"]
    with pytest.raises(jsonschema.ValidationError):
        validator.validate(frame_without_name)


def test_check_indices_catches_what_the_schema_cannot(validator):
    doc = built(sample_stacks())
    n_frames = len(doc["shared"]["frames"])

    out_of_range = copy.deepcopy(doc)
    out_of_range["profiles"][2]["samples"][0].append(n_frames)
    validator.validate(out_of_range)  # the schema only asks for numbers
    problems = speedscope.check_indices(out_of_range)
    assert len(problems) == 1 and f"frame index {n_frames}" in problems[0] and "profile 2 sample 0" in problems[0]

    for index in (-1, 1.5, True):
        wrong = copy.deepcopy(doc)
        wrong["profiles"][0]["samples"][0][0] = index
        assert len(speedscope.check_indices(wrong)) == 1, index

    short_weights = copy.deepcopy(doc)
    short_weights["profiles"][1]["weights"].pop()
    validator.validate(short_weights)
    problems = speedscope.check_indices(short_weights)
    assert len(problems) == 1 and "profile 1" in problems[0] and "weights" in problems[0]

    evented = copy.deepcopy(doc)
    evented["profiles"].append({"type": "evented", "name": "e", "unit": "none", "startValue": 0, "endValue": 1,
                                "events": [{"type": "O", "frame": 0, "at": 0}, {"type": "C", "frame": 99, "at": 1}]})
    validator.validate(evented)
    assert speedscope.check_indices(evented) == [f"profile 4 event 1: frame index 99 not in 0..{n_frames - 1}"]


def test_one_profile_per_thread_after_an_all_threads_profile():
    doc = built(sample_stacks())
    assert doc["$schema"] == "https://www.speedscope.app/file-format-schema.json"
    assert (doc["name"], doc["exporter"], doc["activeProfileIndex"]) == ("run.cpuprof", "cpuprof 0.2.0", 0)
    assert [p["name"] for p in doc["profiles"]] == [
        "all threads", "T0 dispatch MainThread", "T1 worker omp-1", "T2 worker omp-2"]
    assert all(p["type"] == "sampled" and p["startValue"] == 0 for p in doc["profiles"])

    # Each thread's profile holds exactly that thread's stacks, without its root frame, sorted by names.
    assert decoded(doc, doc["profiles"][1]) == [
        (("forward", "mlp"), 1),
        (("forward", "mlp", "aten::linear", "aten::mm", "sgemm_kernel"), 5),
    ]
    assert decoded(doc, doc["profiles"][2]) == [
        (("mlp", "aten::linear", "aten::mm", "__kmp_wait"), 2),
        (("mlp", "aten::linear", "aten::mm", "sgemm_kernel"), 7),
    ]
    assert decoded(doc, doc["profiles"][3]) == [(("mlp", "aten::linear", "aten::mm", "sgemm_kernel"), 4)]

    # "all threads" keeps every stack under its thread's root.
    assert decoded(doc, doc["profiles"][0]) == [
        (("[T0 dispatch MainThread]", "forward", "mlp"), 1),
        (("[T0 dispatch MainThread]", "forward", "mlp", "aten::linear", "aten::mm", "sgemm_kernel"), 5),
        (("[T1 worker omp-1]", "mlp", "aten::linear", "aten::mm", "__kmp_wait"), 2),
        (("[T1 worker omp-1]", "mlp", "aten::linear", "aten::mm", "sgemm_kernel"), 7),
        (("[T2 worker omp-2]", "mlp", "aten::linear", "aten::mm", "sgemm_kernel"), 4),
    ]


def test_a_single_thread_gets_no_all_threads_profile():
    doc = built([s for s in sample_stacks() if s.thread == 1])
    assert [p["name"] for p in doc["profiles"]] == ["T1 worker omp-1"]
    # Frames only the missing "all threads" profile would use (the thread root) are not listed.
    assert "[T1 worker omp-1]" not in [f["name"] for f in doc["shared"]["frames"]]


def test_weights_sum_to_the_input_and_stay_integers():
    stacks = sample_stacks()
    doc = built(stacks)
    total = sum(s.weight for s in stacks)
    assert doc["profiles"][0]["endValue"] == total == 19
    for t, profile in enumerate(doc["profiles"][1:]):
        assert profile["endValue"] == sum(s.weight for s in stacks if s.thread == t)
        assert profile["endValue"] == sum(profile["weights"])
        assert len(profile["weights"]) == len(profile["samples"])
    # Integral weights are written as JSON integers, not 5.0.
    text = json.dumps(doc)
    assert all(type(w) is int for p in doc["profiles"] for w in p["weights"] + [p["endValue"]]), text

    fractional = built([stack(T0, MLP, weight=0.25, thread=0), stack(T0, MM, weight=2.0, thread=0)], "nanoseconds")
    # Sorted by frame names: "aten::mm" before "mlp".
    assert fractional["profiles"][0]["weights"] == [2, 0.25]
    assert type(fractional["profiles"][0]["weights"][0]) is int
    assert fractional["profiles"][0]["endValue"] == 2.25


def test_equal_stacks_merge_and_zero_weights_drop():
    doc = built([stack(T0, MLP, weight=2, thread=0), stack(T0, MLP, weight=3, thread=0),
                 stack(T0, MM, weight=0, thread=0)])
    assert decoded(doc, doc["profiles"][0]) == [(("mlp",), 5)]
    assert "aten::mm" not in [f["name"] for f in doc["shared"]["frames"]]


@pytest.mark.parametrize("weight", [-1, float("nan"), float("inf")])
def test_weights_speedscope_cannot_read_are_refused(weight):
    with pytest.raises(ValueError, match="weight"):
        built([stack(T0, MLP, weight=weight, thread=0)])


def test_frames_dedupe_by_name_and_kind():
    # "aten::mm" as an op and as a native frame of the same name are two frames; each is listed once
    # however many stacks and profiles use it.
    native_mm = FlameFrame("aten::mm", "framework")
    doc = built(sample_stacks() + [stack(T2, MM, native_mm, weight=1, thread=2)])
    frames = doc["shared"]["frames"]
    keys = [(f["name"], f.get("file"), f.get("line")) for f in frames]
    assert len(keys) == len(set(keys))
    assert sorted(keys, key=str) == sorted([
        ("[T0 dispatch MainThread]", "[thread]", None), ("[T1 worker omp-1]", "[thread]", None),
        ("[T2 worker omp-2]", "[thread]", None), ("forward", "modeling_llama.py", 123),
        ("mlp", "[region]", None), ("aten::linear", "[op]", None), ("aten::mm", "[op]", None),
        ("aten::mm", "[framework]", None), ("sgemm_kernel", "[compute]", None), ("__kmp_wait", "[openmp]", None),
    ], key=str)
    t2 = profile_named(doc, "T2 worker omp-2")
    op_mm = keys.index(("aten::mm", "[op]", None))
    fw_mm = keys.index(("aten::mm", "[framework]", None))
    assert [op_mm, fw_mm] in t2["samples"]


@pytest.mark.parametrize(("name", "expected"), [
    ("forward (modeling_llama.py:123)", {"name": "forward", "file": "modeling_llama.py", "line": 123}),
    ("<module> (run.py:7)", {"name": "<module>", "file": "run.py", "line": 7}),
    ("wrapped (fn) (/opt/x:y/m.py:45)", {"name": "wrapped (fn)", "file": "/opt/x:y/m.py", "line": 45}),
    ("forward", {"name": "forward", "file": "[python]"}),
    ("forward (modeling_llama.py)", {"name": "forward (modeling_llama.py)", "file": "[python]"}),
])
def test_python_frames_split_into_name_file_and_line(name, expected):
    assert speedscope.frame_entry(FlameFrame(name, "python")) == expected


def test_other_kinds_carry_their_kind_as_file():
    # Only python frames are split: an op whose name looks like one keeps it whole.
    assert speedscope.frame_entry(FlameFrame("f (a.py:1)", "op")) == {"name": "f (a.py:1)", "file": "[op]"}
    assert speedscope.frame_entry(FlameFrame("[outside ATen ops]", "special")) == {
        "name": "[outside ATen ops]", "file": "[special]"}
    assert speedscope.frame_entry(GEMM) == {"name": "sgemm_kernel", "file": "[compute]"}


@pytest.mark.parametrize(("unit", "value_unit", "names"), [
    ("nanoseconds", "nanoseconds", ["all threads", "T0 dispatch MainThread"]),
    ("samples", "none", ["all threads", "T0 dispatch MainThread"]),
    ("page-faults", "none", ["all threads (page-faults)", "T0 dispatch MainThread (page-faults)"]),
])
def test_units_map_to_speedscopes_value_units(unit, value_unit, names):
    doc = built(sample_stacks(), unit)
    assert [p["unit"] for p in doc["profiles"]] == [value_unit] * 4
    assert [p["name"] for p in doc["profiles"]][:2] == names


def test_output_is_deterministic():
    stacks = sample_stacks() + [stack(T0, FWD, FlameFrame("aten::add", "op"), weight=3, thread=0)]
    texts = set()
    rng = random.Random(0)
    for _ in range(5):
        rng.shuffle(stacks)
        out = io.StringIO()
        speedscope.write(stacks, out, name="n", unit="samples", exporter="e")
        texts.add(out.getvalue())
    assert len(texts) == 1
