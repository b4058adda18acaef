"""The node shell: one process, one loop thread, one LMDB environment, one ROUTER socket.

Theory of operation
-------------------
Clients and peers connect to the node's ROUTER with DEALER sockets; the first frame after
the identity names the protocol (``mesh.wire``). Each loop turn:

1. drain ready messages from the ROUTER (at most ``max_requests_per_turn``, so one busy
   client cannot starve the loop's other duties);
2. handle each: admin and metadata are answered at once; produce batches are validated
   (header, size, CRC: O(1) in records) and *staged* into the turn's LMDB write
   transaction; fetches are answered from committed data or parked (long poll);
3. commit the turn's transaction with one sync (group commit), then answer the staged
   produce requests; if the commit fails (disk full, I/O error) all of them get
   STORAGE_ERROR and the store is exactly as before the turn;
4. wake parked fetches whose partitions grew, expire those whose wait ran out; tick
   timers (retention).

Nothing a client sends can crash the loop: every request runs inside a guard that turns
any failure into an error response (logged once per client and code).
"""
from __future__ import annotations

import heapq
import logging
import os
import signal
import time
from dataclasses import dataclass, field

import msgpack
import zmq

from mesh import messages as m
from mesh import records
from mesh.errors import ErrorCode, MeshError
from mesh.producer_state import ProducerStates
from mesh.topics import MAX_PARTITIONS, normalize_config, validate_topic_name
from mesh.wire import PROTOCOL_CLIENT, pack, unpack
from storage.base import CorruptBatch, LogError, StorageFull
from storage.log import Store

__all__ = ["NodeConfig", "Node"]

log = logging.getLogger("mesh.node")


@dataclass
class NodeConfig:
    node_id: str
    bind: str = "127.0.0.1:7101"
    data_dir: str = "data"
    seeds: list[str] = field(default_factory=list)
    max_requests_per_turn: int = 512
    tick_ms: int = 50
    retention_check_ms: int = 5_000
    map_size_bytes: int = 64 << 30
    sync: bool = True
    hwm_messages: int = 10_000
    text_port: int | None = None


@dataclass
class _Staged:
    ident: bytes
    rid: int
    acks: int
    pid: int
    base: int


@dataclass
class _Waiter:
    ident: bytes
    rid: int
    req: m.FetchRequest
    deadline: float
    pids: tuple
    done: bool = False

    def __lt__(self, other):  # heap order
        return self.deadline < other.deadline


class Node:
    def __init__(self, config: NodeConfig):
        self.cfg = config
        self.store = Store(os.path.join(config.data_dir), map_size=config.map_size_bytes, sync=config.sync)
        self.producers = ProducerStates(self.store)
        self.topics: dict[str, dict] = {}
        for k, v in self.store.items("meta", b"topic:"):
            t = msgpack.unpackb(v, raw=False)
            self.topics[t["name"]] = t
        self.ctx = zmq.Context.instance()
        self.router = self.ctx.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.router.setsockopt(zmq.SNDHWM, config.hwm_messages)
        self.router.setsockopt(zmq.RCVHWM, config.hwm_messages)
        self.router.setsockopt(zmq.LINGER, 0)
        self.router.bind(f"tcp://{config.bind}")
        self.address = config.bind
        self._running = False
        self._staged: list[_Staged] = []
        self._waiters: dict[int, list[_Waiter]] = {}
        self._deadlines: list[_Waiter] = []
        self._logged: set[tuple[bytes, int]] = set()
        self._next_retention = 0.0
        self._grown: set[int] = set()

    # -- lifecycle ----------------------------------------------------------------------
    def install_signal_handlers(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: self.stop())

    def stop(self) -> None:
        self._running = False

    def run(self) -> None:
        self._running = True
        log.info("node %s serving on %s (data %s)", self.cfg.node_id, self.address, self.cfg.data_dir)
        poller = zmq.Poller()
        poller.register(self.router, zmq.POLLIN)
        try:
            while self._running:
                timeout = self._poll_timeout_ms()
                try:
                    events = dict(poller.poll(timeout))
                except zmq.ZMQError as exc:
                    if exc.errno == zmq.EINTR if hasattr(zmq, "EINTR") else False:
                        continue
                    raise
                except InterruptedError:
                    continue
                if self.router in events:
                    self._drain()
                self._after_turn()
        finally:
            self.close()

    def close(self) -> None:
        try:
            self.store.commit()
        except LogError:
            self.store.rollback()
        self.router.close(linger=0)
        self.store.close()
        log.info("node %s stopped", self.cfg.node_id)

    # -- loop ---------------------------------------------------------------------------
    def _poll_timeout_ms(self) -> int:
        t = self.cfg.tick_ms
        if self._deadlines:
            t = min(t, max(0, int((self._deadlines[0].deadline - time.monotonic()) * 1000) + 1))
        return t

    def _drain(self) -> None:
        router = self.router
        for _ in range(self.cfg.max_requests_per_turn):
            try:
                frames = router.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            self._handle(frames)
        self._commit_turn()

    def _after_turn(self) -> None:
        now = time.monotonic()
        if self._grown:
            grown, self._grown = self._grown, set()
            self._wake(grown)
        while self._deadlines and self._deadlines[0].deadline <= now:
            w = heapq.heappop(self._deadlines)
            if not w.done:
                self._answer_fetch(w, force=True)
        if now >= self._next_retention:
            self._next_retention = now + self.cfg.retention_check_ms / 1000
            self._enforce_retention()

    # -- dispatch -----------------------------------------------------------------------
    def _handle(self, frames: list) -> None:
        ident = frames[0]
        rid = 0
        try:
            if len(frames) >= 3 and len(frames[2]) == 8:
                rid = int.from_bytes(frames[2], "big")
            protocol, rid, msg, payload = unpack(frames[1:])
            handler = self._handlers.get(type(msg))
            if handler is None:
                raise MeshError(ErrorCode.INVALID_REQUEST, f"{type(msg).__name__} is not a request")
            handler(self, ident, rid, msg, payload)
        except MeshError as exc:
            self._error(ident, rid, exc.code, exc.message, exc.leader)
        except Exception as exc:  # a bug or an input we did not foresee: answer, keep serving
            log.exception("request from %r failed", ident)
            self._error(ident, rid, ErrorCode.INVALID_REQUEST, f"request could not be handled: {exc}")

    def _error(self, ident: bytes, rid: int, code: ErrorCode, message: str, leader: str | None = None) -> None:
        key = (bytes(ident), int(code))
        if key not in self._logged and len(self._logged) < 10_000:
            self._logged.add(key)
            log.warning("client %s: %s: %s", bytes(ident).hex(), code.name, message)
        self._reply(ident, rid, m.ErrorResponse(int(code), message, leader))

    def _reply(self, ident: bytes, rid: int, msg, payload: bytes | None = None) -> None:
        frames = [ident] + pack(PROTOCOL_CLIENT, rid, msg, payload)
        try:
            self.router.send_multipart(frames, zmq.NOBLOCK, copy=payload is None or len(payload) < 65536)
        except zmq.ZMQError as exc:  # client gone (EHOSTUNREACH) or its pipe is full (EAGAIN)
            log.debug("dropping reply to %s: %s", bytes(ident).hex(), exc)

    # -- topics -------------------------------------------------------------------------
    def _topic(self, name: str) -> dict:
        t = self.topics.get(name)
        if t is None:
            raise MeshError(ErrorCode.UNKNOWN_TOPIC, f"unknown topic {name!r}")
        return t

    def _pid(self, topic: str, partition: int) -> tuple[dict, int]:
        t = self._topic(topic)
        if not isinstance(partition, int) or not 0 <= partition < t["partitions"]:
            raise MeshError(ErrorCode.UNKNOWN_PARTITION,
                            f"topic {topic!r} has partitions 0..{t['partitions'] - 1}, not {partition!r}")
        return t, t["pids"][partition]

    def on_create_topic(self, ident, rid, req: m.CreateTopicRequest, payload) -> None:
        validate_topic_name(req.name)
        if req.name in self.topics:
            raise MeshError(ErrorCode.TOPIC_EXISTS, f"topic {req.name!r} already exists")
        if not 1 <= req.partitions <= MAX_PARTITIONS:
            raise MeshError(ErrorCode.INVALID_CONFIG, f"partitions must be 1..{MAX_PARTITIONS}")
        if req.replication_factor != 1:
            raise MeshError(ErrorCode.INVALID_CONFIG,
                            f"replication factor {req.replication_factor} is larger than the 1 live broker")
        config = normalize_config(req.config)
        pids = [self.store.partition_id(req.name, p) for p in range(req.partitions)]
        t = {"name": req.name, "partitions": req.partitions, "replication_factor": 1,
             "config": config, "pids": pids}
        self.store.put("meta", b"topic:" + req.name.encode(), msgpack.packb(t))
        self.store.commit()
        self.topics[req.name] = t
        log.info("created topic %s with %d partitions", req.name, req.partitions)
        self._reply(ident, rid, m.CreateTopicResponse(0))

    def on_delete_topic(self, ident, rid, req: m.DeleteTopicRequest, payload) -> None:
        t = self._topic(req.name)
        for p in range(t["partitions"]):
            self.store.forget_partition(req.name, p)
        self.store.delete("meta", b"topic:" + req.name.encode())
        self.store.commit()
        del self.topics[req.name]
        self._wake(set(t["pids"]))  # parked fetches learn the topic is gone
        log.info("deleted topic %s", req.name)
        self._reply(ident, rid, m.DeleteTopicResponse(0))

    def on_metadata(self, ident, rid, req: m.MetadataRequest, payload) -> None:
        names = sorted(self.topics) if req.topics is None else list(req.topics)
        topics = []
        for name in names:
            t = self.topics.get(name)
            if t is None:
                topics.append({"name": name, "error": int(ErrorCode.UNKNOWN_TOPIC)})
                continue
            parts = []
            for p, pid in enumerate(t["pids"]):
                end = self.store.synced_end(pid)
                parts.append({"partition": p, "leader": self.cfg.node_id, "leader_address": self.address,
                              "epoch": 0, "replicas": [self.cfg.node_id], "isr": [self.cfg.node_id],
                              "log_start": self.store.log_start(pid), "log_end": end, "high_watermark": end})
            topics.append({"name": name, "error": 0, "config": t["config"],
                           "replication_factor": t["replication_factor"], "partitions": parts})
        brokers = [{"id": self.cfg.node_id, "address": self.address, "status": "alive"}]
        self._reply(ident, rid, m.MetadataResponse(0, brokers, topics, self.cfg.node_id))

    def on_list_offsets(self, ident, rid, req: m.ListOffsetsRequest, payload) -> None:
        out = []
        for topic, partition, which in req.parts:
            try:
                _, pid = self._pid(topic, partition)
                off = self.store.log_start(pid) if which == m.EARLIEST else self.store.synced_end(pid)
                out.append([topic, partition, 0, off, None])
            except MeshError as exc:
                out.append([topic, partition, int(exc.code), -1, exc.leader])
        self._reply(ident, rid, m.ListOffsetsResponse(out))

    # -- produce ------------------------------------------------------------------------
    def on_produce(self, ident, rid, req: m.ProduceRequest, payload) -> None:
        if req.acks not in (0, 1, -1):
            raise MeshError(ErrorCode.INVALID_REQUEST, f"acks must be 0, 1 or -1 (all), not {req.acks}")
        t, pid = self._pid(req.topic, req.partition)
        if payload is None:
            raise MeshError(ErrorCode.INVALID_REQUEST, "produce request has no record batch frame")
        h = records.validate_batch(payload, t["config"]["max.message.bytes"])
        dup = self.producers.check(pid, h)
        if dup is not None:  # a retry of a batch we already have: answer as before
            if req.acks != 0:
                self._reply(ident, rid, m.ProduceResponse(0, base_offset=dup))
            return
        try:
            base, end = self.store.stage_append(pid, payload, 0, h.record_count)
        except LogError as exc:  # the turn is doomed; _commit_turn fails its other requests
            raise MeshError(ErrorCode.STORAGE_ERROR, str(exc))
        self.producers.stage(pid, h, base)
        self._staged.append(_Staged(ident, rid, req.acks, pid, base))

    def _commit_turn(self) -> None:
        staged, self._staged = self._staged, []
        try:
            self.store.commit()
        except (StorageFull, LogError) as exc:
            self.producers.rollback()
            log.error("group commit failed, %d produce requests refused: %s", len(staged), exc)
            for s in staged:
                if s.acks != 0:
                    self._reply(s.ident, s.rid, m.ProduceResponse(int(ErrorCode.STORAGE_ERROR), str(exc)))
            return
        self.producers.committed()
        for s in staged:
            self._grown.add(s.pid)
            if s.acks != 0:
                self._reply(s.ident, s.rid, m.ProduceResponse(0, base_offset=s.base,
                                                              log_start=self.store.log_start(s.pid)))

    # -- fetch --------------------------------------------------------------------------
    def on_fetch(self, ident, rid, req: m.FetchRequest, payload) -> None:
        if not req.parts or len(req.parts) > MAX_PARTITIONS:
            raise MeshError(ErrorCode.INVALID_REQUEST, f"fetch needs 1..{MAX_PARTITIONS} partitions")
        pids = []
        for part in req.parts:
            if not (isinstance(part, list) and len(part) == 4):
                raise MeshError(ErrorCode.INVALID_REQUEST, "each fetch part is [topic, partition, offset, max_bytes]")
            try:
                pids.append(self._pid(part[0], part[1])[1])
            except MeshError:
                pass
        w = _Waiter(ident, rid, req, time.monotonic() + max(0, req.max_wait_ms) / 1000, tuple(pids))
        if not self._answer_fetch(w, force=req.max_wait_ms <= 0):
            for pid in pids:
                self._waiters.setdefault(pid, []).append(w)
            heapq.heappush(self._deadlines, w)

    def _answer_fetch(self, w: _Waiter, force: bool) -> bool:
        """Answer ``w`` if it has min_bytes (or an error), or if ``force``. True if answered."""
        req = w.req
        parts, chunks = [], []
        total, has_error = 0, False
        for topic, partition, offset, part_max in req.parts:
            try:
                _, pid = self._pid(topic, partition)
                start, hw = self.store.log_start(pid), self.store.synced_end(pid)
                if not isinstance(offset, int) or offset < start or offset > hw:
                    raise MeshError(ErrorCode.OFFSET_OUT_OF_RANGE,
                                    f"offset {offset} is outside [{start}, {hw}] of {topic}/{partition}")
                got = []
                if offset < hw and total < req.max_bytes:
                    got = self.store.read(pid, offset, min(int(part_max), req.max_bytes - total), hw)
                n = sum(len(c) for c in got)
                chunks.extend(got)
                total += n
                parts.append([topic, partition, 0, hw, start, n, None])
            except CorruptBatch as exc:
                log.error("%s", exc)
                has_error = True
                parts.append([topic, partition, int(ErrorCode.CORRUPT_MESSAGE), -1, -1, 0, None])
            except MeshError as exc:
                has_error = True
                start = hw = -1
                if exc.code == ErrorCode.OFFSET_OUT_OF_RANGE:
                    start, hw = self.store.log_start(pid), self.store.synced_end(pid)
                parts.append([topic, partition, int(exc.code), hw, start, 0, exc.leader])
        if not (force or has_error or total >= max(1, req.min_bytes)):
            return False
        w.done = True
        self._reply(w.ident, w.rid, m.FetchResponse(parts), b"".join(chunks))
        return True

    def _wake(self, pids: set[int]) -> None:
        for pid in pids:
            waiters = self._waiters.pop(pid, None)
            if not waiters:
                continue
            for w in waiters:
                if not w.done and not self._answer_fetch(w, force=False):
                    self._waiters.setdefault(pid, []).append(w)
        # forget answered waiters still registered under other partitions
        for pid in list(self._waiters):
            ws = [w for w in self._waiters[pid] if not w.done]
            if ws:
                self._waiters[pid] = ws
            else:
                del self._waiters[pid]

    # -- retention ----------------------------------------------------------------------
    def _enforce_retention(self) -> None:
        now_ms = int(time.time() * 1000)
        try:
            for t in self.topics.values():
                c = t["config"]
                for pid in t["pids"]:
                    self.store.stage_retention(pid, now_ms, c["retention.ms"], c["retention.bytes"])
            self.store.commit()
        except LogError as exc:
            log.error("retention pass failed: %s", exc)

    _handlers = {
        m.ProduceRequest: on_produce,
        m.FetchRequest: on_fetch,
        m.MetadataRequest: on_metadata,
        m.CreateTopicRequest: on_create_topic,
        m.DeleteTopicRequest: on_delete_topic,
        m.ListOffsetsRequest: on_list_offsets,
    }
