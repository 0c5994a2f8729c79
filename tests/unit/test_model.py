"""The Profile model: save/load, versions and migration, the written schema, damaged files."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import jsonschema
import pytest
from profiles import V1_DECODE, V1_UNPROFILED, make_profile

from cpuprof.errors import ProfileFormatError
from cpuprof.model import VERSION, Profile
from cpuprof.model.codec import DecodeError, from_json
from cpuprof.model.migrate import parse_v1_shapes
from cpuprof.model.schema import SCHEMA_FILE, profile_schema

SCHEMA_PATH = Path(__file__).resolve().parents[2] / "src/cpuprof/model" / SCHEMA_FILE


def test_round_trip(tmp_path: Path):
    profile = make_profile()
    path = profile.save(tmp_path / "out")
    assert path.name == "profile.json"
    again = Profile.load(tmp_path / "out")
    assert again == profile
    assert json.loads(path.read_text())["version"] == VERSION


def test_saved_file_is_readable_like_any_other(tmp_path: Path):
    old = os.umask(0o022)
    try:
        path = make_profile().save(tmp_path)
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o644


def test_committed_schema_is_the_models_schema():
    """profile.schema.json is generated from the model; regenerate it when the model changes:
    python -m cpuprof.model.schema > src/cpuprof/model/profile.schema.json"""
    assert json.loads(SCHEMA_PATH.read_text()) == profile_schema()


@pytest.mark.parametrize("source", ["hand-built", "v1 decode", "v1 unprofiled"])
def test_profiles_validate_against_the_schema(source):
    profile = {"hand-built": make_profile, "v1 decode": lambda: Profile.load(V1_DECODE),
               "v1 unprofiled": lambda: Profile.load(V1_UNPROFILED)}[source]()
    jsonschema.validate(json.loads(json.dumps(profile.to_dict())), json.loads(SCHEMA_PATH.read_text()))


def test_version_1_profile_of_the_previous_release_loads():
    profile = Profile.load(V1_DECODE)
    v1 = json.loads(V1_DECODE.read_text())
    # The idle thread leaves the per-op columns; the working ones keep their counts.
    assert [t.tid for t in profile.threads] == [t["tid"] for t in v1["threads"] if t["role"] != "idle"]
    assert [t.tid for t in profile.idle_threads] == [t["tid"] for t in v1["threads"] if t["role"] == "idle"]
    old_op = next(o for o in v1["ops"] if o["name"] == "aten::mm" and o["region"] == "attention" and o["calls"] == 4)
    op = next(o for o in profile.ops if o.id == old_op["id"])
    assert op.region == ["attention"]
    old_cpu = old_op["counters_self"]["task-clock"]
    kept = [v for v, t in zip(old_cpu, v1["threads"], strict=True) if t["role"] != "idle"]
    assert op.counters_self["task-clock"] == kept
    assert [(i.kind, i.dtype, i.sizes) for i in op.inputs] == [("tensor", "bf16", [8, 64]),
                                                                ("tensor", "bf16", [64, 64])]
    assert profile.workload.figures.tokens_per_s == pytest.approx(v1["workload"]["tokens_per_s"])
    assert profile.workload.model.config.hidden == 64
    assert profile.settings.topology.node(0).cpus == [0, 1]
    assert profile.overhead.discovery_cpu_ns == v1["overhead"]["sampler_cpu_ns"]
    assert all(t in (-1, 0, 1) for t in profile.spans.thread)
    unprofiled = Profile.load(V1_UNPROFILED)
    assert not unprofiled.profiled and unprofiled.workload.steps_done == 6


def test_v1_shape_text_is_parsed_back_into_inputs():
    inputs = parse_v1_shapes("([1, 2] bf16, [?] f32); [3] i64; None; ints; Device; float")
    assert inputs[0]["kind"] == "tensor_list"
    assert [i["sizes"] if i["kind"] == "tensor" else i["kind"] for i in inputs[0]["items"]] == [[1, 2], "unknown_shape"]
    assert [i["kind"] for i in inputs[1:]] == ["tensor", "none", "int_list", "other", "float"]
    assert parse_v1_shapes("") is None
    assert len(parse_v1_shapes("[1] bf16; [2, 3] f3…")) == 1  # cut text: the cut input is dropped


def test_truncated_file_is_one_clear_error(tmp_path: Path):
    path = make_profile().save(tmp_path)
    text = path.read_text()
    path.write_text(text[: len(text) // 2])
    with pytest.raises(ProfileFormatError, match=r"not valid JSON at line 1 column \d+ \(truncated"):
        Profile.load(tmp_path)


@pytest.mark.parametrize("content, message", [
    ({"traceEvents": []}, "not a cpuprof profile"),
    ({"format": "cpuprof-profile", "version": 99}, "written by a newer cpuprof .*version 99.*upgrade cpuprof"),
    ({"format": "cpuprof-profile", "version": "2"}, "no valid format version"),
    ({"format": "cpuprof-profile", "version": 2, "meta": {}}, r"damaged cpuprof profile \(profile.meta: missing"),
    ({"format": "cpuprof-profile", "version": 1, "meta": {}}, "damaged cpuprof profile"),
])
def test_foreign_damaged_or_future_files(tmp_path: Path, content, message):
    (tmp_path / "profile.json").write_text(json.dumps(content))
    with pytest.raises(ProfileFormatError, match=message):
        Profile.load(tmp_path / "profile.json")


def test_damage_is_reported_with_the_path_of_the_bad_field(tmp_path: Path):
    data = make_profile().to_dict()
    data["ops"][1]["inputs"][0]["sizes"] = "1x8"
    with pytest.raises(ProfileFormatError, match=r"profile.ops\[1\].inputs\[0\].sizes: expected a list"):
        Profile.from_dict(data)
    data = make_profile().to_dict()
    data["threads"][0]["tid"] = True
    with pytest.raises(ProfileFormatError, match=r"threads\[0\].tid: expected a whole number"):
        Profile.from_dict(data)


def test_codec_rejects_unknown_fields():
    from cpuprof.model import Status

    with pytest.raises(DecodeError, match="unknown field"):
        from_json(Status, {"complete": True, "reasons": "x"})


def test_missing_profile(tmp_path: Path):
    with pytest.raises(ProfileFormatError, match="no such profile"):
        Profile.load(tmp_path / "nothing")


def test_validate_catches_broken_invariants():
    profile = make_profile()
    profile.ops[0].counters_self["task-clock"] = [1, 2, 3]
    with pytest.raises(ProfileFormatError, match="3 per-thread values for 2 threads"):
        profile.validate()
    profile = make_profile()
    profile.ops[0].self_ns = profile.ops[0].incl_ns + 1
    with pytest.raises(ProfileFormatError, match="self time exceeds total"):
        profile.validate()
    profile = make_profile()
    profile.spans.thread[0] = 5
    with pytest.raises(ProfileFormatError, match="a span refers to a thread"):
        profile.validate()


def test_save_is_atomic(tmp_path: Path, monkeypatch):
    profile = make_profile()
    profile.save(tmp_path)
    before = (tmp_path / "profile.json").read_text()

    def boom(*_a, **_k):
        raise OSError("disk full")

    monkeypatch.setattr(json, "dumps", boom)
    with pytest.raises(OSError):
        make_profile("sampled").save(tmp_path)
    assert (tmp_path / "profile.json").read_text() == before
    assert not list(tmp_path.glob(".profile-*"))
