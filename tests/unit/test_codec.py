import msgpack
import pytest
from hypothesis import given, settings, strategies as st

from mesh.wire import messages as m
from mesh.wire.errors import ErrorCode, MeshError, retriable
from mesh.wire.codec import PROTOCOL_CLIENT, decode_body, encode_body, pack, unpack


def test_round_trip_every_client_message():
    msgs = [
        m.ProduceRequest("orders", 3, -1, 500),
        m.ProduceResponse(0, "", 42, 0, None),
        m.FetchRequest([["orders", 0, 10, 1024]], 100, 1, 4096),
        m.FetchResponse([m.FetchPart("orders", 0, 0, 12, 0, 100, None)]),
        m.ListOffsetsResponse([m.OffsetsPart("t", 0, 0, 5, None), m.OffsetsPart("t", 1, 0, 3, None, 1500)]),
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


def test_fetch_and_list_offsets_parts_are_typed_rows_and_plain_arrays_on_the_wire():
    """The client protocol's fetch and list-offsets answers decode into typed rows; the wire
    keeps the arrays it always had (a list-offsets part asked by timestamp has six
    elements, the others five), so older clients and brokers read them as before."""
    fetch = m.FetchResponse([m.FetchPart("orders", 0, 0, 12, 0, 100, None)])
    assert msgpack.unpackb(encode_body(fetch)) == [[["orders", 0, 0, 12, 0, 100, None]], 0, ""]
    back = decode_body(b"FETCH_R", msgpack.packb([[["orders", 0, 6, -1, -1, 0, "127.0.0.1:1"]]]))
    assert back.parts[0].error == 6 and back.parts[0].leader == "127.0.0.1:1"
    offsets = m.ListOffsetsResponse([m.OffsetsPart("t", 0, 0, 5, None), m.OffsetsPart("t", 1, 0, 3, None, 1500)])
    assert msgpack.unpackb(encode_body(offsets))[0] == [["t", 0, 0, 5, None], ["t", 1, 0, 3, None, 1500]]
    five, six = decode_body(b"LIST_OFFSETS_R", encode_body(offsets)).parts
    assert (five.offset, five.timestamp, six.offset, six.timestamp) == (5, None, 3, 1500)
    for bad in ([["t", 0, 0]], [["t", 0, 0, 1, None, 2, 3]], ["t"], [7]):
        with pytest.raises(MeshError, match="OffsetsPart") as exc:
            decode_body(b"LIST_OFFSETS_R", msgpack.packb([bad]))
        assert exc.value.code == ErrorCode.INVALID_REQUEST
    with pytest.raises(MeshError, match="FetchPart"):
        decode_body(b"FETCH_R", msgpack.packb([[["orders", 0, 0]]]))


def test_acks_names_the_wire_values():
    assert (m.Acks.NONE, m.Acks.LEADER, m.Acks.ALL) == (0, 1, -1) and m.ACKS_WIRE == {0, 1, -1}
    assert [m.Acks.parse(v) for v in ("0", "1", "all", "-1", 0, 1, -1)] == [0, 1, -1, -1, 0, 1, -1]
    for bad in ("2", 2, None, 1.0, "ALL "):
        with pytest.raises(ValueError):
            m.Acks.parse(bad)
    assert msgpack.unpackb(encode_body(m.ProduceRequest("t", 0, m.Acks.ALL))) == ["t", 0, -1, 30_000]


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


def _sample(tp):
    """A value msgpack would give back for a field annotated ``tp``."""
    import types
    import typing
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return _sample(typing.get_args(tp)[0])
    base = origin or tp
    return {int: 7, float: 1.5, str: "s", bytes: b"b", bool: True, list: [1], tuple: [1], dict: {"k": 1},
            type(None): None}.get(base, None)


def test_generated_decoders_and_inits_build_what_the_dataclass_would():
    """``codec._compile``: for every registered message, the generated decoder and the
    generated ``__init__`` give the same message as the dataclass's own ``__init__`` (all
    fields, and only the required ones: defaults and fresh default factories)."""
    import dataclasses
    import typing
    import mesh.gossip, mesh.groups.messages, mesh.raft.messages  # noqa: F401 - register their messages
    from mesh.wire.codec import REGISTRY, ROWS, encode_body

    for op, cls in REGISTRY.items():
        fields = dataclasses.fields(cls)
        hints = typing.get_type_hints(cls)
        full = [_sample(hints[f.name]) if f.name not in ROWS[cls]
                else [ROWS[cls][f.name]._make(_sample(t) for t in typing.get_type_hints(ROWS[cls][f.name]).values())]
                for f in fields]
        required = [v for v, f in zip(full, fields)
                    if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
        defaults = [f.default if f.default_factory is dataclasses.MISSING else f.default_factory()
                    for f in fields[len(required):]]
        for values, expected in ((full, full), (required, required + defaults)):
            msg = decode_body(op, msgpack.packb(values))
            assert type(msg) is cls and [getattr(msg, f.name) for f in fields] == expected, cls
            assert msg == cls(*values) == cls(**{f.name: v for f, v in zip(fields, values)})
            assert decode_body(op, encode_body(msg)) == msg
        for f in fields:
            if f.default_factory is not dataclasses.MISSING:   # a fresh value per message
                assert getattr(cls(*required), f.name) is not getattr(cls(*required), f.name)
                assert getattr(decode_body(op, msgpack.packb(required)), f.name) is not \
                    getattr(decode_body(op, msgpack.packb(required)), f.name)
        if fields:
            with pytest.raises(dataclasses.FrozenInstanceError):
                setattr(cls(*full), fields[0].name, full[0])


def test_a_bad_field_is_named_and_an_int_must_fit_64_bits():
    for values, needle in ((["t", 1 << 63, 1], "partition: expected int (64-bit signed), got int"),
                           (["t", 0, 1, 2.5], "timeout_ms: expected int (64-bit signed), got float"),
                           (["t", 0, None], "acks: expected int (64-bit signed), got NoneType")):
        with pytest.raises(MeshError) as e:
            decode_body(b"PRODUCE", msgpack.packb(values))
        assert e.value.code == ErrorCode.INVALID_REQUEST and needle in e.value.message
    assert decode_body(b"PRODUCE", msgpack.packb(["t", -(1 << 63), (1 << 63) - 1])).acks == (1 << 63) - 1
