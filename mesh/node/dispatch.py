"""The node's front door: the ROUTER socket, and what happens to each message on it.

``open_router`` makes the node's one ROUTER socket (DESIGN section 2: ROUTER_MANDATORY,
bounded queues, no linger). ``Dispatcher.handle`` takes one multipart message off it: a
peer message (first frame ``PROTOCOL_PEER``) goes to its core (gossip answers are sent at
once; replication input is stepped, its effects staged by the replica host); a client
request goes to its handler (``mesh.node.handlers``, the data path, the group host).

Nothing a client or a peer sends can crash the loop: every message runs inside a guard.
A client request that fails becomes an error response (logged once per client and code);
a peer message gets no response (peers do not read them): a bad one is logged and dropped.
"""
from __future__ import annotations

import logging
from typing import Callable

import zmq

from mesh.gossip import GossipAck, GossipAck2, GossipSyn
from mesh.node.peers import sender_address
from mesh.node.raft_host import REPLICATION_MESSAGES
from mesh.wire import messages as m
from mesh.wire.codec import PROTOCOL_CLIENT, PROTOCOL_PEER, pack, unpack
from mesh.wire.errors import ErrorCode, MeshError

__all__ = ["Dispatcher", "open_router"]

log = logging.getLogger("mesh.node.dispatch")

_GOSSIP_MESSAGES = (GossipSyn, GossipAck, GossipAck2)


def open_router(ctx: zmq.Context, bind: str, hwm_messages: int) -> zmq.Socket:
    """The node's ROUTER, bound to ``bind`` (host:port)."""
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.ROUTER_MANDATORY, 1)
    router.setsockopt(zmq.ROUTER_HANDOVER, 1)
    router.setsockopt(zmq.SNDHWM, hwm_messages)
    router.setsockopt(zmq.RCVHWM, hwm_messages)
    router.setsockopt(zmq.LINGER, 0)
    router.bind(f"tcp://{bind}")
    return router


class Dispatcher:
    def __init__(self, router: zmq.Socket, handlers, groups, gossip, replicas, directory,
                 send: Callable, clock) -> None:
        """``send(effects)``: carry out gossip send effects (the loop's ``_send``)."""
        self.router = router
        self.handlers = handlers
        self.groups = groups
        self.gossip = gossip
        self.replicas = replicas
        self.directory = directory
        self._send = send
        self.clock = clock
        self._logged: set[tuple[bytes, int]] = set()

    def handle(self, frames: list) -> None:
        ident = frames[0]
        if len(frames) > 1 and frames[1] == PROTOCOL_PEER:
            self.handle_peer(ident, frames)
            return
        rid = 0
        try:
            if len(frames) >= 3 and len(frames[2]) == 8:
                rid = int.from_bytes(frames[2], "big")
            protocol, rid, msg, payload = unpack(frames[1:])
            handler = self.handlers.handler_for(msg)
            if handler is not None:
                handler(ident, rid, msg, payload)
            elif self.groups.handles(msg):
                self.groups.handle(ident, rid, msg)
            else:
                raise MeshError(ErrorCode.INVALID_REQUEST, f"{type(msg).__name__} is not a request")
        except MeshError as exc:
            self.error(ident, rid, exc.code, exc.message, exc.leader)
        except Exception as exc:  # a bug or an input we did not foresee: answer, keep serving
            log.exception("request from %r failed", ident)
            self.error(ident, rid, ErrorCode.INVALID_REQUEST, f"request could not be handled: {exc}")

    def handle_peer(self, ident: bytes, frames: list) -> None:
        src = sender_address(bytes(ident))
        try:
            if src is None:
                raise MeshError(ErrorCode.INVALID_REQUEST, "peer message without a peer identity")
            _, _, msg, payload = unpack(frames[1:])
            if isinstance(msg, _GOSSIP_MESSAGES):
                self._send(self.gossip.receive(src, msg, self.clock.wall_ms()))
            elif isinstance(msg, REPLICATION_MESSAGES):
                node = self.directory.node_at(src)
                if node is not None:  # not yet known through gossip: the sender will retry
                    self.replicas.step(node, msg, payload)
            else:
                raise MeshError(ErrorCode.INVALID_REQUEST, f"unexpected peer message {type(msg).__name__}")
        except Exception as exc:
            key = (bytes(ident), -1)
            if key not in self._logged and len(self._logged) < 10_000:
                self._logged.add(key)
                log.warning("bad peer message from %s: %s", src or bytes(ident).hex(), exc)

    def error(self, ident: bytes, rid: int, code: ErrorCode, message: str, leader: str | None = None) -> None:
        key = (bytes(ident), int(code))
        if key not in self._logged and len(self._logged) < 10_000:
            self._logged.add(key)
            log.warning("client %s: %s: %s", bytes(ident).hex(), code.name, message)
        self.reply(ident, rid, m.ErrorResponse(int(code), message, leader))

    def reply(self, ident: bytes, rid: int, msg, payload: bytes | None = None) -> None:
        frames = [ident] + pack(PROTOCOL_CLIENT, rid, msg, payload)
        try:
            self.router.send_multipart(frames, zmq.NOBLOCK, copy=payload is None or len(payload) < 65536)
        except zmq.ZMQError as exc:  # client gone (EHOSTUNREACH) or its pipe is full (EAGAIN)
            log.debug("dropping reply to %s: %s", bytes(ident).hex(), exc)
