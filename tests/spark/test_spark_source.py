"""spark.read / spark.readStream .format("mesh") against a real broker."""
from __future__ import annotations

import json
import threading

import pytest

from mesh.wire.partitioner import partition_for_key
from mesh.testing.launcher import wait_until
from tests.spark.conftest import produce

pytestmark = pytest.mark.spark


def _read(spark, broker, topic, **opts):
    r = spark.read.format("mesh").option("bootstrap", broker.address).option("topic", topic)
    for k, v in opts.items():
        r = r.option(k, v)
    return r.load()


def test_batch_read_every_record_once_with_typed_columns(spark, broker, new_topic):
    from pyspark.sql.types import (
        ArrayType, BinaryType, IntegerType, LongType, StringType, StructType, TimestampType,
    )
    # stamped in 2023: under the default retention.ms (7 days by record time, as Kafka's) a
    # retention pass between the writes and the read deleted a partition's first batch (seen once)
    topic = new_topic(3, config={"retention.ms": -1})
    ts0 = 1_700_000_000_000
    records = []
    for i in range(600):
        r = {"value": f"v{i}".encode(), "timestamp_ms": ts0 + i}
        if i % 3 == 0:
            r["key"] = f"k{i % 50}".encode()
        else:
            r["partition"] = i % 3
        if i % 7 == 0:
            r["headers"] = [("h", f"{i}".encode()), ("trace", b"\x00\x01")]
        records.append(r)
    produce(broker.address, topic, records)

    df = _read(spark, broker, topic)
    s = df.schema
    assert [f.name for f in s.fields] == ["key", "value", "topic", "partition", "offset", "timestamp", "headers"]
    assert isinstance(s["key"].dataType, BinaryType) and isinstance(s["value"].dataType, BinaryType)
    assert isinstance(s["topic"].dataType, StringType) and isinstance(s["partition"].dataType, IntegerType)
    assert isinstance(s["offset"].dataType, LongType) and isinstance(s["timestamp"].dataType, TimestampType)
    h = s["headers"].dataType
    assert isinstance(h, ArrayType) and isinstance(h.elementType, StructType)
    assert [f.name for f in h.elementType.fields] == ["key", "value"]

    rows = df.selectExpr("*", "unix_millis(timestamp) AS ts_ms").collect()
    assert len(rows) == len(records)
    by_value = {bytes(r.value): r for r in rows}
    assert len(by_value) == len(records)  # every record exactly once
    per_partition: dict[int, list[int]] = {}
    for i, rec in enumerate(records):
        row = by_value[rec["value"]]
        assert row.topic == topic
        if "key" in rec:
            assert bytes(row.key) == rec["key"]
            assert row.partition == partition_for_key(rec["key"], 3)  # murmur2, as Kafka places it
        else:
            assert row.key is None and row.partition == rec["partition"]
        assert row.ts_ms == rec["timestamp_ms"]
        if "headers" in rec:
            assert [(x.key, bytes(x.value)) for x in row.headers] == rec["headers"]
        else:
            assert row.headers is None
        per_partition.setdefault(row.partition, []).append(row.offset)
    for p, offs in per_partition.items():  # offsets are 0..n-1 per partition, in send order
        assert sorted(offs) == list(range(len(offs)))
        vals = [int(bytes(r.value)[1:]) for r in sorted((r for r in rows if r.partition == p), key=lambda r: r.offset)]
        assert vals == sorted(vals)


def test_batch_read_offset_ranges_and_several_topics(spark, broker, new_topic):
    a, b = new_topic(2), new_topic(1)
    produce(broker.address, a, [{"value": b"a%d" % i, "partition": i % 2} for i in range(40)])
    produce(broker.address, b, [{"value": b"b%d" % i} for i in range(10)])
    df = _read(spark, broker, f"{a},{b}",
               startingOffsets=json.dumps({a: {"0": 5, "1": -2}}),
               endingOffsets=json.dumps({a: {"0": 15}, b: {"0": -1}}))
    got = sorted((r.topic, r.partition, r.offset) for r in df.select("topic", "partition", "offset").collect())
    want = sorted([(a, 0, o) for o in range(5, 15)] + [(a, 1, o) for o in range(20)] + [(b, 0, o) for o in range(10)])
    assert got == want
    # minPartitions cuts ranges into more tasks without changing the result
    df2 = _read(spark, broker, a, minPartitions=5)
    assert df2.rdd.getNumPartitions() >= 5
    assert sorted(r.offset for r in df2.select("offset").collect()) == sorted(list(range(20)) * 2)
    # subscribePattern
    pat = spark.read.format("mesh").option("bootstrap", broker.address).option("subscribePattern", f"{a}|{b}").load()
    assert pat.count() == 50


def test_stream_read_resumes_exactly_after_the_last_micro_batch(spark, broker, new_topic, tmp_path):
    from mesh.spark import lag

    topic = new_topic(2)
    produce(broker.address, topic, [{"value": b"%d" % i, "partition": i % 2} for i in range(100)])
    seen: dict[int, list[bytes]] = {}   # batch id -> values (a replayed batch overwrites itself)
    lock = threading.Lock()
    appended = threading.Event()

    def sink(df, batch_id):
        vals = [bytes(r.value) for r in df.select("value").collect()]
        with lock:
            seen[batch_id] = vals
        if not appended.is_set():  # new data arrives between micro-batches
            appended.set()
            produce(broker.address, topic, [{"value": b"%d" % i, "partition": i % 2} for i in range(100, 120)])

    def start(trigger: dict):
        return (spark.readStream.format("mesh").option("bootstrap", broker.address).option("topic", topic)
                .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", 30).load()
                .writeStream.foreachBatch(sink).option("checkpointLocation", str(tmp_path / "ck"))
                .trigger(**trigger).start())

    def total():
        with lock:
            return sum(len(v) for v in seen.values())

    q = start({"processingTime": "50 milliseconds"})
    try:
        wait_until(lambda: total() >= 120 or q.exception(), 60, "the stream to read 120 records")
        assert q.exception() is None
    finally:
        q.stop()
    progress = [p for p in q.recentProgress if p["numInputRows"]]
    assert progress and max(p["numInputRows"] for p in progress) <= 30  # admission control
    first = progress[0]
    assert lag(first)["total"] >= 100 - 30  # the first batch saw the backlog it left behind

    produce(broker.address, topic, [{"value": b"%d" % i, "partition": i % 2} for i in range(120, 150)])
    q = start({"availableNow": True})  # restart from the checkpoint
    q.awaitTermination(60)
    assert q.exception() is None
    last = [p for p in q.recentProgress if p["numInputRows"]][-1]
    assert lag(last)["total"] == 0
    values = sorted(int(v) for vals in seen.values() for v in vals)
    assert values == list(range(150))  # nothing lost, nothing twice


def test_errors_are_clear(spark, broker, new_topic):
    from pyspark.errors import PySparkException

    def fails(df_fn):
        with pytest.raises(PySparkException) as ei:
            df_fn()
        return str(ei.value)

    msg = fails(lambda: _read(spark, broker, "no-such-topic").collect())
    assert "unknown topic 'no-such-topic'" in msg

    msg = fails(lambda: spark.read.format("mesh").option("bootstrap", "127.0.0.1:1").option("topic", "x")
                .option("requestTimeoutMs", "300").load().collect())
    assert "cannot reach any mesh broker at '127.0.0.1:1'" in msg

    msg = fails(lambda: spark.read.format("mesh").option("topic", "x").load().collect())
    assert 'option "bootstrap" is required' in msg

    t = new_topic(1)
    msg = fails(lambda: _read(spark, broker, t, startingOffsets="latest").collect())
    assert "startingOffsets=latest is not allowed" in msg


def test_a_worker_python_without_the_package_is_named(spark):
    from mesh.spark import MeshSparkError, check_workers
    check_workers(spark)  # this venv's workers have everything
    with pytest.raises(MeshSparkError) as ei:
        check_workers(spark, modules=("mesh.spark", "no_such_module_for_mesh"))
    msg = str(ei.value)
    assert "cannot import no_such_module_for_mesh" in msg and "PYSPARK_PYTHON" in msg


def test_max_offsets_per_trigger_is_shared_by_backlog_and_exact():
    from mesh.spark.planning import rate_limit as _rate_limit
    a, b, c = ("t", 0), ("t", 1), ("t", 2)
    begin = {a: 0, b: 100, c: 5}
    end = {a: 900, b: 190, c: 15}   # backlogs 900, 90, 10
    got = _rate_limit(begin, end, 100)
    assert {tp: got[tp] - begin[tp] for tp in got} == {a: 90, b: 9, c: 1}
    assert _rate_limit(begin, end, 10_000) == end        # under the limit: everything
    tiny = _rate_limit(begin, end, 1)                    # progress even below one per partition
    assert sum(tiny[tp] - begin[tp] for tp in tiny) == 1 and tiny[a] == 1


def test_options_follow_kafka_names_and_offsets_round_trip_as_json():
    from mesh.spark.options import MeshOptions, MeshSparkError
    from mesh.spark.planning import offsets_from_json, offsets_to_json
    o = MeshOptions({"kafka.bootstrap.servers": "h:1", "SUBSCRIBE": "a, b", "maxOffsetsPerTrigger": "5"})
    assert o.bootstrap == "h:1" and o.topics == ["a", "b"] and o.max_offsets_per_trigger == 5
    assert MeshOptions({"bootstrap": "h:1", "subscribePattern": "or.*"}).pattern.fullmatch("orders")
    for bad, why in [({"topic": "a"}, "bootstrap"), ({"bootstrap": "h:1"}, "exactly one"),
                     ({"bootstrap": "h:1", "topic": "a", "subscribe": "b"}, "exactly one"),
                     ({"bootstrap": "h:1", "topic": "a", "maxOffsetsPerTrigger": "x"}, "not an integer"),
                     ({"bootstrap": "h:1", "subscribePattern": "("}, "not a valid regex")]:
        with pytest.raises(MeshSparkError, match=why):
            MeshOptions(bad)
    js = offsets_to_json({("orders", 1): 40, ("orders", 0): 23})
    assert json.dumps(js) == '{"orders": {"0": 23, "1": 40}}'
    assert offsets_from_json(json.loads(json.dumps(js))) == {("orders", 0): 23, ("orders", 1): 40}


def test_missing_pyarrow_is_named(monkeypatch):
    import sys

    from mesh.spark.options import MeshSparkError, require_pyarrow
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # "import pyarrow" now raises ImportError
    with pytest.raises(MeshSparkError, match="need pyarrow"):
        require_pyarrow()
