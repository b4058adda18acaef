"""The node's front door: the ROUTER socket, and what happens to each message on it.

``open_router`` makes the node's one ROUTER socket (DESIGN section 2: ROUTER_MANDATORY,
bounded queues, no linger). ``Dispatcher.handle`` takes one multipart message off it: a
peer message (first frame ``PROTOCOL_PEER``) goes to its core (gossip answers are sent at
once; replication input is stepped, its effects staged by the replica host; offsets
replication goes to the group host, ``GroupHost.handle_peer``); a client
request goes to its handler (``mesh.node.requests.handlers``, the data path, the group host).

Nothing a client or a peer sends can crash the loop: every message runs inside a guard.
A client request that fails becomes an error response (logged once per client and code
per minute); a peer message gets no response (peers do not read them): a bad one is
logged (same limit) and dropped. An unexpected exception (not a ``MeshError``: a bug, or
an input nobody foresaw) may have left the turn's state half-updated: it calls
``on_doom(reason)`` (the node's ``DataPath.doom``: the turn is rolled back and nothing
from it persisted; ``gossip_suspect`` is set when it came out of the gossip core), unless
the request only reads (fetch, metadata, list offsets: nothing to roll back) and writes one traceback per exception site per minute
(``mesh.node.limits.ratelog``). Bodies are decoded with the node's bounds (``limits``,
``peer_limits``: ``mesh.wire.codec.DecodeLimits``); answers go out through the node's
``Outbox`` (backlogs, quotas, gone clients: ``mesh.node.replication.outbox``) when it has one.
"""
from __future__ import annotations

import functools
import logging
import time
from typing import Callable

import zmq

from mesh.gossip import GossipAck, GossipAck2, GossipPing, GossipPingAck, GossipSyn
from mesh.node.limits.answer_budget import TRACK_MIN_BYTES
from mesh.node.peers.peers import sender_address
from mesh.node.data.producer_state import owner_tag
from mesh.node.limits.ratelog import RateLimitedLog
from mesh.node.replication.raft_host import REPLICATION_MESSAGES
from mesh.security.creds import BROKER_PRINCIPAL
from mesh.wire import messages as m
from mesh.wire.codec import PROTOCOL_CLIENT, PROTOCOL_PEER, ZERO_COPY_MIN_BYTES, pack, unpack
from mesh.wire.errors import ErrorCode, MeshError
from mesh.wire.frames import recv_frames, send_frames

__all__ = ["Dispatcher", "open_router"]

log = logging.getLogger("mesh.node.requests.dispatch")
_ACKS_NONE = m.Acks.NONE   # bound once (an enum member's lookup: ~1 us)

_GOSSIP_MESSAGES = (GossipSyn, GossipAck, GossipAck2, GossipPing, GossipPingAck)
_THROTTLE_REFUSE_MS = 10_000   # a producer whose answers would wait longer has its batches refused
_READ_ONLY = frozenset({m.FetchRequest, m.MetadataRequest, m.ListOffsetsRequest})   # change no state


def _rid_of(frames: list) -> int:
    """The request id of a client message that could not be decoded (0 if there is none)."""
    return int.from_bytes(frames[2], "big") if len(frames) >= 3 and len(frames[2]) == 8 else 0


def open_router(ctx: zmq.Context, bind: str, hwm_messages: int, options: dict | None = None,
                configure: Callable[[zmq.Socket], None] | None = None) -> zmq.Socket:
    """The node's ROUTER, bound to ``bind`` (host:port). ``options``: more socket options
    set before binding (the node's bounds: MAXMSGSIZE, SNDHWM, heartbeats); ``configure``:
    called before binding (security: ZAP, CURVE, ``BrokerSecurity.configure_router``)."""
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.ROUTER_MANDATORY, 1)
    router.setsockopt(zmq.ROUTER_HANDOVER, 1)
    router.setsockopt(zmq.SNDHWM, hwm_messages)
    router.setsockopt(zmq.RCVHWM, hwm_messages)
    router.setsockopt(zmq.LINGER, 0)
    for opt, value in (options or {}).items():
        router.setsockopt(opt, value)
    if configure is not None:
        configure(router)
    router.bind(f"tcp://{bind}")
    return router


class Dispatcher:
    def __init__(self, router: zmq.Socket, handlers, groups, gossip, replicas, directory,
                 send: Callable, clock, security=None) -> None:
        """``send(effects)``: carry out gossip send effects (the loop's ``_send``);
        ``security``: the node's ``mesh.security.broker.BrokerSecurity``.

        Secured mode: ``recv`` also reads the ZAP User-Id of each message (the sender's
        public key); peer messages are accepted only from the cluster key (else dropped,
        counted in ``peer_messages_refused``, logged once per sender); a client request
        goes through ``authorizer.authorize(principal, msg)`` before its handler. Open mode:
        ``recv`` is ``mesh.wire.frames.recv_frames`` (the socket's ``recv_multipart``
        without pyzmq's per-frame overhead), nothing is checked."""
        self.router = router
        self.handlers = handlers
        self.groups = groups
        self.gossip = gossip
        self.replicas = replicas
        self.directory = directory
        self._send = send
        self.peer_clock = None   # mesh.node.peers.peer_clock.PeerClock (the node sets it)
        self.clock = clock
        self._rlog = RateLimitedLog(log)
        self.limits = None        # DecodeLimits for client bodies, set by the node
        self.peer_limits = None   # and for peer bodies
        self.outbox = None        # mesh.node.replication.outbox.Outbox, set by the node
        self.on_doom: Callable[[str], None] = lambda reason: None   # roll the turn back
        self.gossip_suspect = False
        self._due: dict[tuple[bytes, int], int] = {}   # produce answers held by the quota
        self.security = security if security is not None and security.secured else None
        self.user_id = ""                 # the ZAP User-Id of the message being handled
        self.peer_messages_refused = 0
        self._senders: dict[bytes, str] = {}   # peer routing id -> its address (sender_address)
        self.metrics = None   # mesh.node.ops.metrics.NodeMetrics (--metrics-port): request counts, latency, bytes
        self._principals: dict[bytes, str] = {}   # secured: client routing id -> its principal
        self.principal_of = self._principals.get   # (the outbox's per-principal answer budget)
        self.writer_tag = 0   # producer_state.owner_tag of the request being handled (0: open mode)
        self.request_quota = None   # mesh.node.limits.request_quota.RequestTimeQuota (request_percentage), set by the node
        self._code_log = RateLimitedLog(log, window_ms=1_000)   # and at most one line per error code a second
        self.recv = functools.partial(recv_frames, router) if self.security is None else self._recv_secured

    def _recv_secured(self, flags: int = 0) -> list:
        """``recv_multipart``, keeping the first frame's ZAP User-Id in ``user_id``."""
        router = self.router
        first = router.recv(flags, copy=False)
        try:
            self.user_id = first.get("User-Id")
        except zmq.ZMQError:
            self.user_id = ""
        frames = [first.bytes]
        while router.getsockopt(zmq.RCVMORE):
            frames.append(router.recv(flags))
        return frames

    def _refuse_peer(self, ident: bytes) -> None:
        self.peer_messages_refused += 1
        principal = self.security.principal_of(self.user_id) if self.user_id else None
        self._rlog.warning((bytes(ident), "not-a-broker"), "peer message refused from %r: not authenticated as a "
                           "broker (key %s, principal %s)", bytes(ident)[:64], self.user_id or "-", principal or "-")

    def _principal(self, frames: list) -> str:
        """The sender's principal, checked before its body is decoded: a user of the registry
        now, and allowed the request's operation where that does not depend on the body
        (``Authorizer.preauthorize``: cluster operations, unknown requests)."""
        principal = self.security.principal_of(self.user_id)
        if principal is None:
            raise MeshError(ErrorCode.UNAUTHORIZED, "these credentials are not (any more) those of a user")
        if principal != BROKER_PRINCIPAL and len(frames) > 3:
            self.security.authorizer.preauthorize(principal, frames[3])
        return principal

    def _authorize(self, msg, principal: str):
        if principal == BROKER_PRINCIPAL:
            return msg   # the cluster keypair: only brokers (and whoever holds cluster.key) have it
        return self.security.authorizer.authorize(principal, msg)

    def handle(self, frames: list) -> None:
        ident = frames[0]
        if len(frames) > 1 and frames[1] == PROTOCOL_PEER:
            if self.security is not None and self.user_id != self.security.cluster_key:
                self._refuse_peer(ident)
                return
            self.handle_peer(ident, frames)
            return
        rid, msg, principal, started = 0, None, None, 0.0
        quota = self.request_quota
        try:
            if self.security is not None:
                principal = self._principal(frames)
                self.writer_tag = owner_tag(principal) if principal != BROKER_PRINCIPAL else 0
                if principal != BROKER_PRINCIPAL and self._principals.get(ident) != principal:
                    if len(self._principals) >= 100_000:
                        self._principals.clear()
                    self._principals[bytes(ident)] = principal
            if quota is not None and principal != BROKER_PRINCIPAL:
                debt = quota.debt_ms(principal or bytes(ident), self.clock.now_ms())
                if debt:   # refused before its body is decoded: a refusal costs next to nothing
                    quota.refused += 1
                    raise MeshError(ErrorCode.THROTTLED, f"not done: over the request time quota "
                                                         f"(request_percentage); send again in {debt} ms")
                started = time.perf_counter()
            protocol, rid, msg, payload = unpack(frames[1:], self.limits)
            if self.metrics is not None:
                self.metrics.request(ident, rid, msg, frames)
            if self.security is not None:
                msg = self._authorize(msg, principal)
            if payload is not None and type(msg) is m.ProduceRequest and self.outbox is not None \
                    and self.outbox.quotas["produce"] is not None:
                self._charge_produce(ident, rid, msg, payload)
            if type(msg) is m.FetchRequest and self.outbox is not None and self.outbox.budget is not None:
                why = self.outbox.refusal(ident, TRACK_MIN_BYTES)   # before reading records it would drop
                if why is not None:
                    raise MeshError(ErrorCode.THROTTLED, why)
            handler = self.handlers.handler_for(msg)
            if handler is not None:
                handler(ident, rid, msg, payload)
            elif self.groups.handles(msg):
                self.groups.handle(ident, rid, msg)
            else:
                raise MeshError(ErrorCode.INVALID_REQUEST, f"{type(msg).__name__} is not a request")
        except MeshError as exc:
            self.error(ident, rid or _rid_of(frames), exc.code, exc.message, exc.leader)
        except Exception as exc:  # a bug or an input we did not foresee: answer, keep serving
            if type(msg) not in _READ_ONLY:   # a read changed nothing: no need to fail the others' turn
                self.on_doom(f"{type(exc).__name__} while handling a client request")
            self._rlog.exception((bytes(ident), "bug"), exc, "request from client %s failed", bytes(ident).hex())
            self.error(ident, rid or _rid_of(frames), ErrorCode.INVALID_REQUEST,
                       f"request could not be handled: {exc}")
        self.writer_tag = 0   # only for this request (another listener's produce passes its own)
        if started:
            quota.charge(principal or bytes(ident), (time.perf_counter() - started) * 1000.0, self.clock.now_ms())
        if self.metrics is not None:
            self.metrics.handled()

    def _charge_produce(self, ident: bytes, rid: int, msg, payload) -> None:
        debt = self.outbox.debt_ms("produce", ident)
        if debt and (msg.acks == _ACKS_NONE or debt > _THROTTLE_REFUSE_MS):
            # no answer to hold back (acks=0), or the client does not wait for its held
            # answers: delaying them would not slow its writes down, so refuse the batch
            # (judged by the debt before it: a batch larger than the burst still goes in
            # once the client is back under its rate)
            raise MeshError(ErrorCode.THROTTLED, f"not written: over the produce quota "
                                                 f"({self.outbox.quotas['produce'].rate_per_ms * 1000:.0f} "
                                                 f"bytes/s); send again in {debt} ms")
        delay = self.outbox.charge("produce", ident, len(payload))
        if delay and msg.acks != _ACKS_NONE:
            if len(self._due) >= 100_000:
                self._due.clear()   # answers that never came (the client left): forget them
            self._due[(bytes(ident), rid)] = self.clock.now_ms() + delay

    def handle_peer(self, ident: bytes, frames: list) -> None:
        src = self._senders.get(ident)
        if src is None:   # the address in a peer's routing id, decoded once per peer
            src = sender_address(bytes(ident))
            if src is not None:
                if len(self._senders) >= 1024:
                    self._senders.clear()
                self._senders[bytes(ident)] = src
        msg = None
        try:
            if src is None:
                raise MeshError(ErrorCode.INVALID_REQUEST, "peer message without a peer identity")
            _, _, msg, payload = unpack(frames[1:], peer_limits=self.peer_limits)
            if isinstance(msg, REPLICATION_MESSAGES):   # the most frequent first
                node = self.directory.node_at(src)
                if node is not None:  # not yet known through gossip: the sender will retry
                    self.replicas.step(node, msg, payload)
            elif isinstance(msg, _GOSSIP_MESSAGES):
                if self.metrics is not None:
                    self.metrics.gossip_received_bytes += sum(map(len, frames))
                pc = self.peer_clock
                if pc is not None:   # its stamp first: judged by the peers' time if ours is off
                    pc.observe(src, msg)
                    self.gossip.set_clock_offset(pc.correction_ms())
                self._send(self.gossip.receive(src, msg, self.clock.wall_ms()))
                refused = self.gossip.take_refused()   # dropped whole and counted by the core
                if refused is not None:
                    raise MeshError(ErrorCode.INVALID_REQUEST, refused)
            elif self.groups.handles_peer(msg):   # offsets replication (mesh.groups.replication)
                node = self.directory.node_at(src)
                if node is None:   # not yet known through gossip: the coordinator times out or retries
                    raise MeshError(ErrorCode.INVALID_REQUEST, "offsets replication from a broker gossip "
                                                               "does not know yet")
                self.groups.handle_peer(node, msg)
            else:
                raise MeshError(ErrorCode.INVALID_REQUEST, f"unexpected peer message {type(msg).__name__}")
        except MeshError as exc:
            self._rlog.warning((bytes(ident), int(exc.code)), "bad peer message from %s: %s",
                               src or bytes(ident).hex(), exc)
        except Exception as exc:   # the core may be half-updated: the loop rolls the turn back
            self.on_doom(f"{type(exc).__name__} while handling a peer message")
            if isinstance(msg, _GOSSIP_MESSAGES):
                self.gossip_suspect = True
            self._rlog.exception((bytes(ident), "bug"), exc, "peer message %s from %s could not be handled",
                                 type(msg).__name__, src or bytes(ident).hex())

    def error(self, ident: bytes, rid: int, code: ErrorCode, message: str, leader: str | None = None) -> None:
        # once per client and code a minute, and at most once per code a second: clients
        # that cycle connections (a new identity each) must not write a line per request
        if self._rlog.once((bytes(ident), int(code))) and self._code_log.once(int(code)):
            log.warning("client %s: %s: %s", bytes(ident).hex(), code.name, message)
        self.reply(ident, rid, m.ErrorResponse(int(code), message, leader))

    def reply(self, ident: bytes, rid: int, msg, payload: bytes | None = None) -> None:
        if payload is not None and type(msg) is m.FetchResponse and self.outbox is not None \
                and self.outbox.budget is not None:
            why = self.outbox.refusal(ident, len(payload))   # the client's (or everyone's) earlier answers are unread
            if why is not None:
                self._rlog.warning(("unread", bytes(ident)), "client %s: %s", bytes(ident).hex(), why)
                msg, payload = m.ErrorResponse(int(ErrorCode.THROTTLED), why), None
        frames = [ident, *pack(PROTOCOL_CLIENT, rid, msg, payload)]
        if self.metrics is not None:
            self.metrics.answered(ident, rid, msg, frames)
        outbox = self.outbox
        if outbox is not None:
            delay = 0
            if self._due:
                due = self._due.pop((bytes(ident), rid), None)
                if due is not None:
                    delay = max(0, due - self.clock.now_ms())
            if payload is not None and type(msg) is m.FetchResponse:
                delay = max(delay, outbox.charge("fetch", ident, len(payload)))
            if delay or outbox.busy:
                outbox.send(ident, frames, delay)
            else:   # the common case: nothing held or backlogged, no quota delay
                outbox.send_now(ident, frames)
            return
        try:
            send_frames(self.router, frames, copy=payload is None or len(payload) < ZERO_COPY_MIN_BYTES)
        except zmq.ZMQError as exc:  # client gone (EHOSTUNREACH) or its pipe is full (EAGAIN)
            log.debug("dropping reply to %s: %s", bytes(ident).hex(), exc)
