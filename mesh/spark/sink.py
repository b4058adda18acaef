"""The Spark sink: ``df.write.format("mesh")`` and ``df.writeStream.format("mesh")``.

Theory of operation: exactly once by deterministic idempotent producers
------------------------------------------------------------------------
Tasks write their rows straight to the partition leaders (no detour through the driver),
as an idempotent producer would: every record batch carries a producer id and the
sequence number of its first record, and a leader drops a batch whose sequences it
already has (``mesh.node.data.producer_state``; the dedup state is stored in the same LMDB
transaction as the batch, and on followers it is rebuilt from the batch headers).

The producer id is not random: it is a hash of

    (query id, micro-batch id, Spark partition id, chunking options)

for a streaming write (query id and batch id come from the task's local properties,
which Spark sets for every micro-batch; the query id is stored in the checkpoint), and
of (a random id made once per ``save()``, Spark partition id, ...) for a batch write.
Rows are cut into record batches by count and bytes only, so the same rows give the
same batches with the same sequence numbers. Whatever happened before, writing a task's
rows again is harmless:

* a task that failed half way and is retried re-sends its first batches; the leader
  answers "already have them" (a remembered duplicate, or DUPLICATE_SEQUENCE for older
  ones) and appends only what is missing. Should an earlier attempt have flushed a
  shorter last batch (its input ended early, e.g. a cancelled task), a replayed batch
  can straddle the broker's last sequence: DUPLICATE_SEQUENCE on a batch [f, l] is
  therefore checked by sending record l alone, and if the broker is not yet there, the
  batch's records go one by one (written ones come back as duplicates);
* a driver that dies after the tasks wrote but before Spark wrote the micro-batch's
  commit log entry restarts, replays the same micro-batch (same offsets, same rows, same
  batch id, same task ids) and every batch is dropped as a duplicate.

The rules of what to send, resend, probe and finish are the sans-I/O
``mesh.client.sequencer`` (the same the ``Producer`` drives, with the same window,
retries in order under the same sequences, heartbeated connections and epoch-merged
metadata), run here with a fixed producer id, ``probe_duplicates`` and a linear backoff.

So ``commit(messages, batch_id)`` has nothing left to do: the dedup lives on the broker,
which is also what survives a driver crash. What it needs: the rows of a task are the
same on replay (true for this source and for deterministic transformations; not for a
repartition by a random shuffle or non-deterministic UDFs), the same number of write
tasks, the same ``maxBatchRecords`` / ``maxBatchBytes`` (they are part of the producer
id, so changing them gives duplicates, never loss) and the same topic partition count
(keyed placement). A batch ``save()`` that fails leaves what its finished tasks wrote:
topics have no transactions.

Columns: ``value`` (binary or string, required; null is a null value, a tombstone), ``key``
(binary or string: murmur2 placement, exactly the Java Kafka client's), ``partition``
(int), ``headers`` (array<struct<key:string,value:binary>>), ``topic`` (string, used when
no ``topic`` option is given), ``timestamp`` (timestamp). Other columns are ignored.
Unkeyed rows without a partition go to one partition per batch, moving on after each
batch (a deterministic sticky partitioner: task i starts at partition i).
"""
from __future__ import annotations

import bisect
import collections
import hashlib
import itertools
import time
import uuid

from mesh.client.cluster import ClusterView
from mesh.client.sequencer import RETRY, SPLIT, RetryPolicy, SeqBatch, Sequencer
from mesh.client.transport import Transport
from mesh.wire.errors import ErrorCode, MeshError
from mesh.wire.messages import Acks, ErrorResponse, ProduceRequest, ProduceResponse
from mesh.wire.partitioner import partition_for_key
from mesh.wire.records import encode_batch
from mesh.spark.options import MeshOptions, MeshSparkError, _int_option, require_pyarrow
from mesh.spark.source import _Cluster
from mesh.wire.topic_config import BATCH_OVERHEAD_BYTES

from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter, WriterCommitMessage

__all__ = ["MeshSinkConfig", "MeshBatchWriter", "MeshStreamWriter", "MeshCommitMessage", "producer_id_for"]

_ACKS = {"all": Acks.ALL, "-1": Acks.ALL, "1": Acks.LEADER}   # not NONE: acks=0 cannot be exactly-once
_BUFFER_BYTES = 32 << 20    # encoded but unacknowledged, per task
# 5 in flight per partition (within the broker's window of RECENT_BATCHES); a partition
# that fails 50 times in a row fails the task; backoff 0.1 s per failure up to 1 s
_POLICY = RetryPolicy(max_in_flight=5, max_failures=50, backoff_ms=100, backoff_max_ms=1_000,
                      linear_backoff=True, probe_duplicates=True)
_PRODUCE_TIMEOUT_MS = 3_000  # requestTimeoutMs of the sink's requests unless given (see Producer)


class MeshCommitMessage(WriterCommitMessage):
    def __init__(self, producer_id: int, records: int, batches: int, duplicates: int, partitions: dict):
        self.producer_id = producer_id
        self.records = records          # rows this task wrote (including ones found already written)
        self.batches = batches
        self.duplicates = duplicates    # record batches the broker already had (a replay)
        self.partitions = partitions    # {"topic/partition": records}

    def __repr__(self) -> str:
        return (f"MeshCommitMessage(records={self.records}, batches={self.batches}, "
                f"duplicates={self.duplicates})")


class MeshSinkConfig:
    """What a write task needs: options and where each column is (plain data, pickled)."""

    def __init__(self, options, schema):
        opts = MeshOptions(options, sink=True)
        self.bootstrap = opts.bootstrap
        self.creds = opts.creds
        raw = opts.raw
        self.request_timeout_ms = _int_option(raw, "requestTimeoutMs", _PRODUCE_TIMEOUT_MS, 1)
        self.topic = opts.topics[0] if opts.topics else None
        acks = raw.get("acks", "all").strip().lower()
        if acks not in _ACKS:
            raise MeshSparkError(f"option acks={acks!r}: use all or 1 (acks=0 cannot be exactly-once)")
        self.acks = int(_ACKS[acks])
        self.delivery_timeout_ms = _int_option(raw, "deliveryTimeoutMs", 120_000, 1)
        self.max_batch_records = _int_option(raw, "maxBatchRecords", 10_000, 1)
        self.max_batch_bytes = _int_option(raw, "maxBatchBytes", 512 << 10, 1024)
        names = {f.name.lower(): f for f in schema.fields}
        tname = {n: names[n].dataType.typeName() if n in names else None
                 for n in ("value", "key", "partition", "headers", "topic", "timestamp")}
        if tname["value"] not in ("binary", "string"):
            have = ", ".join(f"{f.name} {f.dataType.simpleString()}" for f in schema.fields)
            raise MeshSparkError("the mesh sink needs a column \"value\" of type binary or string "
                                 f"(the DataFrame has: {have})")
        want = {"key": ("binary", "string"), "partition": ("integer", "long", "short", "byte"),
                "headers": ("array",), "topic": ("string",), "timestamp": ("timestamp", "timestamp_ntz")}
        for col, ok in want.items():
            if tname[col] is not None and tname[col] not in ok:
                raise MeshSparkError(f"column {col!r} has type {names[col].dataType.simpleString()}; "
                                     f"the mesh sink accepts {' or '.join(ok)}")
        if tname["headers"]:
            el = names["headers"].dataType.elementType.simpleString()
            if el not in ("struct<key:string,value:binary>", "struct<key:string,value:string>"):
                raise MeshSparkError(f"column 'headers' must be array<struct<key:string,value:binary>>, not "
                                     f"{names['headers'].dataType.simpleString()}")
        self.columns = {c: names[c].name for c in tname if tname[c] is not None}
        if self.topic is None and "topic" not in self.columns:
            raise MeshSparkError('say where to write: option "topic", or a string column "topic"')
        if self.topic is not None:
            self.columns.pop("topic", None)  # the option wins, as in Spark's Kafka sink
        self._opts = opts

    def check_topic(self) -> None:
        """On the driver, before any task runs: the broker answers and the topic exists."""
        if self.topic is None:
            return
        cluster = _Cluster(self._opts)
        try:
            cluster.partitions(required=True)
        finally:
            cluster.close()


def producer_id_for(sink_key: str, task: int, cfg: MeshSinkConfig) -> int:
    """A stable 62-bit producer id for one task of one write (see the module docstring)."""
    ident = f"mesh-spark-sink/{sink_key}/{task}/{cfg.max_batch_records}/{cfg.max_batch_bytes}"
    return int.from_bytes(hashlib.blake2b(ident.encode(), digest_size=8).digest(), "big") >> 2


class MeshBatchWriter(DataSourceArrowWriter):
    def __init__(self, cfg: MeshSinkConfig):
        self.cfg = cfg
        self.write_id = uuid.uuid4().hex  # made once on the driver: task retries share it

    def write(self, iterator):
        return write_task(self.cfg, f"batch/{self.write_id}", iterator)

    def commit(self, messages) -> None:
        pass  # records are in the topic already; see the module docstring

    def abort(self, messages) -> None:
        pass  # no transactions: what finished tasks wrote stays


class MeshStreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, cfg: MeshSinkConfig):
        self.cfg = cfg

    def write(self, iterator):
        from pyspark import TaskContext
        tc = TaskContext.get()
        query = tc.getLocalProperty("sql.streaming.queryId") if tc else None
        batch = tc.getLocalProperty("streaming.sql.batchId") if tc else None
        if not query or batch is None:
            raise MeshSparkError("this Spark does not tell write tasks their streaming query id and batch id "
                                 "(local properties sql.streaming.queryId / streaming.sql.batchId): the mesh "
                                 "sink cannot write exactly once here")
        return write_task(self.cfg, f"stream/{query}/{batch}", iterator)

    def commit(self, messages, batchId) -> None:
        pass  # deduplication happened on the brokers, keyed by (query, batch, task)

    def abort(self, messages, batchId) -> None:
        pass  # a replay of this batch writes only what is missing


def write_task(cfg: MeshSinkConfig, sink_key: str, iterator) -> MeshCommitMessage:
    pa = require_pyarrow()
    from pyspark import TaskContext
    tc = TaskContext.get()
    task = tc.partitionId() if tc else 0
    pid = producer_id_for(sink_key, task, cfg)
    sender = _Sender(cfg, pid)
    try:
        router = _Router(cfg, sender, task, pa)
        for rb in iterator:
            if rb.num_rows:
                router.add(rb)
        router.close()
        sender.flush()
        return MeshCommitMessage(pid, sender.records, sender.batches, sender.duplicates,
                                 {f"{t}/{p}": n for (t, p), n in sorted(sender.per_partition.items())})
    finally:
        sender.close()


class _Open:
    __slots__ = ("values", "keys", "timestamps", "headers", "nbytes")

    def __init__(self):
        self.values: list = []
        self.keys: list | None = None
        self.timestamps: list | None = None
        self.headers: list | None = None
        self.nbytes = 0


class _Router:
    """Rows -> (topic, partition) -> record batches cut by count and bytes only."""

    def __init__(self, cfg: MeshSinkConfig, sender: "_Sender", task: int, pa):
        self.cfg, self.sender, self.task, self.pa = cfg, sender, task, pa
        self.open: dict[tuple[str, int], _Open] = {}
        self.sticky: dict[str, int] = {}

    def _bytes(self, col) -> list:
        pa = self.pa
        t = col.type
        if pa.types.is_string(t):
            col = col.cast(pa.binary())
        elif pa.types.is_large_string(t):
            col = col.cast(pa.large_binary())
        return col.to_pylist()

    def add(self, rb) -> None:
        c = self.cfg.columns
        values = self._bytes(rb.column(c["value"]))
        keys = self._bytes(rb.column(c["key"])) if "key" in c else None
        parts = rb.column(c["partition"]).to_pylist() if "partition" in c else None
        topics = rb.column(c["topic"]).to_pylist() if "topic" in c else None
        headers = None
        if "headers" in c:
            headers = [[[h["key"] or "", h["value"].encode() if isinstance(h["value"], str) else h["value"]]
                        for h in hs if h is not None] or None if hs else None
                       for hs in rb.column(c["headers"]).to_pylist()]
        ts = None
        if "timestamp" in c:
            us = rb.column(c["timestamp"]).cast(self.pa.int64()).to_pylist()
            ts = [None if x is None else x // 1000 for x in us]
        topic = self.cfg.topic
        if keys is None and parts is None and topics is None and headers is None and ts is None:
            self._add_values(topic, values)
            return
        for i, v in enumerate(values):
            t = topic if topics is None else topics[i]
            if t is None:
                raise MeshSparkError("a row has a null 'topic' and no topic option is given")
            k = keys[i] if keys is not None else None
            p = parts[i] if parts is not None else None
            n = self.sender.num_partitions(t)
            if p is not None:
                if not 0 <= p < n:
                    raise MeshSparkError(f"row {i}: partition {p} does not exist: topic {t!r} has "
                                         f"partitions 0..{n - 1}")
            elif k is not None:
                p = partition_for_key(k, n)
            h = headers[i] if headers is not None else None
            self._append(t, p, v, k, ts[i] if ts is not None else None, h)   # (v None: a null value)

    def _add_values(self, t: str, values: list) -> None:
        """Fast path for value-only rows (unkeyed, sticky): whole runs of rows per batch, cut
        exactly where the row-by-row path would cut them."""
        sizes = [0 if v is None else len(v) for v in values] if None in values else map(len, values)  # (None: null)
        cost = list(itertools.accumulate(map((8).__add__, sizes)))  # bytes up to row i
        limit = self.sender.batch_bytes(t)
        n = self.sender.num_partitions(t)
        i, total = 0, len(values)
        while i < total:
            tp = (t, (self.task + self.sticky.get(t, 0)) % n)
            o = self.open.get(tp)
            if o is None:
                o = self.open[tp] = _Open()
            base = cost[i - 1] if i else 0
            fit = bisect.bisect_right(cost, base + limit - o.nbytes, i, total) - i
            k = min(fit, self.cfg.max_batch_records - len(o.values))
            if k == 0:
                if not o.values:
                    raise MeshSparkError(f"a record of {cost[i] - base} bytes is larger than a batch may be "
                                         f"({limit} bytes: maxBatchBytes / topic {t!r} max.message.bytes)")
                self._close(tp)
                continue
            o.values.extend(values[i:i + k])
            for col in (o.keys, o.timestamps):
                if col is not None:
                    col.extend(itertools.repeat(None, k))
            if o.headers is not None:
                o.headers.extend([] for _ in range(k))
            o.nbytes += cost[i + k - 1] - base
            i += k
            if len(o.values) >= self.cfg.max_batch_records:
                self._close(tp)

    def _append(self, t, p, v, k, ts, h) -> None:
        size = (len(v) if v else 0) + (len(k) if k else 0) + (sum(len(a) + len(b or b"") for a, b in h) if h else 0) + 8
        limit = self.sender.batch_bytes(t)
        if size > limit:
            raise MeshSparkError(f"a record of {size} bytes is larger than a batch may be ({limit} bytes: "
                                 f"maxBatchBytes / topic {t!r} max.message.bytes)")
        while True:  # p None: unkeyed, the sticky partition (which moves on when its batch closes)
            tp = (t, p if p is not None else (self.task + self.sticky.get(t, 0)) % self.sender.num_partitions(t))
            o = self.open.get(tp)
            if o is None or o.nbytes + size <= limit:
                break
            self._close(tp)
        if o is None:
            o = self.open[tp] = _Open()
        idx = len(o.values)
        o.values.append(v)
        if k is not None:
            if o.keys is None:
                o.keys = [None] * idx
            o.keys.append(k)
        elif o.keys is not None:
            o.keys.append(None)
        if ts is not None:
            if o.timestamps is None:
                o.timestamps = [None] * idx
            o.timestamps.append(ts)
        elif o.timestamps is not None:
            o.timestamps.append(None)
        if h:
            if o.headers is None:
                o.headers = [[] for _ in range(idx)]
            o.headers.append(h)
        elif o.headers is not None:
            o.headers.append([])
        o.nbytes += size
        if len(o.values) >= self.cfg.max_batch_records:
            self._close(tp)

    def _close(self, tp) -> None:
        o = self.open.pop(tp)
        t, p = tp
        n = self.sender.num_partitions(t)
        if (self.task + self.sticky.get(t, 0)) % n == p:
            self.sticky[t] = self.sticky.get(t, 0) + 1  # sticky: the next unkeyed rows move on
        now_ms = int(time.time() * 1000)
        ts = now_ms if o.timestamps is None else [now_ms if x is None else x for x in o.timestamps]
        self.sender.submit(t, p, o.values, o.keys, ts, o.headers)

    def close(self) -> None:
        for tp in sorted(self.open):
            self._close(tp)


class _Chunk(SeqBatch):
    """One record batch, numbered (producer id, first sequence) once, when submitted."""
    __slots__ = ("payload", "cols")

    def __init__(self, count: int, cols: tuple):
        super().__init__(count)
        self.cols = cols
        self.payload = b""

    def encode(self) -> "_Chunk":
        self.payload = encode_batch(*self.cols, producer_id=self.producer_id, base_sequence=self.seq)
        return self

    def single(self, i: int) -> "_Chunk":
        """Record ``i`` alone, as a one-record batch with its own sequence number."""
        values, keys, ts, headers = self.cols
        cols = ([values[i]], [keys[i]] if keys else None, ts if isinstance(ts, int) else [ts[i]],
                [headers[i]] if headers else None)
        c = _Chunk(1, cols)
        c.seq, c.producer_id = self.seq + i, self.producer_id
        return c.encode()


class _Sender:
    """Pipelined, ordered, retried produce requests under one fixed producer id: the I/O
    around ``mesh.client.sequencer`` (which decides what to send, resend and finish)."""

    def __init__(self, cfg: MeshSinkConfig, producer_id: int):
        self.cfg, self.producer_id = cfg, producer_id
        self.transport = Transport(creds=cfg.creds)
        self.cluster = ClusterView(self.transport, cfg.bootstrap, timeout_ms=cfg.request_timeout_ms)
        self.seq = Sequencer(_POLICY, producer_id=producer_id)
        self.buffered = 0
        self.records = self.batches = self.duplicates = 0
        self.per_partition: dict[tuple[str, int], int] = collections.Counter()
        self._nparts: dict[str, int] = {}
        self._limit: dict[str, int] = {}
        self._next_refresh = 0.0

    def _topic(self, t: str) -> dict:
        try:
            return self.cluster.topic(t)
        except MeshError as exc:
            if exc.code == ErrorCode.UNKNOWN_TOPIC:
                raise MeshSparkError(f"unknown topic {t!r} on the mesh cluster at {self.cfg.bootstrap}: "
                                     "create it first (mesh topic create ...)") from None
            if exc.code in (ErrorCode.BROKER_UNAVAILABLE, ErrorCode.TIMEOUT):
                raise MeshSparkError(f"cannot reach any mesh broker at {self.cfg.bootstrap!r} (the \"bootstrap\" "
                                     f"option): {exc}") from None
            raise

    def num_partitions(self, t: str) -> int:
        n = self._nparts.get(t)
        if n is None:
            n = self._nparts[t] = len(self._topic(t)["partitions"])
        return n

    def batch_bytes(self, t: str) -> int:
        lim = self._limit.get(t)
        if lim is None:
            topic_max = int(self._topic(t).get("config", {}).get("max.message.bytes", 1 << 20))
            lim = self._limit[t] = min(self.cfg.max_batch_bytes, topic_max - BATCH_OVERHEAD_BYTES)
        return lim

    def submit(self, t: str, p: int, values, keys, ts, headers) -> None:
        c = _Chunk(len(values), (values, keys, ts, headers))
        self.seq.append((t, p), c)
        self.seq.assign((t, p), c)
        self.buffered += len(c.encode().payload)
        self._pump(0)
        while self.buffered > _BUFFER_BYTES:
            self._pump(50)

    def flush(self) -> None:
        deadline = time.monotonic() + self.cfg.delivery_timeout_ms / 1000
        while self.seq.busy():
            if time.monotonic() > deadline:
                raise MeshSparkError(f"records not acknowledged within deliveryTimeoutMs="
                                     f"{self.cfg.delivery_timeout_ms}")
            self._pump(50)

    def _pump(self, wait_ms: int) -> None:
        seq = self.seq
        now_ms = time.monotonic() * 1000
        for tp in seq.partitions():
            while (c := seq.next_to_send(tp, now_ms)) is not None:
                addr = self._leader(tp)
                if addr is None or self.transport.is_down(addr):
                    seq.wait(tp, now_ms)  # no leader, or its connection is down: ask again soon
                    self._refresh(tp)
                    break
                rid = self.transport.send(addr, ProduceRequest(tp[0], tp[1], self.cfg.acks, self.cfg.request_timeout_ms),
                                          c.payload if c.probe is None else c.probe.payload)
                seq.sent(tp, c, rid, now_ms, addr)
        self._take_done()
        for _addr, rid, resp, _ in self.transport.poll(wait_ms):
            if not isinstance(resp, (ProduceResponse, ErrorResponse)):
                continue  # a late answer to a metadata request given up on
            err, leader = resp.error, resp.leader
            out = seq.on_reply(rid, err, time.monotonic() * 1000, message=resp.message, leader=leader,
                               rejected=isinstance(resp, ErrorResponse))
            if out is None:
                continue  # an answer to an attempt given up on
            if out.action == SPLIT:
                self.buffered += sum(len(x.payload) for x in out.replaced_by) - len(out.batch.payload)
            elif out.action == RETRY:
                self._after_retry(out.tp, MeshError(err, leader=leader))
            self._take_done()
        gone = self.transport.take_disconnected()
        for tp, _c, err in seq.expire(time.monotonic() * 1000, self.cfg.request_timeout_ms, gone):
            self._after_retry(tp, err)
        self._take_done()

    def _take_done(self) -> None:
        for d in self.seq.take_done():
            tp, c = d.tp, d.batch
            self.buffered -= len(c.payload)
            if d.error is not None:
                how = "keeps failing" if d.gave_up else "failed"
                raise MeshSparkError(f"writing to {tp[0]}/{tp[1]} {how}: {d.error}")
            self.batches += 1
            self.duplicates += d.duplicate
            self.records += c.count
            self.per_partition[tp] += c.count

    def _after_retry(self, tp, err: MeshError) -> None:
        if err.leader:
            self.cluster.set_leader(tp[0], tp[1], err.leader)
        else:
            self._refresh(tp)

    def _refresh(self, tp) -> None:
        now = time.monotonic()
        if now < self._next_refresh:
            return
        self._next_refresh = now + 0.1
        try:
            self.cluster.refresh([tp[0]])  # answers to produce requests meanwhile wait in the transport
        except MeshError:
            pass  # try again after the backoff

    def _leader(self, tp) -> str | None:
        try:
            return self.cluster.leader_address(*tp)
        except MeshError as exc:
            if exc.retriable:
                return None
            raise

    def close(self) -> None:
        self.transport.close()
