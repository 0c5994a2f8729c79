"""Dataclasses to JSON-ready values and back, strictly, driven by their type hints.

Hand-written rather than taken from dacite, cattrs or pydantic: the model needs only dataclasses,
lists, dicts, optionals and scalars; a damaged or foreign file must fail with the path of the
first bad field ("ops[3].inputs[0].sizes: expected a list"), and the profile model must load
without a heavy dependency in the process being profiled. The same hints produce the JSON
schema (``schema.py``), so the file format and its description cannot drift apart.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from typing import Any, TypeVar, Union

T = TypeVar("T")


class DecodeError(ValueError):
    """A value does not fit the model; the message starts with the path of the bad field."""


@functools.cache
def field_types(cls: type) -> dict[str, Any]:
    """Resolved type hints of a dataclass's fields (postponed annotations evaluated once)."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def optional_inner(hint: Any) -> Any | None:
    """For ``X | None`` returns X; for anything else None."""
    if typing.get_origin(hint) in (Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(hint)) == 2:
            return args[0]
    return None


_SCALARS = frozenset({str, int, float, bool, type(None)})


_FIELD_NAMES: dict[type, tuple[str, ...] | None] = {}


def _field_names(cls: type) -> tuple[str, ...] | None:
    """A dataclass's field names, looked up once per class (a profile holds a hundred thousand
    values, and a checkpoint encodes them all while the program runs); None for any other type."""
    try:
        return _FIELD_NAMES[cls]
    except KeyError:
        names = tuple(f.name for f in dataclasses.fields(cls)) if dataclasses.is_dataclass(cls) else None
        _FIELD_NAMES[cls] = names
        return names


def to_json(value: Any) -> Any:
    """A dataclass (or list/dict of them) as plain JSON values; dict keys become strings."""
    kind = type(value)
    if kind in _SCALARS:
        return value
    if kind is list or kind is tuple:
        return [v if type(v) in _SCALARS else to_json(v) for v in value]
    if kind is dict:
        return {str(k): v if type(v) in _SCALARS else to_json(v) for k, v in value.items()}
    names = _field_names(kind)
    if names is not None:
        return {name: to_json(getattr(value, name)) for name in names}
    if isinstance(value, (list, tuple)):  # subclasses (a NamedTuple)
        return [to_json(v) for v in value]
    if isinstance(value, dict):
        return {str(k): to_json(v) for k, v in value.items()}
    return value


def from_json(cls: type[T], data: Any, path: str = "") -> T:
    """Builds ``cls`` from JSON values, checking every field against its type hint."""
    return _decode(cls, data, path or cls.__name__)


def _decode(hint: Any, data: Any, path: str) -> Any:
    inner = optional_inner(hint)
    if inner is not None:
        return None if data is None else _decode(inner, data, path)
    if hint is Any:
        return data
    if hint is type(None):
        if data is not None:
            raise DecodeError(f"{path}: expected null, found {type(data).__name__}")
        return None
    origin = typing.get_origin(hint)
    if origin is list:
        if not isinstance(data, list):
            raise DecodeError(f"{path}: expected a list, found {type(data).__name__}")
        (item,) = typing.get_args(hint)
        return [_decode(item, v, f"{path}[{i}]") for i, v in enumerate(data)]
    if origin is dict:
        if not isinstance(data, dict):
            raise DecodeError(f"{path}: expected an object, found {type(data).__name__}")
        key_type, value_type = typing.get_args(hint)
        out = {}
        for key, value in data.items():
            if key_type is int:
                try:
                    decoded_key: Any = int(key)
                except ValueError as exc:
                    raise DecodeError(f"{path}: key {key!r} is not a whole number") from exc
            else:
                decoded_key = key
            out[decoded_key] = _decode(value_type, value, f"{path}.{key}")
        return out
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        if not isinstance(data, dict):
            raise DecodeError(f"{path}: expected an object, found {type(data).__name__}")
        types_ = field_types(hint)
        unknown = sorted(set(data) - set(types_))
        if unknown:
            raise DecodeError(f"{path}: unknown field(s) {', '.join(unknown)}")
        kwargs = {}
        for f in dataclasses.fields(hint):
            if f.name in data:
                kwargs[f.name] = _decode(types_[f.name], data[f.name], f"{path}.{f.name}")
            elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise DecodeError(f"{path}: missing field {f.name!r}")
        return hint(**kwargs)
    if hint is float:
        if isinstance(data, bool) or not isinstance(data, (int, float)):
            raise DecodeError(f"{path}: expected a number, found {type(data).__name__}")
        try:
            number = float(data)
        except OverflowError:  # a whole number of 400 digits
            number = math.inf
        if not math.isfinite(number):  # NaN, or 1e400 (parsed as inf): cpuprof never writes one
            raise DecodeError(f"{path}: {str(data)[:20]} is not a finite number")
        return number
    if hint is int:
        if isinstance(data, bool) or not isinstance(data, int):
            raise DecodeError(f"{path}: expected a whole number, found {type(data).__name__}")
        return data
    if hint in (str, bool):
        if not isinstance(data, hint):
            raise DecodeError(f"{path}: expected {hint.__name__}, found {type(data).__name__}")
        return data
    if origin is typing.Literal:
        if data not in typing.get_args(hint):
            choices = ", ".join(repr(a) for a in typing.get_args(hint))
            raise DecodeError(f"{path}: {data!r} is not one of {choices}")
        return data
    if origin in (Union, types.UnionType):
        for option in typing.get_args(hint):
            try:
                return _decode(option, data, path)
            except DecodeError:
                continue
        raise DecodeError(f"{path}: {data!r} fits none of {hint}")
    raise TypeError(f"{path}: the model uses a type the codec does not handle: {hint!r}")
