"""The PySpark job: recorded events in, per-cell throughput, latency percentiles and
per-second timelines out.

    bench analyze results/<run> [--master spark://host:7077]
    python -m bench.analysis results/<run> [--master URL]

Definitions (all computed by Spark; Python only formats the collected rows):
- production throughput = acknowledged records (and their key+value bytes) / (last ack -
  the phase's "go"); consumption throughput = records received / (last receive - its
  "go"). In streaming mode both phases share one "go". kB = 1000 bytes, as in the DSBS
  tables.
- produce latency of a record = ack time - intended send time of its batch, weighted by
  the batch's record count; end-to-end latency of a record = receive time - the
  producer's stamp in it (streaming cells only: in split mode records wait by design);
  per-record stamps arrive rounded down to 0.1 ms (``STAMP_QUANTUM_US``), so it may read
  up to 0.1 ms high.
- percentiles p50/p95/p99/p99.9 are exact (Spark's ``percentile`` with a frequency
  column, linear interpolation between closest ranks, like numpy's default).
- timelines: records/s, kB/s and latency p50/p99 per time bin since the phase's "go";
  bins are 1 s, or 100 ms when every phase of the run is shorter than 10 s.

The job reads Parquet and JSON from the run directory: with ``--master`` pointing at a
real cluster that directory must be readable by the executors (a shared filesystem, or
copy it to HDFS/S3 and pass that URL).
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

from bench.events import read_cells
from bench.scenarios import BenchError

__all__ = ["check_java", "spark_session", "spark_scope", "analyze", "PERCENTILES", "main"]

PERCENTILES = (0.5, 0.95, 0.99, 0.999)
PCT_NAMES = ("p50", "p95", "p99", "p999")

_CELLS_DDL = ("cell string, label string, `index` int, mode string, message_bytes long, batch long, "
              "linger_ms long, batch_bytes long, acks string, in_flight long, `keys` boolean, key_space long, "
              "producers long, consumers long, partitions long, replication_factor long, messages long, "
              "duration_s double, rate long, `group` string, topic string, produce_go_ns long, "
              "produce_end_ns long, consume_go_ns long, consume_end_ns long, produced long, consumed long, "
              "log_end long, produce_errors long, wall_s double")
_PRODUCE_DDL = ("cell string, producer int, partition int, send_ns long, intended_ns long, ack_ns long, "
                "count int, bytes long, error string")
_CONSUME_DDL = ("cell string, consumer int, partition int, recv_ns long, count int, bytes long, "
                "first_offset long, ts_us array<long>, ts_n array<int>")

_LOG4J2 = """rootLogger.level = warn
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n
logger.hadoop.name = org.apache.hadoop
logger.hadoop.level = error
logger.spark.name = org.apache.spark
logger.spark.level = warn
"""


def check_java(timeout_s: float = 20.0) -> str:
    """The ``java -version`` line, or BenchError saying how to get Java 17+."""
    java_home = os.environ.get("JAVA_HOME")
    java = os.path.join(java_home, "bin", "java") if java_home else shutil.which("java")
    hint = ("Spark needs Java 17 or newer for the analysis: install it (e.g. `apt-get install "
            "openjdk-17-jre-headless`) or set JAVA_HOME. Without Java, `bench run --skip-analysis` "
            "records the events and `bench analyze <run dir>` analyses them later")
    if not java or not os.path.exists(java):
        where = f"JAVA_HOME={java_home} has no bin/java" if java_home else "no `java` on PATH"
        raise BenchError(f"Java not found ({where}). {hint}")
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BenchError(f"`{java} -version` failed: {exc}. {hint}") from None
    text = (out.stderr or out.stdout).strip()
    m = re.search(r'version "(\d+)(?:\.(\d+))?', text)
    if out.returncode != 0 or not m:
        raise BenchError(f"`{java} -version` did not work: {text[:200]!r}. {hint}")
    major = int(m.group(1))
    if major == 1:
        major = int(m.group(2) or 0)
    if major < 17:
        raise BenchError(f"Java {major} found at {java}; {hint}")
    return text.splitlines()[0]


def spark_session(master: str | None = None, app_name: str = "bench-analysis"):
    """A quiet, small SparkSession (local[2] unless ``master``); reuses a running one."""
    check_java()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if not master or master.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    try:
        from pyspark.sql import SparkSession
    except ImportError:
        raise BenchError("pyspark is not installed: pip install -e '.[spark]'") from None
    conf_dir = os.path.join(tempfile.gettempdir(), "bench-spark-conf")
    os.makedirs(conf_dir, exist_ok=True)
    log4j = os.path.join(conf_dir, "log4j2.properties")
    with open(log4j, "w") as f:
        f.write(_LOG4J2)
    spark = (SparkSession.builder
             .master(master or "local[2]")
             .appName(app_name)
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", os.environ.get("BENCH_SPARK_SHUFFLE_PARTITIONS", "2"))
             .config("spark.default.parallelism", "2")
             # tiny inputs: compiling code costs more than it saves
             .config("spark.sql.codegen.wholeStage", "false")
             .config("spark.sql.autoBroadcastJoinThreshold", str(64 << 20))
             .config("spark.log.structuredLogging.enabled", "false")
             .config("spark.sql.session.timeZone", "UTC")
             .config("spark.sql.debug.maxToStringFields", "200")
             .config("spark.driver.extraJavaOptions",
                     f"-Dlog4j2.configurationFile=file:{log4j} -XX:TieredStopAtLevel=1 -XX:+UseSerialGC")
             .getOrCreate())
    spark.sparkContext.setLogLevel("WARN")
    return spark


def _read(spark, run_dir: str, kind: str, ddl: str):
    path = os.path.join(run_dir, "events", kind)
    if os.path.isdir(path) and any(n.endswith(".parquet") for n in os.listdir(path)):
        return spark.read.schema(ddl).parquet(path)
    return spark.createDataFrame([], ddl)


def _pcts(col: str, weight: str, prefix: str):
    """Exact weighted percentiles (ms) of a microsecond column, plus mean and max; rows
    where the column is null (failed batches, split-mode stamps) are left out."""
    from pyspark.sql import functions as F
    arr = F.percentile(F.col(col), F.array(*[F.lit(p) for p in PERCENTILES]), F.col(weight))
    weight_of_values = F.sum(F.when(F.col(col).isNotNull(), F.col(weight)))
    return [arr.alias(f"{prefix}_pcts"),
            (F.sum(F.col(col) * F.col(weight)) / weight_of_values / 1000.0).alias(f"{prefix}_mean_ms"),
            (F.max(col) / 1000.0).alias(f"{prefix}_max_ms")]


def _spread(row: dict, prefix: str) -> dict:
    arr = row.pop(f"{prefix}_pcts", None)
    for name, v in zip(PCT_NAMES, arr or [None] * len(PCT_NAMES)):
        row[f"{prefix}_{name}_ms"] = None if v is None else v / 1000.0
    return row


def _bin_ns(cells: list[dict]) -> int:
    """Timeline bins: 1 s, or 100 ms when every phase of the run is shorter than 10 s."""
    longest = 0
    for c in cells:
        for side in ("produce", "consume"):
            go, end = c.get(f"{side}_go_ns"), c.get(f"{side}_end_ns")
            if go and end:
                longest = max(longest, end - go)
    return 1_000_000_000 if longest >= 10_000_000_000 else 100_000_000


@contextlib.contextmanager
def spark_scope(master: str | None = None, app_name: str = "bench-analysis"):
    """``spark_session`` for a block: stopped after it if it was made for it; one that was
    running already (a test session's, say) is used and left running for its owner."""
    from pyspark.sql import SparkSession
    running = SparkSession.getActiveSession()
    spark = spark_session(master, app_name)
    try:
        yield spark
    finally:
        if running is None:
            spark.stop()


def analyze(run_dir: str, spark=None, master: str | None = None) -> dict:
    """Run the job on ``run_dir``; returns and writes ``analysis.json`` there."""
    from pyspark.sql import functions as F
    if not os.path.exists(os.path.join(run_dir, "cells.jsonl")):
        raise BenchError(f"{run_dir} has no cells.jsonl: not a bench run directory (or no cell finished)")
    if spark is None:   # one for this job, stopped after it (one already running is left to its owner)
        with spark_scope(master) as spark:
            return analyze(run_dir, spark=spark)
    cells = spark.read.schema(_CELLS_DDL).json(os.path.join(run_dir, "cells.jsonl")).cache()
    prod = _read(spark, run_dir, "produce", _PRODUCE_DDL).cache()
    cons = _read(spark, run_dir, "consume", _CONSUME_DDL).cache()

    # -- production: one pass; failed batches count as requests, not as records --------
    ok = F.col("error").isNull()
    p = (prod.join(F.broadcast(cells.select("cell", "produce_go_ns")), "cell")
         .withColumn("lat_us", F.when(ok, (F.col("ack_ns") - F.col("intended_ns")) / 1000.0))
         .withColumn("ok_count", F.when(ok, F.col("count")).otherwise(0))
         .withColumn("ok_bytes", F.when(ok, F.col("bytes")).otherwise(0)))
    p_agg = (p.groupBy("cell").agg(
        F.sum("ok_count").alias("produced_records"),
        F.sum("ok_bytes").alias("produced_bytes"),
        F.sum(F.when(ok, 0).otherwise(1)).alias("failed_requests"),
        F.count("*").alias("produce_requests"),
        ((F.max("ack_ns") - F.first("produce_go_ns")) / 1e9).alias("produce_s"),
        *_pcts("lat_us", "ok_count", "ack"))
        .withColumn("produce_rps", F.col("produced_records") / F.col("produce_s"))
        .withColumn("produce_kBps", F.col("produced_bytes") / 1000.0 / F.col("produce_s")))

    # -- consumption: one pass over the run-length encoded stamps; the first stamp
    #    of a received batch carries the batch's count and bytes ---------------------
    x = (cons.join(F.broadcast(cells.select("cell", "mode", "consume_go_ns")), "cell")
         .select("cell", "mode", "recv_ns", "consume_go_ns", "count", "bytes",
                 F.posexplode_outer(F.arrays_zip("ts_us", "ts_n")).alias("pos", "z")))
    head = F.col("pos").isNull() | (F.col("pos") == 0)
    x = (x.withColumn("b_count", F.when(head, F.col("count")).otherwise(0))
         .withColumn("b_bytes", F.when(head, F.col("bytes")).otherwise(0))
         .withColumn("n", F.col("z.ts_n"))
         # end to end only where production and consumption overlap (streaming)
         .withColumn("e2e_us", F.when(F.col("mode") == "streaming",
                                      (F.col("recv_ns") - F.col("z.ts_us") * 1000) / 1000.0)))
    c_agg = (x.groupBy("cell").agg(
        F.sum("b_count").alias("consumed_records"),
        F.sum("b_bytes").alias("consumed_bytes"),
        F.sum(F.when(head, 1).otherwise(0)).alias("consume_batches"),
        ((F.max("recv_ns") - F.first("consume_go_ns")) / 1e9).alias("consume_s"),
        *_pcts("e2e_us", "n", "e2e"))
        .withColumn("consume_rps", F.col("consumed_records") / F.col("consume_s"))
        .withColumn("consume_kBps", F.col("consumed_bytes") / 1000.0 / F.col("consume_s")))

    summary = cells.join(p_agg, "cell", "left").join(c_agg, "cell", "left").orderBy("index").cache()
    rows = [_spread(_spread(r.asDict(), "ack"), "e2e") for r in summary.collect()]

    # -- the DSBS-style long table: (mode, side, producers, consumers, batch, size) -> rps, kB/s
    dims = ("mode", "batch", "message_bytes", "producers", "consumers")
    dsbs = (summary.select(*dims, F.lit("production").alias("side"),
                           F.col("produce_rps").alias("rps"), F.col("produce_kBps").alias("kBps"))
            .unionByName(summary.select(*dims, F.lit("consumption").alias("side"),
                                        F.col("consume_rps").alias("rps"), F.col("consume_kBps").alias("kBps")))
            .groupBy("mode", "side", "producers", "consumers", "batch", "message_bytes")
            .agg(F.avg("rps").alias("rps"), F.avg("kBps").alias("kBps"))
            .orderBy("mode", "side", F.desc("producers"), "consumers", "batch", "message_bytes"))
    dsbs_rows = [r.asDict() for r in dsbs.collect()]

    # -- timelines ------------------------------------------------------------------
    bin_ns = _bin_ns(read_cells(run_dir))
    per_s = 1e9 / bin_ns
    two = F.array(F.lit(0.5), F.lit(0.99))
    p_sec = (p.where(ok)
             .groupBy("cell", F.floor((F.col("ack_ns") - F.col("produce_go_ns")) / bin_ns).alias("bin"))
             .agg(F.sum("count").alias("records"), F.sum("bytes").alias("bytes"),
                  F.percentile("lat_us", two, F.col("count")).alias("lat"))
             .withColumn("side", F.lit("produce")))
    c_sec = (x.groupBy("cell", F.floor((F.col("recv_ns") - F.col("consume_go_ns")) / bin_ns).alias("bin"))
             .agg(F.sum("b_count").alias("records"), F.sum("b_bytes").alias("bytes"),
                  F.percentile("e2e_us", two, F.col("n")).alias("lat"))
             .withColumn("side", F.lit("consume")))
    cols = ["cell", "side", (F.col("bin") * (bin_ns / 1e9)).alias("t_s"), "records",
            (F.col("records") * per_s).alias("rps"), (F.col("bytes") / 1000.0 * per_s).alias("kBps"), "lat"]
    timeline = []
    for r in p_sec.select(*cols).unionByName(c_sec.select(*cols)).orderBy("cell", "side", "t_s").collect():
        d = r.asDict()
        lat = d.pop("lat") or [None, None]
        d["lat_p50_ms"] = None if lat[0] is None else lat[0] / 1000.0
        d["lat_p99_ms"] = None if lat[1] is None else lat[1] / 1000.0
        timeline.append(d)
    result = {"run_dir": os.path.abspath(run_dir), "cells": rows, "dsbs": dsbs_rows, "timeline": timeline,
              "timeline_bin_s": bin_ns / 1e9, "percentiles": list(PERCENTILES)}
    with open(os.path.join(run_dir, "analysis.json"), "w") as f:
        json.dump(result, f, indent=1, default=str)
    return result


def main(argv: list[str] | None = None) -> None:
    import argparse
    ap = argparse.ArgumentParser(description="Analyse a bench run with Spark (writes analysis.json)")
    ap.add_argument("run_dir")
    ap.add_argument("--master", default=None, help="Spark master URL (default local[2])")
    args = ap.parse_args(argv)
    try:
        res = analyze(args.run_dir, master=args.master)
    except BenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(1)
    print(f"{len(res['cells'])} cells analysed: {os.path.join(args.run_dir, 'analysis.json')}")


if __name__ == "__main__":
    main()
