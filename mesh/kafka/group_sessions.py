"""Native member sessions kept on behalf of classic Kafka members, and the one thread that
owns the listener's mesh transport.

Theory of operation
-------------------
A ``Transport`` belongs to one thread, but Kafka handlers run on many worker threads and
block. So ``NativeLink`` runs one thread (the *pump*) that alone touches the transport:
handlers hand it requests (``call``: send to a group's coordinator or to any broker, wait
for the answer) and sessions, and wait on one condition variable; the pump sends, reads
answers, follows COORDINATOR_MOVED, retries what a dropped connection lost, and drives
every session's native heartbeats. All shared state is guarded by ``NativeLink.lock``.

A ``Session`` is one classic member: a ``mesh.groups.member.GroupMemberState`` (the mesh's
own member logic: fencing, ghost ids, epochs) heartbeated by the pump at the pace the
coordinator asks for, whatever the Kafka client's pace. Rules:

* ``held`` is what the Kafka client may be consuming: what the last SyncGroup gave it,
  cut at each JoinGroup to the owned partitions its subscription lists (an eager client
  lists none: it revoked everything before rejoining). A partition the coordinator
  revokes is reported released (``GroupMemberState.revoked``) only once it is not in
  ``held``; until then the coordinator hands it to nobody. So a partition is never
  consumed by two Kafka members through the mesh's assignment.
* The Kafka client's liveness is its own: no request for ``kafka_session_ms``
  (session.timeout.ms) ends the session (a native leave: its partitions are free at once),
  as a LeaveGroup does. The native session timeout is the listener's
  (``native_session_ms``, at most the brokers' maximum) and only matters if the listener
  itself stops.
* The native membership ending (UNKNOWN_MEMBER or FENCED_EPOCH: a coordinator failover, or
  a rebalance the client did not rejoin in time) ends the session: the client's next
  request gets UNKNOWN_MEMBER_ID and it rejoins under a new id, dropping its partitions.
* ``seq_sent`` / ``seq_acked`` number the heartbeats: a JoinGroup asks for one more
  (``force``) and waits until an answer to it (or a later one) came, so the generation
  and assignment it answers reflect the subscription and releases it carried.
"""
from __future__ import annotations

import collections
import logging
import re
import threading
import time
from dataclasses import dataclass
from typing import Any

from mesh.client.transport import Transport
from mesh.client.waker import waker
from mesh.groups import GroupFindCoordinator, GroupHeartbeatResponse, GroupMemberState, MemberChanges
from mesh.wire.errors import ErrorCode, MeshError, retriable
from mesh.wire.messages import ErrorResponse

__all__ = ["NativeLink", "Session", "member_state"]

log = logging.getLogger("mesh.kafka.groups")

_MOVED = (ErrorCode.COORDINATOR_MOVED, ErrorCode.COORDINATOR_NOT_AVAILABLE)
_TICK_MS = 50
_FIND_RETRY_MS = 100
_MAX_COORDINATORS = 10_000     # group -> coordinator address entries cached
_SESSION_BOUNDS = re.compile(r"session_timeout_ms must be in \[(\d+), (\d+)\]")


def _ms() -> int:
    return int(time.monotonic() * 1000)


def member_state(group_id: str, topics, assignor: str, session_ms: int, rebalance_ms: int,
                 request_timeout_ms: int) -> GroupMemberState:
    """The native member of one session (a heartbeat unanswered for a third of the session
    counts as failed, so a lost one is followed by another in time)."""
    return GroupMemberState(group_id, topics, assignor=assignor, session_timeout_ms=session_ms,
                            rebalance_timeout_ms=rebalance_ms,
                            request_timeout_ms=max(1, min(request_timeout_ms, session_ms // 3)))


@dataclass(eq=False)
class Session:
    """One classic member (see the module docstring). Fields change under ``NativeLink.lock``."""
    kafka_id: str
    group_id: str
    state: GroupMemberState
    kafka_session_ms: int
    last_seen_ms: int
    client_id: str = ""
    client_host: str = ""
    protocol: str = ""               # the Kafka protocol (assignor) name chosen
    sub_version: int = 0             # the embedded consumer protocol version it speaks
    generation: int = -1             # the generation the last JoinGroup answered
    held: frozenset = frozenset()    # what the client may be consuming
    synced: bool = False             # a SyncGroup answered since the last JoinGroup
    native_id: str = ""
    seq_sent: int = 0
    seq_acked: int = 0
    force: bool = False
    joining: int = 0                 # JoinGroups waiting now (the client is not idle meanwhile)
    dead: int | None = None          # the mesh error that ended it (NONE: left)


@dataclass(eq=False)
class _Call:
    msg: Any
    group: str | None
    deadline_ms: int
    attempts: int = 3
    done: bool = False
    resp: Any = None
    error: MeshError | None = None


@dataclass(eq=False)
class _Sent:
    kind: str                        # "call" | "beat" | "find"
    addr: str
    sent_ms: int
    call: _Call | None = None
    session: Session | None = None
    seq: int = 0
    group: str = ""
    late: bool = False


class NativeLink:
    """The pump (see the module docstring). ``bootstrap[0]`` should be the listener's own node."""

    def __init__(self, transport: Transport, bootstrap: list[str], *, request_timeout_ms: int = 5_000):
        if not bootstrap:
            raise ValueError("no bootstrap address")
        self.transport = transport
        self.bootstrap = list(bootstrap)
        self.request_timeout_ms = request_timeout_ms
        self.session_cap_ms: int | None = None    # the brokers' maximum session, once learned
        self.lock = threading.Lock()
        self.cond = threading.Condition(self.lock)
        self.sessions: dict[str, Session] = {}
        self._todo: collections.deque[_Call] = collections.deque()
        self._sent: dict[int, _Sent] = {}
        self._coord: dict[str, str] = {}
        self._node_addr: dict[str, str] = {}
        self._finding: dict[str, int] = {}        # group -> when a find may be sent again
        self._routing: dict[str, list[_Call]] = {}  # calls waiting for their group's coordinator
        self._boot_next = 0
        self._closed = False
        self._fd, self._wake, drain, self._close_fd = waker()
        transport.add_wakeup(self._fd, drain)
        self._thread = threading.Thread(target=self._run, name="kafka-groups", daemon=True)
        self._thread.start()

    # -- from handler threads -----------------------------------------------------------
    def call(self, msg, group: str | None, timeout_ms: int | None = None):
        """Send ``msg`` to ``group``'s coordinator (None: any broker) and wait for the
        typed answer (a COORDINATOR_MOVED answer after the retries is returned as is).
        Raises MeshError (TIMEOUT, BROKER_UNAVAILABLE, or an ErrorResponse's code)."""
        timeout_ms = self.request_timeout_ms if timeout_ms is None else timeout_ms
        call = _Call(msg, group, _ms() + timeout_ms)
        with self.cond:
            if self._closed:
                raise MeshError(ErrorCode.BROKER_UNAVAILABLE, "the listener is closing")
            self._todo.append(call)
            self._wake()
            self.cond.wait_for(lambda: call.done, timeout_ms / 1000 + 1)
        if not call.done:
            raise MeshError(ErrorCode.TIMEOUT, f"no answer within {timeout_ms} ms")
        if call.error is not None:
            raise call.error
        return call.resp

    def wake(self) -> None:
        self._wake()

    def end(self, session: Session, code: int = ErrorCode.NONE) -> None:
        """End a session (caller holds the lock): native leave, partitions free at once."""
        if session.dead is not None:
            return
        session.dead = int(code)
        if self.sessions.get(session.kafka_id) is session:
            del self.sessions[session.kafka_id]
        leave, _ = session.state.leave()
        if leave is not None:   # fire and forget: the pump routes it on its next turn
            self._todo.append(_Call(leave, session.group_id, _ms() + self.request_timeout_ms, attempts=1))
        self._wake()
        self.cond.notify_all()

    def close(self) -> None:
        with self.cond:
            for s in list(self.sessions.values()):
                self.end(s)
            self._closed = True
            self._wake()
        self._thread.join(5)
        self._close_fd()

    # -- the pump -------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            try:
                answers = self.transport.poll(_TICK_MS)
                gone = self.transport.take_disconnected()
            except Exception as exc:   # credentials refused, a socket error: log, go on
                log.error("kafka groups: the mesh transport failed: %s", exc)
                answers, gone = [], set()
                time.sleep(_TICK_MS / 1000)
            with self.cond:
                try:
                    self._turn(answers, gone, _ms())
                except Exception:   # one bad answer must not stop every group
                    log.exception("kafka groups: turn failed")
                self.cond.notify_all()
                if self._closed and not self._todo:
                    return

    def _turn(self, answers, gone: set[str], now: int) -> None:
        while self._todo:
            self._route(self._todo.popleft(), now)
        for addr, rid, msg, _ in answers:
            sent = self._sent.pop(rid, None)
            if sent is not None:
                self._on_answer(sent, msg, now)
        if gone:
            self._on_gone(gone, now)
        self._expire(now)
        for group in [g for g, calls in self._routing.items() if calls]:
            self._find(group, now)
        if not self._closed:
            for s in list(self.sessions.values()):
                self._drive(s, now)

    def _any(self) -> str:
        addrs = self.bootstrap
        for i in range(len(addrs)):
            addr = addrs[(self._boot_next + i) % len(addrs)]
            if not self.transport.is_down(addr):
                return addr
        return addrs[self._boot_next % len(addrs)]

    def _send(self, addr: str, msg, sent: _Sent) -> None:
        self._sent[self.transport.send(addr, msg)] = sent

    def _route(self, call: _Call, now: int) -> None:
        if call.done:
            return
        if call.group is None:
            addr = self._any()
        else:
            addr = self._coord.get(call.group)
            if addr is None:
                self._routing.setdefault(call.group, []).append(call)
                self._find(call.group, now)
                return
        self._send(addr, call.msg, _Sent("call", addr, now, call=call))

    def _find(self, group: str, now: int) -> None:
        if self._finding.get(group, 0) > now:
            return
        self._finding[group] = now + self.request_timeout_ms   # one find in flight per group
        addr = self._any()
        self._send(addr, GroupFindCoordinator(group), _Sent("find", addr, now, group=group))

    def _complete(self, call: _Call, resp=None, error: MeshError | None = None) -> None:
        call.done, call.resp, call.error = True, resp, error

    def _moved(self, group: str, addr: str, hint: str | None) -> None:
        if self._coord.get(group) == addr:
            del self._coord[group]
        if hint and hint in self._node_addr:
            self._set_coord(group, self._node_addr[hint])

    def _set_coord(self, group: str, addr: str) -> None:
        if len(self._coord) >= _MAX_COORDINATORS and group not in self._coord:
            self._coord.clear()
        self._coord[group] = addr

    def _on_answer(self, sent: _Sent, msg, now: int) -> None:
        if sent.kind == "find":
            self._finding.pop(sent.group, None)
            if getattr(msg, "error", None) == ErrorCode.NONE and getattr(msg, "address", ""):
                self._node_addr[msg.node_id] = msg.address
                self._set_coord(sent.group, msg.address)
                for call in self._routing.pop(sent.group, []):
                    self._route(call, now)
            else:
                self._finding[sent.group] = now + _FIND_RETRY_MS
                self._boot_next += 1
            return
        if sent.kind == "beat":
            self._on_beat(sent, msg, now)
            return
        call = sent.call
        if call.done:
            return
        if isinstance(msg, ErrorResponse):
            self._complete(call, error=MeshError(msg.error, msg.message))
        elif call.group is not None and getattr(msg, "error", 0) in _MOVED and call.attempts > 1:
            call.attempts -= 1
            self._moved(call.group, sent.addr, getattr(msg, "coordinator", None))
            self._route(call, now)
        else:
            self._complete(call, resp=msg)

    def _on_gone(self, gone: set[str], now: int) -> None:
        for rid, sent in list(self._sent.items()):
            if sent.addr not in gone:
                continue
            del self._sent[rid]
            if sent.kind == "find":
                self._finding.pop(sent.group, None)
                self._boot_next += 1
            elif sent.kind == "beat":
                sent.session.state.on_heartbeat_failed(sent.sent_ms, now)
                self._moved(sent.session.group_id, sent.addr, None)
            elif not sent.call.done:
                if sent.call.group is not None:
                    self._moved(sent.call.group, sent.addr, None)
                sent.call.attempts -= 1
                if sent.call.attempts > 0:
                    self._route(sent.call, now)
                else:
                    self._complete(sent.call, error=MeshError(ErrorCode.BROKER_UNAVAILABLE,
                                                              f"lost the connection to {sent.addr}"))

    def _expire(self, now: int) -> None:
        for rid, sent in list(self._sent.items()):
            age = now - sent.sent_ms
            if sent.kind == "beat":
                state = sent.session.state
                if age >= state.session_timeout_ms:
                    del self._sent[rid]
                elif age >= self.request_timeout_ms and not sent.late:
                    sent.late = True   # a late answer is still read (the state knows its age)
                    state.on_heartbeat_failed(sent.sent_ms, now)
                    self._moved(sent.session.group_id, sent.addr, None)
            elif age >= self.request_timeout_ms or (sent.call is not None and sent.call.done):
                del self._sent[rid]
                self.transport.abandon([rid])
                if sent.kind == "find":
                    self._finding.pop(sent.group, None)
                    self._boot_next += 1
        for group in [g for g, until in self._finding.items() if until <= now]:
            del self._finding[group]    # (failed finds wait a little; none is in flight)
        for group, calls in list(self._routing.items()):
            for call in calls:
                if now >= call.deadline_ms:
                    self._complete(call, error=MeshError(ErrorCode.COORDINATOR_NOT_AVAILABLE,
                                                         f"no coordinator found for group {group!r}"))
            self._routing[group] = [c for c in calls if not c.done]
            if not self._routing[group]:
                del self._routing[group]
        for sent in self._sent.values():
            call = sent.call
            if call is not None and not call.done and now >= call.deadline_ms:
                self._complete(call, error=MeshError(ErrorCode.TIMEOUT, "no answer from the mesh in time"))

    # -- sessions -----------------------------------------------------------------------
    def _drive(self, s: Session, now: int) -> None:
        if not s.joining and now - s.last_seen_ms > s.kafka_session_ms:
            log.info("group %s: member %s timed out (no request for %d ms)", s.group_id, s.kafka_id,
                     s.kafka_session_ms)
            self.end(s, ErrorCode.UNKNOWN_MEMBER)
            return
        self._apply(s, s.state.poll(now))
        if s.dead is not None or not (s.force or s.state.heartbeat_due(now)):
            return
        addr = self._coord.get(s.group_id)
        if addr is None:
            self._find(s.group_id, now)
            return
        s.force = False
        s.seq_sent += 1
        self._send(addr, s.state.heartbeat(now), _Sent("beat", addr, now, session=s, seq=s.seq_sent))

    def _on_beat(self, sent: _Sent, msg, now: int) -> None:
        s = sent.session
        if s.dead is not None:
            return
        if not isinstance(msg, GroupHeartbeatResponse):
            s.state.on_heartbeat_failed(sent.sent_ms, now)
            code = getattr(msg, "error", ErrorCode.UNKNOWN)
            if not retriable(code):
                self.end(s, code)
            return
        if msg.error in _MOVED:
            self._moved(s.group_id, sent.addr, msg.coordinator)
        if msg.error == ErrorCode.INVALID_CONFIG and not s.native_id and self._lower_session(s, msg.message):
            return
        try:
            changes = s.state.on_heartbeat_response(msg, sent.sent_ms, now)
        except MeshError as exc:   # INVALID_CONFIG, INVALID_REQUEST...: this member cannot go on
            log.warning("group %s: member %s refused: %s", s.group_id, s.kafka_id, exc)
            self.end(s, exc.code)
            return
        if msg.error == ErrorCode.NONE and msg.member_id == s.state.member_id:
            s.native_id = s.native_id or msg.member_id
            s.seq_acked = max(s.seq_acked, sent.seq)
        self._apply(s, changes)

    def _lower_session(self, s: Session, text: str) -> bool:
        """The brokers allow a shorter session than this native member asked for: join again
        within their bounds (and start every later session there)."""
        m = _SESSION_BOUNDS.search(text or "")
        if m is None or int(m.group(2)) >= s.state.session_timeout_ms or int(m.group(2)) < 1:
            return False
        self.session_cap_ms = int(m.group(2))
        old = s.state
        s.state = member_state(old.group_id, old.topics, old.assignor, self.session_cap_ms,
                               old.rebalance_timeout_ms, self.request_timeout_ms)
        s.force = True
        log.info("group %s: the brokers allow sessions of at most %d ms; rejoining with that",
                 s.group_id, self.session_cap_ms)
        return True

    def _apply(self, s: Session, changes: MemberChanges) -> None:
        addr = self._coord.get(s.group_id)
        for req in changes.send:   # leaves for ids the member state gave up
            if addr is not None:
                self.transport.send(addr, req)
        if changes.lost or (s.native_id and s.state.member_id != s.native_id):
            log.info("group %s: member %s lost its native membership", s.group_id, s.kafka_id)
            self.end(s, ErrorCode.UNKNOWN_MEMBER)
            return
        self.release(s)

    def release(self, s: Session) -> None:
        """Report released every revoked partition the Kafka client no longer holds."""
        free = [tp for tp in s.state.revoking if tp not in s.held]
        if free:
            s.state.revoked(sorted(free))
            self._wake()
