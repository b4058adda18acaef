"""The broker's check of a batch's columns (``mesh.wire.record_check``, through
``validate_batch``): what Kafka's LogValidator refuses is refused, with INVALID_RECORD and a
reason; null values and header values are records, not damage."""
import zlib

import msgpack
import pytest
from hypothesis import given, settings, strategies as st

from mesh.wire import record_check
from mesh.wire.errors import ErrorCode, MeshError
from mesh.wire.records import _PREFIX_CRC, _TAIL, MAGIC, decode_batch, encode_batch, records_from, validate_batch


def raw_batch(payload: bytes, n: int, first_ts: int = 0, max_ts: int = 0, attributes: int = 0) -> bytes:
    """A batch with a good header and CRC around any payload (what a hostile client can send)."""
    tail = _TAIL.pack(MAGIC, attributes, 0, n, first_ts, max_ts, -1, -1, len(payload))
    return b"".join((_PREFIX_CRC.pack(0, 0, zlib.crc32(payload, zlib.crc32(tail))), tail, payload))


def cols(*c) -> bytes:
    return msgpack.packb(list(c), use_bin_type=True)


POISON = {   # name: (payload, record count, words the reason names, with either decoder)
    "int key": (cols([b"a", b"b"], [b"k", 7], None, None), 2, "keys int"),
    "str delta": (cols([b"a", b"b"], None, [0, "5"], None), 2, "deltas str"),
    "bool delta": (cols([b"a", b"b"], None, [0, True], None), 2, "deltas bool"),
    "float delta": (cols([b"a", b"b"], None, [0, 1.5], None), 2, "deltas float"),
    "map value": (cols([{b"x": 1}], None, None, None), 1, "values|map"),
    "str value": (cols(["text"], None, None, None), 1, "values str"),
    "list value": (cols([[b"x"]], None, None, None), 1, "values array"),
    "keys a map": (cols([b"a"], {"k": 1}, None, None), 1, "keys|map"),
    "header not a pair": (cols([b"a"], None, None, [[[b"h"]]]), 1, "headers"),
    "header a str": (cols([b"a"], None, None, [["hv"]]), 1, "headers"),
    "header of three": (cols([b"a"], None, None, [[["h", b"v", b"x"]]]), 1, "headers"),
    "header name bytes": (cols([b"a"], None, None, [[[b"h", b"v"]]]), 1, "headers"),
    "header value int": (cols([b"a"], None, None, [[["h", 3]]]), 1, "headers int"),
    "headers not arrays": (cols([b"a"], None, None, [5]), 1, "headers"),
    "trailing bytes": (cols([b"a"], None, None, None) + b"\xc0", 1, "trailing bytes"),
    "keys too short": (cols([b"a", b"b"], [b"k"], None, None), 2, "keys column"),
    "five columns": (msgpack.packb([[b"a"], None, None, None, None]), 1, "payload|payload"),
    "bad utf-8 str": (b"\x94\x91\xa1\xff\xc0\xc0\xc0", 1, "msgpack|values"),
    "ext value": (cols([msgpack.ExtType(1, b"x")], None, None, None), 1, "msgpack|values"),
}


@pytest.fixture(params=["msgspec", "msgpack"])
def decoder(request, monkeypatch):
    """Both decoders give the same verdicts: msgspec's typed one, and the msgpack path used
    where msgspec is not installed."""
    if request.param == "msgpack":
        monkeypatch.setattr(record_check, "_decoder", None)
    elif record_check._decoder is None:
        pytest.skip("msgspec is not installed")
    return request.param


def _names(message: str, words: str) -> bool:
    """Every word of one of the |-separated alternatives is in the message."""
    return any(all(w in message for w in alt.split()) for alt in words.split("|"))


@pytest.mark.parametrize("name", sorted(POISON))
def test_a_poison_batch_is_refused_with_a_reason(name, decoder):
    payload, n, why = POISON[name]
    with pytest.raises(MeshError) as e:
        validate_batch(raw_batch(payload, n), 1 << 20)
    assert e.value.code in (ErrorCode.INVALID_RECORD, ErrorCode.INVALID_REQUEST), e.value
    assert _names(e.value.message, why), e.value.message
    # and a consumer reading one that an unchecked broker stored gets a MeshError, not an int
    if e.value.code == ErrorCode.INVALID_RECORD:
        with pytest.raises(MeshError):
            records_from("t", 0, raw_batch(payload, n))


def test_flags_and_timestamps_that_lie_are_refused(decoder):
    good = cols([b"a", b"b"], None, [0, 5], None)
    assert validate_batch(raw_batch(good, 2, 100, 105), 1 << 20).record_count == 2
    for attrs in (0x01, 0x02, 0x80):   # control batch, unknown flags
        with pytest.raises(MeshError) as e:
            validate_batch(raw_batch(good, 2, 100, 105, attributes=attrs), 1 << 20)
        assert e.value.code == ErrorCode.INVALID_RECORD and "attributes" in e.value.message
    for first, mx, payload in ((100, 200, good), (100, 100, good), (0, 5, cols([b"a"], None, None, None)),
                               (100, 105, cols([b"a", b"b"], None, [1, 5], None)),
                               (3, 5, cols([b"a", b"b"], None, [0, -5], None)),
                               (100, 105, cols([b"a", b"b"], None, [0, True], None))):
        n = 2 if payload != cols([b"a"], None, None, None) else 1
        with pytest.raises(MeshError) as e:
            validate_batch(raw_batch(payload, n, first, mx), 1 << 20)
        assert e.value.code == ErrorCode.INVALID_RECORD, (first, mx, payload)


values = st.lists(st.one_of(st.none(), st.binary(max_size=30)), min_size=1, max_size=40)


@settings(max_examples=300, deadline=None)
@given(values, st.data())
def test_null_values_round_trip_and_pass_the_broker_check(vals, data):   # (with msgspec, when installed)
    """Property: any mix of None, b"" and bytes comes back as it went in (None is not b"")."""
    n = len(vals)
    keys = data.draw(st.one_of(st.none(), st.lists(st.one_of(st.none(), st.binary(max_size=8)),
                                                   min_size=n, max_size=n)))
    tss = data.draw(st.one_of(st.integers(0, 2**41), st.lists(st.integers(0, 2**41), min_size=n, max_size=n)))
    hdrs = data.draw(st.one_of(st.none(), st.lists(st.lists(st.tuples(st.text(max_size=4),
                                                                      st.one_of(st.none(), st.binary(max_size=4))),
                                                            max_size=2).map(lambda x: [list(p) for p in x]),
                                                   min_size=n, max_size=n)))
    b = encode_batch(vals, keys, tss, hdrs)
    h = validate_batch(b, 1 << 22)
    _, vs, _, _, _ = decode_batch(b)
    assert vs == vals and [v is None for v in vs] == [v is None for v in vals]
    out = records_from("t", 0, b)
    assert [r.value for r in out] == vals
    assert [r.key for r in out] == (keys if keys is not None else [None] * n)
    assert [r.timestamp for r in out] == (tss if isinstance(tss, list) else [tss] * n)
    assert h.max_timestamp_ms == max(r.timestamp for r in out)
    if hdrs is not None:
        assert [[list(p) for p in r.headers] for r in out] == hdrs
