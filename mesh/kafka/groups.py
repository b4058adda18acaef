"""Consumer groups for classic Kafka clients, on the mesh's server-side assignor.

Theory of operation
-------------------
Kafka 4 serves classic clients inside a server-assigned (KIP-848) group
(``GroupMetadataManager.classicGroupJoinToConsumerGroup`` and its siblings); this module does
the same on the mesh's groups (``mesh.groups``). Each classic member is one native member
session kept by the listener (``mesh.kafka.group_sessions``: its rules are stated there):

* FindCoordinator names the Kafka broker of the group's mesh coordinator (the native
  GROUP_FIND_COORDINATOR), or this listener if that broker has no Kafka address. So a
  group's sessions live beside its coordinator (their native heartbeats stay on one host),
  and when that broker dies its sessions die with it, as Kafka clients expect of a
  coordinator: they find the new one and rejoin.
* JoinGroup (v4+: first MEMBER_ID_REQUIRED with a member id) decodes the subscription
  (``mesh.kafka.group_codec``) of the client's first protocol that names a mesh assignor
  (range, roundrobin, cooperative-sticky; sticky is served by cooperative-sticky, kafkajs's
  RoundRobinAssigner by round-robin; any other name by the group's default assignor),
  joins or updates the native member (a member id this listener does not know is taken as
  a new member, as Kafka 4 does: a client that asked another listener for the coordinator
  comes back under its old id), releases what the client no longer owns, waits for
  the coordinator's answer, and answers with generation = member epoch, that protocol,
  and **no leader and no member list**: every client is a follower.
* SyncGroup returns the member's assignment as ConsumerProtocolAssignment bytes (of the
  version the client's subscription used). Heartbeat answers REBALANCE_IN_PROGRESS while
  the coordinator's assignment differs from what the client was given (a revocation is
  pending, or partitions were granted), UNKNOWN_MEMBER_ID / ILLEGAL_GENERATION as Kafka.
  LeaveGroup leaves natively; no request for session.timeout.ms does the same.
* OffsetCommit is a native GROUP_COMMIT under the member's native epoch (the Kafka
  generation is checked here), or a simple commit (generation -1) as Kafka allows for
  assign()-mode consumers; OffsetFetch is GROUP_FETCH_OFFSETS; metadata strings
  round-trip. One namespace: what Kafka clients commit is what ``mesh group describe``
  shows, and the reverse. ListGroups / DescribeGroups come from GROUP_LIST /
  GROUP_DESCRIBE.
* Every request is authorized first (READ on the group for members and offsets, DESCRIBE
  for finding, listing and describing; READ on topics to commit, DESCRIBE to fetch).
  Everything is bounded: sessions per listener, member id and
  metadata sizes, protocols per join, partitions per request.

``ClassicGroups(transport, bootstrap)`` takes over ``transport`` (its own thread drives
it); ``handlers()`` and ``versions()`` go into the listener's tables; ``close()`` leaves
every group and closes the transport.
"""
from __future__ import annotations

import logging
import re
import uuid
from typing import Callable

from kio.schema.errors import ErrorCode as K

from mesh.client.transport import Transport
from mesh.groups import GroupFindCoordinator
from mesh.kafka.context import RequestContext
from mesh.kafka.group_codec import (
    ASSIGNOR_OF, ProtocolError, build, choose_protocol, decode_subscription, encode_assignment,
    kafka_error, sibling,
)
from mesh.kafka.group_offsets import OffsetHandlers
from mesh.kafka.group_sessions import NativeLink, Session, _ms, member_state
from mesh.wire.errors import ErrorCode as M

__all__ = ["ClassicGroups", "API_VERSIONS"]

log = logging.getLogger("mesh.kafka.groups")

FIND_COORDINATOR, JOIN_GROUP, HEARTBEAT, LEAVE_GROUP, SYNC_GROUP = 10, 11, 12, 13, 14
DESCRIBE_GROUPS, LIST_GROUPS, OFFSET_COMMIT, OFFSET_FETCH = 15, 16, 8, 9
API_VERSIONS = {
    FIND_COORDINATOR: (0, 4), JOIN_GROUP: (0, 7), SYNC_GROUP: (0, 5), HEARTBEAT: (0, 4),
    LEAVE_GROUP: (0, 4), OFFSET_COMMIT: (2, 8), OFFSET_FETCH: (1, 8), LIST_GROUPS: (0, 4),
    DESCRIBE_GROUPS: (0, 5),
}

MAX_GROUP_ID_CHARS = 255
MAX_MEMBER_ID_CHARS = 255
MAX_PROTOCOLS = 32
MIN_SESSION_MS, MAX_SESSION_MS = 1_000, 1_800_000        # Kafka's group.max.session.timeout.ms
MAX_REBALANCE_MS = 300_000                               # the mesh's max_rebalance_timeout_ms
_SAFE = re.compile(r"[^A-Za-z0-9._-]")


def _millis(delta) -> int:
    return int(delta.total_seconds() * 1000)


class ClassicGroups(OffsetHandlers):
    """The classic group APIs of one Kafka listener (see the module docstring).

    ``native_session_ms``: the native members' session timeout (at most the brokers'
    ``group_max_session_timeout_ms``); ``max_sessions``: classic members on this listener;
    ``join_wait_ms``: how long a JoinGroup waits for the coordinator's answer."""

    def __init__(self, transport: Transport | None, bootstrap: str | list[str], *,
                 native_session_ms: int = 10_000, max_sessions: int = 10_000,
                 join_wait_ms: int = 10_000, request_timeout_ms: int = 5_000):
        boots = bootstrap if isinstance(bootstrap, list) else [b.strip() for b in bootstrap.split(",")]
        self.transport = transport if transport is not None else Transport()
        self.link = NativeLink(self.transport, [b for b in boots if b], request_timeout_ms=request_timeout_ms)
        self.native_session_ms = native_session_ms
        self.max_sessions = max_sessions
        self.join_wait_ms = join_wait_ms

    # -- the listener's tables ----------------------------------------------------------
    def handlers(self) -> dict[int, Callable[[RequestContext, object], object]]:
        return {
            FIND_COORDINATOR: self.find_coordinator, JOIN_GROUP: self.join_group,
            SYNC_GROUP: self.sync_group, HEARTBEAT: self.heartbeat, LEAVE_GROUP: self.leave_group,
            OFFSET_COMMIT: self.offset_commit, OFFSET_FETCH: self.offset_fetch,
            LIST_GROUPS: self.list_groups, DESCRIBE_GROUPS: self.describe_groups,
        }

    def versions(self) -> dict[int, tuple[int, int]]:
        return dict(API_VERSIONS)

    def close(self) -> None:
        self.link.close()
        self.transport.close(linger_ms=500)   # the leaves go out first

    # -- checks ---------------------------------------------------------------------------
    @staticmethod
    def _group_error(ctx: RequestContext, group_id, operation: str = "READ") -> K | None:
        if not isinstance(group_id, str) or not 0 < len(group_id) <= MAX_GROUP_ID_CHARS:
            return K.invalid_group_id
        if not ctx.authorizer.allowed(ctx.principal, operation, "GROUP", group_id):
            return K.group_authorization_failed
        return None

    def _session(self, group_id: str, member_id) -> Session | None:
        """The live session of ``member_id`` in ``group_id`` (caller holds the lock)."""
        s = self.link.sessions.get(member_id) if isinstance(member_id, str) else None
        if s is None or s.group_id != group_id or s.dead is not None:
            return None
        s.last_seen_ms = _ms()
        return s

    # -- FindCoordinator ------------------------------------------------------------------
    def find_coordinator(self, ctx: RequestContext, req):
        v = ctx.api_version
        Response = sibling(req, "FindCoordinatorResponse")
        if v >= 4:
            Coordinator = sibling(req, "Coordinator")
            keys = list(req.coordinator_keys)[:1_000]
            return build(Response, coordinators=tuple(
                build(Coordinator, key=key, **self._locate(ctx, req.key_type, key)) for key in keys))
        return build(Response, **self._locate(ctx, getattr(req, "key_type", 0), req.key))

    def _locate(self, ctx: RequestContext, key_type: int, key) -> dict:
        def fail(code: K, text: str) -> dict:
            return {"error_code": code, "error_message": text, "node_id": -1, "host": "", "port": -1}
        if key_type != 0:
            return fail(K.invalid_request, "only group coordinators (key type 0): no transactions here")
        error = self._group_error(ctx, key, "DESCRIBE")
        if error is not None:
            return fail(error, error.name)
        try:
            resp = self.link.call(GroupFindCoordinator(key), group=None)
        except Exception as exc:   # MeshError: timeout, broker unavailable
            return fail(K.coordinator_not_available, str(exc))
        if resp.error:
            return fail(kafka_error(resp.error), resp.message)
        broker = ctx.cluster.kafka_broker_of(resp.node_id)
        refresh = getattr(ctx.cluster, "refresh", None)   # (not in the ClusterInfo contract yet)
        if broker is None and callable(refresh):
            refresh()   # a listener that has served no Metadata request yet knows only itself
            broker = ctx.cluster.kafka_broker_of(resp.node_id)
        if broker is None:
            if len(ctx.cluster.kafka_brokers()) <= 1 and resp.node_id != ctx.cluster.self_broker().mesh_id:
                # this listener has not learned the others' Kafka addresses yet: naming itself
                # would split the group's members over two listeners
                return fail(K.coordinator_not_available, "the cluster's Kafka addresses are not known here yet")
            broker = ctx.cluster.self_broker()   # the coordinator's node has no Kafka listener
        return {"error_code": K.none, "error_message": None, "node_id": broker.node_id,
                "host": broker.host, "port": broker.port}

    # -- JoinGroup ------------------------------------------------------------------------
    def join_group(self, ctx: RequestContext, req):
        Response = sibling(req, "JoinGroupResponse")

        def fail(code: K, member_id: str = ""):
            return build(Response, error_code=code, generation_id=-1, member_id=member_id,
                         protocol_name="" if ctx.api_version < 7 else None)
        error = self._group_error(ctx, req.group_id)
        if error is not None:
            return fail(error)
        if req.protocol_type != "consumer" or not 0 < len(req.protocols) <= MAX_PROTOCOLS:
            return fail(K.inconsistent_group_protocol)
        chosen = choose_protocol(req.protocols)
        if chosen is None:
            return fail(K.inconsistent_group_protocol)
        try:
            sub = decode_subscription(chosen[1])
        except ProtocolError as exc:
            log.info("group %s: bad subscription from %s: %s", req.group_id, ctx.peer_host, exc)
            return fail(K.inconsistent_group_protocol)
        session_ms = _millis(req.session_timeout)
        if not MIN_SESSION_MS <= session_ms <= MAX_SESSION_MS:
            return fail(K.invalid_session_timeout)
        rebalance_ms = _millis(req.rebalance_timeout) if ctx.api_version >= 1 else session_ms
        rebalance_ms = min(rebalance_ms if rebalance_ms > 0 else session_ms, MAX_REBALANCE_MS)
        member_id = req.member_id
        if not isinstance(member_id, str) or len(member_id) > MAX_MEMBER_ID_CHARS:
            return fail(K.unknown_member_id)
        with self.link.cond:
            now = _ms()
            if member_id == "":
                member_id = self._new_member_id(ctx.client_id)
                if ctx.api_version >= 4:   # it comes back with the id (nothing kept meanwhile)
                    return fail(K.member_id_required, member_id)
            s = self.link.sessions.get(member_id)
            if s is not None and (s.group_id != req.group_id or s.dead is not None):
                return fail(K.unknown_member_id)
            if s is None:   # (an id this listener does not know: created, as Kafka 4 does)
                if len(self.link.sessions) >= self.max_sessions:
                    return fail(K.group_max_size_reached)
                s = self._new_session(ctx, req.group_id, member_id, sub, chosen[0], session_ms, rebalance_ms, now)
            else:
                self._update_session(s, sub, chosen[0], session_ms, rebalance_ms)
            s.last_seen_ms = now
            s.protocol, s.sub_version = chosen[0], sub.version
            s.held = s.held & sub.owned      # an eager client owns nothing when it rejoins
            s.synced = False
            self.link.release(s)
            s.force = True
            want = s.seq_sent + 1
            self.link.wake()
            s.joining += 1
            try:
                answered = self.link.cond.wait_for(lambda: s.dead is not None or s.seq_acked >= want,
                                                   min(rebalance_ms, self.join_wait_ms) / 1000)
            finally:
                s.joining -= 1
            if s.dead is not None:
                return fail(K.unknown_member_id if s.dead in (M.NONE, M.UNKNOWN_MEMBER) else kafka_error(s.dead))
            if not answered:
                return fail(K.coordinator_not_available, member_id)
            s.generation = s.state.member_epoch
            s.last_seen_ms = _ms()
            return build(Response, error_code=K.none, generation_id=s.generation, protocol_type="consumer",
                         protocol_name=chosen[0], leader="", member_id=member_id, members=())

    def _new_member_id(self, client_id: str | None) -> str:
        prefix = _SAFE.sub("", client_id or "")[:64] or "consumer"
        return f"{prefix}-{uuid.uuid4()}"

    def _new_session(self, ctx, group_id, member_id, sub, protocol, session_ms, rebalance_ms, now) -> Session:
        native_ms = min(session_ms, self.native_session_ms, self.link.session_cap_ms or session_ms)
        state = member_state(group_id, sub.topics, ASSIGNOR_OF.get(protocol, ""), native_ms, rebalance_ms,
                             self.link.request_timeout_ms)
        s = Session(member_id, group_id, state, session_ms, now, client_id=(ctx.client_id or "")[:255],
                    client_host=ctx.peer_host)
        self.link.sessions[member_id] = s
        log.info("group %s: classic member %s joins (%s, %d topics)", group_id, member_id, protocol,
                 len(sub.topics))
        return s

    @staticmethod
    def _update_session(s: Session, sub, protocol, session_ms, rebalance_ms) -> None:
        s.kafka_session_ms = session_ms
        s.state.rebalance_timeout_ms = rebalance_ms
        assignor = ASSIGNOR_OF.get(protocol, "")
        if list(sub.topics) != s.state.topics or assignor != s.state.assignor:
            s.state.assignor = assignor
            s.state.subscribe(sub.topics)

    # -- SyncGroup, Heartbeat, LeaveGroup -------------------------------------------------
    def sync_group(self, ctx: RequestContext, req):
        Response = sibling(req, "SyncGroupResponse")
        extra = {"protocol_type": "consumer"} if ctx.api_version >= 5 else {}

        def answer(code: K, assignment: bytes = b"", name=None):
            return build(Response, error_code=code, assignment=assignment, protocol_name=name, **extra)
        error = self._group_error(ctx, req.group_id)
        if error is not None:
            return answer(error)
        with self.link.cond:
            s = self._session(req.group_id, req.member_id)
            if s is None:
                return answer(K.unknown_member_id)
            if req.generation_id != s.generation:
                return answer(K.illegal_generation)
            if ctx.api_version >= 5 and req.protocol_name not in (None, s.protocol):
                return answer(K.inconsistent_group_protocol)
            given = frozenset(s.state.assignment)
            s.held = s.held | given    # what it had stays held until its next JoinGroup says otherwise
            s.synced = True
            return answer(K.none, encode_assignment(given, s.sub_version), s.protocol)

    def heartbeat(self, ctx: RequestContext, req):
        Response = sibling(req, "HeartbeatResponse")
        error = self._group_error(ctx, req.group_id)
        if error is not None:
            return build(Response, error_code=error)
        with self.link.cond:
            s = self._session(req.group_id, req.member_id)
            if s is None:
                code = K.unknown_member_id
            elif req.generation_id != s.generation:
                code = K.illegal_generation
            elif s.synced and frozenset(s.state.assignment) != s.held:
                code = K.rebalance_in_progress
            else:
                code = K.none
        return build(Response, error_code=code)

    def leave_group(self, ctx: RequestContext, req):
        Response = sibling(req, "LeaveGroupResponse")
        error = self._group_error(ctx, req.group_id)
        if ctx.api_version < 3:
            if error is not None:
                return build(Response, error_code=error)
            return build(Response, error_code=self._leave(req.group_id, req.member_id))
        if error is not None:
            return build(Response, error_code=error, members=())
        Member = sibling(req, "MemberResponse")
        members = tuple(build(Member, member_id=m.member_id, group_instance_id=m.group_instance_id,
                              error_code=self._leave(req.group_id, m.member_id))
                        for m in list(req.members)[:MAX_PROTOCOLS * 32])
        return build(Response, error_code=K.none, members=members)

    def _leave(self, group_id: str, member_id) -> K:
        with self.link.cond:
            s = self._session(group_id, member_id)
            if s is None:
                return K.unknown_member_id
            log.info("group %s: classic member %s leaves", group_id, member_id)
            self.link.end(s)
            return K.none

