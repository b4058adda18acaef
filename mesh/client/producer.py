"""The producer: batching, partitioning, pipelining, retries, idempotence.

``send()`` only appends the record to its partition's open batch (under a lock) and
returns a future; a background I/O thread closes batches, encodes each once, and
pipelines up to ``max_in_flight`` requests per partition to its leader.

A batch closes (``lingered``) when full; at once when its partition has nothing unfinished
(in flight, queued or backing off), so a blocking ``send().get()`` never waits a timer;
otherwise when the partition's requests in flight finish or after ``linger_ms`` (to the
nearest millisecond), whichever comes first: batching grows with load, not with a timer.
Metadata and connections come lazily with the first send, or up front (``connect``).

Ordering and exactly-once across retries: the producer has a random 62-bit producer id;
every batch carries it and the sequence number of its first record. On a retriable error,
a timeout or a dropped connection the partition's unacknowledged batches are all sent
again, in sequence order, with the same producer id and sequences, after a backoff and a
metadata refresh; the leader drops the ones it already has (answering with their original
offsets). Fewer than ``RECENT_BATCHES`` batches separate a partition's oldest
unacknowledged batch from its newest sent one, so the leader always still remembers a
batch that comes back. A batch fails for good at ``delivery_timeout_ms`` (or after
``retries`` attempts, if set), or at once on a non-retriable error; then the partition's
later batches fail too (their order could not be kept), and once nothing of the old
producer id is in doubt the partition continues under a fresh one (never re-sending a
possibly written batch under it). A failed future's ``MeshError.maybe_written`` says
whether the records may have been written all the same. A DUPLICATE_SEQUENCE answer (the
batch was stored, and the broker no longer remembers where) completes the records with
offset -1, as Kafka does. Those rules live in the sans-I/O ``mesh.client.sequencer``,
which this I/O thread drives (so does the Spark sink).

Failover: the transport's connections have ZeroMQ heartbeats, so a dead or paused broker
is noticed within about a second and the requests in flight to it are retried; a leader
whose connection is down is not sent to; a retry refreshes the metadata from three brokers
(highest leader epoch wins). ``request_timeout_ms`` (3 s) bounds a request to a live broker
that does not answer (a leader without a quorum answers TIMEOUT or NOT_LEADER itself).
"""
from __future__ import annotations

import collections
import logging
import random
import threading
import time

import zmq

from mesh.client.batching import _Batch, _checked_headers, _new_producer_id, lingered
from mesh.client.cluster import ClusterView
from mesh.client.future import _PENDING, BatchFuture, RecordFuture, RecordMetadata
from mesh.client.sequencer import RETRY, RetryPolicy, Sequencer
from mesh.client.transport import Transport
from mesh.client.waker import waker as _waker
from mesh.security.creds import load_creds
from mesh.wire.codec import encode_body
from mesh.wire.errors import ErrorCode, MeshError
from mesh.wire.messages import Acks, ErrorResponse, ProduceRequest, ProduceResponse
from mesh.wire.partitioner import partition_for_key
from mesh.wire.records import encode_batch
from mesh.wire.topic_config import MAX_RECORD_BYTES, RECENT_BATCHES

__all__ = ["Producer", "RecordMetadata", "RecordFuture", "BatchFuture"]

log = logging.getLogger("mesh.producer")
_VALUE_TYPES = frozenset((bytes, bytearray, type(None)))   # send_batch's values (None: null; not str)
_KEY_TYPES = frozenset((bytes, bytearray, type(None)))
_REFRESH_EVERY_S = 0.1  # at most this often a metadata refresh from the I/O thread
_LINGER_SLACK_S = 0.0005  # ZeroMQ's poll waits whole milliseconds: lingers round to the nearest
_new_object = object.__new__
_EXPIRE_EVERY_MS = 10     # request timeouts are looked for this often (a dropped connection: at once)


class Producer:
    def __init__(self, bootstrap: str = "127.0.0.1:7101", *, acks="all", linger_ms: int = 5,
                 batch_size: int = 256 << 10, max_in_flight: int = 5, retries: int | None = None,
                 retry_backoff_ms: int = 100, retry_backoff_max_ms: int = 1000,
                 request_timeout_ms: int = 3_000, delivery_timeout_ms: int = 60_000,
                 buffer_memory: int = 64 << 20, max_block_ms: int = 60_000,
                 max_record_bytes: int = MAX_RECORD_BYTES, enable_idempotence: bool = True,
                 context=None, creds=None):
        self.acks = Acks.parse(acks)
        self.linger_s = linger_ms / 1000
        self.batch_size = batch_size
        if enable_idempotence and not 1 <= max_in_flight < RECENT_BATCHES:
            raise ValueError(f"max_in_flight must be 1..{RECENT_BATCHES - 1} with idempotence "
                             f"(the broker remembers {RECENT_BATCHES} batches per producer)")
        self.max_in_flight = max_in_flight
        self.retries = retries
        self.backoff_s, self.backoff_max_s = retry_backoff_ms / 1000, retry_backoff_max_ms / 1000
        self.request_timeout_s = request_timeout_ms / 1000
        self.delivery_s = delivery_timeout_ms / 1000
        self.buffer_memory = buffer_memory
        self.max_block_s = max_block_ms / 1000
        self.max_record_bytes = max_record_bytes
        self.idempotent = enable_idempotence and self.acks != Acks.NONE
        self._bootstrap = bootstrap
        # user side
        self._mutex = threading.RLock()           # held directly on the hot path (send)
        self._lock = threading.Condition(self._mutex)
        self._open: dict[tuple[str, int], _Batch] = {}
        self._ready: collections.deque[_Batch] = collections.deque()
        self._buffered = 0
        self._sticky: dict[str, int] = {}
        self._sticky_open: dict[str, _Batch] = {}    # topic -> its sticky partition's batch, while open
        self._sticky_left: dict[str, int] = {}       # topic -> bytes before the sticky partition changes
        self._partitions: dict[str, int] = {}
        self._closed = False
        self._unfinished: set[_Batch] = set()
        self._space_waiters = 0                    # threads in _wait_for_space: finishing notifies them
        self._connects: list[list] = []            # connect(): [topics, Event, error] for the I/O thread
        self._rng = random.Random()
        # I/O side
        self._io_error: BaseException | None = None
        self._finished: list = []      # Done rows, their futures not yet completed (_complete; I/O thread only)
        self._ctx = ctx = context if context is not None else zmq.Context.instance()   # see Transport
        # wake-ups (``_wake``): the I/O thread clears ``_woken`` only just before it blocks in
        # its poll, with nothing ``_pending``; a user thread sends a wake-up only then
        self._woken = False
        self._pending = False
        self._meta_lock = threading.Lock()
        self._creds = load_creds(creds)   # a path, a Creds, None: $MESH_CREDS (see Transport)
        self._meta_transport = Transport(context=ctx, creds=self._creds)
        self.cluster = ClusterView(self._meta_transport, bootstrap)
        self._wake_fd, self._wake_send, self._wake_drain, self._wake_close = _waker()   # last: no fd leak
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
        if value.__class__ is bytes:               # the common case costs one comparison
            size = len(value)
        elif value is None:                        # a null value (tombstone): nil, not b""
            size = 0
        elif isinstance(value, (bytes, bytearray)):
            value = bytes(value)
            size = len(value)
        else:
            raise TypeError(f"value must be bytes or None, not {type(value).__name__}")
        if key is not None:
            if not isinstance(key, (bytes, bytearray)):
                raise TypeError(f"key must be bytes or None, not {type(key).__name__}")
            size += len(key)
        if headers:
            headers = _checked_headers(headers)
            size += sum(len(k) + (0 if v is None else len(v)) for k, v in headers)
        if size > self.max_record_bytes:
            raise MeshError(ErrorCode.MESSAGE_TOO_LARGE,
                            f"record of {size} bytes exceeds max_record_bytes={self.max_record_bytes}")
        n = self._partitions.get(topic) or self._num_partitions(topic)
        if partition is not None:
            if not 0 <= partition < n:
                raise MeshError(ErrorCode.UNKNOWN_PARTITION, f"topic {topic!r} has partitions 0..{n - 1}")
        elif key is not None:
            partition = partition_for_key(key, n)
        ts = int(time.time() * 1000) if timestamp_ms is None else timestamp_ms
        size += 8
        unkeyed = partition is None
        mutex = self._mutex                  # the Condition's own lock, without its Python wrapper,
        mutex.acquire()                      # and without ``with`` (its __enter__/__exit__ lookups)
        try:
            if self._closed or self._io_error is not None:
                self._check_open()
            if self._buffered + size > self.buffer_memory and self._buffered > 0:
                self._wait_for_space(size)
            b = self._sticky_open.get(topic) if unkeyed else None
            if b is None or b.closed:       # not the sticky partition's open batch (see _close_batch)
                if unkeyed:  # stick to one partition (``_stick``)
                    partition = self._sticky.get(topic)
                    if partition is None:
                        partition = self._sticky[topic] = self._rng.randrange(n)
                tp = (topic, partition)
                b = self._open.get(tp)
                if b is None:
                    b = self._open[tp] = _Batch(topic, partition, time.monotonic(), self.delivery_s)
                    self._unfinished.add(b)
                    self._wake()  # the I/O thread sends it at once if its partition is idle, else lingers
                if unkeyed:
                    self._sticky_open[topic] = b
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
                b.headers.append(headers)
            elif b.headers is not None:
                b.headers.append([])
            b.nbytes += size
            self._buffered += size
            if b.nbytes >= self.batch_size:
                self._close_batch(b)
            if unkeyed:
                self._stick(topic, n, size)
        finally:
            mutex.release()
        f = _new_object(RecordFuture)       # (RecordFuture(b, idx) without an __init__ call)
        f._batch, f._index = b, idx
        return f

    @property
    def failed(self) -> BaseException | None:
        """Why the producer's I/O thread stopped (every send fails from then on), or None."""
        return self._io_error

    def send_batch(self, topic: str, values: list[bytes], partition: int | None = None,
                   keys: list | None = None, timestamp_ms: int | None = None) -> BatchFuture:
        """Bulk path: queue many records for one partition as one batch, with no per-record
        work; returns a future of the batch's base offset (``BatchFuture``: result,
        exception, done, add_done_callback, as concurrent.futures.Future)."""
        n = self._partitions.get(topic) or self._num_partitions(topic)
        if partition is None:
            partition = self._rng.randrange(n)
        if not 0 <= partition < n:
            raise MeshError(ErrorCode.UNKNOWN_PARTITION, f"topic {topic!r} has partitions 0..{n - 1}")
        if not values:
            raise ValueError("send_batch needs at least one value")
        if not set(map(type, values)) <= _VALUE_TYPES:   # (~12 ns a record, in C)
            raise TypeError(f"values must be bytes or None, not "
                            f"{sorted({type(v).__name__ for v in values} - {'bytes', 'bytearray', 'NoneType'})}")
        if keys is not None and not set(map(type, keys)) <= _KEY_TYPES:
            raise TypeError(f"keys must be bytes or None, not "
                            f"{sorted({type(k).__name__ for k in keys} - {'bytes', 'bytearray', 'NoneType'})}")
        nbytes = sum(map(len, filter(None, values))) + 8 * len(values)   # (None: a null value)
        if nbytes > self.max_record_bytes:
            raise MeshError(ErrorCode.MESSAGE_TOO_LARGE,
                            f"batch of {nbytes} bytes exceeds max_record_bytes={self.max_record_bytes}: split it")
        ts = int(time.time() * 1000) if timestamp_ms is None else timestamp_ms
        b = _Batch(topic, partition, time.monotonic(), self.delivery_s)
        b.values, b.keys, b.timestamps, b.nbytes = values, keys, ts, nbytes
        b.closed, b.count = True, len(values)
        mutex = self._mutex                         # (as send: the Condition's lock, directly)
        mutex.acquire()
        try:
            if self._closed or self._io_error is not None:
                self._check_open()
            if self._buffered + nbytes > self.buffer_memory and self._buffered > 0:
                self._wait_for_space(nbytes)
            self._buffered += nbytes
            self._unfinished.add(b)
            self._ready.append(b)                   # closed already: never in _open
            self._wake()
        finally:
            mutex.release()
        return b.future

    def _check_open(self) -> None:
        if self._closed:
            raise MeshError(ErrorCode.INVALID_REQUEST, "producer is closed")
        exc = self._io_error
        if isinstance(exc, MeshError) and exc.code == ErrorCode.UNAUTHORIZED:
            raise MeshError(exc.code, exc.message)
        if exc is not None:
            raise MeshError(ErrorCode.UNKNOWN, f"producer I/O thread failed: {exc}")

    def _wait_for_space(self, size: int) -> None:
        deadline = time.monotonic() + self.max_block_s
        self._space_waiters += 1
        try:
            while self._buffered + size > self.buffer_memory and self._buffered > 0:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise MeshError(ErrorCode.TIMEOUT,
                                    f"buffer_memory={self.buffer_memory} full for max_block_ms")
                self._lock.wait(left)
        finally:
            self._space_waiters -= 1

    def _stick(self, topic: str, n: int, size: int) -> None:
        """Caller holds the lock. Unkeyed records stick to one partition until ``batch_size``
        bytes went to it, then move to another (Kafka's uniform sticky partitioner, KIP-794):
        while a request to it is in flight they gather in its next batch, so batches grow
        with load even though a batch of an idle partition leaves at once."""
        left = self._sticky_left.get(topic, self.batch_size) - size
        if left > 0:
            self._sticky_left[topic] = left
            return
        self._sticky_left[topic] = self.batch_size
        self._sticky_open.pop(topic, None)
        cur = self._sticky.get(topic)
        if cur is not None and n > 1:
            self._sticky[topic] = (cur + 1 + self._rng.randrange(n - 1)) % n

    def _close_batch(self, b: _Batch) -> None:
        """Caller holds the lock."""
        if self._open.get(b.tp) is b:
            del self._open[b.tp]
            if self._sticky_open.get(b.topic) is b:
                del self._sticky_open[b.topic]   # (send checks ``closed`` anyway; this frees it)
        b.closed = True
        b.count = len(b.values)
        self._ready.append(b)
        self._wake()

    def _wake(self) -> None:
        """Caller holds the lock: something new for the I/O thread. A wake-up message goes
        (one eventfd write) only if it sleeps (or is about to) in its poll; else it sees
        ``_pending`` first."""
        self._pending = True
        if not self._woken:
            self._woken = True
            self._wake_send()

    def connect(self, topics, timeout: float | None = 10.0) -> None:
        """Learn ``topics``' (a name or a list) leaders and connect to them now, in the I/O
        thread, so the first send pays for neither a metadata request nor a handshake (they
        happen lazily otherwise, as in Kafka's producer). MeshError if that fails."""
        req = [[topics] if isinstance(topics, str) else list(topics), threading.Event(), None]
        with self._mutex:
            self._check_open()
            self._connects.append(req)
            self._wake()
        if not req[1].wait(timeout):
            raise MeshError(ErrorCode.TIMEOUT, f"no connection to the leaders of {req[0]} within {timeout} s")
        if req[2] is not None:
            raise req[2]

    def flush(self, timeout: float | None = None) -> None:
        """Send everything queued and wait until each has an answer (success or failure)."""
        with self._lock:
            for b in list(self._open.values()):
                self._close_batch(b)
            pending = list(self._unfinished)   # (until its future is complete: see _complete)
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
            self._close_waker()
            self._complete()
            refused = isinstance(exc, MeshError) and exc.code == ErrorCode.UNAUTHORIZED  # creds refused
            if not refused:
                log.exception("producer I/O thread failed")
            self._io_error = exc
            with self._lock:
                for b in list(self._unfinished):
                    self._finish(b, exc=MeshError(exc.code, exc.message) if refused else
                                 MeshError(ErrorCode.UNKNOWN, f"producer I/O failed: {exc}",
                                           maybe_written=b.attempts > 0))

    def _io_loop(self) -> None:
        transport = Transport(context=self._ctx, creds=self._creds)
        io_cluster = ClusterView(transport, self._bootstrap)
        transport.add_wakeup(self._wake_fd, self._wake_drain)
        policy = RetryPolicy(max_in_flight=self.max_in_flight, retries=self.retries,
                             backoff_ms=self.backoff_s * 1000, backoff_max_ms=self.backoff_max_s * 1000,
                             jitter=0.2)
        seq = Sequencer(policy, producer_id=_new_producer_id() if self.idempotent else -1,
                        new_producer_id=_new_producer_id if self.idempotent else None, rng=self._rng)
        timeout_ms = self.request_timeout_s * 1000
        need_refresh = False
        next_refresh = next_expire_ms = 0.0
        heads: dict[tuple, tuple[bytes, bytes]] = {}   # tp -> its ProduceRequest (op, body), encoded once
        acks, linger_s, mutex, leader_of = int(self.acks), self.linger_s, self._mutex, io_cluster.leader_of
        next_rid, send_encoded = transport.next_rid, transport.send_encoded
        burst: list = []
        now = time.monotonic()
        while True:
            # collect closed batches and lingered open ones
            with mutex:
                self._woken = True    # awake: user threads need not wake us (see _wake)
                if self._open:
                    ready_tps = {b.tp for b in self._ready} if self._ready else ()
                    close, next_linger = lingered(self._open.values(), ready_tps, seq.idle, now, linger_s,
                                                  _LINGER_SLACK_S)
                    for b in close:
                        self._close_batch(b)
                else:
                    next_linger = None
                self._pending = False
                ready = self._ready or ()
                connects, self._connects = self._connects, []
                if ready:
                    self._ready = collections.deque()
                closing = self._closed
            for b in ready:
                seq.append(b.tp, b)
            for req in connects:   # connect(): metadata, then a socket to every leader
                try:
                    io_cluster.refresh(req[0])
                    for t in req[0]:
                        for p in range(len(io_cluster.topic(t, refresh=False)["partitions"])):
                            if (addr := io_cluster.leader_address(t, p)) is not None:
                                transport.connect(addr)
                except MeshError as exc:
                    req[2] = exc
                req[1].set()
            if need_refresh and now >= next_refresh:
                need_refresh = False
                next_refresh = now + _REFRESH_EVERY_S
                try:
                    io_cluster.refresh()  # answers to produce requests meanwhile wait in the transport
                except MeshError as exc:
                    log.debug("metadata refresh failed: %s", exc)
                now = time.monotonic()
            # send what may be sent: decide and encode all, then hand them to ZeroMQ back to back
            # (``burst``): its I/O thread is woken (syscalls) once and writes them to TCP together
            now_ms = now * 1000
            for tp in seq.busy_partitions():
                addr = None   # the partition's leader, looked up once per round
                while (b := seq.next_to_send(tp, now_ms)) is not None:
                    if addr is None:
                        try:
                            addr = leader_of(tp)     # cached until a refresh or a NOT_LEADER hint
                        except MeshError as exc:
                            if not (exc.retriable or exc.code == ErrorCode.UNKNOWN_TOPIC):
                                seq.fail(tp, b, exc)
                                continue
                        if addr is None or transport.is_down(addr):
                            seq.wait(tp, now_ms)  # no leader, or its connection is down: ask again soon
                            need_refresh = True
                            break
                    if seq.assign(tp, b) or b.payload is None:
                        b.payload = encode_batch(b.values, b.keys, b.timestamps, b.headers,
                                                 producer_id=b.producer_id, base_sequence=b.seq)
                    head = heads.get(tp)
                    if head is None:
                        msg = ProduceRequest(b.topic, b.partition, acks, int(timeout_ms))
                        head = heads[tp] = (type(msg).OP, encode_body(msg))
                    rid = next_rid()
                    seq.sent(tp, b, rid if acks else None, now_ms, addr)   # acks: an int, 0 = Acks.NONE
                    burst.append((addr, head[0], head[1], b.payload, rid))
            for addr, op, body, payload, rid in burst:
                send_encoded(addr, op, body, payload, rid)
            burst.clear()
            # requests to a broker whose connection dropped, or that timed out: retriable
            # (after the sends: a wake-up's batch leaves first)
            gone = transport.take_disconnected()
            if gone or now_ms >= next_expire_ms:
                next_expire_ms = now_ms + _EXPIRE_EVERY_MS
                for (topic, partition), b, err in seq.expire(now_ms, timeout_ms, gone):
                    need_refresh = True
                    log.debug("retrying %s/%d after %s", topic, partition, err)
            done = seq.take_done()
            if done:
                self._finished += done
            if closing and not seq.busy():
                self._complete()
                if not self._unfinished:
                    break
            # wait for answers, wake-ups, lingers (to the nearest millisecond: ``lingered``
            # closed what is due within half of one), backoffs and timeouts (rounded up)
            wait_ms = 100
            if next_linger is not None:
                wait_ms = min(wait_ms, max(0, int((next_linger - now) * 1000 + 0.5)))
            backoff_ms = seq.next_backoff_ms(now_ms)
            if backoff_ms is not None:
                wait_ms = min(wait_ms, max(0, int(backoff_ms - now_ms) + 1))
            if wait_ms > 0:
                with mutex:
                    if self._pending:
                        wait_ms = 0   # something came since the collection: look at it first
                    else:
                        self._woken = False   # about to block: a user thread must wake us
            if self._finished:
                self._complete()   # last before blocking: a waiting user thread gets the GIL at once
            responses = transport.poll(wait_ms)
            now = time.monotonic()
            now_ms = now * 1000
            for addr, rid, resp, _ in responses:
                if resp.__class__ is ProduceResponse:   # (on_reply's rid, error, now_ms, base_offset, message, leader)
                    out = seq.on_reply(rid, resp.error, now_ms, resp.base_offset, resp.message, resp.leader)
                elif isinstance(resp, ErrorResponse):  # refused before anything was appended
                    out = seq.on_reply(rid, resp.error, now_ms, message=resp.message, leader=resp.leader,
                                       rejected=True)
                else:
                    continue  # a late answer to a metadata request given up on
                if out is None or out.action != RETRY:
                    continue  # a success, a failure, or an answer to an attempt given up on
                if resp.leader:
                    io_cluster.set_leader(out.tp[0], out.tp[1], resp.leader)
                else:
                    need_refresh = True
        self._complete()
        transport.close(linger_ms=2000 if self.acks == Acks.NONE else 0)  # acks=0: let queued sends leave
        self._close_waker()

    def _close_waker(self) -> None:
        """The I/O thread is done: no wake-up goes to its fd any more (``_woken`` stays
        set), and the fd closes once (never written to after: it could be reused)."""
        with self._mutex:
            self._woken = True
            if self._wake_fd >= 0:
                self._wake_fd = -1
                self._wake_close()

    def _complete(self) -> None:
        """Free the buffer space of what the sequencer finished (``_finished``), complete
        their futures in order, then take those batches out of ``_unfinished``. Space comes
        first: a callback may send (and wait for space, which only this thread frees). A
        batch leaves ``_unfinished`` only once its future is complete, so ``flush`` waits
        for exactly what is there. Called just before the I/O thread blocks (a user thread
        woken by a future needs the GIL, which the I/O thread gives up only there)."""
        finished, self._finished = self._finished, []
        if not finished:
            return
        with self._mutex:
            unfinished = self._unfinished
            for d in finished:
                b = d.batch
                if b in unfinished:
                    self._buffered -= b.nbytes
                    b.nbytes = 0   # freed once: _finish of it after a failure frees nothing more
            if self._space_waiters:
                self._lock.notify_all()
        for d in finished:   # (BatchFuture.set_result / set_exception without their frame)
            if d.error is not None:
                d.batch.future._complete(_PENDING, d.error)
            else:
                d.batch.future._complete(d.base_offset, None)
        with self._mutex:
            unfinished = self._unfinished
            for d in finished:
                unfinished.discard(d.batch)

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
