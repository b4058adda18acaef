import msgpack
import pytest
from hypothesis import given, settings, strategies as st

from mesh.wire import messages as m
from mesh.wire.errors import ErrorCode, MeshError, retriable
from mesh.wire.codec import PROTOCOL_CLIENT, decode_body, pack, unpack


def test_round_trip_every_client_message():
    msgs = [
        m.ProduceRequest("orders", 3, -1, 500),
        m.ProduceResponse(0, "", 42, 0, None),
        m.FetchRequest([["orders", 0, 10, 1024]], 100, 1, 4096),
        m.FetchResponse([["orders", 0, 0, 12, 0, 100, None]]),
        m.MetadataRequest(None),
        m.MetadataResponse(0, [{"id": "n1", "address": "127.0.0.1:1"}], [], "n1"),
        m.CreateTopicRequest("t", 6, 1, {"retention.ms": "10"}),
        m.DeleteTopicRequest("t"),
        m.ListOffsetsRequest([["t", 0, m.EARLIEST]]),
        m.ErrorResponse(int(ErrorCode.NOT_LEADER), "not me", "127.0.0.1:7102"),
    ]
    for msg in msgs:
        proto, rid, back, payload = unpack(pack(PROTOCOL_CLIENT, 7, msg, b"raw"))
        assert (proto, rid, back, payload) == (PROTOCOL_CLIENT, 7, msg, b"raw")


def test_defaults_fill_missing_trailing_fields():
    body = msgpack.packb(["orders", 1, 1])
    assert decode_body(b"PRODUCE", body) == m.ProduceRequest("orders", 1, 1)


@pytest.mark.parametrize("op,body,needle", [
    (b"NOPE", msgpack.packb([]), "unknown operation"),
    (b"PRODUCE", b"\xc1garbage", "not msgpack"),
    (b"PRODUCE", msgpack.packb({"topic": "x"}), "must be an array"),
    (b"PRODUCE", msgpack.packb([1, 0, 1]), "ProduceRequest.topic: expected str, got int"),
    (b"PRODUCE", msgpack.packb(["t", "0", 1]), "partition: expected int"),
    (b"PRODUCE", msgpack.packb(["t"]), "required"),
    (b"PRODUCE", msgpack.packb(["t", 0, 1, 5, 6, 7]), "at most"),
    (b"FETCH", msgpack.packb([{"a": 1}]), "parts: expected list"),
])
def test_bad_bodies_are_invalid_request_with_reason(op, body, needle):
    with pytest.raises(MeshError) as e:
        decode_body(op, body)
    assert e.value.code == ErrorCode.INVALID_REQUEST
    assert needle in e.value.message


def test_bad_envelopes():
    with pytest.raises(MeshError) as e:
        unpack([b"mesh/1", b"x"])
    assert "frames" in e.value.message
    with pytest.raises(MeshError) as e:
        unpack([b"http/1.1", (1).to_bytes(8, "big"), b"PRODUCE", b"\x90"])
    assert e.value.code == ErrorCode.UNSUPPORTED_VERSION
    with pytest.raises(MeshError) as e:
        unpack([b"mesh/1", b"123", b"PRODUCE", b"\x90"])
    assert "request id" in e.value.message


def test_bool_is_not_an_int():
    with pytest.raises(MeshError):
        decode_body(b"PRODUCE", msgpack.packb(["t", True, 1]))


def test_retriable_flags():
    assert retriable(ErrorCode.NOT_LEADER) and retriable(ErrorCode.TIMEOUT)
    assert not retriable(ErrorCode.MESSAGE_TOO_LARGE) and not retriable(ErrorCode.INVALID_REQUEST)
    assert MeshError(ErrorCode.NOT_ENOUGH_REPLICAS).retriable


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=64), min_size=1, max_size=5))
def test_any_frames_decode_or_raise_mesh_error(frames):
    try:
        unpack(frames)
    except MeshError:
        pass
