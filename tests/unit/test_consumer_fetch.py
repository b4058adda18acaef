"""The consumer's handling of a fetch answer (``Consumer._handle_fetch`` and ``_take``),
fed by hand: no broker, no socket is opened. Batches are walked (length, CRC) once when the
answer comes and decoded later from that walk's headers; a partition the fetch did not ask
for is ignored, whatever it carries."""
import time

import pytest

from mesh.client.consumer import Consumer, TopicPartition
from mesh.wire.errors import ErrorCode, MeshError
from mesh.wire.messages import FetchPart, FetchResponse
from mesh.wire.records import encode_batch, patch_batch

ADDR = "127.0.0.1:1"   # never connected: nothing here sends


def batch(base: int, values: list[bytes]) -> bytes:
    return patch_batch(encode_batch(values, timestamps_ms=1000), base, 1)


def consumer_fetching(offsets: dict) -> tuple[Consumer, int]:
    """A consumer assigned ``offsets``' partitions at those positions, with one fetch of
    all of them in flight to ADDR (request id 7)."""
    c = Consumer(bootstrap=ADDR)
    c._assigned = list(offsets)
    c._positions = dict(offsets)
    c._inflight[7] = (ADDR, time.monotonic(), dict(offsets))
    c._busy_addrs.add(ADDR)
    return c, 7


def part(tp, payload: bytes, err: int = 0, hw: int = 0):
    return FetchPart(tp.topic, tp.partition, err, hw, 0, len(payload), None)


T0, T1 = TopicPartition("t", 0), TopicPartition("t", 1)


def test_records_come_from_the_walked_headers_and_positions_advance():
    c, rid = consumer_fetching({T0: 1})
    b1, b2 = batch(0, [b"a", b"b"]), batch(2, [b"c"])
    try:
        c._handle_fetch(rid, FetchResponse([part(T0, b1 + b2, hw=3)]), b1 + b2)
        assert c._positions[T0] == 3 and c.highwater(T0) == 3
        assert c.position(T0) == 1          # the next record poll returns (offset 0 is skipped)
        recs = [r for rs in c._take(100) for r in rs]
        assert [(r.offset, r.value, r.timestamp) for r in recs] == [(1, b"b", 1000), (2, b"c", 1000)]
    finally:
        c.close()


def test_a_partition_the_fetch_did_not_ask_for_is_ignored():
    """t/1 is not assigned and was not asked for: its batch, its high watermark and its
    (non-retriable) error are all ignored; t/0, which follows it in the payload, is read
    from the right bytes."""
    c, rid = consumer_fetching({T0: 0})
    stray, mine = batch(0, [b"x"] * 3), batch(0, [b"a"])
    try:
        parts = [part(T1, stray, hw=3), part(T1, b"", err=ErrorCode.UNKNOWN_TOPIC), part(T0, mine, hw=1)]
        c._handle_fetch(rid, FetchResponse(parts), stray + mine)
        assert T1 not in c._positions and c.highwater(T1) is None
        assert [(r.topic, r.partition, r.offset, r.value) for rs in c._take(100) for r in rs] == [
            ("t", 0, 0, b"a")]
        assert c._positions[T0] == 1
    finally:
        c.close()


def test_a_corrupt_or_truncated_batch_is_refused_when_the_answer_is_walked():
    for damage in (lambda b: b[:-1] + bytes([b[-1] ^ 1]),    # a flipped bit in the payload: CRC
                   lambda b: b[:-1]):                          # one byte short: truncated
        c, rid = consumer_fetching({T0: 0})
        bad = damage(batch(0, [b"a", b"b"]))
        try:
            with pytest.raises(MeshError) as e:
                c._handle_fetch(rid, FetchResponse([part(T0, bad, hw=2)]), bad)
            assert e.value.code == ErrorCode.CORRUPT_MESSAGE
            assert c._positions[T0] == 0 and not c._buffer
        finally:
            c.close()


def poison(base: int) -> bytes:
    """A batch an older broker stored unchecked: its keys are ints (the CRC holds)."""
    import zlib

    import msgpack

    from mesh.wire.records import _PREFIX_CRC, _TAIL, MAGIC
    payload = msgpack.packb([[b"p", b"q"], [1, 2], None, None], use_bin_type=True)
    tail = _TAIL.pack(MAGIC, 0, 0, 2, 1000, 1000, -1, -1, len(payload))
    return patch_batch(b"".join((_PREFIX_CRC.pack(0, 0, zlib.crc32(payload, zlib.crc32(tail))), tail, payload)),
                       base, 1)


class _Group:
    def __init__(self):
        self.seeks, self.consumed = [], []

    def on_seek(self, tp, offset):
        self.seeks.append((tp, offset))

    def on_consumed(self, out):
        self.consumed.extend(r.offset for rs in out for r in rs)


@pytest.mark.parametrize("in_group", [False, True])
def test_a_poison_batch_is_reported_clearly_and_a_group_member_is_not_stuck_on_it(in_group):
    """Records before it come first; then CORRUPT_MESSAGE names the batch (never an int key
    handed to the application). Without a group it stays until a seek; a group member skips
    it after reporting it once (its commit position moves past it)."""
    c, rid = consumer_fetching({T0: 0})
    if in_group:
        c._group = group = _Group()
    data = batch(0, [b"a"]) + poison(1) + batch(3, [b"d"])
    try:
        c._handle_fetch(rid, FetchResponse([part(T0, data, hw=4)]), data)
        assert [r.value for rs in c._take(100) for r in rs] == [b"a"]
        with pytest.raises(MeshError) as e:
            c._take(100)
        assert e.value.code == ErrorCode.CORRUPT_MESSAGE and "offsets 1..2" in e.value.message
        assert "record keys" in e.value.message and "int" in e.value.message   # the reason, named
        if not in_group:
            with pytest.raises(MeshError):
                c._take(100)          # still there: nothing skipped without the caller's say
            return
        assert group.seeks == [(T0, 3)]
        assert [(r.offset, r.value) for rs in c._take(100) for r in rs] == [(3, b"d")]
    finally:
        c._group = None
        c.close()
