"""The node's ZAP handler (ZeroMQ RFC 27): who may open a connection to the broker's ROUTER.

Theory of operation
-------------------
libzmq asks the ZAP handler about every new connection of a socket that has a ZAP domain,
before the connection carries a single message: a REP socket bound to
``inproc://zeromq.zap.01`` in the socket's context receives ``[version, request id, domain,
address, identity, mechanism, credentials...]`` and answers ``[version, request id, status,
text, user id, metadata]``. The node polls that REP socket in its own loop, next to the
ROUTER (no thread, no lock); libzmq holds the handshake until the answer comes.

``decide`` (pure) makes the decision:

- the connection cap first: beyond ``max_connections`` open connections a handshake is
  refused with 300 (temporary: the client's ZeroMQ retries it later, as a connection Kafka's
  ``max.connections`` holds back), except a broker's (the cluster key): raw connections
  that never authenticate count as well (a handshake must finish within
  ``HANDSHAKE_IVL_MS``), and they must not keep a broker out of its cluster;
- secured (CURVE) mode: the client key is the cluster's public key (a broker), or a key the
  registry knows (a superuser from the secrets directory, or a user added by an admin):
  200, and the ZAP User-Id is that key, in Z85. Anything else: 400. The dispatcher reads
  the User-Id of every message and maps it to a principal again (so a user removed or
  re-keyed loses access at once, on open connections too);
- open mode: the NULL mechanism, 200 with an empty User-Id (a ZAP domain is set on the
  ROUTER only so that the cap applies).

The ZAP request's identity frame is the *server* socket's own routing id, not the one the
client chose (checked against libzmq 4.3.5): ZAP cannot refuse a client that claims a
``peer:`` routing id. So a broker's links carry a new random routing id each
(``mesh.node.peers``: ``peer:<address>#`` and 64 random bits, known only to that broker and
the ROUTERs it links to): nobody can claim one, ahead of the link or after it; and the
dispatcher accepts peer messages only from the cluster key. The ROUTER runs with
ROUTER_HANDOVER in both modes (``mesh.node.dispatch.open_router``): a link that reconnects
while the receiver still holds its old connection (the receiver was paused, the link timed
out and reconnected meanwhile, and the resumed receiver identified the new connection
before it had processed the old one's end: ``tests/unit/test_router_handover.py``) takes
its routing id over. Without handover (secured mode
before issue 39), libzmq kept that new connection but never delivered a message from it:
a broker paused a few seconds came back deaf to its peers for good.

Connections are counted with a monitor on the ROUTER (ACCEPTED minus DISCONNECTED, which
libzmq also reports for a refused handshake and for a raw connection that never spoke).
libzmq's I/O thread writes each event to the monitor's inproc PAIR pipe with a *blocking*
send, holding the socket's monitor lock: once that pipe is full it blocks for good (no
connection accepted, no message moved, and a close waits on the lock: SIGTERM hangs).
About 1,000 connect-then-close cycles of a port scan filled the default pipe (2 x 1,000
messages) when it was read only before a ZAP decision (issue 39). So the reading end sets
RCVHWM 0 before it connects, which makes the inproc pipe unlimited (libzmq sums the two
ends' HWMs, 0 if either is 0): the I/O thread never blocks on it. The node loop polls the
monitor next to the ROUTER and drains it each turn, at most ``MONITOR_EVENTS_PER_TURN``
events (bounded work a turn; what waits is about 128 bytes an event; measured: drained at
~80,000 events a second, while a scanner here made ~1,500 connect/close cycles a second).
"""
from __future__ import annotations

import logging
from typing import Callable

import zmq
from zmq.utils import z85
from zmq.utils.monitor import parse_monitor_message

__all__ = ["decide", "ZapHandler", "ZAP_ENDPOINT", "ZAP_DOMAIN", "DEFAULT_MAX_CONNECTIONS", "HANDSHAKE_IVL_MS",
           "MONITOR_EVENTS_PER_TURN"]

log = logging.getLogger("mesh.security.zap")

ZAP_ENDPOINT = "inproc://zeromq.zap.01"
ZAP_DOMAIN = b"mesh"
DEFAULT_MAX_CONNECTIONS = 4096
HANDSHAKE_IVL_MS = 10_000   # a connection that has not finished its handshake by then is closed
MONITOR_EVENTS_PER_TURN = 4096   # connection events read in one turn of the node loop (or one ZAP answer)


def decide(mechanism: bytes, client_key: str | None, *, cluster_key: str | None,
           known_key: Callable[[str], bool], connections: int,
           max_connections: int) -> tuple[bytes, bytes, bytes]:
    """(status code, status text, user id) for one handshake. ``connections`` counts the
    open connections, this one included; ``cluster_key`` is None in open mode."""
    broker = cluster_key is not None and mechanism == b"CURVE" and client_key == cluster_key
    if connections > max_connections and not broker:
        # brokers are not held back: connections that never authenticate count toward the
        # cap (they are counted when accepted), and a restarted broker kept out by them was
        # cut off from the cluster
        return b"300", b"too many connections", b""
    if cluster_key is None:
        if mechanism == b"NULL":
            return b"200", b"OK", b""
        return b"400", b"this broker is open: it takes no credentials", b""
    if mechanism != b"CURVE" or client_key is None:
        return b"400", b"CURVE credentials required", b""
    if client_key == cluster_key or known_key(client_key):
        return b"200", b"OK", client_key.encode("ascii")
    return b"400", b"unknown key", b""


class ZapHandler:
    """The REP socket answering ZAP requests, and the ROUTER's connection count."""

    def __init__(self, ctx: zmq.Context, *, cluster_key: str | None, known_key: Callable[[str], bool],
                 max_connections: int = DEFAULT_MAX_CONNECTIONS) -> None:
        self.cluster_key = cluster_key
        self.known_key = known_key
        self.max_connections = max_connections
        self.sock = ctx.socket(zmq.REP)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.bind(ZAP_ENDPOINT)   # before the ROUTER binds: no handshake goes unchecked
        self.monitor: zmq.Socket | None = None
        self.connections = 0
        self.accepted = 0
        self.refused = 0
        self.refused_cap = 0
        self._logged: set[str] = set()

    def watch(self, router: zmq.Socket, name: str) -> None:
        """Count ``router``'s connections (call before it binds). The reading end of the
        monitor pipe has no HWM, so libzmq's I/O thread never blocks on it (module doc);
        the node loop polls ``monitor`` and calls ``drain_monitor`` each turn."""
        addr = f"inproc://mesh-router-monitor-{name}"
        router.monitor(addr, zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED)
        mon = router.context.socket(zmq.PAIR)
        mon.setsockopt(zmq.LINGER, 0)
        mon.setsockopt(zmq.RCVHWM, 0)   # before connect: the pipe is sized when it is made
        mon.connect(addr)
        self.monitor = mon

    def drain_monitor(self, limit: int = MONITOR_EVENTS_PER_TURN) -> int:
        """Read at most ``limit`` connection events; return how many were read."""
        mon = self.monitor
        if mon is None:
            return 0
        accepted = zmq.EVENT_ACCEPTED
        disconnected = zmq.EVENT_DISCONNECTED
        for n in range(limit):
            try:
                frames = mon.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return n
            try:
                event = parse_monitor_message(frames)["event"]
            except Exception:   # not from libzmq (nothing else can reach an inproc name of ours)
                continue
            if event == accepted:
                self.connections += 1
            elif event == disconnected:
                self.connections = max(0, self.connections - 1)
        return limit

    def handle(self) -> None:
        """Answer every ZAP request waiting (called when the REP socket is readable)."""
        while True:
            try:
                frames = self.sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            self.drain_monitor()
            if len(frames) < 6:   # not from libzmq: answer something well-formed all the same
                self.sock.send_multipart([b"1.0", frames[1] if len(frames) > 1 else b"", b"500",
                                          b"bad ZAP request", b"", b""])
                continue
            version, rid, _domain, address, _identity, mechanism = frames[:6]
            key = None
            if mechanism == b"CURVE" and len(frames) > 6 and len(frames[6]) == 32:
                key = z85.encode(frames[6]).decode("ascii")
            status, text, user = decide(mechanism, key, cluster_key=self.cluster_key, known_key=self.known_key,
                                        connections=self.connections, max_connections=self.max_connections)
            if status == b"200":
                self.accepted += 1
            else:
                self.refused += 1
                self.refused_cap += status == b"300"
                who = f"{address.decode(errors='replace')}/{key or mechanism.decode(errors='replace')}"
                if who not in self._logged and len(self._logged) < 10_000:
                    self._logged.add(who)
                    log.warning("connection from %s refused: %s", who, text.decode())
            self.sock.send_multipart([version, rid, status, text, user, b""])

    def close(self) -> None:
        if self.monitor is not None:
            self.monitor.close(linger=0)
            self.monitor = None
        try:
            self.sock.unbind(ZAP_ENDPOINT)   # at once: a close frees an inproc name only later
        except zmq.ZMQError:
            pass
        self.sock.close(linger=0)
