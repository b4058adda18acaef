"""The consumer protocol embedded in classic group requests, and Kafka's names for the mesh's.

A classic Kafka consumer carries its subscription inside JoinGroup (``protocols[i].metadata``)
and receives its assignment inside SyncGroup (``assignment``), both as Kafka's
"ConsumerProtocol" bytes: an int16 version, then the ``ConsumerProtocolSubscription`` /
``ConsumerProtocolAssignment`` body of that version (0-3 here; a newer version is read as
3, as Kafka does: versions only add fields at the end). The bodies are ``kio``'s generated
dataclasses; this module only adds the version prefix, bounds, and the plain-Python
``Subscription`` the handlers use.

Everything decoded here came from the network: every count and name is checked, and a
malformed buffer is ``ProtocolError`` (the handler answers INCONSISTENT_GROUP_PROTOCOL).

Also here: which mesh assignor a Kafka protocol name means (``ASSIGNOR_OF``), Kafka's
state names for the mesh's group states, the mapping of mesh error codes onto Kafka's,
and ``build``, which fills a ``kio`` dataclass of any version from the fields it has.
"""
from __future__ import annotations

import dataclasses
import datetime
import importlib
import io
import struct
from dataclasses import dataclass
from typing import Any

from kio.schema.errors import ErrorCode as K
from kio.serial import entity_reader, entity_writer
from kio.static.primitive import i32Timedelta, i64Timedelta

from mesh.wire.errors import ErrorCode as M, retriable

__all__ = [
    "ProtocolError", "Subscription", "decode_subscription", "encode_subscription",
    "encode_assignment", "decode_assignment", "ASSIGNOR_OF", "KAFKA_NAME_OF", "choose_protocol",
    "kafka_state", "kafka_error", "build", "sibling", "MAX_TOPICS", "MAX_OWNED",
    "MAX_METADATA_BYTES",
]

MAX_TOPICS = 1_000            # topics in one subscription (the mesh's max_topics_per_member)
MAX_OWNED = 100_000           # owned partitions in one subscription
MAX_METADATA_BYTES = 1 << 20  # one protocol's embedded metadata
MAX_TOPIC_CHARS = 249
_HIGHEST = 3

# Kafka's assignor names -> the mesh's (mesh.groups.assignors). The mesh's coordinator moves
# partitions safely whatever the shape, so Kafka's eager "sticky" is served by the
# cooperative one.
ASSIGNOR_OF = {
    "range": "range",
    "roundrobin": "round-robin",
    "cooperative-sticky": "cooperative-sticky",
    "sticky": "cooperative-sticky",
    "RoundRobinAssigner": "round-robin",     # kafkajs's name for its default
}
KAFKA_NAME_OF = {"range": "range", "round-robin": "roundrobin", "cooperative-sticky": "cooperative-sticky"}

_STATE = {"empty": "Empty", "stable": "Stable", "reconciling": "PreparingRebalance", "dead": "Dead"}


class ProtocolError(ValueError):
    """Embedded consumer protocol bytes that cannot be used."""


def _module(kind: str, version: int):
    return importlib.import_module(f"kio.schema.consumer_protocol_{kind}.v{version}.data")


@dataclass(frozen=True, slots=True)
class Subscription:
    topics: tuple[str, ...]
    owned: frozenset[tuple[str, int]]
    version: int              # the embedded version the client used (its assignment uses it too)
    user_data: bytes | None = None


def _check_topic(name: Any) -> str:
    if not isinstance(name, str) or not 0 < len(name) <= MAX_TOPIC_CHARS:
        raise ProtocolError(f"bad topic name {name!r:.60}")
    return name


def _version(data: bytes) -> int:
    if not isinstance(data, (bytes, bytearray, memoryview)) or len(data) < 2:
        raise ProtocolError("embedded consumer protocol shorter than its version")
    if len(data) > MAX_METADATA_BYTES:
        raise ProtocolError(f"embedded consumer protocol of {len(data)} bytes (at most {MAX_METADATA_BYTES})")
    (version,) = struct.unpack_from(">h", data, 0)
    if version < 0:
        raise ProtocolError(f"embedded consumer protocol version {version}")
    return version


def decode_subscription(data: bytes) -> Subscription:
    """ConsumerProtocol subscription bytes (versions 0-3; newer read as 3) -> Subscription."""
    version = _version(data)
    read_as = min(version, _HIGHEST)
    cls = _module("subscription", read_as).ConsumerProtocolSubscription
    try:
        body, _ = entity_reader(cls)(bytes(data), 2)
    except Exception as exc:   # kio raises several types for short or garbled input
        raise ProtocolError(f"malformed subscription (v{version}): {exc}") from None
    topics = tuple(body.topics or ())
    if len(topics) > MAX_TOPICS:
        raise ProtocolError(f"{len(topics)} subscribed topics (at most {MAX_TOPICS})")
    seen = sorted({_check_topic(t) for t in topics})
    owned: set[tuple[str, int]] = set()
    for tp in getattr(body, "owned_partitions", ()) or ():
        topic = _check_topic(tp.topic)
        for p in tp.partitions or ():
            if not 0 <= p < (1 << 31):
                raise ProtocolError(f"bad partition {p}")
            owned.add((topic, int(p)))
            if len(owned) > MAX_OWNED:
                raise ProtocolError(f"more than {MAX_OWNED} owned partitions")
    return Subscription(tuple(seen), frozenset(owned), version, body.user_data)


def _grouped(partitions) -> list[tuple[str, list[int]]]:
    by_topic: dict[str, list[int]] = {}
    for t, p in sorted(partitions):
        by_topic.setdefault(t, []).append(p)
    return sorted(by_topic.items())


def _encode(cls, body, version: int) -> bytes:
    buf = io.BytesIO()
    buf.write(struct.pack(">h", version))
    entity_writer(cls)(buf, body)
    return buf.getvalue()


def encode_subscription(topics, owned=(), version: int = 1, user_data: bytes | None = None) -> bytes:
    """The bytes a classic client sends (tests; and DescribeGroups' member metadata)."""
    mod = _module("subscription", min(version, _HIGHEST))
    cls = mod.ConsumerProtocolSubscription
    fields = {"topics": tuple(sorted(topics)), "user_data": user_data}
    if version >= 1:
        fields["owned_partitions"] = tuple(mod.TopicPartition(topic=t, partitions=tuple(ps))
                                           for t, ps in _grouped(owned))
    return _encode(cls, build(cls, **fields), version)


def encode_assignment(partitions, version: int = 0, user_data: bytes | None = None) -> bytes:
    """ConsumerProtocol assignment bytes of ``version`` (capped at 3) for SyncGroup."""
    version = min(max(version, 0), _HIGHEST)
    mod = _module("assignment", version)
    cls = mod.ConsumerProtocolAssignment
    body = cls(assigned_partitions=tuple(mod.TopicPartition(topic=t, partitions=tuple(ps))
                                         for t, ps in _grouped(partitions)), user_data=user_data)
    return _encode(cls, body, version)


def decode_assignment(data: bytes) -> frozenset[tuple[str, int]]:
    """Assignment bytes -> partitions (tests, and a check of what SyncGroup returns)."""
    version = _version(data)
    cls = _module("assignment", min(version, _HIGHEST)).ConsumerProtocolAssignment
    try:
        body, _ = entity_reader(cls)(bytes(data), 2)
    except Exception as exc:
        raise ProtocolError(f"malformed assignment (v{version}): {exc}") from None
    return frozenset((tp.topic, int(p)) for tp in body.assigned_partitions for p in tp.partitions)


def choose_protocol(protocols) -> tuple[str, bytes] | None:
    """The client's first protocol (its order of preference) that names a mesh assignor;
    else its first protocol (a custom client-side assignor: as Kafka 4 does, the server's
    assignor serves it, here the group's default); None if it sent none."""
    protocols = list(protocols)
    for proto in protocols:
        if proto.name in ASSIGNOR_OF:
            return proto.name, proto.metadata
    return (protocols[0].name, protocols[0].metadata) if protocols else None


def kafka_state(mesh_state: str) -> str:
    return _STATE.get(mesh_state, "Dead")


_ERRORS = {
    M.NONE: K.none,
    M.UNKNOWN_MEMBER: K.unknown_member_id,
    M.FENCED_EPOCH: K.unknown_member_id,
    M.ILLEGAL_GENERATION: K.illegal_generation,
    M.REBALANCE_IN_PROGRESS: K.rebalance_in_progress,
    M.COORDINATOR_MOVED: K.not_coordinator,
    M.COORDINATOR_NOT_AVAILABLE: K.coordinator_not_available,
    M.TIMEOUT: K.coordinator_not_available,
    M.BROKER_UNAVAILABLE: K.coordinator_not_available,
    M.STORAGE_ERROR: K.coordinator_not_available,
    M.NOT_ENOUGH_REPLICAS: K.coordinator_not_available,
    M.UNKNOWN_TOPIC: K.unknown_topic_or_partition,
    M.UNKNOWN_PARTITION: K.unknown_topic_or_partition,
    M.UNAUTHORIZED: K.group_authorization_failed,
    M.INVALID_CONFIG: K.invalid_session_timeout,
    M.UNKNOWN_GROUP: K.group_id_not_found,
    M.GROUP_NOT_EMPTY: K.non_empty_group,
    M.INVALID_REQUEST: K.invalid_request,
}


def kafka_error(code: int) -> K:
    """The Kafka error code for a mesh one. A retriable mesh code with no counterpart above
    (a leader moving, THROTTLED) is COORDINATOR_NOT_AVAILABLE, which every client retries:
    UNKNOWN_SERVER_ERROR is fatal to some (kafkajs's consumer crashes and leaves its group);
    anything else unexpected is UNKNOWN_SERVER_ERROR."""
    try:
        mesh = M(code)
    except ValueError:
        return K.unknown_server_error
    got = _ERRORS.get(mesh)
    if got is None:
        return K.coordinator_not_available if retriable(mesh) else K.unknown_server_error
    return got


# ---------------------------------------------------------------------------------------
# Building kio dataclasses of any version

_NO_TIME32 = i32Timedelta.parse(datetime.timedelta(0))
_NO_TIME64 = i64Timedelta.parse(datetime.timedelta(0))
_ZERO = {"error_code": K.none, "timedelta_i32": _NO_TIME32, "timedelta_i64": _NO_TIME64,
         "int8": 0, "int16": 0, "int32": 0, "int64": 0, "bool": False, "bytes": b""}


def build(cls, **values):
    """An instance of the kio dataclass ``cls`` from those of ``values`` it has a field
    for; a required field not given gets its type's zero (strings "", arrays empty)."""
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.name in values:
            kwargs[f.name] = values[f.name]
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            kafka_type = f.metadata.get("kafka_type")
            if kafka_type == "string":
                kwargs[f.name] = ""
            elif kafka_type in _ZERO:
                kwargs[f.name] = _ZERO[kafka_type]
            else:
                kwargs[f.name] = ()
    return cls(**kwargs)


def sibling(request, name: str):
    """The class ``name`` of the response module of ``request``'s API and version."""
    module = type(request).__module__.rsplit(".", 1)[0] + ".response"
    return getattr(importlib.import_module(module), name)
