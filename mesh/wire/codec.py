"""The message registry and the versioned msgpack codec.

Every wire message is a frozen, slotted dataclass decorated with ``@message("OP")``. The
decorator registers it in one table (``REGISTRY``) keyed by its operation name; the codec
turns a message into a msgpack array of its field values (in declaration order) and back.
Decoding validates the top-level type of every field against the annotations, so a
client that sends a string where an int belongs gets INVALID_REQUEST with the field
named, never a crash deep inside a handler. Both the decoder (type checks, then the
slots set one by one) and a faster ``__init__`` of the same signature are generated per
class from its annotations when it registers (``_compile``): messages are built on every
request's path, and the ``__init__`` that ``dataclasses`` writes for a frozen class costs
an ``object.__setattr__`` lookup and call per field.

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
decode at all. A body of many tiny containers (a million empty arrays fit in 1 MB, and
cost the loop 0.1-0.8 s to build) is bounded by ``max_body_containers``: a body longer
than that many bytes (each container takes at least one) is decoded with msgpack's
``list_hook``/``object_hook`` counting arrays and maps, and the decode stops at the first
one past the bound (INVALID_REQUEST), with the cyclic garbage collector paused meanwhile
(a list built while it runs makes it walk every list built so far: 4x the cost). Scalars
cost far less (a million strings: ~10 ms) and stay bounded by ``max_body_bytes``. Handlers check each field's own range where they use it. Clients decode responses with ``NO_LIMITS`` (a metadata answer of a large
cluster is big, and comes from a broker they chose to trust).
"""
from __future__ import annotations

import dataclasses
import functools
import gc
import operator
import threading
import types
import typing
from typing import Any, Callable

import msgpack

from mesh.wire.errors import ErrorCode, MeshError

__all__ = [
    "PROTOCOL_CLIENT", "PROTOCOL_PEER", "REGISTRY", "message", "encode_body", "decode_body",
    "pack", "unpack", "op_of", "DecodeLimits", "NO_LIMITS", "ZERO_COPY_MIN_BYTES", "ROWS",
]

PROTOCOL_CLIENT = b"mesh/1"
PROTOCOL_PEER = b"mesh-peer/8"  # 2: store identity, lives and recovering flags in replication;
#                                 3: gossip keys chunked (tparts/, lead/, stats/, recovering/<topic>/<k>), users, ACLs;
#                                 4: replication carries config markers and config ids (membership change);
#                                 5: gossip rows carry their origin's life (Row.life);
#                                 6: heartbeat rows say when a partition goes quiet (quiescence);
#                                 7: group commits replicated (GROUP_REPLICATE, GROUP_OFFSETS_PULL), gossip
#                                    digests carry the sender's wall clock, appends the leader's log start;
#                                    partial gossip digests with row bucket hashes (rows_hash, ACK2 digest);
#                                 8: gossip SWIM probes (GOSSIP_PING, GOSSIP_PING_ACK: suspicions, refutations)
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
    max_body_containers: int = 50_000   # arrays and maps in one body (issue 39: a dense body)

    def unpack_kwargs(self) -> dict:
        big = 2 ** 31 - 1
        return {"max_str_len": self.max_str_len or big, "max_bin_len": self.max_bin_len or big,
                "max_array_len": self.max_array_len or big, "max_map_len": self.max_map_len or big,
                "max_ext_len": 0}


NO_LIMITS = DecodeLimits(0, 0, 0, 0, 0, 0)
_FIELDS: dict[type, tuple[str, ...]] = {}    # field names, per message class, in wire order
_TYPE_NAMES: dict[type, tuple[str, ...]] = {}  # what each field must be, for error messages
_DECODERS: dict[bytes, tuple[type, Callable[[list], Any]]] = {}   # op -> (class, generated decoder)
_GETTERS: dict[type, Callable[[Any], tuple]] = {}
_REQUIRED: dict[type, int] = {}              # fields without a default, per message class
ROWS: dict[type, dict[str, type]] = {}       # list fields of typed rows, per message class (``message``)


class _Factory:
    def __repr__(self) -> str:
        return "<factory>"


_FACTORY = _Factory()   # the default of a field with a default factory, in a generated __init__
_UNPACKERS: dict[int, tuple[DecodeLimits, Callable[[bytes], Any]]] = {}   # id -> (limits, unpackb bound to them)
_unpack_unbounded = functools.partial(msgpack.unpackb, strict_map_key=False)   # raw=False, use_list: the defaults
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
    # Each test starts with ``v.__class__ is <the type msgpack makes>`` (about half the cost
    # of isinstance); the rest of the expression keeps the check's meaning for anything else.
    if base is float:
        return f"({v}.__class__ is float or isinstance({v}, (int, float)) and not isinstance({v}, bool))", "float"
    if base is int:   # a signed 64-bit int: what every store key, struct and peer can hold
        return (f"(({v}.__class__ is int or isinstance({v}, int) and not isinstance({v}, bool))"
                f" and {_I64_MIN} <= {v} <= {_I64_MAX})", "int (64-bit signed)")
    if base in (list, tuple):
        return f"({v}.__class__ is list or isinstance({v}, (list, tuple)))", "list"
    if base is dict:
        return f"({v}.__class__ is dict or isinstance({v}, dict))", "map"
    if base is bytes:
        return f"({v}.__class__ is bytes or isinstance({v}, (bytes, bytearray, memoryview)))", "bytes"
    if isinstance(base, type):
        name = f"_t{len(env)}"
        env[name] = base
        return f"({v}.__class__ is {name} or isinstance({v}, {name}))", base.__name__
    return "True", str(tp)


def _bad_count(cls: type, n: int) -> None:
    total = len(_FIELDS[cls])
    if n > total:
        raise MeshError(ErrorCode.INVALID_REQUEST, f"{cls.__name__}: {n} fields, at most {total} expected")
    raise MeshError(ErrorCode.INVALID_REQUEST, f"{cls.__name__}: {n} fields, {_REQUIRED[cls]} required")


def _bad_type(cls: type, i: int, v: Any) -> None:
    raise MeshError(ErrorCode.INVALID_REQUEST, f"{cls.__name__}.{_FIELDS[cls][i]}: expected "
                                               f"{_TYPE_NAMES[cls][i]}, got {type(v).__name__}")


def _slot_setters(cls: type, fields: tuple) -> list | None:
    """The slot setters of a frozen, slotted dataclass whose ``__init__`` is the one
    ``dataclasses`` generated (it only sets each field in order), None for anything else."""
    init_file = getattr(getattr(cls.__dict__.get("__init__"), "__code__", None), "co_filename", "")
    if (not cls.__dataclass_params__.frozen or hasattr(cls, "__post_init__") or init_file != "<string>"
            or any(not f.init or f.kw_only or f.name.startswith("_") or f.name == "self" for f in fields)):
        return None
    setters = []
    for f in fields:
        slot = cls.__dict__.get(f.name)
        if type(slot) is not types.MemberDescriptorType:
            return None
        setters.append(slot.__set__)
    return setters


def _compile(cls: type, hints: dict, rows: dict[str, type]) -> Callable[[list], Any]:
    """Generated from the annotations when a class is registered: ``decode(values)``, the
    message from a body's field values, or MeshError(INVALID_REQUEST) naming the first
    field whose top-level type is wrong (fields past ``len(values)`` take their defaults);
    and, for a frozen slotted dataclass, a faster ``__init__`` with the same signature.

    Both set the slots straight through their descriptors (what ``object.__setattr__``,
    which the ``__init__`` of a frozen dataclass calls per field, ends up doing), and the
    decoder checks each value right before it sets it: one Python call per message
    instead of a check call, an ``__init__`` call and a call per field (decoding and
    building answers are on every request's path)."""
    fields = dataclasses.fields(cls)
    setters = _slot_setters(cls, fields)
    env: dict = {"_cls": cls, "_new": object.__new__, "_bad_count": _bad_count, "_bad_type": _bad_type,
                 "_FACTORY": _FACTORY}
    required = _REQUIRED[cls]
    lines = ["def decode(vs):", "    n = len(vs)",
             f"    if n > {len(fields)} or n < {required}:", "        _bad_count(_cls, n)"]
    if setters is not None:
        lines.append("    o = _new(_cls)")
    init_args, init_body = ["self"], []
    names = []
    for i, f in enumerate(fields):
        expr, name = _check_expr(hints[f.name], "v", env)
        names.append(name)
        step = [f"v = vs[{i}]"]
        if expr != "True":
            step += [f"if not {expr}:", f"    _bad_type(_cls, {i}, v)"]
        if f.name in rows:
            assert setters is not None, f"{cls.__name__}: typed rows need a plain frozen slotted dataclass"
            env[f"_r{i}"] = _row_reader(cls, f.name, rows[f.name])
            step.append(f"v = _r{i}(v)")
        if setters is not None:
            env[f"_s{i}"] = setters[i]
            step.append(f"_s{i}(o, v)")
            init_body.append(f"    _s{i}(self, {f.name})")
        if i < required:
            lines += ["    " + x for x in step]
            init_args.append(f.name)
            continue
        lines += [f"    if n > {i}:"] + ["        " + x for x in step]
        if f.default_factory is not dataclasses.MISSING:
            env[f"_f{i}"] = f.default_factory
            init_args.append(f"{f.name}=_FACTORY")
            init_body[-1:-1] = [f"    if {f.name} is _FACTORY:", f"        {f.name} = _f{i}()"] if setters else []
            default = f"_f{i}()"
        else:
            env[f"_d{i}"] = f.default
            init_args.append(f"{f.name}=_d{i}")
            default = f"_d{i}"
        if setters is not None:
            lines += ["    else:", f"        _s{i}(o, {default})"]
    lines.append("    return o" if setters is not None else "    return _cls(*vs)")
    if setters is not None:
        lines += [f"def __init__({', '.join(init_args)}):"] + (init_body or ["    pass"])
    exec("\n".join(lines), env)   # noqa: S102 - built from our own annotations only
    _TYPE_NAMES[cls] = tuple(names)
    if setters is not None:
        init = env["__init__"]
        init.__qualname__ = f"{cls.__qualname__}.__init__"
        init.__module__ = cls.__module__
        cls.__init__ = init
    return env["decode"]


def _row_reader(cls: type, name: str, row: type) -> Callable[[list], list]:
    """A list field's elements as ``row.from_wire(element)`` (a typed row, e.g. a NamedTuple),
    or MeshError(INVALID_REQUEST) naming the field when one is not an array of its shape."""
    make = row.from_wire   # ValueError (or TypeError) unless its argument is an array of the row's shape

    def read(v: list) -> list:
        try:
            return [make(x) for x in v]
        except (TypeError, ValueError) as exc:
            raise MeshError(ErrorCode.INVALID_REQUEST, f"{cls.__name__}.{name}: {exc}") from None

    return read


def _row_getter(get: Callable[[Any], tuple], index: int, row: type) -> Callable[[Any], tuple]:
    """``get`` with field ``index``'s rows turned into their wire arrays (``row.to_wire``)."""
    def getter(msg):
        vs = list(get(msg))
        vs[index] = [r.to_wire() if isinstance(r, row) else r for r in vs[index]]
        return tuple(vs)
    return getter


def message(op: str, rows: dict[str, type] | None = None):
    """Register a frozen, slotted dataclass as a wire message with operation ``op``.

    ``rows``: list fields whose elements are typed rows ({field: row class}); the wire keeps
    plain arrays: decoding makes each one ``row.from_wire(array)``, encoding packs a row as
    ``row.to_wire()`` when the class has one (a NamedTuple packs as its array otherwise)."""

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
        _REQUIRED[cls] = sum(1 for f in dataclasses.fields(cls)
                             if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)
        ROWS[cls] = dict(rows or {})
        _DECODERS[key] = (cls, _compile(cls, hints, ROWS[cls]))
        get = operator.attrgetter(*names) if names else (lambda msg: ())
        get = get if len(names) != 1 else (lambda msg, g=get: (g(msg),))
        for name, row in (rows or {}).items():
            if hasattr(row, "to_wire"):
                get = _row_getter(get, names.index(name), row)
        _GETTERS[cls] = get
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


def _bounded_unpackb(limits: DecodeLimits) -> Callable[[bytes], Any]:
    """``msgpack.unpackb`` bound to ``limits``, with only the bounds that can bind (each
    keyword costs msgpack time per call). msgpack's own default for a length bound is the
    body's length, and a string, binary, array or map of n bytes (elements) takes at least
    n bytes of the body: so "no bound" (0), and a bound of at least ``max_body_bytes``,
    decode every body exactly as the default does (a body that claims more than it holds
    fails either way). ``raw=False`` and ``use_list=True`` are msgpack's defaults."""
    kwargs: dict = {"strict_map_key": False, "max_ext_len": 0}
    body = limits.max_body_bytes
    for name in ("max_str_len", "max_bin_len", "max_array_len", "max_map_len"):
        bound = getattr(limits, name)
        if bound and not (body and bound >= body):
            kwargs[name] = bound
    return functools.partial(msgpack.unpackb, **kwargs)


class _TooManyContainers(Exception):
    pass


def _unpack_counted(body: bytes, limits: DecodeLimits, unpackb: Callable[[bytes], Any]) -> Any:
    """``unpackb(body)`` that stops at the ``max_body_containers``-th array or map (raises
    ``_TooManyContainers``), with the cyclic GC paused."""
    left = [limits.max_body_containers]

    def hook(obj):
        left[0] -= 1
        if left[0] < 0:
            raise _TooManyContainers
        return obj

    collecting = gc.isenabled()
    gc.disable()
    try:
        return unpackb(body, list_hook=hook, object_hook=hook)
    finally:
        if collecting:
            gc.enable()


def decode_body(op: bytes, body: bytes, limits: DecodeLimits | None = None) -> Any:
    """Decode a body for ``op``; any problem raises MeshError(INVALID_REQUEST, reason).
    ``limits``: bounds for an untrusted body (None: msgpack's defaults, bounded by the
    body's own length)."""
    if op.__class__ is not bytes:
        op = bytes(op)
    got = _DECODERS.get(op)
    if got is None:
        raise MeshError(ErrorCode.INVALID_REQUEST, f"unknown operation {op[:40]!r}")
    cls, decode = got
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
                got = _UNPACKERS[id(limits)] = (limits, _bounded_unpackb(limits))
            if limits.max_body_containers and len(body) > limits.max_body_containers:
                values = _unpack_counted(body, limits, got[1])
            else:
                values = got[1](body)
    except _TooManyContainers:
        raise MeshError(ErrorCode.INVALID_REQUEST, f"{cls.__name__}: body of {len(body)} bytes holds more than "
                                                   f"{limits.max_body_containers} arrays and maps "
                                                   f"(max_body_containers)") from None
    except MeshError:
        raise
    except Exception as exc:  # msgpack raises several types for bad input (and limits)
        raise MeshError(ErrorCode.INVALID_REQUEST, f"{cls.__name__}: body is not msgpack ({exc})")
    if values.__class__ is not list:
        raise MeshError(ErrorCode.INVALID_REQUEST, f"{cls.__name__}: body must be an array")
    try:
        return decode(values)   # checks the count and each field's type (MeshError), then builds
    except MeshError:
        raise
    except (TypeError, ValueError) as exc:
        raise MeshError(ErrorCode.INVALID_REQUEST, f"{cls.__name__}: {exc}")


def pack(protocol: bytes, request_id: int, msg: Any, payload: bytes | None = None) -> list:
    """Frames for one message (without the ROUTER identity)."""
    if payload is None:
        return [protocol, request_id.to_bytes(8, "big"), msg.OP, encode_body(msg)]
    return [protocol, request_id.to_bytes(8, "big"), msg.OP, encode_body(msg), payload]


def unpack(frames: list, limits: DecodeLimits | None = None,
           peer_limits: DecodeLimits | None = None) -> tuple[bytes, int, Any, Any]:
    """(protocol, request id, message, payload or None) from frames without identity.
    ``limits`` bound client bodies, ``peer_limits`` peer bodies (None: unbounded but
    for the body's own length)."""
    n = len(frames)
    if n != 4 and n != 5:
        raise MeshError(ErrorCode.INVALID_REQUEST,
                        f"expected 4 or 5 frames [protocol, request id, op, body, payload?], got {n}")
    protocol = frames[0]
    if protocol.__class__ is not bytes:
        protocol = bytes(protocol)
    if protocol == PROTOCOL_CLIENT:
        bounds = limits
    elif protocol == PROTOCOL_PEER:
        bounds = peer_limits
    else:
        raise MeshError(ErrorCode.UNSUPPORTED_VERSION,
                        f"unknown protocol {protocol[:40]!r}; this broker speaks {PROTOCOL_CLIENT!r}")
    rid = frames[1]
    if rid.__class__ is not bytes:
        rid = bytes(rid)
    if len(rid) != 8:
        raise MeshError(ErrorCode.INVALID_REQUEST, "request id must be 8 bytes")
    msg = decode_body(frames[2], frames[3], bounds)
    return protocol, int.from_bytes(rid, "big"), msg, frames[4] if n == 5 else None
