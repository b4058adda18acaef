import zlib

import pytest
from hypothesis import given, settings, strategies as st

from mesh.wire.errors import ErrorCode, MeshError
from mesh.wire.partitioner import murmur2, partition_for_key
from mesh.wire.records import (HEADER_SIZE, encode_batch, iter_batches, parse_header, patch_batch,
                          records_from, validate_batch)

record = st.tuples(st.one_of(st.none(), st.binary(max_size=20)), st.one_of(st.none(), st.binary(max_size=50)),
                   st.integers(0, 2**40), st.lists(st.tuples(st.text(max_size=5),
                                                             st.one_of(st.none(), st.binary(max_size=5))), max_size=2))


@settings(max_examples=200, deadline=None)
@given(st.lists(record, min_size=1, max_size=30), st.integers(0, 2**40), st.integers(0, 2**31 - 1))
def test_batch_round_trip(recs, base, epoch):
    keys = [r[0] for r in recs]
    values = [r[1] for r in recs]
    tss = [r[2] for r in recs]
    hdrs = [[list(h) for h in r[3]] for r in recs]
    b = encode_batch(values, keys, tss, hdrs, producer_id=9, base_sequence=4)
    h = validate_batch(b, 1 << 20)
    assert h.record_count == len(recs) and h.producer_id == 9 and h.base_sequence == 4
    stored = patch_batch(b, base, epoch)
    validate_batch(stored, 1 << 20)  # the patch is outside the CRC
    out = records_from("t", 2, stored)
    assert [r.offset for r in out] == list(range(base, base + len(recs)))
    assert [r.key for r in out] == keys and [r.value for r in out] == values   # None stays None, b"" stays b""
    assert [r.value is None for r in out] == [v is None for v in values]
    assert [r.timestamp for r in out] == tss
    assert [list(map(list, r.headers)) for r in out] == hdrs
    assert parse_header(stored).leader_epoch == epoch
    # reading from the middle skips the earlier records
    mid = base + len(recs) // 2
    assert [r.offset for r in records_from("t", 2, stored, mid)] == list(range(mid, base + len(recs)))


def test_validate_finds_every_kind_of_damage():
    b = encode_batch([b"v"] * 10)
    with pytest.raises(MeshError) as e:
        validate_batch(b, 20)
    assert e.value.code == ErrorCode.MESSAGE_TOO_LARGE
    with pytest.raises(MeshError) as e:
        validate_batch(b[:30], 1 << 20)
    assert "header" in e.value.message
    flipped = bytearray(b)
    flipped[-1] ^= 1
    with pytest.raises(MeshError) as e:
        validate_batch(bytes(flipped), 1 << 20)
    assert e.value.code == ErrorCode.CORRUPT_MESSAGE
    with pytest.raises(MeshError) as e:
        validate_batch(b + b"x", 1 << 20)
    assert "payload bytes" in e.value.message
    # a payload that is not the column layout, with a matching CRC
    bad_tail = bytearray(b[16:HEADER_SIZE]) + b"\x93\x01\x02\x03"
    bad_tail[36:40] = (4).to_bytes(4, "big")
    bad = b[:12] + zlib.crc32(bytes(bad_tail)).to_bytes(4, "big") + bytes(bad_tail)
    with pytest.raises(MeshError) as e:
        validate_batch(bad, 1 << 20)
    assert "payload" in e.value.message


def test_iter_batches_detects_truncation_and_corruption():
    two = patch_batch(encode_batch([b"a", b"b"]), 0, 1) + patch_batch(encode_batch([b"c"]), 2, 1)
    assert [h.base_offset for h, _ in iter_batches(two)] == [0, 2]
    with pytest.raises(MeshError):
        list(iter_batches(two[:-1]))
    bad = bytearray(two)
    bad[HEADER_SIZE + 3] ^= 0xFF
    with pytest.raises(MeshError):
        list(iter_batches(bytes(bad)))


def test_murmur2_matches_kafka_java_client():
    # org.apache.kafka.common.utils.UtilsTest#testMurmur2
    cases = {b"21": -973932308, b"foobar": -790332482, b"a-little-bit-long-string": -985981536,
             b"a-little-bit-longer-string": -1486304829,
             b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971, b"abc": 479470107}
    for key, expected in cases.items():
        assert murmur2(key) == expected


def test_partition_for_key_is_positive_modulo():
    assert partition_for_key(b"21", 7) == (-973932308 & 0x7FFFFFFF) % 7
    assert all(0 <= partition_for_key(bytes([i]), 6) < 6 for i in range(256))


def test_a_batch_cannot_claim_more_records_than_its_payload_has_bytes():
    """A 65-byte batch claiming 4,294,967,295 records was stored, and took that many offsets."""
    from mesh.wire.records import _PREFIX_CRC, _TAIL, MAGIC
    payload = b"\x94\xdd\xff\xff\xff\xff\xc0\xc0\xc0"   # [values: an array32 of 2**32-1, nil, nil, nil]
    tail = _TAIL.pack(MAGIC, 0, 0, 0xFFFFFFFF, 0, 0, -1, -1, len(payload))
    batch = _PREFIX_CRC.pack(0, 0, zlib.crc32(payload, zlib.crc32(tail))) + tail + payload
    with pytest.raises(MeshError, match="claims 4294967295 records in 9 payload bytes") as e:
        validate_batch(batch, 1 << 20)
    assert e.value.code == ErrorCode.INVALID_REQUEST
