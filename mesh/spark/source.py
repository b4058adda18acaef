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

Where the pieces are: options and errors in ``mesh.spark.options``, the pure offset
planning (offsets JSON, startingOffsets / endingOffsets, ranges, maxOffsetsPerTrigger) in
``mesh.spark.planning``, the Arrow conversion in ``mesh.spark.arrow``; this module holds
the readers and the I/O (metadata, ListOffsets through ``ClusterView.list_offsets``,
fetches).
"""
from __future__ import annotations

import logging
import time
from typing import Iterator

from mesh.spark.options import MeshOptions, MeshSparkError, require_pyarrow
from mesh.spark.planning import (
    MeshPartition, offsets_from_json, offsets_to_json, plan_partitions, rate_limit, resolve_offsets,
    resolve_by_timestamp,
)
from mesh.spark.arrow import arrow_schema, to_arrow
from mesh.client.admin import Admin
from mesh.client.cluster import TopicPartition
from mesh.client.transport import Transport
from mesh.wire.errors import ErrorCode, MeshError
from mesh.wire.messages import EARLIEST, LATEST, ErrorResponse, FetchRequest
from mesh.wire.records import iter_batches

from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow,
)

__all__ = ["MeshBatchReader", "MeshStreamReader", "read_range"]

log = logging.getLogger("mesh.spark")

_FETCH_WAIT_MS = 200


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
            self._admin = Admin(self.opts.bootstrap, request_timeout_ms=self.opts.request_timeout_ms,
                                creds=self.opts.creds)
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
        """Log start (EARLIEST) or high watermark (LATEST) of each partition of ``leaders``,
        from its leader (``ClusterView.list_offsets``: retried until requestTimeoutMs)."""
        cluster = self.admin.cluster
        for (t, p), addr in leaders.items():
            if addr:
                cluster.set_leader(t, p, addr)
        timeout_ms = self.opts.request_timeout_ms
        try:
            got = cluster.list_offsets(sorted(leaders), which, timeout_ms=timeout_ms, request_timeout_ms=timeout_ms)
        except MeshError as exc:
            if exc.code in (ErrorCode.BROKER_UNAVAILABLE, ErrorCode.TIMEOUT):
                raise self._unreachable(exc) from None
            if exc.code == ErrorCode.LEADER_NOT_AVAILABLE:
                raise MeshSparkError(f"no leader answered within {timeout_ms} ms: {exc}") from None
            raise MeshSparkError(f"cannot list offsets: {exc}") from None
        return {(tp.topic, tp.partition): off for tp, off in got.items()}

    def offsets_for_times(self, leaders: dict, query: dict) -> dict[tuple[str, int], int | None]:
        """{(topic, partition): the first offset whose record's timestamp is >= query[tp], or
        None} (``ClusterView.offsets_for_times``), errors as ``list_offsets``."""
        cluster = self.admin.cluster
        for (t, p), addr in leaders.items():
            if addr:
                cluster.set_leader(t, p, addr)
        timeout_ms = self.opts.request_timeout_ms
        try:
            got = cluster.offsets_for_times({TopicPartition(*tp): ts for tp, ts in query.items()},
                                            timeout_ms=timeout_ms, request_timeout_ms=timeout_ms)
        except MeshError as exc:
            if exc.code in (ErrorCode.BROKER_UNAVAILABLE, ErrorCode.TIMEOUT):
                raise self._unreachable(exc) from None
            raise MeshSparkError(f"cannot list offsets by timestamp: {exc}") from None
        return {(tp.topic, tp.partition): None if v is None else v[0] for tp, v in got.items()}

    def starting(self, leaders: dict, default: str, allow: tuple[str, ...]) -> dict:
        """The starting offsets: by timestamp (startingTimestamp / startingOffsetsByTimestamp,
        which win over startingOffsets, as in Spark's Kafka source), else startingOffsets."""
        if self.opts.starting_timestamps is not None:
            return resolve_by_timestamp(self.opts.starting_timestamps, leaders, self.offsets_for_times,
                                        self.list_offsets, self.opts.starting_timestamp_strategy)
        return resolve_offsets(self.opts.starting, default, leaders, self.list_offsets,
                               what="startingOffsets", allow=allow)

    def close(self) -> None:
        if self._admin is not None:
            self._admin.close()
            self._admin = None


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
    schema = arrow_schema()
    opts = part.opts
    topic, partition, end = part.topic, part.partition, part.end
    transport = Transport(creds=opts.creds)
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

    def on_bad(h, exc: MeshError) -> None:
        first, last = max(off, h.base_offset), h.base_offset + h.record_count - 1
        where = f"{topic}/{partition}: the batch of offsets {first}..{last} cannot be decoded ({exc.message})"
        if opts.fail_on_data_loss:
            raise MeshSparkError(f'{where}. Set option "failOnDataLoss" to "false" to skip such batches')
        log.warning("%s: skipped (failOnDataLoss=false)", where)

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
                got = resp.parts[0]
                err, hw, log_start, nbytes, hint = got.error, got.high_watermark, got.log_start, got.nbytes, got.leader
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
            rb = to_arrow(pa, schema, topic, partition, batches, off, end, on_bad)
            off = nxt
            if rb is not None:
                yield rb
    finally:
        transport.close()


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
            start = cluster.starting(leaders, "earliest", ("earliest",))
            end = resolve_offsets(self.opts.ending, "latest", leaders, cluster.list_offsets,
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
        return offsets_to_json(self._cluster.starting(leaders, "latest", ("earliest", "latest")))

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
            end = rate_limit(begin, end, limit.max_rows)
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
