"""The consumer: assigned partitions, positions, pipelined long-poll fetches.

I/O happens in the caller's thread, inside ``poll()`` (as kafka-python does). One fetch is
kept in flight per leader broker, covering every assigned partition that broker leads, so
the next data is usually already on its way while the caller processes the last. The
read-ahead is bounded: no fetch is sent while the records fetched and not yet returned
come to ``fetch_max_bytes`` or more (raw batch bytes), so a caller that takes fewer records
per poll than a fetch brings holds at most about two fetches' worth, however long the
topic (before, a consumer in a group pulled the whole topic into memory that way; the
text gateway runs such consumers inside the broker).
Records come back in offset order per partition; batches are checked (length, CRC) once,
when a fetch answer is walked (``mesh.wire.records.iter_batches``), and decoded in bulk
later from the header that walk parsed (``records_from``). A batch that cannot be decoded
or whose columns are not records (keys that are ints...: a batch stored by an older broker,
which did not check columns; ``mesh.wire.record_check``) stops its partition where it is,
as Kafka's consumer does: ``poll`` first returns what came before it, then raises
``CORRUPT_MESSAGE`` naming the batch until the caller seeks past it; nothing before it is
skipped. A group member raises it once and skips the batch (``_poison``).
"""
from __future__ import annotations

import collections
import logging
import time
from typing import NamedTuple

from mesh.client.cluster import ClusterView, TopicPartition
from mesh.client.transport import Transport
from mesh.wire.errors import ErrorCode, MeshError, retriable
from mesh.wire.messages import EARLIEST, LATEST, ErrorResponse, FetchRequest
from mesh.wire.records import Record, iter_batches, records_from

__all__ = ["Consumer", "TopicPartition", "OffsetAndTimestamp"]


class OffsetAndTimestamp(NamedTuple):
    """An answer of ``Consumer.offsets_for_times`` (as kafka-python's)."""
    offset: int
    timestamp: int

log = logging.getLogger("mesh.consumer")
_tuple_new = tuple.__new__


class Consumer:
    def __init__(self, *topics: str, bootstrap: str = "127.0.0.1:7101",
                 auto_offset_reset: str = "latest", fetch_max_wait_ms: int = 500,
                 fetch_min_bytes: int = 1, max_partition_fetch_bytes: int = 1 << 20,
                 fetch_max_bytes: int = 16 << 20, max_poll_records: int = 100_000,
                 request_timeout_ms: int = 10_000, group_id: str | None = None, context=None, creds=None,
                 **group_options):
        if auto_offset_reset not in ("earliest", "latest", "none"):
            raise ValueError("auto_offset_reset must be 'earliest', 'latest' or 'none'")
        self.transport = Transport(context=context, creds=creds)   # context, creds: see Transport
        self.cluster = ClusterView(self.transport, bootstrap)
        self.auto_offset_reset = auto_offset_reset
        self.max_wait_ms = fetch_max_wait_ms
        self.min_bytes = fetch_min_bytes
        self.part_max = max_partition_fetch_bytes
        self.max_bytes = fetch_max_bytes
        self.max_poll_records = max_poll_records
        self.request_timeout_s = request_timeout_ms / 1000
        self._positions: dict[TopicPartition, int | None] = {}
        self._assigned: list[TopicPartition] = []
        self._inflight: dict[int, tuple[str, float, dict]] = {}   # rid -> (addr, sent, {tp: offset})
        self._busy_addrs: set[str] = set()
        # fetched, not yet returned: raw (topic, partition, batch, min offset, header) or decoded lists
        self._buffer: collections.deque = collections.deque()
        self._buffered_bytes = 0   # raw batch bytes of the buffer's undecoded items (read-ahead bound)
        self._high_watermarks: dict[TopicPartition, int] = {}
        self._next_refresh = 0.0
        self._closed = False
        self._group = None
        if group_id is not None:
            from mesh.client.group import GroupMembership  # groups come with their own issue
            self._group = GroupMembership(self, group_id, **group_options)
        if topics:
            self.subscribe(list(topics))

    # -- assignment ---------------------------------------------------------------------
    def subscribe(self, topics: list[str]) -> None:
        if self._group is not None:
            self._group.subscribe(topics)
            return
        tps = []
        for t in topics:
            tps.extend(TopicPartition(t, p) for p in range(self.cluster.partitions(t)))
        self.assign(tps)

    def assign(self, partitions: list) -> None:
        tps = [TopicPartition(*tp) for tp in partitions]
        for tp in tps:
            if tp.partition >= self.cluster.partitions(tp.topic) or tp.partition < 0:
                raise MeshError(ErrorCode.UNKNOWN_PARTITION, f"{tp.topic} has no partition {tp.partition}")
        self._assigned = tps
        self._positions = {tp: self._positions.get(tp) for tp in tps}
        self._drop_buffered(lambda tp: tp not in self._positions)

    def assignment(self) -> list[TopicPartition]:
        return list(self._assigned)

    def seek(self, tp, offset: int) -> None:
        tp = TopicPartition(*tp)
        if tp not in self._positions:
            raise MeshError(ErrorCode.INVALID_REQUEST, f"{tp} is not assigned")
        self._positions[tp] = offset
        self._drop_buffered(lambda x: x == tp)
        if self._group is not None:
            self._group.on_seek(tp, offset)

    def seek_to_beginning(self, *tps) -> None:
        for tp, off in self._list_offsets(list(tps) or self._assigned, EARLIEST).items():
            self.seek(tp, off)

    def seek_to_end(self, *tps) -> None:
        for tp, off in self._list_offsets(list(tps) or self._assigned, LATEST).items():
            self.seek(tp, off)

    def position(self, tp) -> int:
        """Offset of the next record poll() will return for ``tp``."""
        tp = TopicPartition(*tp)
        for item in self._buffer:
            if self._tp_of(item) == tp:
                return item[0].offset if isinstance(item, list) else max(item[3], item[4].base_offset)
        if self._positions.get(tp) is None:
            self._reset_positions([tp])
        return self._positions[tp]

    # -- consumer groups ------------------------------------------------------------------
    def commit(self, offsets: dict | None = None) -> None:
        """Commit ``offsets`` ({TopicPartition: offset or (offset, metadata)}; the offset is
        the next one to read), or the position after every record returned so far. Returns
        once the offsets are durable on the group's coordinator. Needs ``group_id``."""
        if self._group is None:
            raise MeshError(ErrorCode.INVALID_REQUEST, "commit() needs a consumer created with group_id")
        self._group.commit(offsets)

    def committed(self, tp) -> int | None:
        """The group's committed offset of ``tp`` (None if nothing is committed)."""
        if self._group is None:
            raise MeshError(ErrorCode.INVALID_REQUEST, "committed() needs a consumer created with group_id")
        return self._group.committed(TopicPartition(*tp))

    def end_offsets(self, tps) -> dict[TopicPartition, int]:
        return self._list_offsets([TopicPartition(*tp) for tp in tps], LATEST)

    def beginning_offsets(self, tps) -> dict[TopicPartition, int]:
        return self._list_offsets([TopicPartition(*tp) for tp in tps], EARLIEST)

    def offsets_for_times(self, timestamps: dict) -> dict[TopicPartition, "OffsetAndTimestamp | None"]:
        """{tp: OffsetAndTimestamp(offset, timestamp) of the earliest record whose timestamp
        is >= ``timestamps[tp]`` (ms), or None if no record reaches it} (kafka-python's
        ``offsets_for_times``); seek to the offset to read from that time on."""
        got = self.cluster.offsets_for_times({TopicPartition(*tp): ts for tp, ts in timestamps.items()},
                                             timeout_ms=int(self.request_timeout_s * 1000))
        return {tp: None if v is None else OffsetAndTimestamp(*v) for tp, v in got.items()}

    def _drop_buffered(self, pred) -> None:
        self._buffer = collections.deque(r for r in self._buffer if r and not pred(self._tp_of(r)))
        self._buffered_bytes = sum(len(r[2]) for r in self._buffer if not isinstance(r, list))
        for rid, (addr, sent, offs) in list(self._inflight.items()):
            if any(pred(tp) for tp in offs):
                self._inflight.pop(rid)
                self._busy_addrs.discard(addr)

    @staticmethod
    def _tp_of(item) -> TopicPartition:
        if isinstance(item, list):
            return TopicPartition(item[0].topic, item[0].partition)
        return TopicPartition(item[0], item[1])

    def _list_offsets(self, tps: list[TopicPartition], which: int) -> dict[TopicPartition, int]:
        """Ask each partition's leader; retriable errors (no leader yet, leader moved) are
        retried with a metadata refresh until the request timeout."""
        return self.cluster.list_offsets(tps, which, timeout_ms=int(self.request_timeout_s * 1000))

    def _reset_positions(self, tps: list[TopicPartition]) -> None:
        if self.auto_offset_reset == "none":
            raise MeshError(ErrorCode.OFFSET_OUT_OF_RANGE, f"no position for {tps} and auto_offset_reset='none'")
        which = EARLIEST if self.auto_offset_reset == "earliest" else LATEST
        for tp, off in self._list_offsets(tps, which).items():
            if tp in self._positions:
                self._positions[tp] = off

    # -- fetching -----------------------------------------------------------------------
    def _send_fetches(self) -> None:
        pending = {tp for _, _, offs in self._inflight.values() for tp in offs}
        if pending and pending.issuperset(self._positions):
            return  # every assigned partition has a fetch in flight (the common case: poll_batches
            #         prefetches, then asks again on its next call)
        missing = [tp for tp, off in self._positions.items() if off is None]
        if missing and self._group is not None:
            missing = self._group.initial_positions(missing)   # the group's committed offsets
        if missing:
            self._reset_positions(missing)
        by_addr: dict[str, dict] = collections.defaultdict(dict)
        leaderless = False
        leader_of = self.cluster.leader_of   # cached until a refresh or a NOT_LEADER hint
        for tp, off in self._positions.items():
            if tp in pending:
                continue
            addr = leader_of(tp)
            if addr is None:
                leaderless = True
                continue
            if addr in self._busy_addrs:
                continue
            by_addr[addr][tp] = off
        if leaderless and time.monotonic() >= self._next_refresh:
            self._next_refresh = time.monotonic() + 0.2
            try:
                self.cluster.refresh()
            except MeshError as exc:
                log.debug("metadata refresh failed: %s", exc)
        for addr, offs in by_addr.items():
            req = FetchRequest([[tp.topic, tp.partition, off, self.part_max] for tp, off in offs.items()],
                               self.max_wait_ms, self.min_bytes, self.max_bytes)
            rid = self.transport.send(addr, req)
            self._inflight[rid] = (addr, time.monotonic(), offs)
            self._busy_addrs.add(addr)

    def _handle_fetch(self, rid: int, resp, payload) -> None:
        addr, _, offs = self._inflight.pop(rid)
        self._busy_addrs.discard(addr)
        if isinstance(resp, ErrorResponse):
            if not retriable(resp.error):
                raise MeshError(resp.error, resp.message)
            self.cluster.refresh()
            return
        mv = memoryview(payload or b"")
        pos = 0
        refresh = False
        positions, append = self._positions, self._buffer.append
        added = 0
        for topic, partition, err, hw, log_start, nbytes, leader in resp.parts:
            tp = _tuple_new(TopicPartition, (topic, partition))   # (without the NamedTuple's Python __new__)
            chunk = mv[pos:pos + nbytes]
            pos += nbytes
            start = offs.get(tp)
            if start is None or positions.get(tp) != start:
                continue  # not asked for, or reassigned or sought meanwhile: stale data
            if err == ErrorCode.OFFSET_OUT_OF_RANGE:
                if self.auto_offset_reset == "none":
                    raise MeshError(err, f"offset {offs[tp]} out of range [{log_start}, {hw}] for {tp}")
                log.warning("offset %s out of range [%s, %s] for %s: resetting (%s)",
                            offs[tp], log_start, hw, tp, self.auto_offset_reset)
                self._positions[tp] = log_start if self.auto_offset_reset == "earliest" else hw
                continue
            if err:
                if leader:
                    self.cluster.set_leader(topic, partition, leader)
                elif retriable(err):
                    refresh = True
                else:
                    raise MeshError(err, f"fetch {tp}")
                continue
            self._high_watermarks[tp] = hw
            if not nbytes:
                continue
            end = start
            for h, batch in iter_batches(chunk):  # headers only: records are decoded in _take
                nxt = h.base_offset + h.record_count   # (h.next_offset without a property call)
                if nxt > start:
                    append((topic, partition, batch, start, h))   # (records_from's arguments)
                    added += len(batch)
                    end = nxt
            if end > start:
                positions[tp] = end
        self._buffered_bytes += added
        if refresh:
            self.cluster.refresh()

    def poll(self, timeout_ms: int = 1000, max_records: int | None = None) -> dict[TopicPartition, list[Record]]:
        """Records fetched since the last poll, by partition; waits up to ``timeout_ms``."""
        batches = self.poll_batches(timeout_ms, max_records)
        out: dict[TopicPartition, list[Record]] = {}
        for recs in batches:
            out.setdefault(TopicPartition(recs[0].topic, recs[0].partition), []).extend(recs)
        return out

    def poll_batches(self, timeout_ms: int = 1000, max_records: int | None = None) -> list[list[Record]]:
        """Like ``poll`` but returns the lists of records as fetched (one list per batch
        run of one partition), without regrouping."""
        if self._closed:
            raise MeshError(ErrorCode.INVALID_REQUEST, "consumer is closed")
        limit = max_records or self.max_poll_records
        deadline = time.monotonic() + timeout_ms / 1000
        if self._group is not None:
            self._group.maybe_heartbeat()
        while True:
            if self._buffer:
                if self._group is not None:
                    self._receive(0)  # group answers must not wait for the buffer to drain
                self._prefetch()
                return self._take(limit)
            self._send_fetches()
            left = deadline - time.monotonic()
            self._receive(max(0, int(left * 1000)))
            self._expire_fetches()
            if self._buffer:
                self._prefetch()
                return self._take(limit)
            if time.monotonic() >= deadline:
                return []
            if self._group is not None:
                self._group.maybe_heartbeat()

    def _prefetch(self) -> None:
        """Fetch the next while the caller works, unless ``fetch_max_bytes`` of records
        already wait to be returned (the read-ahead bound)."""
        if self._buffered_bytes < self.max_bytes:
            self._send_fetches()

    def _receive(self, timeout_ms: int) -> None:
        for _addr, rid, resp, payload in self.transport.poll(timeout_ms):
            if rid in self._inflight:
                self._handle_fetch(rid, resp, payload)
            elif self._group is not None:
                self._group.on_response(rid, resp)

    def _take(self, limit: int) -> list[list[Record]]:
        out, n = [], 0
        while self._buffer and n < limit:
            item = self._buffer[0]
            if isinstance(item, list):
                recs = item
            else:
                try:
                    recs = records_from(*item)
                except Exception as exc:   # stored unchecked by an older broker (the CRC holds)
                    if out:
                        break   # what came before it first; the next poll stops at this batch
                    self._poison(item, exc)
                self._buffered_bytes -= len(item[2])
            self._buffer.popleft()
            if n + len(recs) > limit:
                cut = limit - n
                self._buffer.appendleft(recs[cut:])
                recs = recs[:cut]
            if recs:
                out.append(recs)
                n += len(recs)
        if self._group is not None:
            self._group.on_consumed(out)
        return out

    def _poison(self, item, exc: Exception) -> None:
        """A batch at the head of the buffer whose columns are not records: raise
        CORRUPT_MESSAGE naming it. A consumer without a group stays on it until the caller
        seeks (Kafka's consumer does the same); a group member skips it (its position and
        the offset a commit sends move past it), so one bad batch cannot stop the group for
        good: the error is raised once, the next poll goes on after it."""
        topic, partition, _, start, h = item
        first, last = max(start, h.base_offset), h.base_offset + h.record_count - 1
        why = exc.message if isinstance(exc, MeshError) else f"{type(exc).__name__}: {exc}"
        where = f"{topic}/{partition}: the batch of offsets {first}..{last} cannot be decoded ({why})"
        if self._group is None:
            raise MeshError(ErrorCode.CORRUPT_MESSAGE, f"{where}; seek past offset {last} to go on") from exc
        self._buffer.popleft()
        self._buffered_bytes -= len(item[2])
        self._group.on_seek(TopicPartition(topic, partition), last + 1)
        log.error("%s: skipped (a group member does not stop on it)", where)
        raise MeshError(ErrorCode.CORRUPT_MESSAGE, f"{where}; skipped: the next poll goes on at {last + 1}") from exc

    def _expire_fetches(self) -> None:
        now = time.monotonic()
        gone = self.transport.take_disconnected()
        for rid, (addr, sent, offs) in list(self._inflight.items()):
            if addr in gone or now - sent > self.request_timeout_s + self.max_wait_ms / 1000:
                del self._inflight[rid]
                self._busy_addrs.discard(addr)
                self.transport.forget(addr)
                try:
                    self.cluster.refresh()
                except MeshError as exc:
                    log.warning("metadata refresh failed: %s", exc)

    def __iter__(self):
        while not self._closed:
            for recs in self.poll_batches(1000):
                yield from recs

    def highwater(self, tp) -> int | None:
        return self._high_watermarks.get(TopicPartition(*tp))

    def close(self) -> None:
        if self._closed:
            return
        if self._group is not None:
            self._group.close()
        self._closed = True
        self.transport.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
