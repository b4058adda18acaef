"""A request/response multiplexer over DEALER sockets, owned by one thread.

One DEALER per broker address. ``send`` returns a request id at once; ``poll`` collects
whatever responses have arrived; ``call`` / ``call_first`` / ``gather`` are the blocking
conveniences built on both.

Theory of operation
-------------------
Routing. Every response carries the request id it answers, and goes to whoever waits for
that id: a blocking call (``call``, ``call_first``, ``gather``) takes the answers to its
own requests and keeps every other answer for the next ``poll``, so a metadata refresh in
the middle of a producer's I/O loop never eats a produce reply. The only answers dropped
are those to requests their sender gave up on (``abandon``; e.g. the slower brokers of a
``call_first``), and garbled frames (their request then times out and is retried).

Liveness. Every DEALER has ZeroMQ heartbeats (``HEARTBEAT_IVL_MS`` /
``HEARTBEAT_TIMEOUT_MS``): a broker that is dead, paused (SIGSTOP) or cut off stops
answering PINGs and its connection drops within about a second, even when TCP itself
would keep it open for minutes; a reconnection whose handshake does not finish within
``HANDSHAKE_IVL_MS`` drops too. A monitor per socket sees the connection come up (the
ZMTP handshake succeeded) and go down. ``take_disconnected`` reports the addresses whose
connection dropped, and those that have had no connection for ``CONNECT_TIMEOUT_MS``
(a killed broker refuses connections, so it never drops one: requests to it would just
queue); requests in flight to them will never be answered, so callers retry them at once
instead of waiting for their timeout. ``is_down`` says whether an address is known to
have no connection now (do not send there; ask for metadata instead): for a connected
address it answers from what the monitors said when last read, with no socket call (a
``poll`` that waits and every blocking call read the monitors that have events, watched
by their raw ZMQ_FD; ``take_disconnected`` drains them every 20 ms; a ``poll`` that may
not wait skips them); a drop not seen yet is reported by a later ``take_disconnected``,
so what was sent meanwhile is retried.

Credentials. With ``creds`` (``mesh.security.load_creds``: a path, a ``Creds``, or None for
$MESH_CREDS) every DEALER is a CURVE client. A broker that refuses the handshake never
answers, so the monitor also watches for refusals: the broker's ZAP handler refused the key
(HANDSHAKE_FAILED_AUTH), the mechanisms differ (credentials given to an open broker, or
none to a secured one), or the broker closed three CURVE handshakes in a row before any
succeeded (a wrong cluster key). Then every blocking call and ``poll`` raise
``MeshError(UNAUTHORIZED)`` at once, naming the broker and the likely cause (never retried).
A handshake that *timed out* is no refusal: a paused (SIGSTOP) or busy broker's kernel
still accepts the TCP connection, and the handshake dies by our ``HANDSHAKE_IVL_MS``; it is
retried like a dropped connection (issue 39: three timeouts made a 6 s pause fatal). libzmq
reports both as HANDSHAKE_FAILED_NO_DETAIL, so a close counts toward the three only when
the broker ended it (errno EPIPE or ECONNRESET) sooner than half ``HANDSHAKE_IVL_MS`` after
the TCP connection came up (EVENT_CONNECTED; a wrong key is closed in milliseconds). That
guess (the only inferred refusal) is also taken back when a handshake with that broker
succeeds later.
"""
from __future__ import annotations

import collections
import errno
import itertools
import time
from typing import Any

import zmq
from zmq.backend import zmq_poll
from zmq.utils.monitor import parse_monitor_message

from mesh.security.creds import Creds, load_creds
from mesh.wire.errors import ErrorCode, MeshError
from mesh.wire.messages import ErrorResponse
from mesh.wire.codec import PROTOCOL_CLIENT, ZERO_COPY_MIN_BYTES, encode_body, unpack
from mesh.wire.frames import recv_frames, send_frames

_MONITOR_IDS = itertools.count(1)  # process-wide: inproc names are per context

__all__ = ["Transport", "parse_address", "HEARTBEAT_IVL_MS", "HEARTBEAT_TIMEOUT_MS", "CONNECT_TIMEOUT_MS"]

HEARTBEAT_IVL_MS = 300       # a PING every 300 ms on an idle connection
HEARTBEAT_TIMEOUT_MS = 1000  # no traffic for 1 s after a PING: the connection is dropped
HEARTBEAT_TTL_MS = 5000      # the broker drops our connection after 5 s without a PING from us
HANDSHAKE_IVL_MS = 1000      # a connection whose ZMTP handshake takes longer is dropped
CONNECT_TIMEOUT_MS = 1000    # no connection for this long: requests sent there are lost
_ABANDONED_MAX = 4096        # request ids given up on, remembered to drop their late answers

_UP = zmq.EVENT_HANDSHAKE_SUCCEEDED
_DOWN = zmq.EVENT_DISCONNECTED
_AUTH_FAILED = zmq.EVENT_HANDSHAKE_FAILED_AUTH
_PROTOCOL_FAILED = zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
_NO_DETAIL = zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
_EVENTS, _POLLIN = int(zmq.EVENTS), int(zmq.POLLIN)   # ints: enum.Flag arithmetic costs per call
_NO_DETAIL_MAX = 3           # CURVE handshakes closed in a row, none succeeded: a wrong cluster key
_CONNECTED = zmq.EVENT_CONNECTED
_CLOSED_BY_PEER = frozenset({errno.EPIPE, errno.ECONNRESET})   # libzmq's errno when the peer closed it


def parse_address(addr: str) -> str:
    """'host:port' (or tcp://host:port) -> 'host:port', with a clear error."""
    a = addr[6:] if addr.startswith("tcp://") else addr
    host, sep, port = a.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"bad broker address {addr!r}: expected HOST:PORT")
    return a


class Transport:
    def __init__(self, hwm: int = 10_000, heartbeat_ivl_ms: int = HEARTBEAT_IVL_MS,
                 heartbeat_timeout_ms: int = HEARTBEAT_TIMEOUT_MS, connect_timeout_ms: int = CONNECT_TIMEOUT_MS,
                 context: zmq.Context | None = None, creds: "str | Creds | None" = None):
        # ``context``: the ZeroMQ context of its sockets (default the process's shared one;
        # the text gateway gives its clients their own so they cannot use up the broker's)
        self.ctx = context if context is not None else zmq.Context.instance()
        self.creds = load_creds(creds)   # None: an open cluster
        self._refused: MeshError | None = None       # a broker refused our credentials
        self._no_detail: dict[str, int] = {}         # address -> CURVE handshakes closed in a row
        self._guessed: str | None = None             # _refused is the wrong-key guess about this address
        self._connected_at: dict[str, float] = {}    # address -> when its TCP connection last came up
        self._socks: dict[str, zmq.Socket] = {}
        self._addr_of: dict[zmq.Socket, str] = {}
        self._expect: dict[zmq.Socket, int] = {}     # answers still due on each DEALER (_take_ready)
        self._ids = itertools.count(1)
        self._poller = zmq.Poller()                  # everything: DEALERs, monitors, the wake-up socket
        self._hot = zmq.Poller()                     # the same without the monitors (see poll)
        self._hwm = hwm
        self._heartbeat_ivl_ms = heartbeat_ivl_ms
        self._heartbeat_timeout_ms = heartbeat_timeout_ms
        self._connect_timeout_s = connect_timeout_ms / 1000
        # answers received and not yet taken, in arrival order: rid -> (address, msg, payload)
        self._inbox: dict[int, tuple[str, Any, Any]] = {}
        self._abandoned: collections.OrderedDict[int, None] = collections.OrderedDict()
        self._wakeup: int | None = None              # add_wakeup's fd, and what drains it
        self._drain_wakeup = None
        self._monitors: dict[zmq.Socket, str] = {}
        self._monitor_of: dict[zmq.Socket, zmq.Socket] = {}   # DEALER -> its monitor
        self._monitor_fds: dict[int, zmq.Socket] = {}  # a monitor's ZMQ_FD (what poll watches) -> it
        self._up: set[str] = set()                   # connection established (handshake done)
        self._down_since: dict[str, float] = {}      # address -> when it last had no connection
        self._dropped: set[str] = set()              # had a connection, lost it: is_down
        self._disconnected: set[str] = set()         # to report in take_disconnected
        self._next_drain = 0.0                       # take_disconnected: next explicit monitor drain

    def add_wakeup(self, fd: int, drain) -> None:
        """Also wake ``poll`` when the file descriptor ``fd`` (an eventfd or a pipe's read
        end: a raw fd in the same ``zmq_poll``, a syscall cheaper on both sides than an
        inproc socket) becomes readable; ``drain()`` empties it (called here)."""
        self._wakeup, self._drain_wakeup = fd, drain
        self._poller.register(fd, zmq.POLLIN)
        self._hot.register(fd, zmq.POLLIN)

    def _sock(self, addr: str) -> zmq.Socket:
        s = self._socks.get(addr)
        if s is None:
            s = self.ctx.socket(zmq.DEALER)
            s.setsockopt(zmq.LINGER, 0)
            s.setsockopt(zmq.SNDHWM, self._hwm)
            s.setsockopt(zmq.RCVHWM, self._hwm)
            s.setsockopt(zmq.RECONNECT_IVL, 100)
            s.setsockopt(zmq.RECONNECT_IVL_MAX, 1000)
            s.setsockopt(zmq.HEARTBEAT_IVL, self._heartbeat_ivl_ms)
            s.setsockopt(zmq.HEARTBEAT_TIMEOUT, self._heartbeat_timeout_ms)
            s.setsockopt(zmq.HEARTBEAT_TTL, HEARTBEAT_TTL_MS)
            s.setsockopt(zmq.HANDSHAKE_IVL, HANDSHAKE_IVL_MS)
            if self.creds is not None:
                self.creds.apply(s)
            # A unique inproc name: pyzmq's default (the socket's fd) can collide with a
            # monitor of a closed socket that is still being torn down. The reading end has
            # no HWM: libzmq's I/O thread writes events with a blocking send, so a full
            # monitor pipe (a transport nobody polls while its broker refuses or flaps:
            # ~30 events a second) blocked every socket of the context for good (issue 39).
            mon_addr = f"inproc://mesh-monitor-{next(_MONITOR_IDS)}"
            s.monitor(mon_addr, _UP | _DOWN | _AUTH_FAILED | _PROTOCOL_FAILED | _NO_DETAIL | _CONNECTED)
            mon = self.ctx.socket(zmq.PAIR)
            mon.setsockopt(zmq.LINGER, 0)
            mon.setsockopt(zmq.RCVHWM, 0)   # before connect: the pipe is sized when it is made
            mon.connect(mon_addr)
            s.connect(f"tcp://{parse_address(addr)}")
            self._socks[addr] = s
            self._addr_of[s] = addr
            self._expect[s] = 0
            self._monitors[mon] = addr
            self._monitor_of[s] = mon
            self._poller.register(s, zmq.POLLIN)
            self._hot.register(s, zmq.POLLIN)
            # The monitor is polled by its ZMQ_FD, a raw fd (readable when its mailbox got
            # something; it costs nothing beyond poll's own syscall), not as a socket: a
            # socket costs zmq_poll a ZMQ_EVENTS read (two syscalls) before and after every
            # wait. The fd signals only what comes after a read that found the socket
            # empty, so it is read once now; ``_on_monitor`` always reads it dry; and
            # ``take_disconnected`` drains every monitor every 20 ms anyway.
            mfd = mon.get(zmq.FD)
            self._monitor_fds[mfd] = mon
            self._poller.register(mfd, zmq.POLLIN)
            self._on_monitor(mon)
            self._down_since.setdefault(addr, time.monotonic())
        return s

    # -- liveness ---------------------------------------------------------------------------
    def take_disconnected(self) -> set[str]:
        """Addresses whose connection dropped since the last call, or that have had none for
        ``connect_timeout_ms`` (reported again every ``connect_timeout_ms`` while it lasts):
        requests in flight to them will never be answered, so callers retry them now
        instead of waiting for their timeout. (A ``poll`` that waits already reads the
        monitors that have events; the explicit drain here, ~4 us a monitor, runs every
        20 ms.)"""
        now = time.monotonic()
        if now >= self._next_drain:
            self._next_drain = now + 0.02
            self._drain_monitors()
        for addr, since in self._down_since.items():
            if addr in self._socks and now - since >= self._connect_timeout_s:
                self._disconnected.add(addr)
                self._down_since[addr] = now
        out, self._disconnected = self._disconnected, set()
        return out

    def is_down(self, addr: str) -> bool:
        """``addr`` had a connection and lost it, and has not got one back yet (or has had
        none for ``connect_timeout_ms``): a request sent there now would just wait.
        Called before every produce request: a set lookup while connected; otherwise reads
        ``addr``'s own monitor, only when it has an event (no exception per call)."""
        if addr in self._up:
            return False
        s = self._socks.get(addr)
        mon = self._monitor_of.get(s) if s is not None else None
        if mon is not None and mon.get(_EVENTS) & _POLLIN:
            self._on_monitor(mon)
        if addr in self._up:
            return False
        since = self._down_since.get(addr)
        return addr in self._dropped or (since is not None and time.monotonic() - since >= self._connect_timeout_s)

    def _drain_monitors(self) -> None:
        for mon in list(self._monitors):
            self._on_monitor(mon)

    def _on_monitor(self, mon: zmq.Socket) -> None:
        addr = self._monitors[mon]
        while mon.get(_EVENTS) & _POLLIN:   # (checked first: raising Again costs more)
            try:
                ev = parse_monitor_message(mon.recv_multipart(zmq.NOBLOCK))
            except zmq.Again:
                return
            if ev["event"] == _CONNECTED:   # TCP is up; the handshake starts
                self._connected_at[addr] = time.monotonic()
            elif ev["event"] in (_AUTH_FAILED, _PROTOCOL_FAILED, _NO_DETAIL):
                self._on_refused(addr, ev["event"], ev["value"])
            elif ev["event"] == _UP:
                self._on_up(addr)
            elif ev["event"] == _DOWN:
                if addr in self._up:
                    self._up.discard(addr)
                    self._dropped.add(addr)
                    self._disconnected.add(addr)
                self._down_since.setdefault(addr, time.monotonic())

    def _on_up(self, addr: str) -> None:
        """A handshake with ``addr`` succeeded."""
        self._no_detail.pop(addr, None)
        if self._guessed == addr:   # the key was right after all (the broker was slow)
            self._refused = self._guessed = None
        self._up.add(addr)
        self._dropped.discard(addr)
        self._down_since.pop(addr, None)

    def _on_refused(self, addr: str, event: int, value: int) -> None:
        who = f"broker {addr}"
        if event == _AUTH_FAILED:
            why = (f"{who} refused the credentials of {self.creds.principal!r} (status {value}): not a user "
                   f"of this cluster (mesh user add), or removed" if self.creds is not None
                   else f"{who} refused this connection (status {value})")
        elif event == _PROTOCOL_FAILED and value == zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH:
            why = (f"{who} is open (no CURVE): it takes no credentials (drop creds= / --creds / $MESH_CREDS)"
                   if self.creds is not None else
                   f"{who} requires credentials: pass creds= (Python), --creds FILE or $MESH_CREDS (CLI), "
                   f'.option("creds", FILE) (Spark)')
        elif event == _NO_DETAIL and self.creds is not None:
            since = self._connected_at.pop(addr, None)
            if value not in _CLOSED_BY_PEER or since is None or \
                    time.monotonic() - since >= HANDSHAKE_IVL_MS / 2000:
                return   # timed out (a paused or busy broker), not closed by it: retried
            n = self._no_detail[addr] = self._no_detail.get(addr, 0) + 1
            if n < _NO_DETAIL_MAX:
                return
            why = (f"{who} closed {n} CURVE handshakes in a row: the cluster public key in the credentials of "
                   f"{self.creds.principal!r} is probably not this cluster's")
            if self._refused is None:
                self._refused = MeshError(ErrorCode.UNAUTHORIZED, why)
                self._guessed = addr
            return
        else:
            return   # a handshake cut short for another reason: the connection is retried
        if self._refused is None or self._guessed is not None:   # a definite refusal beats the guess
            self._refused = MeshError(ErrorCode.UNAUTHORIZED, why)
            self._guessed = None

    def check_refused(self) -> None:
        """Raise ``MeshError(UNAUTHORIZED)`` if a broker refused our credentials."""
        if self._refused is not None:
            raise MeshError(self._refused.code, self._refused.message)

    # -- requests ---------------------------------------------------------------------------
    def send(self, addr: str, msg, payload: bytes | None = None) -> int:
        return self.send_encoded(addr, type(msg).OP, encode_body(msg), payload)

    def next_rid(self) -> int:
        """A fresh request id, for ``send_encoded(..., rid=)``."""
        return next(self._ids)

    def send_encoded(self, addr: str, op: bytes, body: bytes, payload: bytes | None = None,
                     rid: int | None = None) -> int:
        """``send`` of a message encoded beforehand (``type(msg).OP``, ``encode_body(msg)``):
        a driver that sends the same message many times (the producer: one ProduceRequest
        per partition) encodes it once. ``rid``: an id from ``next_rid`` (default: a fresh
        one)."""
        if rid is None:
            rid = next(self._ids)
        if payload is None:
            frames, copy = [PROTOCOL_CLIENT, rid.to_bytes(8, "big"), op, body], True
        else:
            frames = [PROTOCOL_CLIENT, rid.to_bytes(8, "big"), op, body, payload]
            copy = len(payload) < ZERO_COPY_MIN_BYTES
        s = self._socks.get(addr) or self._sock(addr)
        try:
            send_frames(s, frames, copy=copy)
        except zmq.Again:
            return rid  # queue full: the caller's deadline turns this into a timeout and a retry
        self._expect[s] += 1
        return rid

    def abandon(self, rids) -> None:
        """Nobody waits for the answers to ``rids`` any more: drop them when they come."""
        for rid in rids:
            if self._inbox.pop(rid, None) is None:
                self._abandoned[rid] = None
        while len(self._abandoned) > _ABANDONED_MAX:
            self._abandoned.popitem(last=False)

    def _receive(self, timeout_ms: int) -> None:
        """Wait up to ``timeout_ms`` for something; move every answer that arrived into the inbox."""
        if self._refused is not None:
            self.check_refused()
        self._take_ready(zmq_poll(self._poller.sockets, timeout_ms))   # (Poller.poll without its wrapper)

    def _take_ready(self, ready: list) -> None:
        """Read every ready DEALER dry. Whether another message waits costs a ZMQ_EVENTS
        read (~4 us: two syscalls), so it is asked only while more answers are due on that
        socket than came (``_expect``: every request has one answer; one that never comes,
        e.g. to a request given up on, only costs the question again). A message beyond
        the count stays queued and a later ``zmq_poll`` sees it."""
        expect = self._expect
        for sock, _ in ready:
            if sock.__class__ is int:   # (zmq_poll gives a raw fd back as a new int)
                if sock == self._wakeup:
                    self._drain_wakeup()
                elif (mon := self._monitor_fds.get(sock)) is not None:
                    self._on_monitor(mon)
                continue
            addr = self._addr_of.get(sock)
            if addr is None:
                continue
            while True:
                try:
                    frames = recv_frames(sock)
                except zmq.Again:
                    break
                due = expect[sock] - 1
                if due >= 0:
                    expect[sock] = due
                more = due > 0 and sock.get(_EVENTS) & _POLLIN   # read on without raising Again at the end
                try:
                    _, rid, msg, payload = unpack(frames)
                except MeshError:
                    continue  # a garbled response: the request will time out and be retried
                if rid in self._abandoned:
                    del self._abandoned[rid]
                else:
                    self._inbox[rid] = (addr, msg, payload)
                if not more:
                    break

    def poll(self, timeout_ms: int) -> list[tuple[str, int, Any, Any]]:
        """[(address, request id, response message, payload)]: every answer received and
        not taken by a blocking call, waiting up to ``timeout_ms`` if there is none. A
        poll that may wait is one ``zmq_poll`` of everything, the monitors' raw fds
        included (a first look without waiting cost a second one per wait); one that may
        not skips the monitors (``take_disconnected`` reads them every 20 ms)."""
        if self._refused is not None:
            self.check_refused()
        if timeout_ms > 0 and not self._inbox:
            self._take_ready(zmq_poll(self._poller.sockets, timeout_ms))  # (one zmq_poll, not two)
        else:
            ready = zmq_poll(self._hot.sockets, 0)
            if ready:
                self._take_ready(ready)
        out = [(a, rid, msg, p) for rid, (a, msg, p) in self._inbox.items()]
        self._inbox.clear()
        return out

    def gather(self, rids, timeout_ms: int, grace_ms: int | None = None) -> dict[int, tuple[str, Any, Any]]:
        """Wait for the answers to ``rids``: {rid: (address, msg, payload)}, once all came,
        or ``grace_ms`` after the first one came (None: no grace, wait for all), or at
        ``timeout_ms``. Answers to other requests stay for ``poll``; requests left
        unanswered are abandoned."""
        want = set(rids)
        got: dict[int, tuple[str, Any, Any]] = {}
        deadline = time.monotonic() + timeout_ms / 1000
        while True:
            for rid in [r for r in want if r in self._inbox]:
                got[rid] = self._inbox.pop(rid)
                want.discard(rid)
                if grace_ms is not None and len(got) == 1:
                    deadline = min(deadline, time.monotonic() + grace_ms / 1000)
            left = deadline - time.monotonic()
            if not want or left <= 0:
                break
            self._receive(int(left * 1000) + 1)
        self.abandon(want)
        return got

    def call_first(self, addrs: list[str], msg, timeout_ms: int = 2_000):
        """Send ``msg`` to every address; the first answer that is not an error wins
        (metadata: any broker will do, and a dead one must not cost a timeout). Raises
        MeshError (the last error answered, or TIMEOUT)."""
        rids = {self.send(a, msg): a for a in addrs}
        deadline = time.monotonic() + timeout_ms / 1000
        last: MeshError | None = None
        while rids:
            for r in [r for r in rids if r in self._inbox]:
                del rids[r]
                _a, resp, p = self._inbox.pop(r)
                if isinstance(resp, ErrorResponse):
                    last = MeshError(resp.error, resp.message, leader=resp.leader)
                    continue
                self.abandon(rids)
                return resp, p
            left = deadline - time.monotonic()
            if not rids or left <= 0:
                break
            self._receive(int(left * 1000) + 1)
        self.abandon(rids)
        raise last or MeshError(ErrorCode.TIMEOUT, f"no answer from {', '.join(addrs)} within {timeout_ms} ms")

    def call(self, addr: str, msg, payload: bytes | None = None, timeout_ms: int = 10_000):
        """Send and wait for the answer; raises MeshError (TIMEOUT, or the response's code)."""
        rid = self.send(addr, msg, payload)
        got = self.gather([rid], timeout_ms)
        if rid not in got:
            raise MeshError(ErrorCode.TIMEOUT, f"no answer from {addr} within {timeout_ms} ms")
        _, resp, p = got[rid]
        if isinstance(resp, ErrorResponse):
            raise MeshError(resp.error, resp.message, leader=resp.leader)
        return resp, p

    def connect(self, addr: str) -> None:
        """Open the connection to ``addr`` now (sends open it lazily otherwise)."""
        self._sock(addr)

    def forget(self, addr: str, linger_ms: int = 0) -> None:
        """Drop the socket to ``addr`` (e.g. after a timeout) so the next send reconnects."""
        s = self._socks.pop(addr, None)
        if s is not None:
            self._poller.unregister(s)
            self._hot.unregister(s)
            del self._addr_of[s]
            self._expect.pop(s, None)
            for mon, a in list(self._monitors.items()):
                if a == addr:
                    for mfd in [f for f, m in self._monitor_fds.items() if m is mon]:
                        self._poller.unregister(mfd)
                        del self._monitor_fds[mfd]
                    del self._monitors[mon]
                    self._monitor_of.pop(s, None)
                    s.disable_monitor()
                    mon.close(linger=0)
            s.close(linger=linger_ms)
            self._up.discard(addr)
            self._dropped.discard(addr)
            self._down_since.pop(addr, None)
            self._connected_at.pop(addr, None)

    def close(self, linger_ms: int = 0) -> None:
        """Close every socket; ``linger_ms`` lets queued one-way sends (acks=0) leave first."""
        for addr in list(self._socks):
            self.forget(addr, linger_ms)
