"""The message registry and the versioned msgpack codec.

Every wire message is a frozen, slotted dataclass decorated with ``@message("OP")``. The
decorator registers it in one table (``REGISTRY``) keyed by its operation name; the codec
turns a message into a msgpack array of its field values (in declaration order) and back.
Decoding validates the top-level type of every field against the annotations, so a
client that sends a string where an int belongs gets INVALID_REQUEST with the field
named, never a crash deep inside a handler.

A ZeroMQ message (after the ROUTER identity) is a list of frames::

    [protocol/version, request id, operation, msgpack body, optional raw payload]

``PROTOCOL_CLIENT`` is spoken by clients, ``PROTOCOL_PEER`` between brokers. The raw
payload frame carries record batches as opaque bytes (see ``mesh.wire.records``).

Bounds (``DecodeLimits``): a broker decodes bodies with limits, so a small frame cannot
become a large object graph. A body over ``max_body_bytes`` is refused before msgpack
sees it (each msgpack byte can become a ~70-byte Python object: an empty map is one byte);
strings, binaries, arrays and maps are capped by msgpack itself (``max_str_len``,
``max_bin_len``, ``max_array_len``, ``max_map_len``); an ``int`` field must be a signed
64-bit integer (msgpack also carries unsigned 64-bit ones), beyond that it does not
decode at all. Handlers check each field's own range where they use it. Clients decode responses with ``NO_LIMITS`` (a metadata answer of a large
cluster is big, and comes from a broker they chose to trust).
"""
from __future__ import annotations

import dataclasses
import functools
import operator
import threading
import types
import typing
from typing import Any, Callable

import msgpack

from mesh.wire.errors import ErrorCode, MeshError

__all__ = [
    "PROTOCOL_CLIENT", "PROTOCOL_PEER", "REGISTRY", "message", "encode_body", "decode_body",
    "pack", "unpack", "op_of", "DecodeLimits", "NO_LIMITS", "ZERO_COPY_MIN_BYTES",
]

PROTOCOL_CLIENT = b"mesh/1"
PROTOCOL_PEER = b"mesh-peer/4"  # 2: store identity, lives and recovering flags in replication;
#                                 3: gossip keys chunked (tparts/, lead/, stats/, recovering/<topic>/<k>), users, ACLs;
#                                 4: replication carries config markers and config ids (membership change)
PROTOCOLS = (PROTOCOL_CLIENT, PROTOCOL_PEER)

REGISTRY: dict[bytes, type] = {}
_local = threading.local()
_I64_MIN, _I64_MAX = -(1 << 63), (1 << 63) - 1


@dataclasses.dataclass(frozen=True, slots=True)
class DecodeLimits:
    """Bounds for decoding one body (0 = no bound)."""
    max_body_bytes: int = 1 << 20
    max_str_len: int = 1 << 20
    max_bin_len: int = 1 << 20
    max_array_len: int = 100_000
    max_map_len: int = 10_000

    def unpack_kwargs(self) -> dict:
        big = 2 ** 31 - 1
        return {"max_str_len": self.max_str_len or big, "max_bin_len": self.max_bin_len or big,
                "max_array_len": self.max_array_len or big, "max_map_len": self.max_map_len or big,
                "max_ext_len": 0}


NO_LIMITS = DecodeLimits(0, 0, 0, 0, 0)
_FIELDS: dict[type, tuple[str, ...]] = {}    # field names, per message class, in wire order
_CHECKS: dict[type, tuple[Callable[[list], int], tuple[str, ...]]] = {}  # (check, type names)
_GETTERS: dict[type, Callable[[Any], tuple]] = {}
_REQUIRED: dict[type, int] = {}              # fields without a default, per message class
_UNPACKERS: dict[int, tuple[DecodeLimits, Callable[[bytes], Any]]] = {}   # id -> (limits, unpackb bound to them)
_unpack_unbounded = functools.partial(msgpack.unpackb, raw=False, use_list=True, strict_map_key=False)
# A payload frame at least this big is sent without copying (pyzmq tracks it and frees it in
# its garbage-collector thread, which wakes and takes the GIL once per frame); smaller ones
# are copied, which costs less than that wake-up (a 1 MiB memcpy is tens of microseconds).
ZERO_COPY_MIN_BYTES = 1 << 20


def _check_expr(tp: Any, v: str, env: dict) -> tuple[str, str]:
    """(Python expression true when ``v`` fits the annotation ``tp``, its name): a cheap
    top-level type check. ``env`` collects the names the expression needs."""
    if tp is Any or tp is object:
        return "True", "any"
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        parts = [_check_expr(a, v, env) for a in typing.get_args(tp)]
        return "(" + " or ".join(e for e, _ in parts) + ")", " or ".join(n for _, n in parts)
    if tp is type(None) or tp is None:
        return f"{v} is None", "null"
    base = origin or tp
    if base is float:
        return f"(isinstance({v}, (int, float)) and not isinstance({v}, bool))", "float"
    if base is int:   # a signed 64-bit int: what every store key, struct and peer can hold
        return (f"(isinstance({v}, int) and not isinstance({v}, bool) and {_I64_MIN} <= {v} <= {_I64_MAX})",
                "int (64-bit signed)")
    if base in (list, tuple):
        return f"isinstance({v}, (list, tuple))", "list"
    if base is dict:
        return f"isinstance({v}, dict)", "map"
    if base is bytes:
        return f"isinstance({v}, (bytes, bytearray, memoryview))", "bytes"
    if isinstance(base, type):
        name = f"_t{len(env)}"
        env[name] = base
        return f"isinstance({v}, {name})", base.__name__
    return "True", str(tp)


def _compile_check(cls: type, hints: dict) -> tuple[Callable[[list], int], tuple[str, ...]]:
    """One generated function per message class: ``check(values) -> index of the first
    field whose value has the wrong type, or -1``; fields past ``len(values)`` (defaults)
    are not checked. One call per message instead of one per field (decoding is on every
    request's path)."""
    env: dict = {}
    lines = ["def check(vs):", "    n = len(vs)"]
    names = []
    for i, f in enumerate(dataclasses.fields(cls)):
        expr, name = _check_expr(hints[f.name], "v", env)
        names.append(name)
        if expr != "True":
            lines += [f"    if n > {i}:", f"        v = vs[{i}]", f"        if not {expr}:", f"            return {i}"]
    lines.append("    return -1")
    exec("\n".join(lines), env)   # noqa: S102 - built from our own annotations only
    return env["check"], tuple(names)


def message(op: str):
    """Register a frozen, slotted dataclass as a wire message with operation ``op``."""

    def wrap(cls):
        if not dataclasses.is_dataclass(cls):
            cls = dataclasses.dataclass(frozen=True, slots=True)(cls)
        key = op.encode()
        if key in REGISTRY and REGISTRY[key].__qualname__ != cls.__qualname__:
            raise ValueError(f"operation {op!r} registered twice")
        REGISTRY[key] = cls
        cls.OP = key
        hints = typing.get_type_hints(cls)
        names = tuple(f.name for f in dataclasses.fields(cls))
        _FIELDS[cls] = names
        _CHECKS[cls] = _compile_check(cls, hints)
        get = operator.attrgetter(*names) if names else (lambda msg: ())
        _GETTERS[cls] = get if len(names) != 1 else (lambda msg, g=get: (g(msg),))
        _REQUIRED[cls] = sum(1 for f in dataclasses.fields(cls)
                             if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)
        return cls

    return wrap


def op_of(msg: Any) -> bytes:
    return type(msg).OP


def encode_body(msg: Any) -> bytes:
    try:
        packer = _local.packer
    except AttributeError:   # one reusable Packer per thread (msgpack.packb builds one per call)
        packer = _local.packer = msgpack.Packer(use_bin_type=True)
    try:
        return packer.pack(_GETTERS[type(msg)](msg))
    except BaseException:
        packer.reset()   # a failed pack may leave bytes behind in the packer's buffer
        raise


def decode_body(op: bytes, body: bytes, limits: DecodeLimits | None = None) -> Any:
    """Decode a body for ``op``; any problem raises MeshError(INVALID_REQUEST, reason).
    ``limits``: bounds for an untrusted body (None: msgpack's defaults, bounded by the
    body's own length)."""
    cls = REGISTRY.get(bytes(op))
    if cls is None:
        raise MeshError(ErrorCode.INVALID_REQUEST, f"unknown operation {bytes(op)[:40]!r}")
    try:
        if limits is None:
            values = _unpack_unbounded(body)
        else:
            if limits.max_body_bytes and len(body) > limits.max_body_bytes:
                raise MeshError(ErrorCode.MESSAGE_TOO_LARGE,
                                f"{cls.__name__}: body of {len(body)} bytes; at most {limits.max_body_bytes}")
            got = _UNPACKERS.get(id(limits))   # by identity: a dataclass hash costs a Python call
            if got is None or got[0] is not limits:
                if len(_UNPACKERS) >= 64:
                    _UNPACKERS.clear()
                got = _UNPACKERS[id(limits)] = (limits, functools.partial(
                    msgpack.unpackb, raw=False, use_list=True, strict_map_key=False, **limits.unpack_kwargs()))
            values = got[1](body)
    except MeshError:
        raise
    except Exception as exc:  # msgpack raises several types for bad input (and limits)
        raise MeshError(ErrorCode.INVALID_REQUEST, f"{cls.__name__}: body is not msgpack ({exc})")
    check, type_names = _CHECKS[cls]
    if values.__class__ is not list:
        raise MeshError(ErrorCode.INVALID_REQUEST, f"{cls.__name__}: body must be an array")
    if len(values) > len(type_names):
        raise MeshError(ErrorCode.INVALID_REQUEST,
                        f"{cls.__name__}: {len(values)} fields, at most {len(type_names)} expected")
    n_required = _REQUIRED[cls]
    if len(values) < n_required:
        raise MeshError(ErrorCode.INVALID_REQUEST,
                        f"{cls.__name__}: {len(values)} fields, {n_required} required")
    bad = check(values)
    if bad >= 0:
        raise MeshError(ErrorCode.INVALID_REQUEST, f"{cls.__name__}.{_FIELDS[cls][bad]}: expected "
                                                   f"{type_names[bad]}, got {type(values[bad]).__name__}")
    try:
        return cls(*values)
    except MeshError:
        raise
    except (TypeError, ValueError) as exc:
        raise MeshError(ErrorCode.INVALID_REQUEST, f"{cls.__name__}: {exc}")


def pack(protocol: bytes, request_id: int, msg: Any, payload: bytes | None = None) -> list:
    """Frames for one message (without the ROUTER identity)."""
    frames = [protocol, request_id.to_bytes(8, "big"), type(msg).OP, encode_body(msg)]
    if payload is not None:
        frames.append(payload)
    return frames


def unpack(frames: list, limits: DecodeLimits | None = None,
           peer_limits: DecodeLimits | None = None) -> tuple[bytes, int, Any, Any]:
    """(protocol, request id, message, payload or None) from frames without identity.
    ``limits`` bound client bodies, ``peer_limits`` peer bodies (None: unbounded but
    for the body's own length)."""
    if len(frames) not in (4, 5):
        raise MeshError(ErrorCode.INVALID_REQUEST,
                        f"expected 4 or 5 frames [protocol, request id, op, body, payload?], got {len(frames)}")
    protocol = bytes(frames[0])
    if protocol not in PROTOCOLS:
        raise MeshError(ErrorCode.UNSUPPORTED_VERSION,
                        f"unknown protocol {protocol[:40]!r}; this broker speaks {PROTOCOL_CLIENT!r}")
    rid = bytes(frames[1])
    if len(rid) != 8:
        raise MeshError(ErrorCode.INVALID_REQUEST, "request id must be 8 bytes")
    msg = decode_body(frames[2], frames[3], peer_limits if protocol == PROTOCOL_PEER else limits)
    payload = frames[4] if len(frames) == 5 else None
    return protocol, int.from_bytes(rid, "big"), msg, payload
