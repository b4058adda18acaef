"""df.write / df.writeStream .format("mesh") against a real broker, including replays."""
from __future__ import annotations

import collections
import os

import pytest

from mesh.wire.partitioner import partition_for_key
from tests.spark.conftest import consume_all, produce

pytestmark = pytest.mark.spark


class _RecordingSender:
    """Stands in for the network: records the record batches the router cuts."""

    def __init__(self):
        self.batches = []

    def num_partitions(self, topic):
        return 3

    def batch_bytes(self, topic):
        return 2000

    def submit(self, topic, partition, values, keys, ts, headers):
        self.batches.append((topic, partition, list(values), keys and list(keys)))


@pytest.mark.parametrize("keyed", [False, True])
def test_rows_are_cut_into_the_same_record_batches_however_spark_chunks_them(keyed):
    """Exactly-once rests on this: the same rows give the same record batches, hence the same
    sequence numbers, whatever Arrow batch sizes Spark hands the sink on a replay."""
    import random

    import pyarrow as pa

    from mesh.spark.sink import _Router

    class Cfg:
        topic = "t"
        max_batch_records = 7
        columns = {"value": "value", "key": "key"} if keyed else {"value": "value"}

    rng = random.Random(7)
    values = [bytes(rng.randrange(0, 300)) for _ in range(500)]
    keys = [b"k%d" % rng.randrange(20) if rng.random() < 0.5 else None for _ in values]

    def cut(step):
        sender = _RecordingSender()
        router = _Router(Cfg, sender, 1, pa)
        for i in range(0, len(values), step):
            cols = [pa.array(values[i:i + step], pa.binary())]
            names = ["value"]
            if keyed:
                cols.append(pa.array(keys[i:i + step], pa.binary()))
                names.append("key")
            router.add(pa.RecordBatch.from_arrays(cols, names=names))
        router.close()
        return sender.batches

    first = cut(37)
    assert first == cut(1) == cut(500)
    assert sum(len(b[2]) for b in first) == 500
    assert all(len(b[2]) <= 7 for b in first)


@pytest.mark.parametrize("keyed,stop", [(False, 26), (False, 27), (True, 26)])
def test_a_replayed_task_appends_only_what_is_missing(broker, new_topic, monkeypatch, keyed, stop):
    """Below Spark: one task's rows written by a first attempt whose input ended early (so
    its last record batch was short), then by the full replay, then once more. The broker
    drops what it has, also inside a replayed batch that straddles its last sequence."""
    import pyarrow as pa
    from pyspark.sql.types import BinaryType, StructField, StructType

    from mesh.spark import sink as spark_sink
    from mesh.spark.sink import MeshSinkConfig, write_task

    topic = new_topic(2)
    fields = [StructField("value", BinaryType())] + ([StructField("key", BinaryType())] if keyed else [])
    cfg = MeshSinkConfig({"bootstrap": broker.address, "topic": topic, "maxBatchRecords": "4"}, StructType(fields))
    rows = [b"r%d" % i for i in range(90)]

    def rbs(n, step):
        for i in range(0, n, step):
            cols = [pa.array(rows[i:min(n, i + step)], pa.binary())]
            if keyed:
                cols.append(pa.array([b"k%d" % (j % 5) for j in range(i, min(n, i + step))], pa.binary()))
            yield pa.RecordBatch.from_arrays(cols, names=[f.name for f in fields])

    singles = []
    real_single = spark_sink._Chunk.single
    monkeypatch.setattr(spark_sink._Chunk, "single", lambda c, i: singles.append(i) or real_single(c, i))

    key = f"test/replay/{keyed}/{stop}"
    assert write_task(cfg, key, rbs(stop, 10)).records == stop   # the attempt whose input ended early
    assert write_task(cfg, key, rbs(90, 13)).records == 90       # the replay: all of the task's rows
    assert singles  # a replayed batch straddled what the broker had, and was probed
    write_task(cfg, key, rbs(90, 90))                            # and once more
    got = collections.Counter(r.value for r in consume_all(broker.address, topic))
    assert got == collections.Counter(rows)


def test_batch_write_then_read_back(spark, broker, new_topic):
    from pyspark.sql.types import (
        ArrayType, BinaryType, IntegerType, StringType, StructField, StructType,
    )
    topic = new_topic(3)
    header = StructType([StructField("key", StringType()), StructField("value", BinaryType())])
    schema = StructType([StructField("value", StringType()), StructField("key", StringType()),
                         StructField("partition", IntegerType()), StructField("headers", ArrayType(header))])
    rows = []
    for i in range(300):
        key = f"user-{i % 17}" if i % 2 == 0 else None
        part = 2 if i % 5 == 1 else None
        hdrs = [("n", str(i).encode())] if i % 4 == 0 else None
        rows.append((f"value-{i}", key, part, hdrs))
    df = spark.createDataFrame(rows, schema)  # two partitions (local[2]): two write tasks
    df.write.format("mesh").mode("append").option("bootstrap", broker.address).option("topic", topic).save()

    got = consume_all(broker.address, topic)
    assert sorted(r.value for r in got) == sorted(f"value-{i}".encode() for i in range(300))
    by_value = {r.value: r for r in got}
    for value, key, part, hdrs in rows:
        r = by_value[value.encode()]
        if part is not None:
            assert r.partition == part
        elif key is not None:
            assert r.key == key.encode() and r.partition == partition_for_key(key.encode(), 3)
        assert [tuple(h) for h in r.headers] == (hdrs or [])

    # and read back with the source: same records
    back = (spark.read.format("mesh").option("bootstrap", broker.address).option("topic", topic).load()
            .selectExpr("CAST(value AS STRING) AS v").collect())
    assert sorted(r.v for r in back) == sorted(f"value-{i}" for i in range(300))


def test_write_errors_are_clear(spark, broker, new_topic):
    from pyspark.errors import PySparkException
    df = spark.createDataFrame([("a",)], "value string")
    with pytest.raises(PySparkException) as ei:
        df.write.format("mesh").mode("append").option("bootstrap", broker.address).option("topic", "nope-x").save()
    assert "unknown topic 'nope-x'" in str(ei.value)
    with pytest.raises(PySparkException) as ei:
        spark.createDataFrame([(1,)], "n int").write.format("mesh").mode("append") \
            .option("bootstrap", broker.address).option("topic", new_topic()).save()
    assert 'needs a column "value"' in str(ei.value)
    with pytest.raises(PySparkException) as ei:
        df.write.format("mesh").mode("append").option("bootstrap", "127.0.0.1:1") \
            .option("requestTimeoutMs", "300").option("topic", "x").save()
    assert "cannot reach any mesh broker at '127.0.0.1:1'" in str(ei.value)


def _topic_to_topic(spark, broker, src, dst, ck, transform=None):
    df = (spark.readStream.format("mesh").option("bootstrap", broker.address).option("topic", src)
          .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", 100).load())
    df = transform(df) if transform else df.selectExpr("CAST(value AS STRING) AS value", "key")
    # 2 records per record batch: a replayed task re-sends more batches than the broker
    # remembers (5), so both kinds of duplicate answers are exercised
    return (df.writeStream.format("mesh").option("bootstrap", broker.address).option("topic", dst)
            .option("maxBatchRecords", 2).option("checkpointLocation", ck)
            .trigger(availableNow=True).start())


def _assert_exactly_once(broker, dst, n):
    got = collections.Counter(r.value for r in consume_all(broker.address, dst))
    doubled = {v: c for v, c in got.items() if c > 1}
    assert not doubled, f"records written more than once: {sorted(doubled)[:10]}"
    assert sorted(got) == sorted(b"m%d" % i for i in range(n))


def test_stream_replay_after_driver_crash_between_write_and_commit(spark, broker, new_topic, tmp_path):
    """The worst moment for a driver to die: every task wrote its rows, Spark has not yet
    written the micro-batch's commit log entry. The restarted query runs the batch again;
    the brokers must drop every record of it as a duplicate."""
    src, dst = new_topic(2), new_topic(3)
    produce(broker.address, src, [{"value": b"m%d" % i, "key": b"k%d" % (i % 13)} for i in range(200)])
    ck = str(tmp_path / "ck")
    q = _topic_to_topic(spark, broker, src, dst, ck)
    q.awaitTermination(60)
    assert q.exception() is None
    _assert_exactly_once(broker, dst, 200)
    last = max(int(f) for f in os.listdir(os.path.join(ck, "commits")) if f.isdigit())
    assert last == 1  # maxOffsetsPerTrigger=100: two micro-batches
    # the state a crash between "tasks wrote" and "commit log written" leaves behind
    os.remove(os.path.join(ck, "commits", str(last)))
    crc = os.path.join(ck, "commits", f".{last}.crc")
    if os.path.exists(crc):
        os.remove(crc)

    q = _topic_to_topic(spark, broker, src, dst, ck)
    q.awaitTermination(60)
    assert q.exception() is None
    replayed = [p for p in q.recentProgress if p["batchId"] == last]
    assert replayed and replayed[0]["numInputRows"] == 100  # the batch really ran again
    _assert_exactly_once(broker, dst, 200)


def test_stream_killed_mid_batch_then_restarted_writes_each_record_once(spark, broker, new_topic, tmp_path):
    """A poison row fails its task half way through a micro-batch, after some of the task's
    rows are already in the output topic; the query dies. Restarted (the poison is gone the
    second time), the output holds every input record exactly once."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType

    src, dst = new_topic(1), new_topic(2)
    pad = "x" * 4000  # big rows: the UDF worker's output buffer flushes rows on to the sink
    produce(broker.address, src, [{"value": f"m{i}|{pad}".encode()} for i in range(500)])
    marker = str(tmp_path / "poisoned-once")
    bootstrap = broker.address

    def poison(v):
        if v.startswith("m450|") and not os.path.exists(marker):
            open(marker, "w").close()
            # fail only once rows of this micro-batch (300..499) have reached the output topic
            from mesh.client import Admin
            from mesh.testing.launcher import wait_until
            with Admin(bootstrap) as a:
                wait_until(lambda: sum(p["high_watermark"] for p in a.describe_topic(dst)["partitions"]) >= 340,
                           30, "earlier rows of the micro-batch to be written")
            raise ValueError("poison row")
        return v

    udf = F.udf(poison, StringType(), useArrow=False)
    ck = str(tmp_path / "ck")

    def start():
        df = (spark.readStream.format("mesh").option("bootstrap", bootstrap).option("topic", src)
              .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", 300).load())
        return (df.select(udf(F.col("value").cast("string")).alias("value"))
                .writeStream.format("mesh").option("bootstrap", bootstrap).option("topic", dst)
                .option("maxBatchRecords", 10).option("checkpointLocation", ck)
                .trigger(availableNow=True).start())

    prev = spark.conf.get("spark.sql.execution.arrow.maxRecordsPerBatch")
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "10")  # rows reach the sink in small steps
    try:
        q = start()
        with pytest.raises(Exception):
            q.awaitTermination(90)
        assert "poison row" in str(q.exception())
        partial = len(consume_all(bootstrap, dst))
        assert 340 <= partial < 500  # the failed micro-batch left some of its rows behind
        q = start()
        q.awaitTermination(90)
        assert q.exception() is None
    finally:
        spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", prev)
    got = collections.Counter(r.value.split(b"|")[0] for r in consume_all(bootstrap, dst))
    assert {v: c for v, c in got.items() if c > 1} == {}
    assert sorted(got) == sorted(b"m%d" % i for i in range(500))
