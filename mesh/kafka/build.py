"""Build a response dataclass of any version from plain data (``make``).

Each API has a dozen versions whose response classes differ by a few fields. Handlers
write their answer once, as nested dicts with the newest field names, and ``make`` turns
it into the class of the version asked: fields the version does not have are dropped,
fields the data does not give take the class's default (an array without one is empty), a list for a nested array becomes
a tuple of the nested class (read from the field's type), ints become ``ErrorCode`` or a
``timedelta`` where the field wants one.
"""
from __future__ import annotations

import dataclasses
import datetime
import typing
from functools import lru_cache

from kio.schema.errors import ErrorCode

__all__ = ["make", "ms", "error_code"]


def ms(td) -> int:
    """A kio timedelta field as int milliseconds."""
    if isinstance(td, datetime.timedelta):
        return int(td.total_seconds() * 1000)
    return int(td)


def error_code(code: int) -> ErrorCode:
    try:
        return ErrorCode(int(code))
    except ValueError:
        return ErrorCode.unknown_server_error


@lru_cache(maxsize=None)
def _plan(cls) -> tuple:
    out = []
    for f in dataclasses.fields(cls):
        t = f.type
        kind, sub = "plain", None
        origin = typing.get_origin(t)
        if origin is tuple:
            args = typing.get_args(t)
            if args and dataclasses.is_dataclass(args[0]):
                kind, sub = "array", args[0]
        elif dataclasses.is_dataclass(t):
            kind, sub = "entity", t
        elif isinstance(t, type) and issubclass(t, datetime.timedelta):
            kind, sub = "timedelta", t
        elif t is ErrorCode:
            kind = "error"
        else:
            for a in typing.get_args(t):   # X | None
                if dataclasses.is_dataclass(a):
                    kind, sub = "entity", a
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        out.append((f.name, kind, sub, required))
    return tuple(out)


def make(cls, data: dict):
    kwargs = {}
    for name, kind, sub, required in _plan(cls):
        if name not in data:
            if required and kind == "array":
                kwargs[name] = ()   # an array the answer leaves empty (record_errors, ...)
            continue
        v = data[name]
        if kind == "array" and v is not None:
            v = tuple(x if dataclasses.is_dataclass(x) else make(sub, x) for x in v)
        elif kind == "entity" and isinstance(v, dict):
            v = make(sub, v)
        elif kind == "timedelta" and not isinstance(v, datetime.timedelta):
            v = sub.parse(datetime.timedelta(milliseconds=int(v)))
        elif kind == "error" and not isinstance(v, ErrorCode):
            v = error_code(v)
        kwargs[name] = v
    return cls(**kwargs)
