"""A request/response multiplexer over DEALER sockets, owned by one thread.

One DEALER per broker address. ``send`` returns a request id at once; ``poll`` collects
whatever responses have arrived; ``call`` is the blocking convenience built on both.
Responses may arrive out of order and for several addresses; each carries the request id
it answers. Liveness is the caller's concern: a request to a dead broker simply gets no
answer, and callers wait with a deadline.
"""
from __future__ import annotations

import itertools
import time
from typing import Any

import zmq
from zmq.utils.monitor import parse_monitor_message

from mesh.wire.errors import ErrorCode, MeshError
from mesh.wire.messages import ErrorResponse
from mesh.wire.codec import PROTOCOL_CLIENT, pack, unpack

_MONITOR_IDS = itertools.count(1)  # process-wide: inproc names are per context

__all__ = ["Transport", "parse_address"]


def parse_address(addr: str) -> str:
    """'host:port' (or tcp://host:port) -> 'host:port', with a clear error."""
    a = addr[6:] if addr.startswith("tcp://") else addr
    host, sep, port = a.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"bad broker address {addr!r}: expected HOST:PORT")
    return a


class Transport:
    def __init__(self, hwm: int = 10_000):
        self.ctx = zmq.Context.instance()
        self._socks: dict[str, zmq.Socket] = {}
        self._addr_of: dict[zmq.Socket, str] = {}
        self._ids = itertools.count(1)
        self._poller = zmq.Poller()
        self._hwm = hwm
        self._stash: dict[int, tuple[str, Any, Any]] = {}
        self._wakeup: zmq.Socket | None = None
        self._monitors: dict[zmq.Socket, str] = {}
        self._connected: set[str] = set()
        self._disconnected: set[str] = set()

    def add_wakeup(self, sock: zmq.Socket) -> None:
        """Also wake ``poll`` when ``sock`` (an inproc PAIR) becomes readable; drained here."""
        self._wakeup = sock
        self._poller.register(sock, zmq.POLLIN)

    def _sock(self, addr: str) -> zmq.Socket:
        s = self._socks.get(addr)
        if s is None:
            s = self.ctx.socket(zmq.DEALER)
            s.setsockopt(zmq.LINGER, 0)
            s.setsockopt(zmq.SNDHWM, self._hwm)
            s.setsockopt(zmq.RCVHWM, self._hwm)
            s.setsockopt(zmq.RECONNECT_IVL, 100)
            s.setsockopt(zmq.RECONNECT_IVL_MAX, 1000)
            # A unique inproc name: pyzmq's default (the socket's fd) can collide with a
            # monitor of a closed socket that is still being torn down.
            mon = s.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED,
                                       addr=f"inproc://mesh-monitor-{next(_MONITOR_IDS)}")
            s.connect(f"tcp://{parse_address(addr)}")
            self._socks[addr] = s
            self._addr_of[s] = addr
            self._monitors[mon] = addr
            self._poller.register(s, zmq.POLLIN)
            self._poller.register(mon, zmq.POLLIN)
        return s

    def take_disconnected(self) -> set[str]:
        """Addresses whose connection dropped since the last call: requests in flight to
        them will never be answered (a killed broker), so callers retry them now instead
        of waiting for their timeout."""
        out, self._disconnected = self._disconnected, set()
        return out

    def _on_monitor(self, mon: zmq.Socket) -> None:
        addr = self._monitors[mon]
        while True:
            try:
                ev = parse_monitor_message(mon.recv_multipart(zmq.NOBLOCK))
            except zmq.Again:
                return
            if ev["event"] == zmq.EVENT_CONNECTED:
                self._connected.add(addr)
            elif ev["event"] == zmq.EVENT_DISCONNECTED and addr in self._connected:
                self._connected.discard(addr)
                self._disconnected.add(addr)

    def send(self, addr: str, msg, payload: bytes | None = None) -> int:
        rid = next(self._ids)
        frames = pack(PROTOCOL_CLIENT, rid, msg, payload)
        try:
            self._sock(addr).send_multipart(frames, zmq.NOBLOCK, copy=payload is None or len(payload) < 65536)
        except zmq.Again:
            pass  # queue full: the caller's deadline turns this into a timeout and a retry
        return rid

    def poll(self, timeout_ms: int) -> list[tuple[str, int, Any, Any]]:
        """[(address, request id, response message, payload)] received within timeout."""
        out = [(a, rid, msg, p) for rid, (a, msg, p) in self._stash.items()]
        self._stash.clear()
        if out:
            timeout_ms = 0
        for sock, _ in self._poller.poll(timeout_ms):
            if sock is self._wakeup:
                while True:
                    try:
                        sock.recv(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                continue
            if sock in self._monitors:
                self._on_monitor(sock)
                continue
            addr = self._addr_of[sock]
            while True:
                try:
                    frames = sock.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                try:
                    _, rid, msg, payload = unpack(frames)
                except MeshError:
                    continue  # a garbled response: the request will time out and be retried
                out.append((addr, rid, msg, payload))
        return out

    def call_first(self, addrs: list[str], msg, timeout_ms: int = 2_000):
        """Send ``msg`` to every address; the first answer wins (metadata: any broker will
        do, and a dead one must not cost a timeout). Raises MeshError on error or timeout."""
        rids = {self.send(a, msg): a for a in addrs}
        deadline = time.monotonic() + timeout_ms / 1000
        last: MeshError | None = None
        while rids:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            for a, r, resp, p in self.poll(int(left * 1000) + 1):
                if r not in rids:
                    continue  # a late answer to an earlier call: drop it
                del rids[r]
                if isinstance(resp, ErrorResponse):
                    last = MeshError(resp.error, resp.message, leader=resp.leader)
                    continue
                return resp, p
        for a in set(rids.values()):
            self.forget(a)  # silent brokers: reconnect fresh next time
        raise last or MeshError(ErrorCode.TIMEOUT, f"no answer from {', '.join(addrs)} within {timeout_ms} ms")

    def call(self, addr: str, msg, payload: bytes | None = None, timeout_ms: int = 10_000):
        """Send and wait for the answer; raises MeshError (TIMEOUT, or the response's code)."""
        rid = self.send(addr, msg, payload)
        deadline = time.monotonic() + timeout_ms / 1000
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise MeshError(ErrorCode.TIMEOUT, f"no answer from {addr} within {timeout_ms} ms")
            for a, r, resp, p in self.poll(int(left * 1000) + 1):
                if r == rid:
                    if isinstance(resp, ErrorResponse):
                        raise MeshError(resp.error, resp.message, leader=resp.leader)
                    return resp, p
                self._stash[r] = (a, resp, p)

    def forget(self, addr: str, linger_ms: int = 0) -> None:
        """Drop the socket to ``addr`` (e.g. after a timeout) so the next send reconnects."""
        s = self._socks.pop(addr, None)
        if s is not None:
            self._poller.unregister(s)
            del self._addr_of[s]
            for mon, a in list(self._monitors.items()):
                if a == addr:
                    self._poller.unregister(mon)
                    del self._monitors[mon]
                    s.disable_monitor()
                    mon.close(linger=0)
            s.close(linger=linger_ms)
            self._connected.discard(addr)

    def close(self, linger_ms: int = 0) -> None:
        """Close every socket; ``linger_ms`` lets queued one-way sends (acks=0) leave first."""
        for addr in list(self._socks):
            self.forget(addr, linger_ms)
