"""The Spark source and sink with null values, starting offsets by timestamp, and batches
whose columns are not records (stored by an older broker)."""
from __future__ import annotations

import pytest

from tests.spark.conftest import consume_all, produce

pytestmark = pytest.mark.spark


def _read(spark, broker, topic, **opts):
    r = spark.read.format("mesh").option("bootstrap", broker.address).option("topic", topic)
    for k, v in opts.items():
        r = r.option(k, v)
    return r.load()


def test_null_values_are_nulls_both_ways(spark, broker, new_topic):
    src, dst = new_topic(1), new_topic(1)
    produce(broker.address, src, [{"value": None, "key": b"a", "partition": 0},
                                  {"value": b"", "key": b"b", "partition": 0},
                                  {"value": b"x", "key": b"c", "partition": 0,
                                   "headers": [("h", None)]}])
    rows = sorted(_read(spark, broker, src).collect(), key=lambda r: r.offset)
    assert [(bytes(r.key), None if r.value is None else bytes(r.value)) for r in rows] == [
        (b"a", None), (b"b", b""), (b"c", b"x")]
    assert [(h.key, h.value) for h in rows[2].headers] == [("h", None)]
    # the sink writes a null value as a null value (not as b"")
    df = spark.createDataFrame([("k1", None), ("k2", ""), (None, None)], "key string, value string")
    df.write.format("mesh").mode("append").option("bootstrap", broker.address).option("topic", dst).save()
    got = {r.key: r.value for r in consume_all(broker.address, dst)}
    assert got == {b"k1": None, b"k2": b"", None: None}


def test_starting_offsets_by_timestamp(spark, broker, new_topic):
    from mesh.spark.options import MeshSparkError
    t = new_topic(2, config={"retention.ms": -1})   # stamped in 1970: kept from retention by time
    produce(broker.address, t, [{"value": b"p0-%d" % i, "partition": 0, "timestamp_ms": 1000 * (i + 1)}
                                for i in range(4)]
            + [{"value": b"p1-%d" % i, "partition": 1, "timestamp_ms": 10_000 + i} for i in range(3)])
    values = lambda df: sorted(bytes(r.value) for r in df.collect())
    df = _read(spark, broker, t, startingOffsetsByTimestamp=f'{{"{t}": {{"0": 2500, "1": 10001}}}}')
    assert values(df) == [b"p0-2", b"p0-3", b"p1-1", b"p1-2"]
    df = _read(spark, broker, t, startingTimestamp="4000")
    assert values(df) == [b"p0-3", b"p1-0", b"p1-1", b"p1-2"]
    # no record at or after it: an error by default (as Spark's Kafka source), latest on request
    with pytest.raises(Exception, match="startingOffsetsByTimestampStrategy"):
        _read(spark, broker, t, startingTimestamp="99999").collect()
    df = _read(spark, broker, t, startingTimestamp="10002", startingOffsetsByTimestampStrategy="latest")
    assert values(df) == [b"p1-2"]
    with pytest.raises(Exception, match="every subscribed partition"):
        _read(spark, broker, t, startingOffsetsByTimestamp=f'{{"{t}": {{"0": 1}}}}').collect()
    with pytest.raises(MeshSparkError):
        from mesh.spark.options import MeshOptions
        MeshOptions({"bootstrap": "x", "topic": t, "startingOffsetsByTimestamp": '{"t": {"0": "soon"}}'})


def test_a_batch_that_is_not_records_is_a_clear_error_or_skipped():
    """``to_arrow`` hands a batch whose columns are not records to ``on_bad`` (read_range:
    MeshSparkError naming it and failOnDataLoss, or skipped when failOnDataLoss=false)
    instead of failing with a bare TypeError."""
    import zlib

    import msgpack
    import pyarrow as pa

    from mesh.spark.arrow import arrow_schema, to_arrow
    from mesh.wire.records import _PREFIX_CRC, _TAIL, MAGIC, encode_batch, iter_batches, patch_batch
    payload = msgpack.packb([[b"p", b"q"], [1, 2], None, None], use_bin_type=True)   # int keys
    tail = _TAIL.pack(MAGIC, 0, 0, 2, 5, 5, -1, -1, len(payload))
    bad = patch_batch(b"".join((_PREFIX_CRC.pack(0, 0, zlib.crc32(payload, zlib.crc32(tail))), tail, payload)), 1, 1)
    data = patch_batch(encode_batch([b"a"], timestamps_ms=5), 0, 1) + bad + \
        patch_batch(encode_batch([b"d"], timestamps_ms=5), 3, 1)
    batches = list(iter_batches(data))
    seen = []
    rb = to_arrow(pa, arrow_schema(), "t", 0, batches, 0, 4, lambda h, exc: seen.append((h.base_offset, exc.message)))
    assert rb.column(1).to_pylist() == [b"a", b"d"] and rb.column(4).to_pylist() == [0, 3]
    assert [off for off, _ in seen] == [1] and "record keys" in seen[0][1] and "int" in seen[0][1]
    from mesh.wire.errors import MeshError
    with pytest.raises(MeshError, match="record keys"):
        to_arrow(pa, arrow_schema(), "t", 0, batches, 0, 4)


def _compacted_topic(broker, admin, name, writes):
    """A compacted topic holding ``writes`` [(key, value)], compacted to its end."""
    from mesh.testing.launcher import wait_until
    admin.create_topic(name, partitions=1, config={"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.01"})
    produce(broker.address, name, [{"key": k, "value": v, "partition": 0} for k, v in writes])

    def compacted():
        p = admin.describe_topic(name)["partitions"][0]
        return p.get("local_clean_end") == p["high_watermark"] == len(writes)
    wait_until(compacted, 20, f"{name} compacted")


def test_a_compacted_topic_reads_with_its_gaps(spark, broker, admin):
    """Offsets of a compacted partition have gaps; the source steps over them (issue 40)."""
    import os
    t = f"compacted-{os.getpid()}"
    writes = [(b"k%d" % (i % 7), b"v%d" % i) for i in range(200)] + [(b"k3", None)]
    _compacted_topic(broker, admin, t, writes)
    rows = sorted(_read(spark, broker, t).collect(), key=lambda r: r.offset)
    latest = {}
    for i, (k, v) in enumerate(writes):
        latest[k] = (i, v)
    want = sorted((i, k, v) for k, (i, v) in latest.items())   # the tombstone is kept (1 day)
    assert [(r.offset, bytes(r.key), None if r.value is None else bytes(r.value)) for r in rows] == want
    # a range that starts and ends inside the gaps
    got = _read(spark, broker, t, startingOffsets=f'{{"{t}": {{"0": 5}}}}',
                endingOffsets=f'{{"{t}": {{"0": {want[-2][0]}}}}}').collect()
    assert sorted(r.offset for r in got) == [i for i, _k, _v in want if 5 <= i < want[-2][0]]


def test_to_arrow_of_a_compacted_batch():
    import pyarrow as pa

    from mesh.spark.arrow import arrow_schema, to_arrow
    from mesh.wire.records import encode_batch, iter_batches, patch_batch
    from storage.compaction import compact_batches
    b1 = patch_batch(encode_batch([b"1", b"2", b"3", b"4"], [b"a", b"b", b"a", b"c"], 5), 0, 1)
    b2 = patch_batch(encode_batch([b"5", b"6"], [b"c", b"d"], 6), 4, 1)
    batches = list(iter_batches(b"".join(compact_batches([b1, b2], 6, 0))))
    rb = to_arrow(pa, arrow_schema(), "t", 0, batches, 0, 6)
    assert rb.column(4).to_pylist() == [1, 2, 4, 5] and rb.column(1).to_pylist() == [b"2", b"3", b"5", b"6"]
    rb = to_arrow(pa, arrow_schema(), "t", 0, batches, 2, 5)
    assert rb.column(4).to_pylist() == [2, 4]
