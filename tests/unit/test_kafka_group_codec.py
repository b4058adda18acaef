"""The consumer protocol embedded in classic group requests (``mesh.kafka.group_codec``):
every version a client sends (0-3) decodes, what kafka-python encodes is read the same,
what we encode kafka-python reads back, a newer version is read as 3, and hostile bytes
are refused with ``ProtocolError`` instead of an exception of any kind."""
from __future__ import annotations

import struct

import pytest
from kafka.protocol.consumer.metadata import ConsumerProtocolAssignment, ConsumerProtocolSubscription

from mesh.kafka.group_codec import (
    MAX_TOPICS, ProtocolError, build, choose_protocol, decode_assignment, decode_subscription,
    encode_assignment, encode_subscription, kafka_error, kafka_state,
)
from kio.schema.errors import ErrorCode as K
from mesh.wire.errors import ErrorCode as M


@pytest.mark.parametrize("version", [0, 1, 2, 3])
def test_roundtrip_every_version(version):
    owned = {("orders", 0), ("orders", 3), ("audit", 1)} if version >= 1 else set()
    sub = decode_subscription(encode_subscription(["orders", "audit"], owned, version=version, user_data=b"x"))
    assert sub.topics == ("audit", "orders")
    assert sub.owned == frozenset(owned)
    assert sub.version == version and sub.user_data == b"x"
    parts = {("orders", 2), ("orders", 0), ("audit", 5)}
    data = encode_assignment(parts, version)
    assert struct.unpack_from(">h", data)[0] == version
    assert decode_assignment(data) == frozenset(parts)


@pytest.mark.parametrize("version", [0, 1, 2, 3])
def test_kafka_python_encodings(version):
    """A real client's bytes: kafka-python 3's generated ConsumerProtocol classes."""
    kw = dict(version=version, topics=["a", "b"], user_data=b"u")
    if version >= 1:
        kw["owned_partitions"] = [ConsumerProtocolSubscription.TopicPartition(topic="a", partitions=[0, 2])]
    sub = decode_subscription(ConsumerProtocolSubscription(**kw).encode(version=version, header=True))
    assert sub.topics == ("a", "b")
    assert sub.owned == (frozenset({("a", 0), ("a", 2)}) if version >= 1 else frozenset())
    got = ConsumerProtocolAssignment.decode(encode_assignment([("a", 1), ("b", 0)], version))
    assert sorted((tp.topic, tp.partition) for tp in got.partitions()) == [("a", 1), ("b", 0)]


def test_a_newer_version_is_read_as_the_highest_known():
    data = bytearray(encode_subscription(["t"], {("t", 1)}, version=3))
    data[0:2] = struct.pack(">h", 7)
    data += b"\x00\x00\x00\x05later"          # fields a newer version appended
    sub = decode_subscription(bytes(data))
    assert sub.topics == ("t",) and sub.owned == {("t", 1)} and sub.version == 7
    assert struct.unpack_from(">h", encode_assignment([("t", 1)], sub.version))[0] == 3


@pytest.mark.parametrize("data", [
    b"", b"\x00", b"\xff\xff", b"\x00\x00\x00\x00\x00\x05", b"\x00\x01\x7f\xff\xff\xff",
    b"\x00\x01\x00\x00\x00\x00\xff\xff\xff\xff\x00\x00\x00\x05",   # owned: 5 entries, none there
    b"\x00\x00\x00\x00\x00\x01\x00\x00\xff\xff\xff\xff",   # an empty topic name
])
def test_garbage_is_a_protocol_error(data):
    with pytest.raises(ProtocolError):
        decode_subscription(data)


def test_bounds():
    with pytest.raises(ProtocolError):
        decode_subscription(encode_subscription([f"t{i}" for i in range(MAX_TOPICS + 1)]))
    with pytest.raises(ProtocolError):
        decode_subscription(b"\x00\x00" + b"\x00" * (1 << 20))
    long_name = encode_subscription(["x" * 250])
    with pytest.raises(ProtocolError):
        decode_subscription(long_name)


class _Proto:
    def __init__(self, name, metadata=b""):
        self.name, self.metadata = name, metadata


def test_protocol_choice_follows_the_clients_preference():
    assert choose_protocol([_Proto("mine"), _Proto("roundrobin", b"r"), _Proto("range")]) == ("roundrobin", b"r")
    assert choose_protocol([_Proto("cooperative-sticky", b"c"), _Proto("range")]) == ("cooperative-sticky", b"c")
    assert choose_protocol([_Proto("custom", b"x"), _Proto("mine")]) == ("custom", b"x")   # the default assignor
    assert choose_protocol([_Proto("mine"), _Proto("RoundRobinAssigner", b"k")]) == ("RoundRobinAssigner", b"k")
    assert choose_protocol([]) is None


def test_states_errors_and_build():
    assert [kafka_state(s) for s in ("empty", "stable", "reconciling", "dead", "odd")] == \
        ["Empty", "Stable", "PreparingRebalance", "Dead", "Dead"]
    assert kafka_error(M.UNKNOWN_MEMBER) == K.unknown_member_id
    assert kafka_error(M.TIMEOUT) == K.coordinator_not_available
    assert kafka_error(999) == K.unknown_server_error
    # a transient mesh code with no Kafka counterpart is one every client retries (kafkajs's
    # consumer crashes on UNKNOWN_SERVER_ERROR)
    for code in (M.LEADER_NOT_AVAILABLE, M.NOT_LEADER, M.THROTTLED, M.CORRUPT_MESSAGE):
        assert kafka_error(code) == K.coordinator_not_available
    assert kafka_error(M.INVALID_RECORD) == K.unknown_server_error
    from kio.schema.join_group.v0.response import JoinGroupResponse
    r = build(JoinGroupResponse, member_id="m", not_a_field=1)
    assert (r.member_id, r.leader, r.members, r.error_code) == ("m", "", (), K.none)
