"""The ``/metrics`` HTTP server: one thread, a selector, bounded connections (issue 39).

prometheus_client's ``start_http_server`` is a ``ThreadingHTTPServer``: one thread per
connection, no timeout, so 1,000 connections that send nothing held 1,000 threads in the
broker process. This server is one daemon thread with a ``selectors`` loop:

- at most ``MAX_CONNECTIONS`` (32) open at once; one more evicts the oldest (a scraper
  sends its request at once and is answered in the same turn it arrives, so the newest
  connection is the likeliest real scrape, and a crowd of idle ones cannot lock it out);
- each connection has ``REQUEST_TIMEOUT_S`` (10 s, Prometheus' default scrape timeout) to
  send its request and read the answer, then it is closed (slowloris);
- a request head over ``MAX_HEAD_BYTES`` is refused (431); only ``GET``/``HEAD`` of
  ``/metrics`` (or ``/``) is served; every answer closes its connection.

The exposition is prometheus_client's ``generate_latest`` of the node's own registry (its
collectors only read the snapshot the node loop swapped in: ``mesh.node.ops.metrics``).
"""
from __future__ import annotations

import logging
import selectors
import socket
import threading
import time

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

__all__ = ["MetricsServer", "MAX_CONNECTIONS", "REQUEST_TIMEOUT_S", "MAX_HEAD_BYTES"]

log = logging.getLogger("mesh.node.ops.metrics")

MAX_CONNECTIONS = 32
REQUEST_TIMEOUT_S = 10.0
MAX_HEAD_BYTES = 8192


class _Conn:
    __slots__ = ("sock", "started", "inbuf", "outbuf")

    def __init__(self, sock: socket.socket, started: float) -> None:
        self.sock = sock
        self.started = started
        self.inbuf = b""
        self.outbuf: memoryview | None = None


def _answer(status: str, body: bytes, ctype: str = "text/plain; charset=utf-8", head_only: bool = False) -> bytes:
    head = (f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
            f"Connection: close\r\n\r\n").encode("ascii")
    return head if head_only else head + body


class MetricsServer:
    """Serve ``registry`` on ``host:port`` from one daemon thread (``start``/``close``)."""

    def __init__(self, registry, host: str, port: int, *, max_connections: int = MAX_CONNECTIONS,
                 timeout_s: float = REQUEST_TIMEOUT_S) -> None:
        self.registry = registry
        self.max_connections = max_connections
        self.timeout_s = timeout_s
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.listener = socket.socket(family, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self.listener.bind((host, port))
            self.listener.listen(128)
        except OSError:
            self.listener.close()
            raise
        self.listener.setblocking(False)
        self.port = self.listener.getsockname()[1]
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._conns: dict[int, _Conn] = {}   # fileno -> connection, oldest first
        self._sel = selectors.DefaultSelector()
        self._sel.register(self.listener, selectors.EVENT_READ, None)
        self._sel.register(self._wake_r, selectors.EVENT_READ, None)
        self._stop = False
        self.evicted = 0
        self.timed_out = 0
        self.served = 0
        self._thread = threading.Thread(target=self._run, name="mesh-metrics-http", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._stop = True
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass
        self._thread.join(timeout=5)
        for c in list(self._conns.values()):
            self._drop(c)
        for s in (self.listener, self._wake_r, self._wake_w):
            s.close()
        self._sel.close()

    # -- the server thread -------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop:
            try:
                self._turn()
            except Exception as exc:   # never let the thread die: /metrics would go silent
                log.exception("metrics server: %s", exc)
                time.sleep(0.1)

    def _turn(self) -> None:
        conns = self._conns
        timeout = None
        if conns:
            oldest = next(iter(conns.values()))
            timeout = max(0.0, oldest.started + self.timeout_s - time.monotonic())
        for key, mask in self._sel.select(timeout):
            sock = key.fileobj
            if sock is self.listener:
                self._accept()
            elif sock is self._wake_r:
                try:
                    self._wake_r.recv(64)
                except OSError:
                    pass
            else:
                c = key.data
                if c.sock.fileno() in conns:
                    if mask & selectors.EVENT_READ and c.outbuf is None:
                        self._read(c)
                    elif mask & selectors.EVENT_WRITE:
                        self._write(c)
        now = time.monotonic()
        while conns:
            c = next(iter(conns.values()))
            if c.started + self.timeout_s > now:
                break
            self.timed_out += 1
            self._drop(c)

    def _accept(self) -> None:
        for _ in range(256):   # a burst of connects is bounded per turn
            try:
                sock, _addr = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:   # EMFILE and the like: try again next turn
                log.warning("metrics server: accept failed: %s", exc)
                return
            while len(self._conns) >= self.max_connections:
                self.evicted += 1
                self._drop(next(iter(self._conns.values())))
            sock.setblocking(False)
            c = _Conn(sock, time.monotonic())
            self._conns[sock.fileno()] = c
            self._sel.register(sock, selectors.EVENT_READ, c)

    def _read(self, c: _Conn) -> None:
        try:
            data = c.sock.recv(4096)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._drop(c)
            return
        c.inbuf += data
        end = c.inbuf.find(b"\r\n\r\n")
        if end < 0:
            if len(c.inbuf) > MAX_HEAD_BYTES:
                self._respond(c, _answer("431 Request Header Fields Too Large", b"request head too large\n"))
            return
        self._respond(c, self._handle(c.inbuf[:end]))

    def _handle(self, head: bytes) -> bytes:
        parts = head.split(b"\r\n", 1)[0].split(b" ")
        if len(parts) != 3:
            return _answer("400 Bad Request", b"bad request line\n")
        method, target = parts[0], parts[1].split(b"?", 1)[0]
        if method not in (b"GET", b"HEAD"):
            return _answer("405 Method Not Allowed", b"only GET\n")
        if target not in (b"/metrics", b"/"):
            return _answer("404 Not Found", b"see /metrics\n")
        self.served += 1
        return _answer("200 OK", generate_latest(self.registry), CONTENT_TYPE_LATEST, head_only=method == b"HEAD")

    def _respond(self, c: _Conn, data: bytes) -> None:
        c.outbuf = memoryview(data)
        self._sel.modify(c.sock, selectors.EVENT_WRITE, c)
        self._write(c)

    def _write(self, c: _Conn) -> None:
        try:
            n = c.sock.send(c.outbuf)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._drop(c)
            return
        c.outbuf = c.outbuf[n:]
        if not len(c.outbuf):
            try:
                c.sock.shutdown(socket.SHUT_WR)
            except OSError:
                pass
            self._drop(c)

    def _drop(self, c: _Conn) -> None:
        fd = c.sock.fileno()
        if fd >= 0:
            self._conns.pop(fd, None)
            try:
                self._sel.unregister(c.sock)
            except (KeyError, ValueError):
                pass
        c.sock.close()
