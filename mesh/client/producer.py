"""The producer: batching, partitioning, pipelining, retries, idempotence.

``send()`` only appends the record to its partition's open batch (under a lock) and
returns a future; a background I/O thread closes batches when they are full or have
lingered ``linger_ms``, encodes each once, and pipelines up to ``max_in_flight`` requests
per partition to its leader.

Ordering and exactly-once across retries: the producer has a random 62-bit producer id;
every batch carries it and the sequence number of its first record. On a retriable error
(or a timeout) the partition's unacknowledged batches are all sent again, in sequence
order, after a backoff and a metadata refresh; the leader drops the ones it already has
(answering with their original offsets). A batch fails for good after ``retries`` attempts
or ``delivery_timeout_ms``, or at once on a non-retriable error; then the partition's later
queued batches fail too (their order could not be kept) and the partition restarts its
sequence under a fresh producer id.
"""
from __future__ import annotations

import collections
import logging
import os
import random
import threading
import time
from concurrent.futures import Future
from typing import NamedTuple

import zmq

from mesh.client.cluster import ClusterView
from mesh.client.transport import Transport
from mesh.wire.errors import ErrorCode, MeshError, retriable
from mesh.wire.messages import ProduceRequest, ProduceResponse
from mesh.wire.partitioner import partition_for_key
from mesh.wire.records import encode_batch
from mesh.wire.topic_config import MAX_RECORD_BYTES

__all__ = ["Producer", "RecordMetadata", "RecordFuture"]

log = logging.getLogger("mesh.producer")
_ACKS = {"0": 0, "1": 1, "all": -1, "-1": -1, 0: 0, 1: 1, -1: -1}


class RecordMetadata(NamedTuple):
    topic: str
    partition: int
    offset: int


class RecordFuture:
    """The future of one record: a view on its batch's future."""
    __slots__ = ("_batch", "_index")

    def __init__(self, batch: "_Batch", index: int):
        self._batch = batch
        self._index = index

    def get(self, timeout: float | None = None) -> RecordMetadata:
        base = self._batch.future.result(timeout)
        b = self._batch
        return RecordMetadata(b.topic, b.partition, base + self._index)

    def done(self) -> bool:
        return self._batch.future.done()

    def exception(self, timeout: float | None = None):
        return self._batch.future.exception(timeout)

    def add_callback(self, fn) -> "RecordFuture":
        self._batch.future.add_done_callback(
            lambda f: fn(self.get()) if f.exception() is None else None)
        return self

    def add_errback(self, fn) -> "RecordFuture":
        self._batch.future.add_done_callback(
            lambda f: fn(f.exception()) if f.exception() is not None else None)
        return self


class _Batch:
    __slots__ = ("topic", "partition", "values", "keys", "timestamps", "headers", "nbytes",
                 "created", "future", "payload", "seq", "attempts", "deadline", "sent_at",
                 "producer_id", "closed", "sent_to")

    def __init__(self, topic: str, partition: int, now: float, delivery_s: float):
        self.topic, self.partition = topic, partition
        self.values: list = []
        self.keys: list | None = None
        self.timestamps: list = []
        self.headers: list | None = None
        self.nbytes = 0
        self.created = now
        self.future: Future = Future()
        self.payload: bytes | None = None
        self.seq = -1
        self.attempts = 0
        self.deadline = now + delivery_s
        self.sent_at = 0.0
        self.producer_id = -1
        self.closed = False
        self.sent_to = ""


class _Part:
    """I/O-thread state of one partition."""
    __slots__ = ("queue", "inflight", "backoff_until", "next_seq", "producer_id", "backoff_s")

    def __init__(self, producer_id: int):
        self.queue: collections.deque[_Batch] = collections.deque()   # ready, not sent
        self.inflight: dict[int, _Batch] = {}                         # rid -> batch, in send order
        self.backoff_until = 0.0
        self.backoff_s = 0.0
        self.next_seq = 0
        self.producer_id = producer_id


def _new_producer_id() -> int:
    return int.from_bytes(os.urandom(8), "big") >> 2


class Producer:
    def __init__(self, bootstrap: str = "127.0.0.1:7101", *, acks="all", linger_ms: int = 5,
                 batch_size: int = 64 << 10, max_in_flight: int = 5, retries: int = 20,
                 retry_backoff_ms: int = 100, retry_backoff_max_ms: int = 1000,
                 request_timeout_ms: int = 10_000, delivery_timeout_ms: int = 60_000,
                 buffer_memory: int = 64 << 20, max_block_ms: int = 60_000,
                 max_record_bytes: int = MAX_RECORD_BYTES, enable_idempotence: bool = True,
                 client_id: str = ""):
        if acks not in _ACKS:
            raise ValueError(f"acks must be 0, 1 or 'all', not {acks!r}")
        self.acks = _ACKS[acks]
        self.linger_s = linger_ms / 1000
        self.batch_size = batch_size
        from mesh.node.producer_state import RECENT_BATCHES
        if enable_idempotence and not 1 <= max_in_flight <= RECENT_BATCHES:
            raise ValueError(f"max_in_flight must be 1..{RECENT_BATCHES} with idempotence "
                             f"(the broker remembers that many batches per producer)")
        self.max_in_flight = max_in_flight
        self.retries = retries
        self.backoff_s, self.backoff_max_s = retry_backoff_ms / 1000, retry_backoff_max_ms / 1000
        self.request_timeout_s = request_timeout_ms / 1000
        self.delivery_s = delivery_timeout_ms / 1000
        self.buffer_memory = buffer_memory
        self.max_block_s = max_block_ms / 1000
        self.max_record_bytes = max_record_bytes
        self.idempotent = enable_idempotence and self.acks != 0
        self._bootstrap = bootstrap
        # user side
        self._lock = threading.Condition()
        self._open: dict[tuple[str, int], _Batch] = {}
        self._ready: collections.deque[_Batch] = collections.deque()
        self._buffered = 0
        self._sticky: dict[str, int] = {}
        self._partitions: dict[str, int] = {}
        self._flush_requested = 0
        self._closed = False
        self._unfinished: set[_Batch] = set()
        self._rng = random.Random()
        # I/O side
        self._io_error: BaseException | None = None
        self._wake_addr = f"inproc://mesh-producer-{id(self)}-{_new_producer_id()}"
        ctx = zmq.Context.instance()
        self._wake_rx = ctx.socket(zmq.PAIR)
        self._wake_rx.bind(self._wake_addr)
        self._wake_tx = ctx.socket(zmq.PAIR)
        self._wake_tx.connect(self._wake_addr)
        self._woken = False
        self._meta_lock = threading.Lock()
        self._meta_transport = Transport()
        self.cluster = ClusterView(self._meta_transport, bootstrap)
        self._thread = threading.Thread(target=self._io_main, name="mesh-producer-io", daemon=True)
        self._thread.start()

    # -- user side ----------------------------------------------------------------------
    def _num_partitions(self, topic: str) -> int:
        n = self._partitions.get(topic)
        if n is None:
            with self._meta_lock:
                n = self.cluster.partitions(topic)
            self._partitions[topic] = n
        return n

    def send(self, topic: str, value: bytes | None = None, key: bytes | None = None,
             partition: int | None = None, headers: list | None = None,
             timestamp_ms: int | None = None) -> RecordFuture:
        """Queue one record; returns a future of its RecordMetadata."""
        if value is not None and not isinstance(value, (bytes, bytearray)):
            raise TypeError(f"value must be bytes or None, not {type(value).__name__}")
        if key is not None and not isinstance(key, (bytes, bytearray)):
            raise TypeError(f"key must be bytes or None, not {type(key).__name__}")
        value = b"" if value is None else bytes(value)
        size = len(value) + (len(key) if key else 0) + (
            sum(len(k) + len(v) for k, v in headers) if headers else 0)
        if size > self.max_record_bytes:
            raise MeshError(ErrorCode.MESSAGE_TOO_LARGE,
                            f"record of {size} bytes exceeds max_record_bytes={self.max_record_bytes}")
        n = self._num_partitions(topic)
        if partition is None:
            partition = partition_for_key(key, n) if key is not None else None
        elif not 0 <= partition < n:
            raise MeshError(ErrorCode.UNKNOWN_PARTITION, f"topic {topic!r} has partitions 0..{n - 1}")
        ts = int(time.time() * 1000) if timestamp_ms is None else timestamp_ms
        with self._lock:
            self._check_open()
            self._wait_for_space(size)
            if partition is None:  # sticky: fill one partition's batch, then move on
                partition = self._sticky.get(topic)
                if partition is None:
                    partition = self._sticky[topic] = self._rng.randrange(n)
            tp = (topic, partition)
            b = self._open.get(tp)
            if b is None:
                b = self._open[tp] = _Batch(topic, partition, time.monotonic(), self.delivery_s)
                self._unfinished.add(b)
                self._wake()  # so the I/O thread starts this batch's linger clock
            idx = len(b.values)
            b.values.append(value)
            b.timestamps.append(ts)
            if key is not None:
                if b.keys is None:
                    b.keys = [None] * idx
                b.keys.append(bytes(key))
            elif b.keys is not None:
                b.keys.append(None)
            if headers:
                if b.headers is None:
                    b.headers = [[] for _ in range(idx)]
                b.headers.append([[str(k), bytes(v)] for k, v in headers])
            elif b.headers is not None:
                b.headers.append([])
            b.nbytes += size + 8
            self._buffered += size + 8
            if b.nbytes >= self.batch_size:
                self._close_batch(b)
            return RecordFuture(b, idx)

    def send_batch(self, topic: str, values: list[bytes], partition: int | None = None,
                   keys: list | None = None, timestamp_ms: int | None = None) -> Future:
        """Bulk path: queue many records for one partition as one batch, with no per-record
        work; returns a Future of the batch's base offset."""
        n = self._num_partitions(topic)
        if partition is None:
            partition = self._rng.randrange(n)
        if not 0 <= partition < n:
            raise MeshError(ErrorCode.UNKNOWN_PARTITION, f"topic {topic!r} has partitions 0..{n - 1}")
        if not values:
            raise ValueError("send_batch needs at least one value")
        nbytes = sum(map(len, values)) + 8 * len(values)
        if nbytes > self.max_record_bytes:
            raise MeshError(ErrorCode.MESSAGE_TOO_LARGE,
                            f"batch of {nbytes} bytes exceeds max_record_bytes={self.max_record_bytes}: split it")
        ts = int(time.time() * 1000) if timestamp_ms is None else timestamp_ms
        b = _Batch(topic, partition, time.monotonic(), self.delivery_s)
        b.values, b.keys, b.timestamps, b.nbytes = values, keys, ts, nbytes
        with self._lock:
            self._check_open()
            self._wait_for_space(nbytes)
            self._buffered += nbytes
            self._unfinished.add(b)
            self._close_batch(b)
        return b.future

    def _check_open(self) -> None:
        if self._closed:
            raise MeshError(ErrorCode.INVALID_REQUEST, "producer is closed")
        if self._io_error is not None:
            raise MeshError(ErrorCode.UNKNOWN, f"producer I/O thread failed: {self._io_error}")

    def _wait_for_space(self, size: int) -> None:
        deadline = time.monotonic() + self.max_block_s
        while self._buffered + size > self.buffer_memory and self._buffered > 0:
            left = deadline - time.monotonic()
            if left <= 0:
                raise MeshError(ErrorCode.TIMEOUT,
                                f"buffer_memory={self.buffer_memory} full for max_block_ms")
            self._lock.wait(left)

    def _close_batch(self, b: _Batch) -> None:
        """Caller holds the lock. Unkeyed records stick to one partition until its batch
        closes (full, or lingered), then move to another (Kafka's sticky partitioner)."""
        if self._open.get((b.topic, b.partition)) is b:
            del self._open[(b.topic, b.partition)]
            n = self._partitions.get(b.topic, 1)
            if self._sticky.get(b.topic) == b.partition and n > 1:
                self._sticky[b.topic] = (b.partition + 1 + self._rng.randrange(n - 1)) % n
        b.closed = True
        self._ready.append(b)
        self._wake()

    def _wake(self) -> None:
        if not self._woken:
            self._woken = True
            try:
                self._wake_tx.send(b"", zmq.NOBLOCK)
            except zmq.ZMQError:
                pass

    def flush(self, timeout: float | None = None) -> None:
        """Send everything queued and wait until each has an answer (success or failure)."""
        with self._lock:
            for b in list(self._open.values()):
                self._close_batch(b)
            pending = list(self._unfinished)
        deadline = None if timeout is None else time.monotonic() + timeout
        for b in pending:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                b.future.exception(left)
            except TimeoutError:
                raise MeshError(ErrorCode.TIMEOUT, f"flush did not finish within {timeout} s")

    def close(self, timeout: float | None = None) -> None:
        if self._closed:
            return
        try:
            self.flush(timeout)
        finally:
            with self._lock:
                self._closed = True
                self._wake()
            self._thread.join(5)
            self._wake_tx.close(linger=0)
            self._meta_transport.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- I/O thread ---------------------------------------------------------------------
    def _io_main(self) -> None:
        try:
            self._io_loop()
        except BaseException as exc:  # surface to users instead of hanging them
            log.exception("producer I/O thread failed")
            self._io_error = exc
            with self._lock:
                for b in list(self._unfinished):
                    self._finish(b, exc=MeshError(ErrorCode.UNKNOWN, f"producer I/O failed: {exc}"))

    def _io_loop(self) -> None:
        transport = Transport()
        io_cluster = ClusterView(transport, self._bootstrap)
        self._io_cluster = io_cluster
        parts: dict[tuple[str, int], _Part] = {}
        by_rid: dict[int, tuple[_Batch, _Part]] = {}
        transport.add_wakeup(self._wake_rx)
        base_pid = _new_producer_id()
        need_refresh = False
        while True:
            now = time.monotonic()
            # collect closed batches and lingered open ones
            with self._lock:
                self._woken = False
                for b in [b for b in self._open.values() if now - b.created >= self.linger_s]:
                    self._close_batch(b)
                ready, self._ready = self._ready, collections.deque()
                closing = self._closed
                next_linger = min((b.created + self.linger_s for b in self._open.values()), default=None)
            for b in ready:
                tp = (b.topic, b.partition)
                p = parts.get(tp)
                if p is None:
                    p = parts[tp] = _Part(base_pid if self.idempotent else -1)
                p.queue.append(b)
            if need_refresh:
                need_refresh = False
                try:
                    io_cluster.refresh()
                except MeshError as exc:
                    log.debug("metadata refresh failed: %s", exc)
            # send what may be sent
            for tp, p in parts.items():
                if not p.queue or p.backoff_until > now:
                    continue
                while p.queue and len(p.inflight) < self.max_in_flight:
                    b = p.queue[0]
                    if b.deadline <= now:
                        p.queue.popleft()
                        self._fail_partition(p, b, MeshError(ErrorCode.TIMEOUT, "delivery_timeout_ms passed"))
                        continue
                    try:
                        addr = io_cluster.leader_address(b.topic, b.partition)
                    except MeshError as exc:
                        if exc.retriable or exc.code == ErrorCode.UNKNOWN_TOPIC:
                            addr = None
                        else:
                            p.queue.popleft()
                            self._fail_partition(p, b, exc)
                            continue
                    if addr is None:
                        self._retry_later(p, by_rid, b, MeshError(ErrorCode.LEADER_NOT_AVAILABLE, "no leader known"))
                        need_refresh = True
                        break
                    p.queue.popleft()
                    if b.payload is None or b.producer_id != p.producer_id:
                        self._encode(b, p)
                    b.attempts += 1
                    b.sent_at = now
                    b.sent_to = addr
                    rid = transport.send(addr, ProduceRequest(b.topic, b.partition, self.acks,
                                                              int(self.request_timeout_s * 1000)), b.payload)
                    if self.acks == 0:
                        self._finish(b, base=-1)
                        continue
                    p.inflight[rid] = b
                    by_rid[rid] = (b, p)
            if closing and not by_rid and not any(p.queue for p in parts.values()) and not self._unfinished:
                break
            # wait for answers, wake-ups, lingers, timeouts
            timeout_s = 0.1
            if next_linger is not None:
                timeout_s = min(timeout_s, max(0.0, next_linger - now))
            backoffs = [p.backoff_until for p in parts.values() if p.queue and p.backoff_until > now]
            if backoffs:
                timeout_s = min(timeout_s, max(0.0, min(backoffs) - now))
            responses = transport.poll(int(timeout_s * 1000) + 1)
            now = time.monotonic()
            for addr, rid, resp, _ in responses:
                entry = by_rid.pop(rid, None)
                if entry is None:
                    continue  # answer to an attempt we already gave up on
                b, p = entry
                p.inflight.pop(rid, None)
                if isinstance(resp, ProduceResponse) and resp.error == 0:
                    p.backoff_s = 0.0
                    self._finish(b, base=resp.base_offset)
                    continue
                err = MeshError(resp.error, getattr(resp, "message", ""), leader=getattr(resp, "leader", None))
                if err.leader:
                    io_cluster.set_leader(b.topic, b.partition, err.leader)
                else:
                    need_refresh = True
                if retriable(err.code):
                    self._retry_later(p, by_rid, b, err)
                else:
                    self._fail_partition(p, b, err)
            # requests to a broker whose connection dropped, or that timed out: retriable
            gone = transport.take_disconnected()
            if gone:
                need_refresh = True
            for rid, (b, p) in list(by_rid.items()):
                if b.sent_to in gone:
                    by_rid.pop(rid, None)
                    p.inflight.pop(rid, None)
                    self._retry_later(p, by_rid, b, MeshError(ErrorCode.BROKER_UNAVAILABLE,
                                                              f"connection to {b.sent_to} dropped"))
                    continue
                if now - b.sent_at > self.request_timeout_s:
                    by_rid.pop(rid, None)
                    p.inflight.pop(rid, None)
                    try:
                        transport.forget(io_cluster.leader_address(b.topic, b.partition) or "")
                    except MeshError:
                        pass
                    need_refresh = True
                    self._retry_later(p, by_rid, b, MeshError(ErrorCode.TIMEOUT,
                                                              f"no answer within {self.request_timeout_s} s"))
        transport.close(linger_ms=2000 if self.acks == 0 else 0)  # acks=0: let queued sends leave
        self._wake_rx.close(linger=0)

    def _encode(self, b: _Batch, p: _Part) -> None:
        if self.idempotent:
            if b.seq < 0 or b.producer_id != p.producer_id:
                b.seq = p.next_seq
                p.next_seq += len(b.values)
            b.producer_id = p.producer_id
        b.payload = encode_batch(b.values, b.keys, b.timestamps, b.headers,
                                 producer_id=b.producer_id if self.idempotent else -1,
                                 base_sequence=b.seq if self.idempotent else -1)

    def _retry_later(self, p: _Part, by_rid: dict, b: _Batch, err: MeshError) -> None:
        """Put ``b`` and every later in-flight batch of its partition back at the front of
        the queue, in sequence order, and back off."""
        if b.attempts > self.retries or time.monotonic() >= b.deadline:
            self._fail_partition(p, b, err)
            return
        back = [b] + [x for x in p.inflight.values()]
        for rid in list(p.inflight):
            by_rid.pop(rid, None)
        p.inflight.clear()
        back.extend(p.queue)
        back.sort(key=lambda x: (x.seq < 0, x.seq))
        seen, uniq = set(), []
        for x in back:
            if id(x) not in seen:
                seen.add(id(x))
                uniq.append(x)
        p.queue = collections.deque(uniq)
        p.backoff_s = min(self.backoff_max_s, max(self.backoff_s, p.backoff_s * 2))
        p.backoff_until = time.monotonic() + p.backoff_s * (0.8 + 0.4 * self._rng.random())
        log.debug("retrying %s/%d after %s", b.topic, b.partition, err)

    def _fail_partition(self, p: _Part, b: _Batch, err: MeshError) -> None:
        """``b`` failed for good: so do the partition's later queued batches (order could not
        be kept); the partition restarts its sequence under a new producer id."""
        self._finish(b, exc=err)
        while p.queue:
            self._finish(p.queue.popleft(), exc=MeshError(err.code, f"an earlier batch failed: {err.message}"))
        if self.idempotent:
            p.producer_id = _new_producer_id()
            p.next_seq = 0

    def _finish(self, b: _Batch, base: int = -1, exc: BaseException | None = None) -> None:
        with self._lock:
            if b not in self._unfinished:
                return
            self._unfinished.discard(b)
            self._buffered -= b.nbytes
            self._lock.notify_all()
        if exc is not None:
            b.future.set_exception(exc)
        else:
            b.future.set_result(base)
