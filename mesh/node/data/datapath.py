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

A handover (preferred leader, a move): while this node hands its leadership over, and
after it has stepped down for the target until it learns who won (``transferring``), a
produce request is held (``_hold``), not refused: there is no elected leader to name yet,
and a refusal without one costs the client a backoff and a metadata refresh. Once the handover ends
(``release_held``, every turn) a held request runs again: appended if we lead (the
transfer was abandoned, or we stepped down and won again), otherwise answered NOT_LEADER with the new leader's address,
which the client follows at once. Held for at most ``_HOLD_MS`` (and the request's
timeout), at most ``_HOLD_MAX`` per partition, ``_HOLD_ALL`` and ``_HOLD_BYTES`` in all; past a bound a
request is refused as before. A held request has appended nothing (its answer is an
``ErrorResponse`` unless it is appended when it runs again).

Fetch: answered from data below the high watermark (what a quorum has synced), or parked
until the high watermark moves or ``max_wait_ms`` passes.

Bounds (``DataLimits``, each a node option): a fetch answer holds at most
``fetch_max_bytes`` (plus one batch, so a batch larger than the cap is still served) and
at most ``partition_fetch_max_bytes`` per partition, whatever the request asks (Kafka:
``fetch.max.bytes``, ``max.partition.fetch.bytes``); a partition listed twice is
INVALID_REQUEST; ``max_wait_ms`` is capped at ``fetch_max_wait_ms``. At most
``max_parked_fetches`` fetches wait at once, ``max_parked_per_client`` per client (one
more is answered at once with what there is). Parked fetches are indexed by partition and
by client (removal is O(partitions of the fetch)), so a produce wakes only the fetches of
its partition, and a client that is gone (``drop_client``, from the outbox's
EHOSTUNREACH) takes its parked fetches with it. A produce's ``timeout_ms`` is capped at
``max_produce_timeout_ms``.

Listeners (``on_commit``: callables taking ``ok``) hear how every commit ended, right
after it: the group host answers the offsets commits staged in the turn then, so they
share the turn's one sync instead of syncing on their own.

Parked fetches wake in the turn whose commit moved their partition's high watermark,
never a turn later: a move made while the turn drained (a follower's answer) wakes them
right before the turn's sync, with the acks=all answers it covers
(``ReplicaHost.answer_committed`` says why neither waits for the sync); a move made by the
sync itself (the leader's own copy counted) wakes them in ``after_turn``.

Contained failures: ``doom(reason)`` marks the turn as possibly inconsistent (an
unexpected exception somewhere in it); the next ``commit_turn`` then rolls the whole turn
back instead of committing it (the store, producer states and the replication core, as
for a failed sync) and refuses its produce requests with STORAGE_ERROR.
"""
from __future__ import annotations

import functools
import heapq
import itertools
import logging
from time import perf_counter as _perf
from dataclasses import dataclass, field
from typing import Callable, NamedTuple

from mesh.cluster.catalog import Topic
from mesh.clock import now_ms as _monotonic_ms
from mesh.clock import wall_ms as _wall_ms
from mesh.node.limits.ratelog import RateLimitedLog
from mesh.wire import messages as m
from mesh.wire import records
from mesh.wire.errors import ErrorCode, MeshError
from mesh.node.data.producer_state import ProducerStates
from mesh.node.data.compactor import refuse_keyless
from mesh.node.data.retention import enforce_retention
from mesh.node.replication.raft_host import ReplicaHost
from mesh.wire.topic_config import MAX_PARTITIONS, compacted
from storage.base import CorruptBatch, LogError, StorageFull

__all__ = ["DataPath", "DataLimits"]

log = logging.getLogger("mesh.node.data.datapath")
_NONE, _LEADER, _ALL = m.Acks.NONE, m.Acks.LEADER, m.Acks.ALL   # bound once (an enum member's lookup: ~1 us)
_fetch_part = functools.partial(tuple.__new__, m.FetchPart)   # a FetchPart without its Python __new__


@dataclass(frozen=True)
class DataLimits:
    fetch_max_bytes: int = 8 << 20
    partition_fetch_max_bytes: int = 4 << 20
    fetch_max_wait_ms: int = 30_000
    max_parked_fetches: int = 5_000
    max_parked_per_client: int = 16
    max_produce_timeout_ms: int = 300_000


_tuple_new = tuple.__new__
_HOLD_MS = 2_000        # a handover ends within an election timeout (then it is abandoned)
# A batch stamped further ahead of this broker's clock is refused (Kafka 4's default for
# log.message.timestamp.after.max.ms): time retention deletes from the head while the head's
# newest timestamp is old enough, so one batch stamped in the far future kept a partition
# from ever expiring.
MAX_TIMESTAMP_AHEAD_MS = 3_600_000
_HOLD_MAX = 1_024       # produce requests held per partition during a handover
_HOLD_BYTES = 64 << 20  # bytes of produce requests held in all
_HOLD_ALL = 16_384      # produce requests held in all
_FULL_HANDOVER_MS = 30_000   # a full store hands a partition's leadership over at most this often


class _Staged(NamedTuple):   # a tuple: built once per produce request
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
    parts: list            # [[topic, partition, offset, max_bytes]], bounds applied
    max_bytes: int
    min_bytes: int
    deadline_ms: int
    pids: tuple
    seq: int = 0
    done: bool = False
    parked: bool = field(default=False)

    def __lt__(self, other):  # heap order
        return (self.deadline_ms, self.seq) < (other.deadline_ms, other.seq)


class DataPath:
    def __init__(self, store, catalog, replicas: ReplicaHost, producers: ProducerStates, reply: Callable,
                 leader_of: Callable[[Topic, int], str | None],
                 now_ms: Callable[[], int] = _monotonic_ms,
                 address_of: Callable[[str], str | None] | None = None,
                 limits: DataLimits | None = None, wall_ms: Callable[[], int] = _wall_ms):
        """``leader_of(topic, partition) -> address or None`` names the leader of a
        partition this node does not lead; ``now_ms``: the node's monotonic clock;
        ``address_of(node id) -> address or None`` turns the replication core's hints (a
        leadership transfer's target) into addresses for clients."""
        self.now_ms = now_ms
        self.wall_ms = wall_ms
        self.address_of = address_of
        self.store = store
        self.catalog = catalog
        self.replicas = replicas
        self.reply = reply
        self.leader_of = leader_of
        self.producers = producers
        self.writer_tag: Callable[[], int] = lambda: 0   # owner tag of the request being handled (the node's)
        self.limits = limits or DataLimits()
        self._staged: list[_Staged] = []
        self._waiters: dict[int, dict[int, _Waiter]] = {}      # pid -> seq -> parked fetch
        self._by_client: dict[bytes, dict[int, _Waiter]] = {}  # ident -> seq -> parked fetch
        self._parked = 0
        self._seq = itertools.count(1)
        self._deadlines: list[_Waiter] = []
        self._grown: set[int] = set()
        self._held: dict[int, list[tuple]] = {}   # pid -> [(ident, rid, req, payload, until_ms)]
        self._held_bytes = 0
        self._held_count = 0
        self.held_total = 0   # produce requests ever held through a handover
        self._doomed: str | None = None
        self._full_handover_ms: dict[int, int] = {}   # pid -> when a full store last handed it over
        self.commit_failures = 0          # turns in a row whose commit failed
        self.last_commit_error = ""
        self._commit_log = RateLimitedLog(log, window_ms=1_000)   # a failing store fails every turn
        self.on_commit: list[Callable[[bool], None]] = []   # told after every commit_turn: ok or not
        self.metrics = None   # mesh.node.ops.metrics.NodeMetrics (--metrics-port)

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
        """When the earliest parked fetch or held produce times out, or write caching's
        flush.ms sync is due (the turn's commit starts it) (``now_ms`` scale), None if nothing
        waits."""
        while self._deadlines and self._deadlines[0].done:
            heapq.heappop(self._deadlines)
        d = self._deadlines[0].deadline_ms if self._deadlines else None
        if self._held:
            h = min(held[0][4] for held in self._held.values())
            d = h if d is None else min(d, h)
        f = getattr(self.store, "unsynced_due_ms", None)
        return d if f is None else f if d is None else min(d, f)

    @property
    def parked(self) -> int:
        return self._parked

    def doom(self, reason: str) -> None:
        """Something in this turn failed unexpectedly: roll the turn back at its commit."""
        if self._doomed is None:
            self._doomed = reason

    @property
    def doomed(self) -> bool:
        """The turn will be rolled back: nothing of it may leave (early appends included: a
        request that failed after its batch was staged was answered with an ErrorResponse,
        "not written", which a batch that reached the followers could belie)."""
        return self._doomed is not None

    # -- produce ------------------------------------------------------------------------
    def on_produce(self, ident, rid, req: m.ProduceRequest, payload, hold: bool = True,
                   owner: int | None = None) -> None:
        """``owner``: the writer's ``producer_state.owner_tag`` (None: ``writer_tag()``, the
        native request the dispatcher is handling, 0 outside one; held requests keep
        theirs). Another listener (Kafka's) passes its principal's tag here."""
        if owner is None:
            owner = self.writer_tag()
        if req.acks not in m.ACKS_WIRE:
            raise MeshError(ErrorCode.INVALID_REQUEST, f"acks must be 0, 1 or -1 (all), not {req.acks}")
        if req.timeout_ms < 0:
            raise MeshError(ErrorCode.INVALID_REQUEST, f"timeout_ms must be >= 0, not {req.timeout_ms}")
        producers, replicas = self.producers, self.replicas
        t, pid = self.catalog.partition(req.topic, req.partition)
        leading = pid is not None and replicas.is_leader(pid)
        if not leading and not (hold and pid is not None and replicas.transferring(pid)):
            self.local_partition(req.topic, req.partition)   # raises NOT_LEADER with the leader's address
        if payload is None:
            raise MeshError(ErrorCode.INVALID_REQUEST, "produce request has no record batch frame")
        h = records.validate_batch(payload, t.config["max.message.bytes"])
        if compacted(t.config):
            refuse_keyless(payload)
        if h.max_timestamp_ms > self.wall_ms() + MAX_TIMESTAMP_AHEAD_MS or h.first_timestamp_ms > h.max_timestamp_ms:
            raise MeshError(ErrorCode.INVALID_REQUEST,
                            f"batch timestamps {h.first_timestamp_ms}..{h.max_timestamp_ms} ms: more than an hour "
                            f"ahead of this broker's clock, or out of order")
        if not leading:   # stepped down for a handover, the winner not known here yet: wait for it
            if not self._hold(pid, ident, rid, req, payload, owner=owner):
                self.local_partition(req.topic, req.partition)   # a bound is reached: refused as before
            return
        if hold and pid in self._held:   # earlier requests of this partition wait: keep the order
            # (before the sequence check: the batches held ahead of this one are not stored yet)
            if not self._hold(pid, ident, rid, req, payload, behind=True, owner=owner):
                raise MeshError(ErrorCode.NOT_LEADER, f"{req.topic}/{req.partition}: a leadership handover "
                                                      "is in progress and too many requests wait for it")
            return
        if h.producer_id >= 0:
            dup = producers.check(pid, h, owner) if owner else producers.check(pid, h)
            if dup is not None:  # a retry of a batch we already have: answer as before
                end = dup + h.record_count
                if req.acks == _ALL and end > replicas.commit_offset(pid):
                    replicas.park_ack(pid, ident, rid, dup, end, req.timeout_ms)
                elif req.acks == _LEADER:
                    # after the turn's sync, as the batch it repeats: that one may be staged in
                    # this very turn, and a commit that fails takes it back (an acknowledged
                    # record lost: the client took the early answer and never retried)
                    self._staged.append(_tuple_new(_Staged, (ident, rid, 1, pid, dup, end, 0)))
                elif req.acks != _NONE:
                    self.reply(ident, rid, m.ProduceResponse(0, base_offset=dup))
                return
        try:
            base, epoch = replicas.append_position(pid)
        except MeshError as exc:  # the core names leaders by node id; clients need an address
            if hold and exc.code == ErrorCode.NOT_LEADER and self._hold(pid, ident, rid, req, payload, owner=owner):
                return   # a handover is in progress: answered when it ends (release_held)
            hint = self.address_of(exc.leader) if exc.leader and self.address_of else None
            raise MeshError(exc.code, exc.message, leader=hint or self.leader_of(t, req.partition))
        if not self.store.room_for(len(payload)):   # refused alone: a put that fails dooms the turn
            self._full(pid)
            raise MeshError(ErrorCode.STORAGE_ERROR, f"not written: the store is full "
                                                     f"(a {len(payload)}-byte batch does not fit)")
        try:
            staged_base, end, stored = self.store.stage_batch(pid, payload, epoch, h.record_count)
        except LogError as exc:  # nothing staged; the turn is doomed, commit_turn fails its other requests
            raise MeshError(ErrorCode.STORAGE_ERROR, str(exc))
        assert staged_base == base, (pid, staged_base, base)
        replicas.leader_append(pid, end, epoch, base, stored, patched=True)   # (may leave before the sync)
        if owner:
            producers.stage(pid, h, base, owner)
        else:
            producers.stage(pid, h, base)
        if self.metrics is not None:
            self.metrics.appended(t.name, h.record_count, len(payload))
        # staged: from here on the answer is a ProduceResponse (the outcome may be "written")
        self._staged.append(_tuple_new(_Staged, (ident, rid, req.acks, pid, base, end,
                                                 min(req.timeout_ms, self.limits.max_produce_timeout_ms))))

    def _full(self, pid: int) -> None:
        """A batch for ``pid`` did not fit this store: hand the leadership to a caught-up
        replica, whose store may have room (Kafka moves leaders off a failed log directory),
        at most once per ``_FULL_HANDOVER_MS`` per partition (every store may be full)."""
        now = self.now_ms()
        if now - self._full_handover_ms.get(pid, -_FULL_HANDOVER_MS) >= _FULL_HANDOVER_MS:
            if len(self._full_handover_ms) >= MAX_PARTITIONS:   # deleted partitions' entries linger
                self._full_handover_ms.clear()
            self._full_handover_ms[pid] = now
            self.replicas.hand_over(pid)

    def _hold(self, pid: int, ident, rid, req: m.ProduceRequest, payload: bytes, behind: bool = False,
              owner: int = 0) -> bool:
        """Hold a produce request while this node hands ``pid``'s leadership over or has
        just stepped down for the target (``transferring``, see the module doc), or
        ``behind`` requests of ``pid`` held already (so that none overtakes them); False if
        there is no reason to, or a bound is reached."""
        if not behind and not self.replicas.transferring(pid):
            return False
        held = self._held.get(pid)
        if ((held is not None and len(held) >= _HOLD_MAX) or self._held_bytes + len(payload) > _HOLD_BYTES
                or self._held_count >= _HOLD_ALL):
            return False
        if held is None:
            held = self._held[pid] = []
        held.append((ident, rid, req, payload, self.now_ms() + min(_HOLD_MS, max(0, req.timeout_ms)), owner))
        self._held_bytes += len(payload)
        self._held_count += 1
        self.held_total += 1
        return True

    @property
    def holding(self) -> int:
        """Produce requests held now."""
        return self._held_count

    def refuse_held(self) -> None:
        """The node is closing: answer every held request now (nothing of it was appended),
        NOT_LEADER with the leader's address where it is known, so clients move on at once
        instead of waiting for their request timeout."""
        held, self._held = self._held, {}
        for pid, reqs in held.items():
            for ident, rid, req, payload, _, _ in reqs:
                self._held_bytes -= len(payload)
                self._held_count -= 1
                try:
                    self.local_partition(req.topic, req.partition)
                    exc = MeshError(ErrorCode.NOT_LEADER, "the broker is stopping")
                except MeshError as e:
                    exc = e
                self.reply(ident, rid, m.ErrorResponse(int(exc.code), exc.message, exc.leader))

    def release_held(self) -> None:
        """Every turn: run again, in order, the produce requests held for a handover that
        ended (or whose first one waited long enough). While the leadership is between
        nodes (we stepped down, nobody won yet) they wait on: the answer should name the
        new leader."""
        if not self._held or self._doomed is not None:
            return   # a doomed turn would roll them back: the next turn runs them
        now = self.now_ms()
        replicas = self.replicas
        for pid in list(self._held):
            held = self._held[pid]
            hosted = replicas.hosts(pid)
            leader = replicas.leader(pid)[0] if hosted else None
            if hosted and (replicas.transferring(pid) or leader is None) and held[0][4] > now:
                continue
            del self._held[pid]   # all of them, in the order they came (none may overtake another)
            # the elected successor, as the replication core knows it (gossip may lag behind)
            try:
                addr = (self.address_of(leader) if hosted and leader is not None and self.address_of
                        and not replicas.is_leader(pid) else None)
            except Exception:  # an odd view: let on_produce name the leader
                addr = None
            for ident, rid, req, payload, _, owner in held:
                self._held_bytes -= len(payload)
                self._held_count -= 1
                try:
                    if addr is not None:
                        raise MeshError(ErrorCode.NOT_LEADER, f"{req.topic}/{req.partition} is led by {addr}",
                                        leader=addr)
                    self.on_produce(ident, rid, req, payload, hold=False, owner=owner)
                except MeshError as exc:
                    self.reply(ident, rid, m.ErrorResponse(int(exc.code), exc.message, exc.leader))
                except Exception as exc:  # as the dispatcher: answer, fail the turn, keep serving
                    self.doom(f"{type(exc).__name__} while running a held produce request")
                    log.exception("held produce request failed: %s", exc)
                    self.reply(ident, rid, m.ErrorResponse(int(ErrorCode.INVALID_REQUEST),
                                                           f"request could not be handled: {exc}"))

    def answer_committed(self) -> None:
        """Right after the drain: answer the acks=all requests and wake the parked fetches
        that the commit advances of the drain allow (``ReplicaHost.answer_committed``: they
        need no sync of this turn), unless the turn is doomed."""
        if self._doomed is None and self.replicas.early_acks:
            moved = self.replicas.answer_committed()
            if moved:
                self._wake(moved)

    def commit_turn(self) -> bool:
        """Commit the turn (one sync) and answer its produce requests. False if it failed
        (or the turn was doomed: then it is rolled back)."""
        staged, self._staged = self._staged, []
        try:
            if self._doomed is not None:
                doomed, self._doomed = self._doomed, None
                self.store.rollback()
                raise LogError(f"turn rolled back after an internal error ({doomed})")
            moved = self.replicas.before_commit(self.store.has_writes())   # acks=all it covers answered
            if moved:
                self._wake(moved)   # below the commit offset is all in the store already (ReplicaHost)
            t0 = _perf() if self.metrics is not None and self.store.has_writes() else None
            self.store.commit(self.now_ms())   # (synced unless write caching allows: storage.base)
            if t0 is not None:
                self.metrics.synced(_perf() - t0)   # the turn's commit + sync
        except (StorageFull, LogError) as exc:
            self.producers.rollback()
            self.replicas.after_commit(False)
            self.commit_failures += 1
            self.last_commit_error = str(exc)
            if self._commit_log.once(type(exc)):
                log.error("group commit failed, %d produce requests refused: %s (%d in a row)", len(staged), exc,
                          self.commit_failures)
            for s in staged:
                if s.acks != _NONE:
                    self.reply(s.ident, s.rid, m.ProduceResponse(int(ErrorCode.STORAGE_ERROR), str(exc)))
            for listener in self.on_commit:
                listener(False)
            return False
        self.commit_failures = 0   # (the producer states heard of the commit: store.post_commit)
        reply, store = self.reply, self.store
        for s in staged:
            if s.acks == _LEADER:
                reply(s.ident, s.rid, m.ProduceResponse(0, base_offset=s.base, log_start=store.log_start(s.pid)))
            elif s.acks == _ALL:
                self.replicas.park_ack(s.pid, s.ident, s.rid, s.base, s.end, s.timeout_ms)
        self._grown.update(self.replicas.after_commit(True))
        for listener in self.on_commit:
            listener(True)
        return True

    # -- fetch --------------------------------------------------------------------------
    def on_fetch(self, ident, rid, req: m.FetchRequest, payload) -> None:
        lim = self.limits
        if not req.parts or len(req.parts) > MAX_PARTITIONS:
            raise MeshError(ErrorCode.INVALID_REQUEST, f"fetch needs 1..{MAX_PARTITIONS} partitions")
        if req.min_bytes < 0 or req.max_bytes < 0:
            raise MeshError(ErrorCode.INVALID_REQUEST, "min_bytes and max_bytes must be >= 0")
        part_cap = lim.partition_fetch_max_bytes
        parts, seen, pids = [], set(), []
        for part in req.parts:
            if not (isinstance(part, list) and len(part) == 4 and isinstance(part[0], str)
                    and all(type(v) is int for v in part[1:]) and part[3] >= 0):
                raise MeshError(ErrorCode.INVALID_REQUEST,
                                "each fetch part is [topic, partition, offset, max_bytes >= 0]")
            key = (part[0], part[1])
            if key in seen:
                raise MeshError(ErrorCode.INVALID_REQUEST, f"{part[0]}/{part[1]} is listed twice in one fetch")
            seen.add(key)
            parts.append([part[0], part[1], part[2], min(part[3], part_cap)])
            try:
                pids.append(self.local_partition(part[0], part[1])[1])
            except MeshError:
                pass
        wait_ms = max(0, min(req.max_wait_ms, lim.fetch_max_wait_ms))   # negative: do not wait
        w = _Waiter(ident, rid, parts, min(req.max_bytes, lim.fetch_max_bytes), req.min_bytes,
                    self.now_ms() + wait_ms, tuple(pids))
        client = self._by_client.get(ident)
        full = self._parked >= lim.max_parked_fetches or (client is not None
                                                          and len(client) >= lim.max_parked_per_client)
        if not self._answer_fetch(w, force=wait_ms <= 0 or full):
            self._park(w)

    def _park(self, w: _Waiter) -> None:
        w.seq = next(self._seq)
        w.parked = True
        self._parked += 1
        for pid in w.pids:
            self._waiters.setdefault(pid, {})[w.seq] = w
        self._by_client.setdefault(w.ident, {})[w.seq] = w
        heapq.heappush(self._deadlines, w)
        if len(self._deadlines) > 2 * self._parked + 64:   # answered fetches linger in the heap
            self._deadlines = [x for x in self._deadlines if not x.done]
            heapq.heapify(self._deadlines)

    def _unpark(self, w: _Waiter) -> None:
        if not w.parked:
            return
        w.parked = False
        self._parked -= 1
        for pid in w.pids:
            ws = self._waiters.get(pid)
            if ws is not None:
                ws.pop(w.seq, None)
                if not ws:
                    del self._waiters[pid]
        ws = self._by_client.get(w.ident)
        if ws is not None:
            ws.pop(w.seq, None)
            if not ws:
                del self._by_client[w.ident]

    def drop_client(self, ident: bytes) -> None:
        """The client is gone: forget its parked fetches (nobody would read the answers)."""
        for w in list(self._by_client.get(ident, {}).values()):
            w.done = True
            self._unpark(w)

    def _answer_fetch(self, w: _Waiter, force: bool) -> bool:
        """Answer ``w`` if it has min_bytes (or an error), or if ``force``. True if answered."""
        parts, chunks = [], []
        total, has_error, max_bytes = 0, False, w.max_bytes
        for topic, partition, offset, part_max in w.parts:
            pid = None
            try:
                _, pid = self.local_partition(topic, partition)
                start, hw = self.store.log_start(pid), self.replicas.commit_offset(pid)
                if offset < start or offset > max(hw, self.store.log_end(pid)):
                    raise MeshError(ErrorCode.OFFSET_OUT_OF_RANGE,
                                    f"offset {offset} is outside [{start}, {hw}] of {topic}/{partition}")
                got = []
                if offset < hw and total < max_bytes:
                    got = self.store.read(pid, offset, min(part_max, max_bytes - total), hw)
                n = sum(len(c) for c in got)
                chunks.extend(got)
                total += n
                parts.append(_fetch_part((topic, partition, 0, hw, start, n, None)))
                if n and self.metrics is not None:
                    self.metrics.fetched(topic, n)
            except CorruptBatch:  # logged once and reported to the core by the store (note_corrupt)
                has_error = True
                parts.append(m.FetchPart(topic, partition, int(ErrorCode.CORRUPT_MESSAGE), -1, -1, 0, None))
            except MeshError as exc:
                has_error = True
                start = hw = -1
                if exc.code == ErrorCode.OFFSET_OUT_OF_RANGE and pid is not None:
                    start, hw = self.store.log_start(pid), self.replicas.commit_offset(pid)
                parts.append(m.FetchPart(topic, partition, int(exc.code), hw, start, 0, exc.leader))
        if not (force or has_error or total >= max(1, w.min_bytes)):
            return False
        w.done = True
        self._unpark(w)
        self.reply(w.ident, w.rid, m.FetchResponse(parts), b"".join(chunks))
        return True

    def _answer_guarded(self, w: _Waiter, force: bool) -> bool:
        """``_answer_fetch`` for a parked fetch: an unexpected failure answers it with an
        error (and is logged) instead of escaping into the loop's turn."""
        try:
            return self._answer_fetch(w, force)
        except Exception as exc:
            log.error("parked fetch of client %s failed: %r", bytes(w.ident).hex(), exc)
            w.done = True
            self._unpark(w)
            self.reply(w.ident, w.rid, m.ErrorResponse(int(ErrorCode.UNKNOWN), f"fetch failed: {exc}"))
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
                self._answer_guarded(w, force=True)

    def _wake(self, pids: set[int]) -> None:
        """Answer the parked fetches of ``pids`` that now have enough (O(their fetches))."""
        for pid in pids:
            ws = self._waiters.get(pid)
            if ws:
                for w in list(ws.values()):
                    if not w.done:
                        self._answer_guarded(w, force=False)

    def forget(self, pids: set[int]) -> None:
        """Partitions that left this node: parked fetches learn it now."""
        for pid in pids:
            self.producers.forget_partition(pid)
        self._wake(pids)

    # -- retention ----------------------------------------------------------------------
    def enforce_retention(self, now_ms: int, by_time: bool = True) -> None:
        """One retention pass (``mesh.node.data.retention``)."""
        enforce_retention(self.store, self.catalog, self.replicas, now_ms, by_time)
