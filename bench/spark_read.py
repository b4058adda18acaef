"""Spark source/sink speed: batch read rows/s and small streaming micro-batch latency.

    python -m bench.spark_read [--records 1000000] [--size 100] [--partitions 2] [--runs 3]
                               [--stream-batches 20] [--stream-records 10] [--json]

Starts a broker on a free 127.0.0.1 port in a temporary directory, fills a topic with
``--records`` records of ``--size`` bytes (bulk producer), then in a ``local[2]``
SparkSession (set PYSPARK_PYTHON to this venv's python):
  1. batch read: ``spark.read.format("mesh")`` of the whole topic into Spark's ``noop``
     sink (every column materialised, nothing else done), ``--runs`` times after one
     warm-up; prints rows/s of each run;
     then the same for a source that only hands over ready-made Arrow batches (the
     ceiling Spark's Python data source path allows on this machine at this moment),
     and a batch write of as many rows from ``spark.range`` through the mesh sink;
  2. streaming: a topic-to-topic query (mesh source -> CAST -> mesh sink, exactly-once)
     while the driver appends ``--stream-records`` records every 200 ms; prints, for the
     micro-batches that carried data, Spark's ``triggerExecution`` time and the
     end-to-end latency (append acknowledged -> record readable in the output topic),
     p50 / p95 / max.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time

from mesh.testing.launcher import BrokerProcess


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def _fill(addr: str, topic: str, records: int, size: int, partitions: int) -> float:
    from mesh.client import Producer
    values = [b"x" * size] * 1000
    t0 = time.perf_counter()
    with Producer(addr, acks=1, max_in_flight=8) as p:
        futs, sent, i = [], 0, 0
        while sent < records:
            n = min(1000, records - sent)
            futs.append(p.send_batch(topic, values[:n], partition=i % partitions))
            sent += n
            i += 1
            if len(futs) > 64:
                futs.pop(0).result()
        for f in futs:
            f.result()
    return time.perf_counter() - t0


def _batch_read(spark, addr: str, topic: str, records: int, runs: int) -> list[float]:
    df = (spark.read.format("mesh").option("bootstrap", addr).option("topic", topic)
          .option("startingOffsets", "earliest").option("endingOffsets", "latest").load())
    df.write.format("noop").mode("overwrite").save()  # warm-up: workers started, code loaded
    out = []
    for i in range(runs):
        t0 = time.perf_counter()
        df.write.format("noop").mode("overwrite").save()
        dt = time.perf_counter() - t0
        out.append(records / dt)
        print(f"  batch read {i + 1}: {records:,} rows in {dt:.2f} s = {records / dt:,.0f} rows/s", flush=True)
    (n,) = df.selectExpr("count(*)").first()
    assert n == records, f"read {n} rows, expected {records}"
    return out


def _ceiling(spark, records: int, size: int, partitions: int, runs: int) -> float:
    """rows/s of a Python source that only hands Spark ready-made Arrow batches of the same
    shape: what Spark's Python data source machinery costs on this machine, right now."""
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

    class Reader(DataSourceReader):
        def partitions(self):
            return [InputPartition(i) for i in range(partitions)]

        def read(self, part):
            import pyarrow as pa
            from mesh.spark.arrow import arrow_schema
            s = arrow_schema()
            left = records // partitions + (part.value < records % partitions)
            n = min(left, 100_000)
            cols = [pa.nulls(n, s.types[0]), pa.array([b"x" * size] * n, s.types[1]),
                    pa.repeat(pa.scalar("bench", s.types[2]), n), pa.repeat(pa.scalar(0, s.types[3]), n),
                    pa.array(range(n), s.types[4]), pa.repeat(pa.scalar(0, s.types[5]), n), pa.nulls(n, s.types[6])]
            rb = pa.RecordBatch.from_arrays(cols, schema=s)
            while left > 0:
                yield rb if left >= n else rb.slice(0, left)
                left -= n

    class Ceiling(DataSource):
        @classmethod
        def name(cls):
            return "mesh_bench_ceiling"

        def schema(self):
            from mesh.spark.arrow import spark_schema
            return spark_schema()

        def reader(self, schema):
            return Reader()

    spark.dataSource.register(Ceiling)
    df = spark.read.format("mesh_bench_ceiling").load()
    df.write.format("noop").mode("overwrite").save()
    best = 0.0
    for _ in range(runs):
        t0 = time.perf_counter()
        df.write.format("noop").mode("overwrite").save()
        best = max(best, records / (time.perf_counter() - t0))
    return best


def _batch_write(spark, addr: str, records: int, size: int, partitions: int) -> float:
    from mesh.client import Admin
    with Admin(addr) as a:
        a.create_topic("bench-write", partitions=partitions)
    df = spark.range(0, records, 1, partitions).selectExpr(f"CAST(repeat('x', {size}) AS BINARY) AS value")
    t0 = time.perf_counter()
    df.write.format("mesh").mode("append").option("bootstrap", addr).option("topic", "bench-write").save()
    dt = time.perf_counter() - t0
    print(f"  batch write: {records:,} rows in {dt:.2f} s = {records / dt:,.0f} rows/s", flush=True)
    return records / dt


def _stream(spark, addr: str, tmp: str, batches: int, per_batch: int) -> dict:
    from mesh.client import Admin, Consumer, Producer
    with Admin(addr) as a:
        a.create_topic("stream-in", partitions=1)
        a.create_topic("stream-out", partitions=1)
    q = (spark.readStream.format("mesh").option("bootstrap", addr).option("topic", "stream-in")
         .option("startingOffsets", "earliest").load()
         .selectExpr("CAST(value AS STRING) AS value")
         .writeStream.format("mesh").option("bootstrap", addr).option("topic", "stream-out")
         .option("checkpointLocation", os.path.join(tmp, "ck")).trigger(processingTime="0 seconds").start())
    sent: dict[bytes, float] = {}
    seen: dict[bytes, float] = {}
    stop = threading.Event()

    def watch():
        with Consumer("stream-out", bootstrap=addr, auto_offset_reset="earliest", fetch_max_wait_ms=5) as c:
            while not stop.is_set():
                for recs in c.poll_batches(50):
                    now = time.perf_counter()
                    for r in recs:
                        seen.setdefault(r.value, now)

    def wait_seen(keys, timeout_s=60.0):
        deadline = time.monotonic() + timeout_s
        while not all(k in seen for k in keys):
            if q.exception() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"records did not come through: {q.exception()}")
            time.sleep(0.005)

    w = threading.Thread(target=watch, daemon=True)
    w.start()
    total = 0
    try:
        with Producer(addr, acks="all", linger_ms=0) as p:
            for i in range(3):  # warm-up micro-batches, not measured
                p.send("stream-in", b"warm-%d" % i).get(30)
                wait_seen([b"warm-%d" % i])
                total += 1
            first_measured = None
            for b in range(batches):  # one append at a time: each is its own micro-batch
                keys = [b"%d-%d" % (b, i) for i in range(per_batch)]
                now = time.perf_counter()
                for k in keys:
                    sent[k] = now
                futs = [p.send("stream-in", k) for k in keys]
                p.flush()
                for f in futs:
                    f.get(30)
                if first_measured is None:
                    first_measured = max(x["batchId"] for x in q.recentProgress) + 1
                wait_seen(keys)
                total += per_batch
        deadline = time.monotonic() + 60  # let the last micro-batch report its progress
        while sum(x["numInputRows"] for x in q.recentProgress) < total and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        stop.set()
        q.stop()
        w.join(5)
    if q.exception() is not None:
        raise RuntimeError(f"streaming query failed: {q.exception()}")
    e2e = [seen[k] - t for k, t in sent.items()]
    progress = [x for x in q.recentProgress if x["numInputRows"] and x["batchId"] >= first_measured]
    trig = [x["durationMs"]["triggerExecution"] / 1000 for x in progress]
    if not trig:
        raise RuntimeError("no micro-batch progress recorded: "
                           + str([(x["batchId"], x["numInputRows"]) for x in q.recentProgress]))
    return {"micro_batches": len(trig), "records": len(e2e),
            "trigger_p50_s": _pct(trig, 0.5), "trigger_p95_s": _pct(trig, 0.95), "trigger_max_s": max(trig),
            "e2e_p50_s": _pct(e2e, 0.5), "e2e_p95_s": _pct(e2e, 0.95), "e2e_max_s": max(e2e)}


def run(args) -> dict:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    tmp = tempfile.mkdtemp(prefix="mesh-spark-bench-")
    broker = BrokerProcess("b1", os.path.join(tmp, "b1"), log_path=os.path.join(tmp, "broker.log"))
    addr = broker.address
    spark = None
    try:
        broker.start()
        from mesh.client import Admin
        with Admin(addr) as a:
            a.create_topic("bench", partitions=args.partitions)
        dt = _fill(addr, "bench", args.records, args.size, args.partitions)
        print(f"filled: {args.records:,} records of {args.size} B in {dt:.1f} s", flush=True)

        from pyspark.sql import SparkSession
        from mesh.spark import register
        t0 = time.perf_counter()
        spark = (SparkSession.builder.master("local[2]").appName("mesh-spark-bench")
                 .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
                 .config("spark.sql.shuffle.partitions", "2").getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")
        register(spark)
        print(f"SparkSession + register: {time.perf_counter() - t0:.1f} s", flush=True)
        rates = _batch_read(spark, addr, "bench", args.records, args.runs)
        res = {"records": args.records, "size": args.size, "partitions": args.partitions,
               "batch_rows_per_s": [round(r) for r in rates], "batch_rows_per_s_best": round(max(rates)),
               "batch_rows_per_s_median": round(statistics.median(rates))}
        print(f"batch read: median {res['batch_rows_per_s_median']:,} rows/s, best {res['batch_rows_per_s_best']:,}")
        res["ceiling_rows_per_s"] = round(_ceiling(spark, args.records, args.size, args.partitions, args.runs))
        print(f"  (ceiling on this machine now: a Python source handing over ready Arrow batches does "
              f"{res['ceiling_rows_per_s']:,} rows/s)", flush=True)
        res["batch_write_rows_per_s"] = round(_batch_write(spark, addr, args.records, args.size, args.partitions))
        st = _stream(spark, addr, tmp, args.stream_batches, args.stream_records)
        res["stream"] = st
        print(f"streaming, {st['micro_batches']} micro-batches with data ({args.stream_records} records per append): "
              f"triggerExecution p50 {st['trigger_p50_s'] * 1000:.0f} ms, p95 {st['trigger_p95_s'] * 1000:.0f} ms; "
              f"append -> visible in output topic p50 {st['e2e_p50_s'] * 1000:.0f} ms, "
              f"p95 {st['e2e_p95_s'] * 1000:.0f} ms, max {st['e2e_max_s'] * 1000:.0f} ms", flush=True)
        return res
    finally:
        if spark is not None:
            spark.stop()
        broker.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--partitions", type=int, default=2)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--stream-batches", type=int, default=20)
    ap.add_argument("--stream-records", type=int, default=10)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    res = run(args)
    if args.json:
        print(json.dumps(res))


if __name__ == "__main__":
    main()
