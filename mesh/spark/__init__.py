"""PySpark source and sink for mesh topics, batch and streaming.

    from mesh.spark import register
    register(spark)
    df = (spark.read.format("mesh")
          .option("bootstrap", "127.0.0.1:7101").option("topic", "orders")
          .option("startingOffsets", "earliest").option("endingOffsets", "latest").load())
    # key binary, value binary, topic string, partition int, offset long,
    # timestamp timestamp, headers array<struct<key:string,value:binary>>

    q = (spark.readStream.format("mesh").option("bootstrap", "127.0.0.1:7101")
         .option("topic", "orders").option("maxOffsetsPerTrigger", 100000).load()
         .selectExpr("CAST(value AS STRING) AS value")
         .writeStream.format("mesh").option("bootstrap", "127.0.0.1:7101")
         .option("topic", "orders-clean")
         .option("checkpointLocation", "checkpoints/orders-clean").start())

Source options (names as in Spark's Kafka source where the meaning is the same):
  bootstrap            HOST:PORT[,HOST:PORT...] of any brokers (required;
                       kafka.bootstrap.servers is accepted too)
  topic / subscribe    comma-separated topic names; or
  subscribePattern     a regex matched against whole topic names (streams pick up new
                       matching topics and new partitions, read from their beginning)
  startingOffsets      earliest | latest | {"orders":{"0":23,"1":-2}} (-2 earliest,
                       -1 latest; partitions left out: the default). Default: earliest
                       for batch, latest for streams. A restarted stream uses its
                       checkpoint instead.
  startingTimestamp    one timestamp (ms) for every partition: start at the first record
                       whose timestamp is at or after it (wins over the two below)
  startingOffsetsByTimestamp  {"orders":{"0":1700000000000,"1":...}}, every subscribed
                       partition named (wins over startingOffsets); a partition with no
                       such record: an error, or its latest offset with
                       startingOffsetsByTimestampStrategy=latest
  endingOffsets        batch only: latest | JSON (-1 latest). Default latest.
  maxOffsetsPerTrigger streams: at most this many records per micro-batch, shared among
                       partitions by backlog (ignored by batch reads, as by Kafka's)
  minPartitions        cut large ranges so there are at least this many Spark tasks
  failOnDataLoss       true (default): fail when records to read were deleted by
                       retention, or a batch cannot be decoded (stored by an older broker);
                       false: skip them (logged)
  requestTimeoutMs     per request (default 10000); fetchMaxBytes per fetch (8 MiB)
  creds                a secured cluster: the creds file of the principal to act as
                       (mesh user add ... --out FILE); the same path on every worker.
                       Default: $MESH_CREDS where the task runs, else none (open)

Sink options: bootstrap, topic (else a "topic" column), acks (all | 1, default all),
maxBatchRecords (10000), maxBatchBytes (512 KiB), deliveryTimeoutMs (120000),
requestTimeoutMs, creds. Columns: value (required), key, partition, headers, topic, timestamp.
Exactly-once writes: see ``mesh.spark.sink``.

Lag: each micro-batch's progress carries, per source, ``endOffset`` and
``latestOffset`` (what the brokers had); ``lag(progress)`` returns the difference.
(PySpark offers Python sources no custom-metrics hook, so lag is not a named metric.)

Needs pyspark 4.2+ (admission control and availableNow for Python streaming sources),
pyarrow, and Spark's Python workers able to import this package: ``register`` checks.
Each Spark task opens its own connections to the partition leaders it reads or writes.
"""
from __future__ import annotations

import json

from mesh.spark.options import MeshOptions, MeshSparkError, require_pyarrow  # first: checks the pyspark version
from mesh.spark.arrow import SCHEMA_DDL, spark_schema
from mesh.spark.sink import MeshBatchWriter, MeshSinkConfig, MeshStreamWriter
from mesh.spark.source import MeshBatchReader, MeshStreamReader

from pyspark.sql.datasource import DataSource

__all__ = ["register", "MeshDataSource", "MeshSparkError", "lag", "SCHEMA_DDL", "check_workers"]

_registered: set[int] = set()


class MeshDataSource(DataSource):
    """``format("mesh")``: read and write mesh topics."""

    @classmethod
    def name(cls) -> str:
        return "mesh"

    def schema(self):
        return spark_schema()

    def _source_options(self) -> MeshOptions:
        return MeshOptions(self.options)

    def _check_schema(self, schema) -> None:
        if schema is not None and schema != spark_schema():
            raise MeshSparkError(f"the mesh source has a fixed schema ({SCHEMA_DDL}); "
                                 "do not pass .schema(...) to it")

    def reader(self, schema):
        self._check_schema(schema)
        return MeshBatchReader(self._source_options())  # maxOffsetsPerTrigger: ignored, as by Kafka's

    def streamReader(self, schema):
        self._check_schema(schema)
        opts = self._source_options()
        if opts.ending:
            raise MeshSparkError("endingOffsets applies to batch reads only; a stream has no end")
        return MeshStreamReader(opts)

    def writer(self, schema, overwrite):
        if overwrite:
            raise MeshSparkError('topics are append-only: use mode("append")')
        cfg = MeshSinkConfig(self.options, schema)
        cfg.check_topic()
        return MeshBatchWriter(cfg)

    def streamWriter(self, schema, overwrite):
        # no driver-side topic check here: Spark calls this again for every micro-batch's
        # commit, which must not fail on a metadata hiccup; tasks report unknown topics
        return MeshStreamWriter(MeshSinkConfig(self.options, schema))


def register(spark, check_workers_python: bool = True) -> None:
    """Make ``format("mesh")`` available in ``spark``. Unless ``PYSPARK_PYTHON`` (or
    ``spark.pyspark.python``) names a Python for the workers, they run this driver's Python,
    which can import mesh (Spark's default, ``python3``, often cannot). By default also runs one tiny task
    to check that Spark's Python workers can import this package and pyarrow, so a
    misconfigured ``PYSPARK_PYTHON`` fails here with a clear message instead of with
    "Python worker exited unexpectedly" later."""
    require_pyarrow()
    _use_this_python(spark)
    spark.dataSource.register(MeshDataSource)
    key = id(spark)
    if check_workers_python and key not in _registered:
        check_workers(spark)
    _registered.add(key)


def _use_this_python(spark) -> None:
    """Point the Python functions created from now on (this data source's, the probe's) at
    ``sys.executable`` when nobody chose the workers' Python."""
    import os
    import sys
    try:
        sc = spark.sparkContext
    except Exception:  # Spark Connect: the server's workers are not ours to choose
        return
    if os.environ.get("PYSPARK_PYTHON") or sc.getConf().get("spark.pyspark.python"):
        return
    sc.pythonExec = sys.executable


# The probe is compiled from source so that cloudpickle ships it by value: a worker that
# cannot import mesh can still run it and say so.
_PROBE_SRC = '''
def probe(modules):
    import sys
    out = {"python": sys.executable, "version": sys.version.split()[0], "missing": []}
    for mod in modules:
        try:
            __import__(mod)
        except Exception as exc:
            out["missing"].append(f"{mod} ({type(exc).__name__}: {exc})")
    return out
'''


def _probe():
    ns: dict = {"__name__": "mesh_spark_probe"}
    exec(compile(_PROBE_SRC, "<mesh.spark probe>", "exec"), ns)
    return ns["probe"]


def check_workers(spark, modules: tuple[str, ...] = ("mesh.spark", "pyarrow")) -> None:
    """Raise MeshSparkError if Spark's Python workers cannot import ``modules``."""
    try:
        sc = spark.sparkContext
    except Exception:  # Spark Connect: no SparkContext to run a probe with
        return
    probe = _probe()
    (res,) = sc.parallelize([list(modules)], 1).map(probe).collect()
    if res["missing"]:
        raise MeshSparkError(
            f"Spark's Python workers ({res['python']}, Python {res['version']}) cannot import "
            f"{' and '.join(res['missing'])}. Install broker-mesh[spark] into that Python, or set "
            "PYSPARK_PYTHON (and spark.pyspark.python) to the Python that has it, e.g. the venv's "
            "bin/python, before the SparkSession starts")


def lag(progress) -> dict:
    """Records behind per source and partition in a streaming progress:
    ``{"total": n, "partitions": {"orders/0": n, ...}}`` = latestOffset - endOffset.
    Takes a StreamingQueryProgress, its ``json`` string or the dict (``q.lastProgress``)."""
    if hasattr(progress, "json"):
        progress = progress.json
    if isinstance(progress, str):
        progress = json.loads(progress)
    out: dict[str, int] = {}
    for src in progress.get("sources", []):
        end, latest = src.get("endOffset"), src.get("latestOffset")
        if isinstance(end, str):
            end = json.loads(end)
        if isinstance(latest, str):
            latest = json.loads(latest)
        if not isinstance(end, dict) or not isinstance(latest, dict):
            continue
        for topic, parts in latest.items():
            if not isinstance(parts, dict):
                continue
            for p, off in parts.items():
                done = (end.get(topic) or {}).get(p, 0)
                out[f"{topic}/{p}"] = max(0, int(off) - int(done))
    return {"total": sum(out.values()), "partitions": out}
