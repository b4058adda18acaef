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
(``mesh.node.peers.peers``: ``peer:<address>#`` and 64 random bits, known only to that broker and
the ROUTERs it links to): nobody can claim one, ahead of the link or after it; and the
dispatcher accepts peer messages only from the cluster key. The ROUTER runs with
ROUTER_HANDOVER in both modes (``mesh.node.requests.dispatch.open_router``): a link that reconnects
while the receiver still holds its old connection (the receiver was paused, the link timed
out and reconnected meanwhile, and the resumed receiver identified the new connection
before it had processed the old one's end: ``tests/unit/test_router_handover.py``) takes
its routing id over. Without handover (secured mode
before issue 39), libzmq kept that new connection but never delivered a message from it:
a broker paused a few seconds came back deaf to its peers for good.

With ``max_connections_per_ip`` (``--max-connections-per-ip``, Kafka's
``max.connections.per.ip``; 0, the default, is no bound, as loopback tests and open-mode
brokers all come from 127.0.0.1) the monitor also counts connections per source address:
an ACCEPTED event carries the connection's fd (libzmq's, in this process), whose
``getpeername`` (on a dup) gives the address; its DISCONNECTED (the same fd) uncounts it.
A handshake from an address is refused with 300 once the bound's worth of its connections
were admitted, or once it holds more than twice the bound open (raw ones that never speak
and handshakes under way: a burst of connects is all counted before the first ZAP request
is read, so open connections alone cannot say which were first); a broker's (the cluster
key) never is (in open mode nothing tells a broker apart: the bound holds for peers too).
ZAP does not say which connection a request is for, so when an admitted one closes the
address's admitted count drops only once it exceeds its open count: with raw connections
from that address held meanwhile (at most ``HANDSHAKE_IVL_MS``), it may refuse one too
many for a while, never admit one too many. A 300 sends no ERROR: the connection waits
until the handshake timer closes it, and the client's ZeroMQ reconnects.

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
import os
import socket
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
           max_connections: int, ip_connections: int = 0, ip_admitted: int = 0,
           max_connections_per_ip: int = 0) -> tuple[bytes, bytes, bytes]:
    """(status code, status text, user id) for one handshake. ``connections`` counts the
    open connections, this one included; ``ip_connections`` those from its source address
    and ``ip_admitted`` those of them admitted (``max_connections_per_ip`` 0: no bound);
    ``cluster_key`` is None in open mode."""
    broker = cluster_key is not None and mechanism == b"CURVE" and client_key == cluster_key
    if connections > max_connections and not broker:
        # brokers are not held back: connections that never authenticate count toward the
        # cap (they are counted when accepted), and a restarted broker kept out by them was
        # cut off from the cluster
        return b"300", b"too many connections", b""
    if max_connections_per_ip and not broker and (ip_admitted >= max_connections_per_ip
                                                   or ip_connections > 2 * max_connections_per_ip):
        return b"300", b"too many connections from this address", b""
    if cluster_key is None:
        if mechanism == b"NULL":
            return b"200", b"OK", b""
        return b"400", b"this broker is open: it takes no credentials", b""
    if mechanism != b"CURVE" or client_key is None:
        return b"400", b"CURVE credentials required", b""
    if client_key == cluster_key or known_key(client_key):
        return b"200", b"OK", client_key.encode("ascii")
    return b"400", b"unknown key", b""


def _norm_ip(ip: str) -> str:
    return ip[7:] if ip.startswith("::ffff:") else ip


def peer_ip(fd: int) -> str:
    """The source address of the connection on ``fd`` (a dup is asked; "?" if it is gone)."""
    try:
        dup = os.dup(fd)
    except OSError:
        return "?"
    try:
        with socket.socket(fileno=dup) as s:
            peer = s.getpeername()
    except OSError:
        return "?"
    return _norm_ip(peer[0]) if isinstance(peer, tuple) else str(peer)


class ZapHandler:
    """The REP socket answering ZAP requests, and the ROUTER's connection count."""

    def __init__(self, ctx: zmq.Context, *, cluster_key: str | None, known_key: Callable[[str], bool],
                 max_connections: int = DEFAULT_MAX_CONNECTIONS, max_connections_per_ip: int = 0) -> None:
        self.cluster_key = cluster_key
        self.known_key = known_key
        self.max_connections = max_connections
        self.max_connections_per_ip = max_connections_per_ip
        self.per_ip: dict[str, int] = {}     # source address -> open connections (with a per-IP bound)
        self.admitted_ip: dict[str, int] = {}   # source address -> of those, admitted (at most per_ip's)
        self._fd_ip: dict[int, str] = {}     # the ROUTER's connection fd -> its source address
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
                parsed = parse_monitor_message(frames)
                event = parsed["event"]
            except Exception:   # not from libzmq (nothing else can reach an inproc name of ours)
                continue
            if event == accepted:
                self.connections += 1
                if self.max_connections_per_ip:
                    self._count_ip(int(parsed["value"]))
            elif event == disconnected:
                self.connections = max(0, self.connections - 1)
                if self.max_connections_per_ip:
                    self._uncount_ip(int(parsed["value"]))
        return limit

    def _count_ip(self, fd: int) -> None:
        """An ACCEPTED event: its fd's source address, counted. The fd is this process's
        (libzmq's); by the time the event is read it may be closed (its DISCONNECTED waits
        behind) or even reused by a later connection: then this one is counted under that
        address, and its DISCONNECTED (the same fd) uncounts the same address."""
        ip = peer_ip(fd)
        old = self._fd_ip.pop(fd, None)
        if old is not None:   # an fd reused before its DISCONNECTED was read: should not happen
            self._dec(old)
        self._fd_ip[fd] = ip
        self.per_ip[ip] = self.per_ip.get(ip, 0) + 1

    def _uncount_ip(self, fd: int) -> None:
        ip = self._fd_ip.pop(fd, None)
        if ip is not None:
            self._dec(ip)

    def _dec(self, ip: str) -> None:
        n = self.per_ip.get(ip, 0) - 1
        if n > 0:
            self.per_ip[ip] = n
            if self.admitted_ip.get(ip, 0) > n:
                self.admitted_ip[ip] = n
        else:
            self.per_ip.pop(ip, None)
            self.admitted_ip.pop(ip, None)

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
            ip = _norm_ip(address.decode(errors="replace"))
            status, text, user = decide(mechanism, key, cluster_key=self.cluster_key, known_key=self.known_key,
                                        connections=self.connections, max_connections=self.max_connections,
                                        ip_connections=self.per_ip.get(ip, 0), ip_admitted=self.admitted_ip.get(ip, 0),
                                        max_connections_per_ip=self.max_connections_per_ip)
            if status == b"200":
                self.accepted += 1
                if self.max_connections_per_ip and ip in self.per_ip:
                    self.admitted_ip[ip] = min(self.per_ip[ip], self.admitted_ip.get(ip, 0) + 1)
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
