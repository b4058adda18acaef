"""The Spark source: topics as a DataFrame, batch and streaming (``format("mesh")``).

Theory of operation
-------------------
Offsets are per topic-partition, written as Spark's Kafka source writes them:
``{"orders": {"0": 23, "1": 40}}`` (string partition keys, because Spark round-trips
offsets through JSON). An offset is the next record to read, so a range is
``[start, end)``.

* Planning runs on the driver (``partitions()``, ``initialOffset()``, ``latestOffset()``):
  it asks the cluster for metadata (topics, partitions, leaders) and for each
  partition's log start / high watermark (ListOffsets to the partition's leader, the
  authority; gossip-fed metadata may lag on a cluster).
* Each planned ``[start, end)`` of one topic-partition is one Spark task
  (``MeshPartition``), optionally cut into ``minPartitions`` pieces. A task fetches its
  range straight from the leader, keeps the next fetch in flight while it decodes the
  last (pipelining), and hands Spark one ``pyarrow.RecordBatch`` per fetch: the record
  batches' columns (values, keys, timestamp deltas, headers) become Arrow arrays in bulk,
  with no Python object per row beyond the bytes msgpack makes.
* Streaming: Spark keeps the offsets in its checkpoint (the offset log is written before
  a micro-batch runs, the commit log after), so a restarted query replays the last
  unfinished micro-batch with exactly the same ranges and then continues. The broker is
  never told what was consumed (as with Spark's Kafka source, no consumer group).
* Admission control: ``maxOffsetsPerTrigger`` becomes ``ReadMaxRows`` and is shared among
  partitions in proportion to their backlog (largest remainder, so the sum is exact).
  ``Trigger.AvailableNow`` snapshots the high watermarks once and never reads past them.
* Lag: ``reportLatestOffset`` gives Spark the latest offsets seen, which appear as
  ``latestOffset`` in each source's query progress; ``mesh.spark.lag(progress)`` turns
  that into records behind per partition. (PySpark has no custom-metrics hook for Python
  sources, so lag cannot be a named metric.)

Everything a task needs travels in its ``MeshPartition``; reader objects drop their
network clients when pickled.
"""
from __future__ import annotations

import itertools
import json
import re
import time
from typing import Iterator

from mesh.client.admin import Admin
from mesh.client.transport import Transport
from mesh.wire.errors import ErrorCode, MeshError, retriable
from mesh.wire.messages import EARLIEST, LATEST, ErrorResponse, FetchRequest, ListOffsetsRequest
from mesh.wire.records import ATTR_CONTROL, decode_batch, iter_batches

import pyspark

if tuple(int(x) for x in re.findall(r"\d+", pyspark.__version__)[:2]) < (4, 2):
    raise ImportError(f"mesh.spark needs pyspark 4.2 or newer (admission control and availableNow for Python "
                      f"streaming sources); this is pyspark {pyspark.__version__}: pip install -U 'pyspark>=4.2'")

from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition  # noqa: E402
from pyspark.sql.streaming.datasource import (  # noqa: E402
    ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow,
)

__all__ = [
    "SCHEMA_DDL", "spark_schema", "MeshSparkError", "MeshOptions", "MeshPartition", "MeshBatchReader",
    "MeshStreamReader", "require_pyarrow", "offsets_to_json", "offsets_from_json",
]

SCHEMA_DDL = ("key binary, value binary, topic string, partition int, offset long, "
              "timestamp timestamp, headers array<struct<key:string,value:binary>>")


def spark_schema():
    """SCHEMA_DDL as a StructType, built without a JVM (planner workers have none)."""
    from pyspark.sql.types import (
        ArrayType, BinaryType, IntegerType, LongType, StringType, StructField, StructType, TimestampType,
    )
    header = StructType([StructField("key", StringType()), StructField("value", BinaryType())])
    return StructType([
        StructField("key", BinaryType()), StructField("value", BinaryType()),
        StructField("topic", StringType()), StructField("partition", IntegerType()),
        StructField("offset", LongType()), StructField("timestamp", TimestampType()),
        StructField("headers", ArrayType(header)),
    ])

_DEFAULT_TIMEOUT_MS = 10_000
_DEFAULT_FETCH_BYTES = 8 << 20
_FETCH_WAIT_MS = 200


class MeshSparkError(RuntimeError):
    """An error a Spark user can act on; the message names the option or the fix."""


def require_pyarrow():
    try:
        import pyarrow
    except ImportError as exc:  # on the driver or on a worker
        raise MeshSparkError(
            "mesh's Spark source and sink need pyarrow in every Python that Spark runs "
            "(driver and workers): pip install pyarrow (or 'broker-mesh[spark]'), and point "
            "PYSPARK_PYTHON at that Python") from exc
    return pyarrow


# -- options ---------------------------------------------------------------------------
def _int_option(opts: dict, name: str, default: int | None, minimum: int = 0) -> int | None:
    raw = opts.get(name.lower())
    if raw is None or raw == "":
        return default
    try:
        v = int(raw)
    except ValueError:
        raise MeshSparkError(f"option {name}={raw!r} is not an integer") from None
    if v < minimum:
        raise MeshSparkError(f"option {name}={v} must be at least {minimum}")
    return v


def _bool_option(opts: dict, name: str, default: bool) -> bool:
    raw = opts.get(name.lower())
    if raw is None:
        return default
    if raw.strip().lower() not in ("true", "false"):
        raise MeshSparkError(f"option {name}={raw!r} must be true or false")
    return raw.strip().lower() == "true"


class MeshOptions:
    """The parsed options shared by source and sink (plain data: it is pickled to tasks)."""

    def __init__(self, options, *, sink: bool = False):
        opts = {str(k).lower(): str(v) for k, v in dict(options or {}).items()}
        self.raw = opts
        self.bootstrap = (opts.get("bootstrap") or opts.get("kafka.bootstrap.servers") or "").strip()
        if not self.bootstrap:
            raise MeshSparkError('option "bootstrap" is required, e.g. .option("bootstrap", "127.0.0.1:7101")')
        self.request_timeout_ms = _int_option(opts, "requestTimeoutMs", _DEFAULT_TIMEOUT_MS, 1)
        topic = opts.get("topic")
        subscribe = opts.get("subscribe")
        pattern = opts.get("subscribepattern")
        if sink:
            self.topics = [topic.strip()] if topic and topic.strip() else []
            self.pattern = None
            return
        given = [n for n, v in (("topic", topic), ("subscribe", subscribe), ("subscribePattern", pattern)) if v]
        if len(given) != 1:
            raise MeshSparkError('give exactly one of the options "topic" / "subscribe" (comma-separated '
                                 'topic names) or "subscribePattern" (a regex)'
                                 + (f"; got {', '.join(given)}" if given else ""))
        self.pattern = None
        self.topics = []
        if pattern:
            try:
                self.pattern = re.compile(pattern)
            except re.error as exc:
                raise MeshSparkError(f"subscribePattern {pattern!r} is not a valid regex: {exc}") from None
        else:
            self.topics = [t.strip() for t in (topic or subscribe).split(",") if t.strip()]
            if not self.topics:
                raise MeshSparkError("no topic named in the topic/subscribe option")
        self.starting = opts.get("startingoffsets")
        self.ending = opts.get("endingoffsets")
        self.max_offsets_per_trigger = _int_option(opts, "maxOffsetsPerTrigger", None, 1)
        self.min_partitions = _int_option(opts, "minPartitions", None, 1)
        self.fail_on_data_loss = _bool_option(opts, "failOnDataLoss", True)
        self.fetch_max_bytes = _int_option(opts, "fetchMaxBytes", _DEFAULT_FETCH_BYTES, 1024)


# -- offsets as Spark keeps them -------------------------------------------------------
def offsets_to_json(offsets: dict) -> dict:
    """{(topic, partition): offset} -> {"topic": {"partition": offset}}, sorted."""
    out: dict[str, dict[str, int]] = {}
    for (t, p), off in sorted(offsets.items()):
        out.setdefault(t, {})[str(p)] = int(off)
    return out


def offsets_from_json(js: dict | str) -> dict:
    if isinstance(js, str):
        js = json.loads(js)
    out = {}
    for t, parts in js.items():
        if not isinstance(parts, dict):
            raise MeshSparkError(f"offsets of topic {t!r} must be an object like {{\"0\": 23}}, not {parts!r}")
        for p, off in parts.items():
            try:
                out[(t, int(p))] = int(off)
            except (TypeError, ValueError):
                raise MeshSparkError(f"bad offset {t}/{p}: {off!r}") from None
    return out


class _Cluster:
    """Driver-side view: which partitions exist, who leads them, where they start and end."""

    def __init__(self, opts: MeshOptions):
        self.opts = opts
        self._admin: Admin | None = None

    def __getstate__(self):
        return {"opts": self.opts, "_admin": None}

    @property
    def admin(self) -> Admin:
        if self._admin is None:
            self._admin = Admin(self.opts.bootstrap, request_timeout_ms=self.opts.request_timeout_ms)
        return self._admin

    def _unreachable(self, exc: Exception) -> MeshSparkError:
        return MeshSparkError(
            f"cannot reach any mesh broker at {self.opts.bootstrap!r} (the \"bootstrap\" option) within "
            f"{self.opts.request_timeout_ms} ms: is a broker running there? ({exc})")

    def _metadata(self, topics):
        try:
            return self.admin.cluster.refresh(topics)
        except MeshError as exc:
            if exc.code in (ErrorCode.BROKER_UNAVAILABLE, ErrorCode.TIMEOUT):
                raise self._unreachable(exc) from None
            raise

    def topic_names(self) -> list[str]:
        if self.opts.pattern is None:
            return list(self.opts.topics)
        resp = self._metadata(None)
        return sorted(t["name"] for t in resp.topics
                      if not t.get("error") and self.opts.pattern.fullmatch(t["name"]))

    def partitions(self, required: bool = True) -> dict[tuple[str, int], str | None]:
        """{(topic, partition): leader address} of the subscribed topics."""
        names = self.topic_names()
        out: dict[tuple[str, int], str | None] = {}
        if not names:
            return out
        resp = self._metadata(names)
        missing = [t["name"] for t in resp.topics if t.get("error")]
        if missing and required:
            known = sorted(t["name"] for t in self._metadata(None).topics if not t.get("error"))
            raise MeshSparkError(
                f"unknown topic{'s' if len(missing) > 1 else ''} {', '.join(map(repr, missing))} on the mesh "
                f"cluster at {self.opts.bootstrap}; existing topics: {', '.join(known) or '(none)'}")
        for t in resp.topics:
            if t.get("error"):
                continue
            for p in t["partitions"]:
                out[(t["name"], p["partition"])] = p.get("leader_address")
        return out

    def list_offsets(self, leaders: dict, which: int) -> dict[tuple[str, int], int]:
        """Log start (EARLIEST) or high watermark (LATEST) of each partition, from its leader."""
        out: dict[tuple[str, int], int] = {}
        todo = dict(leaders)
        deadline = time.monotonic() + self.opts.request_timeout_ms / 1000
        while todo:
            by_addr: dict[str, list] = {}
            for (t, p), addr in todo.items():
                by_addr.setdefault(addr or "", []).append([t, p, which])
            retry = {}
            for addr, parts in by_addr.items():
                if not addr:
                    retry.update({(t, p): None for t, p, _ in parts})
                    continue
                try:
                    resp, _ = self.admin.transport.call(addr, ListOffsetsRequest(parts),
                                                        timeout_ms=self.opts.request_timeout_ms)
                except MeshError as exc:
                    if exc.code in (ErrorCode.BROKER_UNAVAILABLE, ErrorCode.TIMEOUT):
                        self.admin.transport.forget(addr)
                        if time.monotonic() > deadline:
                            raise self._unreachable(exc) from None
                        retry.update({(t, p): None for t, p, _ in parts})
                        continue
                    raise
                for t, p, err, off, leader in resp.parts:
                    if not err:
                        out[(t, p)] = off
                    elif retriable(err):
                        retry[(t, p)] = leader
                    else:
                        raise MeshSparkError(f"cannot list offsets of {t}/{p}: {ErrorCode(err).name}")
            if retry:
                if time.monotonic() > deadline:
                    raise MeshSparkError(f"no leader answered for {sorted(retry)} within "
                                         f"{self.opts.request_timeout_ms} ms")
                time.sleep(0.1)  # back off before asking again (leader election in progress)
                fresh = self.partitions(required=False)
                retry = {tp: hint or fresh.get(tp) for tp, hint in retry.items()}
            todo = retry
        return out

    def close(self) -> None:
        if self._admin is not None:
            self._admin.close()
            self._admin = None


def _resolve(spec: str | None, default: str, leaders: dict, cluster: _Cluster, *, what: str,
             allow: tuple[str, ...]) -> dict[tuple[str, int], int]:
    """startingOffsets / endingOffsets -> {(topic, partition): offset} for every partition."""
    spec = (spec or default).strip()
    if spec.lower() in ("earliest", "latest"):
        if spec.lower() not in allow:
            raise MeshSparkError(f"{what}={spec} is not allowed here (use {' or '.join(allow)} or JSON)")
        return cluster.list_offsets(leaders, EARLIEST if spec.lower() == "earliest" else LATEST)
    try:
        given = offsets_from_json(spec)
    except json.JSONDecodeError:
        raise MeshSparkError(f'{what} must be "earliest", "latest" or JSON like '
                             f'{{"orders":{{"0":23,"1":-2}}}}, not {spec!r}') from None
    unknown = sorted(set(given) - set(leaders))
    if unknown:
        raise MeshSparkError(f"{what} names partitions that are not subscribed or do not exist: {unknown}")
    out = {}
    need = {EARLIEST: {}, LATEST: {}}
    fallback = EARLIEST if default == "earliest" else LATEST
    for tp, addr in leaders.items():
        off = given.get(tp, fallback)
        if off in (EARLIEST, LATEST):
            if off == EARLIEST and "earliest" not in allow:
                raise MeshSparkError(f"{what}: -2 (earliest) is not allowed for {tp[0]}/{tp[1]}")
            need[off][tp] = addr
        elif off < 0:
            raise MeshSparkError(f"{what}: offset {off} of {tp[0]}/{tp[1]} is negative (use -2 earliest, -1 latest)")
        else:
            out[tp] = off
    for which, sub in need.items():
        if sub:
            out.update(cluster.list_offsets(sub, which))
    return out


# -- tasks -----------------------------------------------------------------------------
class MeshPartition(InputPartition):
    """One Spark task: records [start, end) of one topic-partition."""

    def __init__(self, topic: str, partition: int, start: int, end: int, leader: str | None,
                 opts: MeshOptions, new_partition: bool = False):
        super().__init__((topic, partition, start, end))
        self.topic, self.partition, self.start, self.end = topic, partition, start, end
        self.leader, self.opts, self.new_partition = leader, opts, new_partition

    def __repr__(self) -> str:
        return f"MeshPartition({self.topic}/{self.partition} [{self.start}, {self.end}))"


def _split(topic, partition, start, end, leader, opts, pieces, new=False) -> list[MeshPartition]:
    n = max(1, min(pieces, end - start))
    step, extra = divmod(end - start, n)
    out, s = [], start
    for i in range(n):
        e = s + step + (1 if i < extra else 0)
        out.append(MeshPartition(topic, partition, s, e, leader, opts, new))
        s = e
    return out


def plan_partitions(start: dict, end: dict, leaders: dict, opts: MeshOptions,
                    new_partitions: frozenset = frozenset()) -> list[MeshPartition]:
    ranges = [(tp, start.get(tp, 0), end[tp]) for tp in sorted(end) if end[tp] > start.get(tp, 0)]
    total = sum(e - s for _, s, e in ranges)
    out = []
    for (t, p), s, e in ranges:
        pieces = 1
        if opts.min_partitions and opts.min_partitions > len(ranges) and total:
            pieces = max(1, -(-opts.min_partitions * (e - s) // total))  # ceil: at least minPartitions
        out.extend(_split(t, p, s, e, leaders.get((t, p)), opts, pieces, (t, p) in new_partitions))
    return out


_arrow_schema_cache = None


def _arrow_schema():
    """The Arrow schema Spark checks batches against (the same function Spark uses)."""
    global _arrow_schema_cache
    if _arrow_schema_cache is None:
        from pyspark.sql.pandas.types import to_arrow_schema
        _arrow_schema_cache = to_arrow_schema(spark_schema(), timezone="UTC")
    return _arrow_schema_cache


def _wait_for(transport: Transport, rid: int, timeout_ms: int):
    deadline = time.monotonic() + timeout_ms / 1000
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return None, None
        for _addr, r, resp, payload in transport.poll(int(left * 1000) + 1):
            if r == rid:
                return resp, payload
            # answers to requests abandoned after a timeout: drop them


def read_range(part: MeshPartition) -> Iterator:
    """The records of one MeshPartition as pyarrow RecordBatches (one per fetch)."""
    if part.start >= part.end:
        return
    pa = require_pyarrow()
    schema = _arrow_schema()
    opts = part.opts
    topic, partition, end = part.topic, part.partition, part.end
    transport = Transport()
    addr = part.leader
    off = part.start
    t0 = time.monotonic()

    def leader() -> str:
        from mesh.client.cluster import ClusterView
        view = ClusterView(transport, opts.bootstrap, timeout_ms=opts.request_timeout_ms)
        try:
            a = view.leader_address(topic, partition)
        except MeshError as exc:
            if exc.code == ErrorCode.UNKNOWN_TOPIC:
                raise MeshSparkError(f"topic {topic!r} no longer exists (deleted while being read?)") from None
            raise MeshSparkError(f"cannot find the leader of {topic}/{partition} via {opts.bootstrap}: {exc}") from None
        if a is None:
            raise MeshError(ErrorCode.LEADER_NOT_AVAILABLE, f"no leader for {topic}/{partition}")
        return a

    def send(offset: int) -> int:
        return transport.send(addr, FetchRequest([[topic, partition, offset, opts.fetch_max_bytes]],
                                                 _FETCH_WAIT_MS, 1, opts.fetch_max_bytes))

    try:
        addr = addr or leader()
        rid = send(off)
        while off < end:
            resp, payload = _wait_for(transport, rid, opts.request_timeout_ms + _FETCH_WAIT_MS)
            problem = None
            if resp is None:
                problem = MeshError(ErrorCode.TIMEOUT, f"no answer from {addr}")
                transport.forget(addr)
            elif isinstance(resp, ErrorResponse):
                problem = MeshError(resp.error, resp.message, leader=resp.leader)
            else:
                (_t, _p, err, hw, log_start, nbytes, hint) = resp.parts[0]
                if err == ErrorCode.OFFSET_OUT_OF_RANGE and off < log_start:
                    if opts.fail_on_data_loss and not part.new_partition:
                        raise MeshSparkError(
                            f"data loss: {topic}/{partition} records [{off}, {min(log_start, end)}) were deleted "
                            f"by retention before they were read (the log now starts at {log_start}). Set "
                            f'option "failOnDataLoss" to "false" to skip them')
                    off = log_start
                    if off >= end:
                        break
                    rid = send(off)
                    continue
                if err:
                    problem = MeshError(err, f"fetch {topic}/{partition} at {off}", leader=hint)
            if problem is not None:
                if not problem.retriable and problem.code != ErrorCode.OFFSET_OUT_OF_RANGE:
                    raise MeshSparkError(f"reading {topic}/{partition} at offset {off} failed: {problem}")
                if time.monotonic() - t0 > opts.request_timeout_ms / 1000 * 3:
                    raise MeshSparkError(f"reading {topic}/{partition} at offset {off} keeps failing: {problem}")
                time.sleep(0.1)  # back off, then ask again (leader change, broker restart)
                try:
                    addr = problem.leader or leader()
                except MeshError:
                    pass  # no leader known yet: ask the old one again, it may redirect
                rid = send(off)
                continue
            batches = [(h, b) for h, b in iter_batches(memoryview(payload)[:nbytes] if payload else b"")
                       if h.next_offset > off]
            if not batches:
                if hw <= off and time.monotonic() - t0 > opts.request_timeout_ms / 1000:
                    raise MeshSparkError(f"{topic}/{partition} ends at {hw}, but offsets up to {end} were "
                                         "planned: was the topic deleted and re-created?")
                rid = send(off)
                continue
            nxt = batches[-1][0].next_offset
            if nxt < end:
                rid = send(nxt)  # the next fetch travels while this one is decoded
            t0 = time.monotonic()
            rb = _to_arrow(pa, schema, topic, partition, batches, off, end)
            off = nxt
            if rb is not None:
                yield rb
    finally:
        transport.close()


def _to_arrow(pa, schema, topic: str, partition: int, batches, lo: int, hi: int):
    """Columns of the records with offsets in [lo, hi) of ``batches``: one RecordBatch."""
    import pyarrow.compute as pc
    values: list = []
    keys: list | None = None
    headers: list | None = None
    ts: list = []                      # int64 microsecond arrays, one per record batch
    runs: list[tuple[int, int]] = []  # (first offset, count) per record batch
    for h, b in batches:
        if h.attributes & ATTR_CONTROL:
            continue
        _, vs, ks, deltas, hs = decode_batch(b)
        n = h.record_count
        a, z = max(0, lo - h.base_offset), min(n, hi - h.base_offset)
        if a >= z:
            continue
        if a or z < n:
            vs = vs[a:z]
            ks = ks[a:z] if ks else None
            deltas = deltas[a:z] if deltas else None
            hs = hs[a:z] if hs else None
        m = z - a
        done = len(values)
        values.extend(vs)
        if ks is not None:
            if keys is None:
                keys = [None] * done
            keys.extend(ks)
        elif keys is not None:
            keys.extend(itertools.repeat(None, m))
        if hs is not None:
            if headers is None:
                headers = [None] * done
            headers.extend([[(str(k), v) for k, v in x] if x else None for x in hs])
        elif headers is not None:
            headers.extend(itertools.repeat(None, m))
        first_us = h.first_timestamp_ms * 1000
        if deltas:
            ts.append(pc.add(pc.multiply(pa.array(deltas, pa.int64()), 1000), first_us))
        else:  # one timestamp for the whole batch: no Python int per record
            ts.append(pa.repeat(pa.scalar(first_us, pa.int64()), m))
        runs.append((h.base_offset + a, m))
    n = len(values)
    if not n:
        return None
    f = schema.types
    first_off = runs[0][0]
    if all(runs[i][0] == runs[i - 1][0] + runs[i - 1][1] for i in range(1, len(runs))):
        offsets = pc.add(pc.cumulative_sum(pa.repeat(pa.scalar(1, pa.int64()), n)), first_off - 1)
    else:  # control batches in between
        offsets = pa.array(list(itertools.chain.from_iterable(range(s, s + c) for s, c in runs)), pa.int64())
    cols = [
        pa.array(keys, f[0]) if keys is not None else pa.nulls(n, f[0]),
        pa.array(values, f[1]),
        pa.repeat(pa.scalar(topic, f[2]), n),
        pa.repeat(pa.scalar(partition, f[3]), n),
        offsets,
        pa.concat_arrays(ts).cast(f[5]),
        pa.array(headers, f[6]) if headers is not None else pa.nulls(n, f[6]),
    ]
    return pa.RecordBatch.from_arrays(cols, schema=schema)


# -- readers ---------------------------------------------------------------------------
class MeshBatchReader(DataSourceReader):
    """``spark.read.format("mesh")``: the records between startingOffsets (default
    earliest) and endingOffsets (default latest), resolved once when the query is planned."""

    def __init__(self, opts: MeshOptions):
        self.opts = opts

    def partitions(self):
        cluster = _Cluster(self.opts)
        try:
            leaders = cluster.partitions()
            start = _resolve(self.opts.starting, "earliest", leaders, cluster,
                             what="startingOffsets", allow=("earliest",))
            end = _resolve(self.opts.ending, "latest", leaders, cluster,
                           what="endingOffsets", allow=("latest",))
            for tp in sorted(leaders):
                if start[tp] > end[tp]:
                    raise MeshSparkError(f"{tp[0]}/{tp[1]}: startingOffsets {start[tp]} is after "
                                         f"endingOffsets {end[tp]}")
            parts = plan_partitions(start, end, leaders, self.opts)
        finally:
            cluster.close()
        # Spark wants at least one partition; an empty range reads nothing
        return parts or [MeshPartition("", 0, 0, 0, None, self.opts)]

    def read(self, partition: MeshPartition):
        return read_range(partition)


class MeshStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream.format("mesh")``; one instance per query lives on the driver."""

    def __init__(self, opts: MeshOptions):
        self.opts = opts
        self._cluster = _Cluster(opts)
        self._latest: dict | None = None          # for reportLatestOffset (lag)
        self._available_now: dict | None = None   # Trigger.AvailableNow target
        self._leaders: dict = {}

    def __getstate__(self):  # read() runs on a pickled copy: no sockets in it
        st = dict(self.__dict__)
        st["_cluster"] = _Cluster(self.opts)
        return st

    def _partitions(self) -> dict:
        self._leaders = self._cluster.partitions(required=self.opts.pattern is None)
        return self._leaders

    def initialOffset(self) -> dict:
        leaders = self._partitions()
        return offsets_to_json(_resolve(self.opts.starting, "latest", leaders, self._cluster,
                                        what="startingOffsets", allow=("earliest", "latest")))

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.opts.max_offsets_per_trigger:
            return ReadMaxRows(self.opts.max_offsets_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._available_now = self._cluster.list_offsets(self._partitions(), LATEST)

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        begin = offsets_from_json(start)
        leaders = self._partitions()
        latest = self._cluster.list_offsets(leaders, LATEST)
        self._latest = dict(latest)
        if self._available_now is not None:
            latest = {tp: min(off, self._available_now[tp]) for tp, off in latest.items()
                      if tp in self._available_now}
        new = [tp for tp in latest if tp not in begin]
        if new:  # a partition or topic that appeared since: read it from its beginning
            begin.update(self._cluster.list_offsets({tp: leaders[tp] for tp in new}, EARLIEST))
        end = dict(begin)
        for tp, off in latest.items():
            end[tp] = max(begin[tp], off)
        if isinstance(limit, ReadMaxRows):
            end = _rate_limit(begin, end, limit.max_rows)
        return offsets_to_json(end)

    def reportLatestOffset(self):
        return None if self._latest is None else offsets_to_json(self._latest)

    def partitions(self, start: dict, end: dict):
        s, e = offsets_from_json(start), offsets_from_json(end)
        for tp, off in e.items():
            if tp in s and off < s[tp]:
                raise MeshSparkError(f"{tp[0]}/{tp[1]}: end offset {off} is before start {s[tp]} "
                                     "(was the topic deleted and re-created?)")
        new = frozenset(tp for tp in e if tp not in s)
        return plan_partitions(s, e, self._leaders, self.opts, new)

    def read(self, partition: MeshPartition):
        return read_range(partition)

    def commit(self, end: dict) -> None:
        pass  # the checkpoint is the truth; the broker is not told (as with Spark's Kafka source)

    def stop(self) -> None:
        self._cluster.close()


def _rate_limit(begin: dict, end: dict, max_rows: int) -> dict:
    """Advance at most ``max_rows`` records in all, shared in proportion to each partition's
    backlog (largest remainder: the shares add up exactly)."""
    backlog = {tp: end[tp] - begin[tp] for tp in end}
    total = sum(backlog.values())
    if total <= max_rows:
        return end
    shares = {tp: max_rows * n / total for tp, n in backlog.items()}
    take = {tp: int(x) for tp, x in shares.items()}
    left = max_rows - sum(take.values())
    for tp in sorted(shares, key=lambda tp: (take[tp] - shares[tp], tp))[:left]:
        take[tp] += 1
    return {tp: begin[tp] + min(take[tp], backlog[tp]) for tp in end}
