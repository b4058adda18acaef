"""The data path of a node: produce (staged, group-committed), fetch (long poll), retention.

Produce (on the partition's leader): validate the batch in O(1) records (header, size,
CRC), check the idempotent producer's sequence, ask the replication core where it goes
(``append_position``: NOT_LEADER / NOT_ENOUGH_REPLICAS otherwise), stage it in the turn's
LMDB transaction and tell the core (``leader_append``). ``commit_turn`` syncs the whole
turn once; then acks=1 requests are answered (the leader has it on disk) and acks=all
requests wait in ``ReplicaHost`` until the commit offset (high watermark) passes them. A
failed commit refuses the turn's requests with STORAGE_ERROR and leaves the store as it
was.

What an error answer tells the client (its ``MeshError.maybe_written``): ``on_produce``
raises (the loop answers an ``ErrorResponse``) only *before* the batch is staged, so an
``ErrorResponse`` to a produce request means this request appended nothing; once the batch
is staged every answer is a ``ProduceResponse``, and an error there (STORAGE_ERROR,
NOT_LEADER or TIMEOUT of a waiting acks=all request) leaves the outcome unknown. A retry
of a stored batch (same producer id and sequences, ``ProducerStates.check``) is answered
with its original offsets (or DUPLICATE_SEQUENCE when it is older than the batches kept),
never stored twice. NOT_LEADER carries the leader's address when this node knows it.

Fetch: answered from data below the high watermark (what a quorum has synced), or parked
until the high watermark moves or ``max_wait_ms`` passes.
"""
from __future__ import annotations

import heapq
import logging
from dataclasses import dataclass
from typing import Callable

from mesh.cluster.catalog import Topic
from mesh.node.clock import now_ms as _monotonic_ms
from mesh.wire import messages as m
from mesh.wire import records
from mesh.wire.errors import ErrorCode, MeshError
from mesh.node.producer_state import ProducerStates
from mesh.node.raft_host import ReplicaHost
from mesh.wire.topic_config import MAX_PARTITIONS
from storage.base import CorruptBatch, LogError, StorageFull

__all__ = ["DataPath"]

log = logging.getLogger("mesh.node.datapath")


@dataclass
class _Staged:
    ident: bytes
    rid: int
    acks: int
    pid: int
    base: int
    end: int
    timeout_ms: int


@dataclass
class _Waiter:
    ident: bytes
    rid: int
    req: m.FetchRequest
    deadline_ms: int
    pids: tuple
    done: bool = False

    def __lt__(self, other):  # heap order
        return self.deadline_ms < other.deadline_ms


class DataPath:
    def __init__(self, store, catalog, replicas: ReplicaHost, producers: ProducerStates, reply: Callable,
                 leader_of: Callable[[Topic, int], str | None],
                 now_ms: Callable[[], int] = _monotonic_ms,
                 address_of: Callable[[str], str | None] | None = None):
        """``leader_of(topic, partition) -> address or None`` names the leader of a
        partition this node does not lead; ``now_ms``: the node's monotonic clock;
        ``address_of(node id) -> address or None`` turns the replication core's hints (a
        leadership transfer's target) into addresses for clients."""
        self.now_ms = now_ms
        self.address_of = address_of
        self.store = store
        self.catalog = catalog
        self.replicas = replicas
        self.reply = reply
        self.leader_of = leader_of
        self.producers = producers
        self._staged: list[_Staged] = []
        self._waiters: dict[int, list[_Waiter]] = {}
        self._deadlines: list[_Waiter] = []
        self._grown: set[int] = set()

    # -- helpers ------------------------------------------------------------------------
    def local_partition(self, topic: str, partition: int) -> tuple[Topic, int]:
        """(topic, pid) of a partition this node leads; NOT_LEADER with a hint otherwise."""
        t, pid = self.catalog.partition(topic, partition)
        if pid is None or not self.replicas.is_leader(pid):
            addr = self.leader_of(t, partition)
            if addr is None:
                raise MeshError(ErrorCode.LEADER_NOT_AVAILABLE, f"{topic}/{partition} has no live leader")
            raise MeshError(ErrorCode.NOT_LEADER, f"{topic}/{partition} is led by {addr}", leader=addr)
        return t, pid

    def next_deadline_ms(self) -> int | None:
        """When the earliest parked fetch times out (``now_ms`` scale), None if none is parked."""
        return self._deadlines[0].deadline_ms if self._deadlines else None

    # -- produce ------------------------------------------------------------------------
    def on_produce(self, ident, rid, req: m.ProduceRequest, payload) -> None:
        if req.acks not in (0, 1, -1):
            raise MeshError(ErrorCode.INVALID_REQUEST, f"acks must be 0, 1 or -1 (all), not {req.acks}")
        t, pid = self.local_partition(req.topic, req.partition)
        if payload is None:
            raise MeshError(ErrorCode.INVALID_REQUEST, "produce request has no record batch frame")
        h = records.validate_batch(payload, t.config["max.message.bytes"])
        dup = self.producers.check(pid, h)
        if dup is not None:  # a retry of a batch we already have: answer as before
            end = dup + h.record_count
            if req.acks == -1 and end > self.replicas.commit_offset(pid):
                self.replicas.park_ack(pid, ident, rid, dup, end, req.timeout_ms)
            elif req.acks != 0:
                self.reply(ident, rid, m.ProduceResponse(0, base_offset=dup))
            return
        try:
            base, epoch = self.replicas.append_position(pid)
        except MeshError as exc:  # the core names leaders by node id; clients need an address
            hint = self.address_of(exc.leader) if exc.leader and self.address_of else None
            raise MeshError(exc.code, exc.message, leader=hint or self.leader_of(t, req.partition))
        try:
            staged_base, end = self.store.stage_append(pid, payload, epoch, h.record_count)
        except LogError as exc:  # nothing staged; the turn is doomed, commit_turn fails its other requests
            raise MeshError(ErrorCode.STORAGE_ERROR, str(exc))
        assert staged_base == base, (pid, staged_base, base)
        self.replicas.leader_append(pid, end, epoch)
        self.producers.stage(pid, h, base)
        # staged: from here on the answer is a ProduceResponse (the outcome may be "written")
        self._staged.append(_Staged(ident, rid, req.acks, pid, base, end, req.timeout_ms))

    def commit_turn(self) -> bool:
        """Commit the turn (one sync) and answer its produce requests. False if it failed."""
        staged, self._staged = self._staged, []
        try:
            self.replicas.before_commit(self.store.has_writes())
            self.store.commit()
        except (StorageFull, LogError) as exc:
            self.producers.rollback()
            self.replicas.after_commit(False)
            log.error("group commit failed, %d produce requests refused: %s", len(staged), exc)
            for s in staged:
                if s.acks != 0:
                    self.reply(s.ident, s.rid, m.ProduceResponse(int(ErrorCode.STORAGE_ERROR), str(exc)))
            return False
        self.producers.committed()
        for s in staged:
            if s.acks == 1:
                self.reply(s.ident, s.rid, m.ProduceResponse(0, base_offset=s.base,
                                                             log_start=self.store.log_start(s.pid)))
            elif s.acks == -1:
                self.replicas.park_ack(s.pid, s.ident, s.rid, s.base, s.end, s.timeout_ms)
        self._grown.update(self.replicas.after_commit(True))
        return True

    # -- fetch --------------------------------------------------------------------------
    def on_fetch(self, ident, rid, req: m.FetchRequest, payload) -> None:
        if not req.parts or len(req.parts) > MAX_PARTITIONS:
            raise MeshError(ErrorCode.INVALID_REQUEST, f"fetch needs 1..{MAX_PARTITIONS} partitions")
        pids = []
        for part in req.parts:
            if not (isinstance(part, list) and len(part) == 4):
                raise MeshError(ErrorCode.INVALID_REQUEST, "each fetch part is [topic, partition, offset, max_bytes]")
            try:
                pids.append(self.local_partition(part[0], part[1])[1])
            except MeshError:
                pass
        w = _Waiter(ident, rid, req, self.now_ms() + max(0, req.max_wait_ms), tuple(pids))
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
            pid = None
            try:
                _, pid = self.local_partition(topic, partition)
                start, hw = self.store.log_start(pid), self.replicas.commit_offset(pid)
                if not isinstance(offset, int) or offset < start or offset > max(hw, self.store.log_end(pid)):
                    raise MeshError(ErrorCode.OFFSET_OUT_OF_RANGE,
                                    f"offset {offset} is outside [{start}, {hw}] of {topic}/{partition}")
                got = []
                if offset < hw and total < req.max_bytes:
                    got = self.store.read(pid, offset, min(int(part_max), req.max_bytes - total), hw)
                n = sum(len(c) for c in got)
                chunks.extend(got)
                total += n
                parts.append([topic, partition, 0, hw, start, n, None])
            except CorruptBatch:  # logged once and reported to the core by the store (note_corrupt)
                has_error = True
                parts.append([topic, partition, int(ErrorCode.CORRUPT_MESSAGE), -1, -1, 0, None])
            except MeshError as exc:
                has_error = True
                start = hw = -1
                if exc.code == ErrorCode.OFFSET_OUT_OF_RANGE and pid is not None:
                    start, hw = self.store.log_start(pid), self.replicas.commit_offset(pid)
                parts.append([topic, partition, int(exc.code), hw, start, 0, exc.leader])
        if not (force or has_error or total >= max(1, req.min_bytes)):
            return False
        w.done = True
        self.reply(w.ident, w.rid, m.FetchResponse(parts), b"".join(chunks))
        return True

    def after_turn(self) -> None:
        if self._grown:
            grown, self._grown = self._grown, set()
            self._wake(grown)
        self.replicas.expire()
        now = self.now_ms()
        while self._deadlines and self._deadlines[0].deadline_ms <= now:
            w = heapq.heappop(self._deadlines)
            if not w.done:
                self._answer_fetch(w, force=True)

    def _wake(self, pids: set[int]) -> None:
        for pid in pids:
            waiters = self._waiters.pop(pid, None)
            if not waiters:
                continue
            for w in waiters:
                if not w.done and not self._answer_fetch(w, force=False):
                    self._waiters.setdefault(pid, []).append(w)
        for pid in list(self._waiters):  # forget answered waiters still listed elsewhere
            ws = [w for w in self._waiters[pid] if not w.done]
            if ws:
                self._waiters[pid] = ws
            else:
                del self._waiters[pid]

    def forget(self, pids: set[int]) -> None:
        """Partitions that left this node: parked fetches learn it now."""
        for pid in pids:
            self.producers.forget_partition(pid)
        self._wake(pids)

    # -- retention ----------------------------------------------------------------------
    def enforce_retention(self, now_ms: int) -> None:
        try:
            for t in self.catalog.topics.values():
                c = t.config
                for pid in t.pids:
                    if pid is not None and self.replicas.hosts(pid):
                        self.store.stage_retention(pid, now_ms, c["retention.ms"], c["retention.bytes"],
                                                   keep_from=self.replicas.persisted_commit(pid))
        except LogError as exc:  # the turn is doomed: commit_turn rolls it back and says so
            log.error("retention pass failed: %s", exc)
