"""Links to other brokers: one DEALER per peer address, one-way messages.

Peers never answer on the connection a message came in on: every peer message is a
one-way send from the sender's DEALER to the receiver's ROUTER, and an answer is another
one-way send back. The DEALER's routing id is ``b"peer:" + own address + b"#" + a random
nonce`` (new for every link), so the receiving ROUTER knows the sender's address from the
identity frame (``sender_address``), and no other connection can claim that routing id
(a client, any user, that took ``peer:<address>`` while that broker was down would have
cut it off). A restarted broker's new links have new routing ids, so nothing waits for the
receiver to drop the old connection. A link's reconnection keeps its routing id; the
receiving ROUTER has ROUTER_HANDOVER, so the new connection takes over from an old one
the receiver has not dropped yet (a paused receiver: ``mesh.security.zap``).

Secured mode (``creds``: the cluster keypair): every link is a CURVE client of the peer's
ROUTER and authenticates as ``broker`` (``mesh.security.zap``); the receiver trusts a peer
message only for that, never for the routing id.

Reconnects back off from 100 ms to at most ``RECONNECT_MAX_MS`` (300 ms): a broker that
was down for seconds gets its peers' answers (gossip ACKs, appends) within 300 ms of
coming back, not after a backoff that grew while it was away; ``connect`` opens the links
to the peers a restarted broker already knows before its first gossip round (a first
message on a link still connecting is dropped: IMMEDIATE).

Sends never block: a message to a peer that is not connected (IMMEDIATE) or whose queue is
full is dropped and counted. Gossip and replication both retransmit, so a drop is a delay,
never a loss of anything acknowledged.
"""
from __future__ import annotations

import logging
import os

import zmq

from mesh.wire.codec import PROTOCOL_PEER, ZERO_COPY_MIN_BYTES, pack
from mesh.wire.frames import send_frames

__all__ = ["PeerLinks", "sender_address", "PEER_PREFIX"]

log = logging.getLogger("mesh.node.peers.peers")
PEER_PREFIX = b"peer:"
RECONNECT_MAX_MS = 300


def sender_address(identity: bytes) -> str | None:
    if identity.startswith(PEER_PREFIX):
        return identity[len(PEER_PREFIX):].split(b"#", 1)[0].decode(errors="replace")
    return None


class PeerLinks:
    def __init__(self, ctx: zmq.Context, own_address: str, hwm_messages: int = 10_000, creds=None,
                 heartbeat_ivl_ms: int = 1_000, heartbeat_timeout_ms: int = 3_000):
        """``creds``: a ``mesh.security.Creds`` (the cluster keypair) in secured mode.
        Heartbeats: a PING every ``heartbeat_ivl_ms``; a link silent ``heartbeat_timeout_ms``
        after one is dropped and reconnected, and the receiving ROUTER drops its end of it
        after the same time without a PING (the TTL the link announces)."""
        self.ctx = ctx
        self.heartbeat_ivl_ms = heartbeat_ivl_ms
        self.heartbeat_timeout_ms = heartbeat_timeout_ms
        self.creds = creds
        self.identity = PEER_PREFIX + own_address.encode()
        self.hwm = hwm_messages
        self._socks: dict[str, zmq.Socket] = {}
        self._used: set[str] = set()          # addresses sent to since the last prune
        self._idle: dict[str, int] = {}       # address -> prunes in a row it was neither kept nor used
        self.dropped = 0
        self.sent = 0
        self.bytes_sent = 0

    def _sock(self, addr: str) -> zmq.Socket:
        s = self._socks.get(addr)
        if s is None:
            s = self.ctx.socket(zmq.DEALER)
            s.setsockopt(zmq.ROUTING_ID, self.identity + b"#" + os.urandom(8).hex().encode())   # module doc
            s.setsockopt(zmq.LINGER, 0)
            s.setsockopt(zmq.SNDHWM, self.hwm)
            s.setsockopt(zmq.RCVHWM, 1)  # peers never answer on this socket
            s.setsockopt(zmq.IMMEDIATE, 1)
            s.setsockopt(zmq.RECONNECT_IVL, 100)
            s.setsockopt(zmq.RECONNECT_IVL_MAX, RECONNECT_MAX_MS)
            s.setsockopt(zmq.HEARTBEAT_IVL, self.heartbeat_ivl_ms)
            s.setsockopt(zmq.HEARTBEAT_TIMEOUT, self.heartbeat_timeout_ms)
            s.setsockopt(zmq.HEARTBEAT_TTL, min(self.heartbeat_timeout_ms, 6_553_500))
            if self.creds is not None:
                self.creds.apply(s)
            try:
                s.connect(f"tcp://{addr}")
            except zmq.ZMQError:           # an address from gossip that ZeroMQ refuses
                s.close(linger=0)
                raise
            self._socks[addr] = s
        return s

    def connect(self, addrs) -> None:
        """Open the links to ``addrs`` now (each is kept), so a first message need not wait."""
        for addr in addrs:
            if addr not in self._socks:
                try:
                    self._sock(addr)
                except zmq.ZMQError as exc:
                    log.debug("cannot link to %s: %s", addr, exc)

    def send(self, addr: str, msg, payload: bytes | None = None) -> bool:
        frames = pack(PROTOCOL_PEER, 0, msg, payload)
        sock = self._socks.get(addr)
        self._used.add(addr)
        try:
            send_frames(sock if sock is not None else self._sock(addr), frames,
                        copy=payload is None or len(payload) < ZERO_COPY_MIN_BYTES)
        except zmq.Again:
            self.dropped += 1
            return False
        except zmq.ZMQError as exc:
            log.debug("send to %s failed: %s", addr, exc)
            self.dropped += 1
            return False
        self.sent += 1
        self.bytes_sent += sum(map(len, frames))
        return True

    def prune(self, keep: set[str], idle_rounds: int = 60) -> int:
        """Once a second: close the links to addresses not in ``keep`` (members that are
        not DEAD or LEFT, seeds) that nothing was sent to for ``idle_rounds`` calls: every
        address a gossip row ever named kept a socket that reconnected forever. A dead
        member that gossip still probes keeps its link (a new link drops its first message:
        IMMEDIATE). Returns how many were closed."""
        used, self._used = self._used, set()
        gone = []
        for addr in self._socks:
            if addr in keep or addr in used:
                self._idle.pop(addr, None)
            elif self._idle.get(addr, 0) + 1 >= idle_rounds:
                gone.append(addr)
            else:
                self._idle[addr] = self._idle.get(addr, 0) + 1
        for addr in gone:
            self._socks.pop(addr).close(linger=0)
            self._idle.pop(addr, None)
        return len(gone)

    def flush_and_close(self, linger_ms: int = 300) -> None:
        for s in self._socks.values():
            s.close(linger=linger_ms)
        self._socks.clear()
