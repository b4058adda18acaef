"""The member side of the consumer-group heartbeat protocol (sans-I/O), for the client.

Theory of operation
-------------------
``GroupMemberState`` is the member's half of the protocol whose coordinator half is
``mesh.groups.coordinator.GroupCoordinator`` (read that module's docstring first: the rules that keep two
members from ever holding one partition are stated there). The member:

* takes partitions the moment an answer gives them, and accepts an answer only if its
  epoch is not older than its own; from an answer of its own epoch it only *removes*;
* reports released partitions in its next heartbeat, which goes out at once;
* fences itself (drops everything, rejoins under a new id) once
  ``session_timeout_ms - fence_margin_ms`` have passed since it *sent* its last
  acknowledged heartbeat, because by then the coordinator may have handed its partitions
  on; answers older than that are ignored for the same reason;
* sends a leave (epoch -1) for every member id it abandons, so a ghost id is freed at once.

No clock, no socket: time comes in as ``now_ms``; requests go out as return values. The
client shell (``mesh.client.group``) carries out every ``MemberChanges``.
"""
from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import Iterable

from mesh.groups.messages import (
    JOIN_EPOCH, LEAVE_EPOCH, GroupCommit, GroupHeartbeat, GroupHeartbeatResponse,
    check_group_id, wire_partitions,
)
from mesh.wire.errors import ErrorCode, MeshError, retriable
from mesh.wire.types import TopicPartition

__all__ = ["MemberChanges", "GroupMemberState"]


@dataclass(frozen=True, slots=True)
class MemberChanges:
    """What the client must do after feeding the member state an input.

    * ``assigned``: now held; fetch their committed offsets and start consuming;
    * ``revoke``: stop consuming them, commit their offsets, then call ``revoked()``
      (each partition is reported once);
    * ``lost``: already dropped (the membership ended); stop at once and do not commit;
    * ``send``: fire-and-forget requests (leaves for member ids this member abandoned).
    """
    assigned: tuple[TopicPartition, ...] = ()
    revoke: tuple[TopicPartition, ...] = ()
    lost: tuple[TopicPartition, ...] = ()
    send: tuple[GroupHeartbeat, ...] = ()


_NO_CHANGES = MemberChanges()
_ABANDONED_IDS_KEPT = 64


class GroupMemberState:
    """Sans-I/O member side of the heartbeat protocol, for the client library.

    Each loop turn: ``poll(now)``; if ``heartbeat_due(now)``, send ``heartbeat(now)`` and
    remember when; feed the answer to ``on_heartbeat_response(resp, sent_ms, now)`` (or
    ``on_heartbeat_failed(sent_ms, now)`` on a timeout or transport error). Act on every
    ``MemberChanges`` returned. ``leave()`` before closing.

    The member fences itself: once ``session_timeout_ms - fence_margin_ms`` have passed since
    it sent its last acknowledged heartbeat, it drops everything (``lost``) and rejoins under
    a new id, because by then the coordinator may have handed its partitions on. Answers
    older than that are ignored for the same reason.
    """

    def __init__(self, group_id: str, topics: Iterable[str], *, assignor: str = "",
                 session_timeout_ms: int = 10_000, rebalance_timeout_ms: int = 60_000,
                 request_timeout_ms: int | None = None, fence_margin_ms: int | None = None,
                 retry_backoff_ms: int = 100):
        self.group_id = check_group_id(group_id)
        self.topics = sorted(set(topics))
        self.assignor = assignor
        self.session_timeout_ms = session_timeout_ms
        self.rebalance_timeout_ms = rebalance_timeout_ms
        margin = session_timeout_ms // 10 if fence_margin_ms is None else fence_margin_ms
        self.fence_ms = session_timeout_ms - margin
        if self.fence_ms <= 0:
            raise ValueError("fence margin must be smaller than the session timeout")
        self.request_timeout_ms = request_timeout_ms or max(1, session_timeout_ms // 3)
        self.retry_backoff_ms = retry_backoff_ms
        self.heartbeat_interval_ms = max(1, session_timeout_ms // 3)
        self.member_id = ""
        self.member_epoch = JOIN_EPOCH
        self._owned: set[TopicPartition] = set()
        self._target: set[TopicPartition] = set()
        self._revoke_told: set[TopicPartition] = set()
        self._last_ok_sent_ms: int | None = None
        self._next_heartbeat_ms = 0
        self._urgent = False
        self._inflight_sent_ms: int | None = None
        self._abandoned: collections.deque[str] = collections.deque(maxlen=_ABANDONED_IDS_KEPT)
        self._closed = False

    # -- views ----------------------------------------------------------------------------

    @property
    def owned(self) -> frozenset[TopicPartition]:
        """Everything held right now, including partitions being revoked."""
        return frozenset(self._owned)

    @property
    def assignment(self) -> frozenset[TopicPartition]:
        """What the coordinator lets this member keep."""
        return frozenset(self._target)

    @property
    def revoking(self) -> frozenset[TopicPartition]:
        return frozenset(self._owned - self._target)

    # -- inputs ---------------------------------------------------------------------------

    def subscribe(self, topics: Iterable[str]) -> None:
        self.topics = sorted(set(topics))
        self._urgent = True

    def heartbeat_due(self, now_ms: int) -> bool:
        """One heartbeat in flight at a time (until ``request_timeout_ms``), except that news
        the coordinator is waiting for (a release, a new subscription) goes out at once."""
        if self._closed:
            return False
        if self._urgent:
            return True
        if self._inflight_sent_ms is not None and now_ms - self._inflight_sent_ms < self.request_timeout_ms:
            return False
        return now_ms >= self._next_heartbeat_ms

    def heartbeat(self, now_ms: int) -> GroupHeartbeat:
        self._inflight_sent_ms = now_ms
        self._urgent = False
        return GroupHeartbeat(self.group_id, self.member_id, self.member_epoch, list(self.topics),
                              wire_partitions(self._owned), self.assignor,
                              self.session_timeout_ms, self.rebalance_timeout_ms)

    def poll(self, now_ms: int) -> MemberChanges:
        """Fence ourselves when the session may have ended at the coordinator."""
        if self.member_id and self._last_ok_sent_ms is not None \
                and now_ms - self._last_ok_sent_ms >= self.fence_ms:
            return self._abandon(send_leave=True)
        return _NO_CHANGES

    def on_heartbeat_failed(self, sent_ms: int, now_ms: int) -> None:
        if self._inflight_sent_ms == sent_ms:
            self._inflight_sent_ms = None
            self._next_heartbeat_ms = now_ms + self.retry_backoff_ms

    def on_heartbeat_response(self, resp: GroupHeartbeatResponse, sent_ms: int,
                              now_ms: int) -> MemberChanges:
        if self._inflight_sent_ms == sent_ms:
            self._inflight_sent_ms = None
        fresh = now_ms - sent_ms < self.fence_ms   # older: our session may have ended since
        joined = resp.error == ErrorCode.NONE and resp.member_epoch != LEAVE_EPOCH
        if resp.member_id != self.member_id or self._closed:
            if not joined or resp.member_id in self._abandoned:
                return _NO_CHANGES   # about an id we gave up, or an error for an older join
            if self.member_id or not fresh or self._closed:
                # An extra join answer (a retried join, or one from before we re-joined):
                # that id is a ghost holding partitions; tell the coordinator to free it.
                self._abandoned.append(resp.member_id)
                return MemberChanges(send=(self._leave_request(resp.member_id),))
            self.member_id = resp.member_id   # our join answer
            self._last_ok_sent_ms = sent_ms
        if resp.error != ErrorCode.NONE:
            return self._on_error(resp, now_ms)
        if not joined or not fresh:
            return _NO_CHANGES
        self._last_ok_sent_ms = max(self._last_ok_sent_ms or sent_ms, sent_ms)
        self.heartbeat_interval_ms = max(1, resp.heartbeat_interval_ms or self.heartbeat_interval_ms)
        self._next_heartbeat_ms = now_ms + min(self.heartbeat_interval_ms, self.fence_ms // 3 or 1)
        if resp.member_epoch < self.member_epoch:
            return _NO_CHANGES
        given = {(t, p) for t, p in resp.assignment}
        if resp.member_epoch > self.member_epoch:
            self.member_epoch = resp.member_epoch
            self._target = given
        else:
            self._target &= given   # an answer of our own epoch can only take away
        new = tuple(sorted(self._target - self._owned))
        self._owned.update(new)
        revoke = tuple(sorted(self._owned - self._target - self._revoke_told))
        self._revoke_told.update(revoke)
        return MemberChanges(assigned=new, revoke=revoke) if new or revoke else _NO_CHANGES

    def revoked(self, partitions: Iterable[TopicPartition]) -> None:
        """The client stopped consuming these (after committing): report it at once."""
        for tp in partitions:
            tp = (tp[0], tp[1])
            if tp in self._owned and tp not in self._target:
                self._owned.discard(tp)
                self._revoke_told.discard(tp)
        self._urgent = True

    def leave(self) -> tuple[GroupHeartbeat | None, MemberChanges]:
        """Leave the group for good: everything held is dropped (commit first if you want
        to); send the request if there is one (no need to wait for its answer)."""
        member_id = self.member_id
        changes = self._abandon(send_leave=False)
        self._closed = True
        return (self._leave_request(member_id) if member_id else None), changes

    def commit(self, offsets: Iterable[tuple[str, int, int, str]]) -> GroupCommit:
        """A commit request for partitions this member holds (``(topic, partition, offset,
        metadata)``); ILLEGAL_GENERATION in reply: heartbeat, then retry what is still held."""
        offsets = [[t, p, o, m] for t, p, o, m in offsets]
        if not self.member_id:
            raise MeshError(ErrorCode.UNKNOWN_MEMBER, "not a member of the group yet")
        for t, p, _, _ in offsets:
            if (t, p) not in self._owned:
                raise MeshError(ErrorCode.ILLEGAL_GENERATION, f"this member does not hold {t}/{p}")
        return GroupCommit(self.group_id, self.member_id, self.member_epoch, offsets)

    # -- internals ------------------------------------------------------------------------

    def _on_error(self, resp: GroupHeartbeatResponse, now_ms: int) -> MemberChanges:
        code = ErrorCode(resp.error)
        if code in (ErrorCode.UNKNOWN_MEMBER, ErrorCode.FENCED_EPOCH):
            # Final for this id however late it comes: ids are never reused. A fenced id may
            # still hold partitions at the coordinator: leaving frees them at once.
            return self._abandon(send_leave=code == ErrorCode.FENCED_EPOCH)
        if retriable(code):
            self._next_heartbeat_ms = now_ms + self.retry_backoff_ms
            return _NO_CHANGES
        raise MeshError(code, resp.message)

    def _abandon(self, send_leave: bool) -> MemberChanges:
        """Drop everything and start over under a new id."""
        lost = tuple(sorted(self._owned))
        send = ()
        if self.member_id:
            self._abandoned.append(self.member_id)
            if send_leave:
                send = (self._leave_request(self.member_id),)
        self.member_id, self.member_epoch = "", JOIN_EPOCH
        self._owned.clear()
        self._target.clear()
        self._revoke_told.clear()
        self._last_ok_sent_ms = None
        self._inflight_sent_ms = None
        self._next_heartbeat_ms = 0
        return MemberChanges(lost=lost, send=send)

    def _leave_request(self, member_id: str) -> GroupHeartbeat:
        return GroupHeartbeat(self.group_id, member_id, LEAVE_EPOCH, [], [], self.assignor,
                              self.session_timeout_ms, self.rebalance_timeout_ms)
