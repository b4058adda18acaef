"""Consumer groups on the client: the member's shell, and the group admin calls.

``GroupMembership`` is what a ``Consumer(group_id=...)`` uses; it drives the sans-I/O
``mesh.groups.member.GroupMemberState`` with the consumer's own transport, in the caller's
thread, inside ``poll()`` (there is no background thread):

* heartbeats go out from ``poll()``; their answers arrive with the fetch responses. **Call
  ``poll()`` at least once per ``session_timeout_ms``** (Kafka's ``max.poll.interval.ms``):
  a member that does not has its partitions handed to others, and itself drops them and
  rejoins on its next poll;
* a partition given to the member: its committed offset is fetched from the coordinator
  (``GROUP_FETCH_OFFSETS``) before consuming starts there; with none committed, the
  consumer's ``auto_offset_reset`` applies;
* a partition to give back: fetching stops at once, its offset is committed (with
  auto-commit; else ``on_revoke`` may commit), then it is released and the coordinator
  hands it on. A partition *lost* (the membership ended) is dropped without a commit;
* the committed offset is the next offset to read. ``commit()`` commits the positions of
  every record returned so far; auto-commit (``enable_auto_commit``, every
  ``auto_commit_interval_ms``) commits the records returned by *earlier* polls, which the
  caller has finished with since it polled again.

Delivery: **at-least-once** is the default: process what ``poll()`` returns, then poll
again (auto-commit) or ``commit()``; after a crash the next owner re-reads what was not
committed. **At-most-once**: ``enable_auto_commit=False`` and ``commit()`` right after
``poll()``, before processing; a crash then skips what was being processed.

The coordinator is found with ``GROUP_FIND_COORDINATOR`` (any broker answers) and
followed on COORDINATOR_MOVED or when it stops answering.

``GroupAdmin`` (``mesh.client.group_admin``) lists, describes and resets groups.
"""
from __future__ import annotations

import logging
import time
from typing import Callable, Iterable

from mesh.client.cluster import TopicPartition
from mesh.client.coordinator import MOVED as _MOVED, Coordinator
from mesh.client.transport import Transport
from mesh.wire.errors import ErrorCode, MeshError, retriable
from mesh.groups import (
    LEAVE_EPOCH, GroupCommit, GroupCommitResponse, GroupFetchOffsets, GroupHeartbeatResponse,
    GroupMemberState, MemberChanges,
)

__all__ = ["GroupMembership"]

log = logging.getLogger("mesh.group")

_COMMIT_ATTEMPTS = 4


def _ms() -> int:
    return int(time.monotonic() * 1000)


def _tp(tp) -> TopicPartition:
    return TopicPartition(tp[0], tp[1])


class GroupMembership:
    """The consumer's membership in one group (see the module docstring).

    Options (``Consumer(..., group_id=..., **options)``): ``session_timeout_ms`` (10 s; at
    most the brokers' limit, 10 s by default), ``rebalance_timeout_ms``, ``assignor``
    (``range``, ``round-robin``, ``cooperative-sticky``; "" lets the coordinator choose),
    ``enable_auto_commit`` (True), ``auto_commit_interval_ms`` (5000), ``commit_on_close``
    (True: ``close()`` commits every record returned; False: only those acknowledged by a
    later poll), and ``on_assign`` / ``on_revoke`` / ``on_lost`` callbacks, each called with
    a list of TopicPartitions (``on_revoke`` runs before the release, so it may ``commit``).
    """

    def __init__(self, consumer, group_id: str, *, session_timeout_ms: int = 10_000,
                 rebalance_timeout_ms: int = 60_000, assignor: str = "",
                 enable_auto_commit: bool = True, auto_commit_interval_ms: int = 5_000,
                 commit_on_close: bool = True, request_timeout_ms: int | None = None,
                 on_assign: Callable | None = None, on_revoke: Callable | None = None,
                 on_lost: Callable | None = None):
        if auto_commit_interval_ms < 0:
            raise ValueError("auto_commit_interval_ms must not be negative")
        self.consumer = consumer
        self.transport: Transport = consumer.transport
        self.group_id = group_id
        self.state = GroupMemberState(group_id, [], assignor=assignor, session_timeout_ms=session_timeout_ms,
                                      rebalance_timeout_ms=rebalance_timeout_ms)
        self.request_timeout_ms = request_timeout_ms or self.state.request_timeout_ms
        self.coordinator = Coordinator(self.transport, consumer.cluster, group_id)
        self.enable_auto_commit = enable_auto_commit
        self.auto_commit_interval_ms = auto_commit_interval_ms
        self.commit_on_close = commit_on_close
        self.on_assign, self.on_revoke, self.on_lost = on_assign, on_revoke, on_lost
        self._subscribed = False
        self._heartbeats: dict[int, tuple[int, str]] = {}     # rid -> (sent ms, address)
        self._late: set[int] = set()                           # ... of those, timed out
        self._commits: dict[int, tuple[int, dict]] = {}       # async commits: rid -> (sent ms, offsets)
        self._consumed: dict[TopicPartition, int] = {}         # next offset after the records returned
        self._processed: dict[TopicPartition, int] = {}        # ... as of the start of this poll
        self._committed: dict[TopicPartition, int] = {}
        self._pending: set[TopicPartition] = set()             # held, committed offset not fetched yet
        self._next_pending_ms = 0
        self._next_commit_ms = _ms() + auto_commit_interval_ms
        self._closed = False

    # -- hooks called by the Consumer ---------------------------------------------------
    def subscribe(self, topics: Iterable[str]) -> None:
        topics = sorted(set(topics))
        if not topics:
            raise ValueError("subscribe needs at least one topic")
        self.state.subscribe(topics)
        self._subscribed = True

    def maybe_heartbeat(self) -> None:
        """At the start of (and during) every poll: the previous poll's records count as
        processed; heartbeat, reconcile and auto-commit when due."""
        if self._closed:
            return
        self._processed = dict(self._consumed)
        now = _ms()
        if self._subscribed:
            self._expire(now)
            self._apply(self.state.poll(now))
            if self._pending and now >= self._next_pending_ms:
                self._resolve_pending(now)
            if self.state.heartbeat_due(now):
                self._send_heartbeat(now)
        if self.enable_auto_commit and now >= self._next_commit_ms:
            self._next_commit_ms = now + self.auto_commit_interval_ms
            self._commit_async(self._processed, now)

    def on_response(self, rid: int, resp) -> bool:
        """A response the consumer's fetch loop does not own; True if it was ours."""
        entry = self._heartbeats.pop(rid, None)
        if entry is not None:
            self._late.discard(rid)
            self._on_heartbeat(resp, entry[0], entry[1])
            return True
        commit = self._commits.pop(rid, None)
        if commit is not None:
            self._on_commit(resp, commit[1])
            return True
        return False

    def on_consumed(self, batches: list) -> None:
        for recs in batches:
            if recs:
                last = recs[-1]
                self._consumed[TopicPartition(last.topic, last.partition)] = last.offset + 1

    def on_seek(self, tp, offset: int) -> None:
        self._consumed[_tp(tp)] = offset

    def initial_positions(self, tps: list) -> list:
        """Positions for assigned partitions that have none: a manually assigned consumer
        with a group starts at the group's committed offsets. Returns those still without."""
        if self._subscribed or not tps:
            return tps
        try:
            found = self._fetch_committed(tps)
        except MeshError as exc:
            log.warning("group %s: committed offsets unavailable (%s); using auto_offset_reset", self.group_id, exc)
            return tps
        rest = []
        for tp in tps:
            off = found.get(_tp(tp), -1)
            if off >= 0:
                self.consumer._positions[_tp(tp)] = off
                self._consumed.setdefault(_tp(tp), off)
                self._committed[_tp(tp)] = off
            else:
                rest.append(tp)
        return rest

    def commit(self, offsets=None) -> None:
        """Commit ``offsets`` ({TopicPartition: offset or (offset, metadata)}), or the
        positions of every record returned so far; returns once durable on the coordinator.
        Raises MeshError (ILLEGAL_GENERATION) for partitions this member no longer holds."""
        if offsets is None:
            offsets = dict(self._consumed)
        self._commit_sync({_tp(tp): v for tp, v in offsets.items()}, explicit=True)

    def committed(self, tp) -> int | None:
        off = self._fetch_committed([_tp(tp)]).get(_tp(tp), -1)
        return off if off >= 0 else None

    def close(self) -> None:
        if self._closed:
            return
        if self.enable_auto_commit:
            offsets = self._consumed if self.commit_on_close else self._processed
            try:
                self._commit_sync(dict(offsets), explicit=False)
            except MeshError as exc:
                log.warning("group %s: final commit failed: %s", self.group_id, exc)
        self._closed = True
        if self._subscribed:
            leave, _ = self.state.leave()
            addr = self.coordinator.address
            if leave is not None and addr is not None:
                try:   # wait briefly so the leave is on the wire before the sockets close
                    self.transport.call(addr, leave, timeout_ms=min(1_000, self.request_timeout_ms))
                except MeshError:
                    pass

    def abandon(self) -> None:
        """Stop without committing or leaving (the broker is going away); the coordinator
        ends the membership when its session times out."""
        self._closed = True

    # -- views --------------------------------------------------------------------------
    @property
    def member_id(self) -> str:
        return self.state.member_id

    def assignment(self) -> list[TopicPartition]:
        return sorted(_tp(tp) for tp in self.state.assignment if _tp(tp) not in self._pending)

    # -- heartbeats ---------------------------------------------------------------------
    def _send_heartbeat(self, now: int) -> None:
        addr = self.coordinator.get(now)
        if addr is None:
            return
        req = self.state.heartbeat(now)
        self._heartbeats[self.transport.send(addr, req)] = (now, addr)

    def _expire(self, now: int) -> None:
        """A heartbeat unanswered for ``request_timeout_ms`` counts as failed (the next one
        may go out), but a late answer is still read (the member state knows how old it
        is) until the session timeout: on a busy machine answers can lag."""
        for rid, (sent, addr) in list(self._heartbeats.items()):
            if now - sent >= self.state.session_timeout_ms:
                del self._heartbeats[rid]
                self._late.discard(rid)
            elif now - sent >= self.request_timeout_ms and rid not in self._late:
                self._late.add(rid)
                self.state.on_heartbeat_failed(sent, now)
                if self.coordinator.address == addr:
                    log.info("group %s: coordinator %s does not answer; looking again", self.group_id, addr)
                    self.coordinator.moved(None)
        for rid, (sent, _) in list(self._commits.items()):
            if now - sent >= self.request_timeout_ms:
                del self._commits[rid]

    def _on_heartbeat(self, resp, sent: int, addr: str) -> None:
        now = _ms()
        if not isinstance(resp, GroupHeartbeatResponse):
            code = getattr(resp, "error", ErrorCode.UNKNOWN)
            if not retriable(code):
                raise MeshError(code, getattr(resp, "message", "unexpected heartbeat answer"))
            self.state.on_heartbeat_failed(sent, now)
            return
        if resp.error in _MOVED and self.coordinator.address == addr:
            self.coordinator.moved(resp.coordinator)
        self._apply(self.state.on_heartbeat_response(resp, sent, now))

    def _heartbeat_sync(self) -> None:
        addr = self.coordinator.get(wait=True)
        if addr is None:
            return
        sent = _ms()
        try:
            resp, _ = self.transport.call(addr, self.state.heartbeat(sent), timeout_ms=self.request_timeout_ms)
        except MeshError as exc:
            self.state.on_heartbeat_failed(sent, _ms())
            if exc.retriable:
                self.coordinator.moved(None)
                return
            raise
        self._on_heartbeat(resp, sent, addr)

    # -- reconciliation -----------------------------------------------------------------
    def _apply(self, changes: MemberChanges) -> None:
        for req in changes.send:   # leaves for ids we abandoned
            addr = self.coordinator.address
            if addr is not None:
                self.transport.send(addr, req)
        if changes.lost:
            lost = [_tp(tp) for tp in changes.lost]
            log.warning("group %s: lost %d partitions (membership ended); rejoining", self.group_id, len(lost))
            self._drop(lost)
            self._sync_assignment()
            if self.on_lost:
                self.on_lost(lost)
        if changes.revoke:
            revoke = [_tp(tp) for tp in changes.revoke]
            resolved = [tp for tp in revoke if tp not in self._pending]
            self._pending.difference_update(revoke)
            self._sync_assignment()   # stop fetching them now
            if self.enable_auto_commit and resolved:
                try:
                    self._commit_sync({tp: self._processed[tp] for tp in resolved if tp in self._processed},
                                      explicit=False)
                except MeshError as exc:   # the next owner re-reads from the last commit
                    log.warning("group %s: commit before release failed: %s", self.group_id, exc)
            if self.on_revoke and resolved:
                self.on_revoke(resolved)
            self.state.revoked(revoke)
            self._drop(revoke)
        if changes.assigned:
            self._pending.update(_tp(tp) for tp in changes.assigned)
            self._resolve_pending(_ms())

    def _drop(self, tps: list) -> None:
        for tp in tps:
            self._pending.discard(tp)
            self._consumed.pop(tp, None)
            self._processed.pop(tp, None)
            self._committed.pop(tp, None)

    def _sync_assignment(self) -> None:
        """The consumer fetches exactly what we hold, are not revoking, and know where to start."""
        active = sorted(_tp(tp) for tp in self.state.assignment if _tp(tp) not in self._pending)
        if active == sorted(self.consumer._assigned):
            return
        try:
            self.consumer.assign(active)
        except MeshError as exc:
            if exc.code != ErrorCode.UNKNOWN_PARTITION:
                raise
            self.consumer.cluster.refresh()   # the topic grew since our metadata was read
            self.consumer.assign(active)

    def _resolve_pending(self, now: int) -> None:
        pending = sorted(tp for tp in self._pending if tp in self.state.assignment)
        self._pending.intersection_update(pending)
        if not pending:
            return
        try:
            found = self._fetch_committed(pending)
        except MeshError as exc:
            log.info("group %s: committed offsets not available yet (%s); retrying", self.group_id, exc)
            self._next_pending_ms = now + 200
            return
        self._pending.difference_update(pending)
        self._sync_assignment()
        for tp in pending:
            off = found.get(tp, -1)
            if off >= 0:
                self.consumer.seek(tp, off)
                self._committed[tp] = off
            # else: no commit yet; the consumer applies auto_offset_reset when it fetches
        if self.on_assign:
            self.on_assign(pending)

    # -- offsets ------------------------------------------------------------------------
    def _fetch_committed(self, tps: list) -> dict[TopicPartition, int]:
        resp = self.coordinator.call(GroupFetchOffsets(self.group_id, [[t, p] for t, p in tps]),
                                     timeout_ms=self.request_timeout_ms)
        if resp.error:
            raise MeshError(resp.error, resp.message)
        return {TopicPartition(t, p): off for t, p, off, _ in resp.offsets}

    def _commit_request(self, offsets: dict) -> tuple[GroupCommit | None, list]:
        """(request, partitions left out because this member does not hold them)."""
        items, missing = [], []
        for tp, v in sorted(offsets.items()):
            off, meta = (v, "") if isinstance(v, int) else (v[0], v[1])
            if self._subscribed and tp not in self.state.owned:
                missing.append(tp)
                continue
            items.append((tp.topic, tp.partition, off, meta))
        if not items:
            return None, missing
        if self._subscribed:
            if not self.state.member_id:
                return None, missing + [TopicPartition(t, p) for t, p, _, _ in items]
            return self.state.commit(items), missing
        return GroupCommit(self.group_id, "", LEAVE_EPOCH, [list(i) for i in items]), missing

    def _commit_async(self, offsets: dict, now: int) -> None:
        todo = {tp: off for tp, off in offsets.items() if self._committed.get(tp) != off}
        req, _ = self._commit_request(todo)
        addr = self.coordinator.get(now)
        if req is None or addr is None:
            return
        self._commits[self.transport.send(addr, req)] = (now, {TopicPartition(t, p): o for t, p, o, _ in req.offsets})

    def _on_commit(self, resp, offsets: dict) -> None:
        if isinstance(resp, GroupCommitResponse) and resp.error == ErrorCode.NONE:
            self._committed.update(offsets)
            return
        code = getattr(resp, "error", ErrorCode.UNKNOWN)
        if code in _MOVED:
            self.coordinator.moved(getattr(resp, "coordinator", None))
        log.info("group %s: auto-commit refused (%s); retrying soon", self.group_id, ErrorCode(code).name)
        self._next_commit_ms = min(self._next_commit_ms, _ms() + 200)

    def _commit_sync(self, offsets: dict, explicit: bool) -> None:
        """Commit and wait. ``explicit`` (the user's ``commit()``): commit everything asked,
        on ILLEGAL_GENERATION heartbeat and retry, and raise on failure. Otherwise (before a
        release, on close): skip offsets already committed, no heartbeat, only log."""
        if not explicit:
            offsets = {tp: v for tp, v in offsets.items() if self._committed.get(tp) != v}
        last: MeshError | None = None
        missing: list = []
        for _ in range(_COMMIT_ATTEMPTS):
            req, missing = self._commit_request(offsets)
            if req is None:
                last = None
                break
            try:
                resp = self.coordinator.call(req, timeout_ms=self.request_timeout_ms, attempts=2)
            except MeshError as exc:
                last = exc
                if not exc.retriable:
                    break
                continue
            if resp.error == ErrorCode.NONE:
                self._committed.update({TopicPartition(t, p): o for t, p, o, _ in req.offsets})
                last = None
                break
            last = MeshError(resp.error, resp.message)
            if resp.error == ErrorCode.ILLEGAL_GENERATION and explicit and self._subscribed:
                self._heartbeat_sync()   # learn the current epoch (and any revocation), then retry
                continue
            break
        if not explicit:
            if last is not None:
                log.warning("group %s: commit failed: %s", self.group_id, last)
            return
        if last is not None:
            raise last
        if missing:
            raise MeshError(ErrorCode.ILLEGAL_GENERATION, f"not committed: this member does not hold {missing}")
