"""The JSON Schema of the profile file, generated from the model's type hints.

``profile.schema.json`` beside this module is the written description of the format; a test
regenerates it and fails when the committed file differs, so the two never drift apart.
Regenerate with ``python -m cpuprof.model.schema > src/cpuprof/model/profile.schema.json``.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import types
import typing
from typing import Any

from . import codec
from .io import FORMAT, VERSION
from .profile import Profile

SCHEMA_FILE = "profile.schema.json"


def _schema(hint: Any, defs: dict[str, Any]) -> dict[str, Any]:
    inner = codec.optional_inner(hint)
    if inner is not None:
        return {"anyOf": [_schema(inner, defs), {"type": "null"}]}
    if hint is Any:
        return {}
    if hint is type(None):
        return {"type": "null"}
    origin = typing.get_origin(hint)
    if origin is typing.Literal:
        return {"enum": list(typing.get_args(hint))}
    if origin in (typing.Union, types.UnionType):
        return {"anyOf": [_schema(option, defs) for option in typing.get_args(hint)]}
    if origin is list:
        (item,) = typing.get_args(hint)
        return {"type": "array", "items": _schema(item, defs)}
    if origin is dict:
        key, value = typing.get_args(hint)
        out: dict[str, Any] = {"type": "object", "additionalProperties": _schema(value, defs)}
        if key is int:
            out["propertyNames"] = {"pattern": "^-?[0-9]+$"}
        return out
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        name = hint.__name__
        if name not in defs:
            defs[name] = {}  # placeholder: recursive types (OpInput.items) refer to themselves
            types_ = codec.field_types(hint)
            fields = dataclasses.fields(hint)
            definition: dict[str, Any] = {
                "type": "object",
                "properties": {f.name: _schema(types_[f.name], defs) for f in fields},
                "required": [f.name for f in fields
                             if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING],
                "additionalProperties": False,
            }
            doc = (hint.__doc__ or "").strip()
            if doc and not doc.startswith(f"{name}("):
                definition["description"] = " ".join(doc.split())
            defs[name] = definition
        return {"$ref": f"#/$defs/{name}"}
    simple = {int: "integer", float: "number", str: "string", bool: "boolean"}
    if hint in simple:
        return {"type": simple[hint]}
    raise TypeError(f"no schema for {hint!r}")


def profile_schema() -> dict[str, Any]:
    defs: dict[str, Any] = {}
    root = _schema(Profile, defs)
    profile = dict(defs[root["$ref"].split("/")[-1]])
    profile["properties"] = {"format": {"const": FORMAT}, "version": {"const": VERSION}, **profile["properties"]}
    profile["required"] = ["format", "version", *profile["required"]]
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": f"https://cpuprof.dev/schema/profile-v{VERSION}.json",
        "title": f"cpuprof profile, format version {VERSION}",
        **profile,
        "$defs": {k: v for k, v in sorted(defs.items()) if k != "Profile"},
    }


def main() -> None:
    json.dump(profile_schema(), sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
