"""A config field's declared type, read from its dataclass: what `None` may stand for, the base type a value must
have, and the checks every config section runs on its values at construction.

The dataclasses that use these (`TrainConfig`, `WarmStart`) are declared without `from __future__ import
annotations`, so `dataclasses.fields(...)[i].type` is the type itself, not its text.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any

from training.config.errors import fail

__all__ = ["type_args", "is_optional", "base_type", "coerce_types", "check_types"]


def type_args(tp: Any) -> tuple[Any, ...]:
    """The types a field's annotation allows, `NoneType` last when it is optional (`int | None` → `(int, NoneType)`)."""
    if isinstance(tp, str):
        raise TypeError(f"config field annotation {tp!r} is text: declare config dataclasses without "
                        "`from __future__ import annotations`")
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        return tuple(a for a in args if a is not type(None)) + ((type(None),) if type(None) in args else ())
    return (tp,)


def is_optional(tp: Any) -> bool:
    return type(None) in type_args(tp)


def base_type(tp: Any) -> type:
    """The field's type without `None` and without its parameters (`list[str] | None` → `list`)."""
    first = type_args(tp)[0]
    origin = typing.get_origin(first)
    return origin if origin is not None else first


def coerce_types(obj: Any) -> None:
    """JSON gives ints for floats and lists for lists: normalise so equality and saving are stable."""
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if value is None:
            continue
        base = base_type(f.type)
        if base is float and isinstance(value, int) and not isinstance(value, bool):
            setattr(obj, f.name, float(value))
        elif base is list and isinstance(value, tuple):
            setattr(obj, f.name, list(value))


def check_types(obj: Any, prefix: str = "") -> None:
    """Every field of `obj` holds a value of its declared type (or None where that is allowed); `prefix` names the
    section in the error (`"sft."`)."""
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if value is None:
            if not is_optional(f.type):
                fail(f"{prefix}{f.name} must be set (got null)")
            continue
        base = base_type(f.type)
        ok = (
            (base is bool and isinstance(value, bool))
            or (base is int and isinstance(value, int) and not isinstance(value, bool))
            or (base is float and isinstance(value, (int, float)) and not isinstance(value, bool))
            or (base is str and isinstance(value, str))
            or (base is list and isinstance(value, list))
            or (base is dict and isinstance(value, dict))
            or (dataclasses.is_dataclass(base) and isinstance(value, base))
        )
        if not ok:
            fail(f"{prefix}{f.name} must be of type {base.__name__}, got {value!r}")
