"""The Kafka listener's socket server: framing, order, bounds; the APIs are handlers.

Theory of operation
-------------------
- One thread accepts. Each connection has two threads: a *reader* that cuts the byte
  stream into frames (a 4-byte size, then the request) and a *worker* that decodes each
  request, calls its handler (``mesh.kafka.context``: ``handler(ctx, request)``, which may
  block, e.g. a long-polling fetch) and writes the answer. One worker per connection
  answers a connection's requests strictly in order, as Kafka does, while connections never
  wait for each other.
- Bounds (every one of them holds whatever a client sends): a frame larger than
  ``max_request_bytes`` (Kafka's ``socket.request.max.bytes``, 100 MiB) or with a negative
  size closes the connection before it is read; at most ``max_queued_requests`` requests
  (Kafka's ``queued.max.requests``) and ``max_request_bytes`` bytes wait per connection,
  beyond which the reader stops reading (TCP pushes back on the client); an answer the
  client does not read within ``send_timeout_s`` closes the connection, so a client that
  never reads holds one answer and a bounded queue, never more; at most
  ``max_connections`` connections, and ``max_connections_per_ip`` from one source address
  (Kafka's ``max.connections.per.ip``; 0: no such bound, Kafka's default; one more is
  closed at once, before a thread is started for it); at most
  ``max_queued_bytes`` (256 MiB) of requests read or queued by all connections together
  (memory grows with the bytes that arrive, never with what a size prefix claims); a connection idle for
  ``idle_timeout_s`` is closed (Kafka's ``connections.max.idle.ms``).
- What cannot be served closes the connection, as Kafka's broker does: an API key that is
  not registered, a version outside the advertised range, a request that does not decode.
  ApiVersions is the exception (KIP-511): a version it does not know is answered in v0
  with UNSUPPORTED_VERSION and the supported ranges, so the client can retry with one.
- Produce requests are pipelined (``max_pipelined``, 8): a produce handler sends its batches
  and returns a ``Deferred``; while it waits for the mesh the worker starts the next queued
  produce request, so the node group-commits several of one connection's batches in one
  turn (as the native producer's requests in flight); the answers are written in request
  order. Any other request waits until every earlier answer is written.
- A handler that raises is a bug, not the client's: it is logged (rate-limited) and the
  connection is closed; the listener goes on. ``None`` from a handler (acks=0) writes nothing.
- SASL (``auth``: a factory of per-connection sessions, ``mesh.kafka.sasl``): until the
  session is ``done`` only the APIs it allows are served (others close the connection);
  its handlers are the connection's own; ``failed`` closes the connection after the answer,
  and so does a request on a connection still not authenticated ``AUTH_TIMEOUT_S`` after it
  opened (``expired()``).
- TLS (``ssl_context``, ``mesh.kafka.tls``): each accepted socket is wrapped without a
  handshake, which the connection's reader does (its send timeout bounds it), so a client
  that never finishes one holds no other connection back.
"""
from __future__ import annotations

import collections
import itertools
import logging
import queue
import socket
import threading
import time
from dataclasses import dataclass
from typing import Callable

from kio.schema.errors import ErrorCode

from mesh.kafka.build import make
from mesh.kafka.codec import BadRequest, decode_request, encode_response, peek_header, response_class
from mesh.kafka.context import Deferred, RequestContext

__all__ = ["KafkaServer", "ServerLimits", "Registry", "OpenAuthorizer"]

log = logging.getLogger("mesh.kafka.server")

API_VERSIONS = 18
_PRODUCE_KEY = b"\0\0"   # a frame's first two bytes: API key 0
_CLOSE = object()
_INTO_MAX = 1 << 20   # frames up to this size are read into one buffer (_recv_into)


@dataclass(frozen=True)
class ServerLimits:
    max_request_bytes: int = 100 << 20     # socket.request.max.bytes
    max_queued_requests: int = 16          # per connection (queued.max.requests)
    max_connections: int = 1024
    max_connections_per_ip: int = 0        # max.connections.per.ip (0 = unbounded, as Kafka's default)
    max_queued_bytes: int = 256 << 20      # requests read or queued, all connections (queued.max.request.bytes)
    send_timeout_s: float = 30.0
    idle_timeout_s: float = 600.0          # connections.max.idle.ms
    max_pipelined: int = 8                 # produce requests of one connection in flight at once


class _Budget:
    """Bytes of requests being read or queued, all connections together (Kafka's
    ``queued.max.request.bytes``): a reader waits for room before it reads a request's body,
    so many connections each announcing a large request cannot together exhaust memory."""

    def __init__(self, limit: int) -> None:
        self.limit, self.used = limit, 0
        self._cond = threading.Condition()

    def take(self, n: int, gone) -> bool:
        with self._cond:
            while self.used and self.used + n > self.limit:
                if gone():
                    return False
                self._cond.wait(0.5)
            self.used += n
            return True

    def give(self, n: int) -> None:
        with self._cond:
            self.used -= n
            self._cond.notify_all()


class OpenAuthorizer:
    """An open listener: everything is allowed."""

    def allowed(self, principal, operation, resource_type, name) -> bool:
        return True


class Registry:
    """Handlers by API key, with the version range each serves; ApiVersions answers from it."""

    def __init__(self) -> None:
        self.handlers: dict[int, tuple[int, int, Callable]] = {}

    def register(self, api_key: int, min_version: int, max_version: int, handler: Callable) -> None:
        self.handlers[api_key] = (min_version, max_version, handler)

    def versions(self) -> list[tuple[int, int, int]]:
        return sorted((k, lo, hi) for k, (lo, hi, _) in self.handlers.items())

    def lookup(self, api_key: int, version: int) -> Callable | None:
        entry = self.handlers.get(api_key)
        if entry is None or not entry[0] <= version <= entry[1]:
            return None
        return entry[2]


class KafkaServer:
    def __init__(self, host: str, port: int, registry: Registry, cluster, links, *, authorizer=None,
                 limits: ServerLimits = ServerLimits(), auth: Callable | None = None, ssl_context=None) -> None:
        self.ssl_context = ssl_context
        self.registry = registry
        self.cluster = cluster
        self.links = links
        self.authorizer = authorizer or OpenAuthorizer()
        self.limits = limits
        self.auth = auth
        self.memory = _Budget(max(limits.max_queued_bytes, limits.max_request_bytes))
        self._sock = socket.create_server((host, port), reuse_port=False, backlog=128)
        self._sock.settimeout(0.5)
        self.port = self._sock.getsockname()[1]
        self._conns: set[_Connection] = set()
        self._per_ip: collections.Counter = collections.Counter()   # open connections by source address
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._ids = itertools.count(1)
        self._errors_logged: dict[str, float] = {}
        self._thread = threading.Thread(target=self._accept, name="kafka-accept", daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                sock, peer = self._sock.accept()
            except (socket.timeout, InterruptedError):
                continue
            except OSError:
                if self._stop.is_set():
                    return
                time.sleep(0.05)   # EMFILE and friends: do not spin
                continue
            per_ip = self.limits.max_connections_per_ip
            with self._lock:
                full = len(self._conns) >= self.limits.max_connections
                ip_full = bool(per_ip) and self._per_ip[peer[0]] >= per_ip
            if full or ip_full:
                if full:
                    self.log_once("connections", "at most %d Kafka connections: one more from %s closed",
                                  self.limits.max_connections, peer[0])
                else:
                    self.log_once("connections per ip", "at most %d Kafka connections from one address "
                                  "(--max-connections-per-ip): one more from %s closed", per_ip, peer[0])
                sock.close()
                continue
            if self.ssl_context is not None:   # the handshake is the reader's (a slow client holds no one else)
                try:
                    sock = self.ssl_context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
                except OSError:
                    sock.close()
                    continue
            conn = _Connection(self, sock, peer[0], next(self._ids))
            with self._lock:
                self._conns.add(conn)
                self._per_ip[conn.peer] += 1
            conn.start()

    def forget(self, conn: "_Connection") -> None:
        with self._lock:
            if conn in self._conns:
                self._conns.discard(conn)
                self._per_ip[conn.peer] -= 1
                if self._per_ip[conn.peer] <= 0:
                    del self._per_ip[conn.peer]

    def log_once(self, what: str, fmt: str, *args, level: int = logging.WARNING) -> None:
        """At most one line per ``what`` a minute: a client cannot flood the log."""
        now = time.monotonic()
        if now - self._errors_logged.get(what, -1e9) >= 60.0:
            self._errors_logged[what] = now
            if len(self._errors_logged) > 1000:
                self._errors_logged.clear()
            log.log(level, fmt, *args)

    def close(self) -> None:
        self._stop.set()
        try:
            self._sock.close()
        except OSError:
            pass
        with self._lock:
            conns = list(self._conns)
        for c in conns:
            c.close()
        self._thread.join(2.0)
        for c in conns:
            c.join(2.0)


class _Connection:
    def __init__(self, server: KafkaServer, sock: socket.socket, peer: str, cid: int) -> None:
        self.server = server
        self.sock = sock
        self.peer = peer
        self.cid = cid
        self.limits = server.limits
        sock.settimeout(server.limits.send_timeout_s)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.queue: queue.Queue = queue.Queue(server.limits.max_queued_requests)
        self._bytes = 0                   # queued request bytes
        self._room = threading.Condition()
        self._closed = False
        self.session: dict = {}
        self.auth = server.auth(self) if server.auth is not None else None
        self.handlers = self.auth.handlers() if self.auth is not None else {}
        self._reader = threading.Thread(target=self._read_loop, name=f"kafka-read-{cid}", daemon=True)
        self._worker = threading.Thread(target=self._work_loop, name=f"kafka-work-{cid}", daemon=True)

    def start(self) -> None:
        self._reader.start()
        self._worker.start()

    def join(self, timeout_s: float) -> None:
        self._reader.join(timeout_s)
        self._worker.join(timeout_s)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        try:
            self.sock.close()
        except OSError:
            pass
        with self._room:
            self._room.notify_all()
        try:
            self.queue.put_nowait(_CLOSE)
        except queue.Full:
            pass
        self.server.forget(self)

    # -- reading ----------------------------------------------------------------------------
    def _recv_exact(self, n: int) -> bytes | None:
        """``n`` bytes, read in chunks of at most 1 MiB: memory grows with what arrives,
        not with what a size prefix claims."""
        if n <= _INTO_MAX:
            return self._recv_into(n)
        chunks = []
        got = 0
        idle_since = time.monotonic()
        while got < n:
            try:
                chunk = self.sock.recv(min(n - got, 1 << 20))
            except socket.timeout:
                if self._closed or time.monotonic() - idle_since > self.limits.idle_timeout_s:
                    return None
                continue
            except OSError:
                return None
            if not chunk:
                return None
            chunks.append(chunk)
            got += len(chunk)
            idle_since = time.monotonic()
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    def _recv_into(self, n: int) -> bytes | None:
        """``_recv_exact`` of a frame up to ``_INTO_MAX``, into one buffer: ``recv(k)`` makes a
        k-byte object for each read and shrinks it to what arrived (a 256 KiB produce request
        came in a dozen reads, each a fresh large allocation, then a join). The buffer is no
        larger than the first ``recv`` of the chunked path would be."""
        buf = bytearray(n)
        view = memoryview(buf)
        got = 0
        idle_since = time.monotonic()
        try:
            while got < n:
                try:
                    k = self.sock.recv_into(view[got:])
                except socket.timeout:
                    if self._closed or time.monotonic() - idle_since > self.limits.idle_timeout_s:
                        return None
                    continue
                except OSError:
                    return None
                if not k:
                    return None
                got += k
                idle_since = time.monotonic()
        finally:
            view.release()
        return bytes(buf)

    def _read_loop(self) -> None:
        try:
            if self.server.ssl_context is not None:
                try:
                    self.sock.do_handshake()
                except (OSError, ValueError) as exc:
                    # once a minute per address and kind of failure (a plaintext client's line
                    # must not hide another client's different failure)
                    self.server.log_once(f"tls:{self.peer}:{type(exc).__name__}:{getattr(exc, 'reason', '')}",
                                         "Kafka connection from %s: TLS handshake failed: %s", self.peer, exc)
                    return
            while not self._closed:
                head = self._recv_exact(4)
                if head is None:
                    break
                size = int.from_bytes(head, "big", signed=True)
                if size < 4 + 4 or size > self.limits.max_request_bytes:   # key, version, correlation id
                    self.server.log_once(f"size:{self.peer}", "Kafka connection from %s: a request of %d bytes "
                                         "(socket.request.max.bytes=%d): closed", self.peer, size,
                                         self.limits.max_request_bytes)
                    break
                with self._room:   # wait for room (bytes); the queue bounds the count
                    while not self._closed and self._bytes and self._bytes + size > self.limits.max_request_bytes:
                        self._room.wait(0.5)
                    self._bytes += size
                if not self.server.memory.take(size, lambda: self._closed):
                    break
                frame = self._recv_exact(size)
                if frame is None:
                    self.server.memory.give(size)
                    break
                queued = False
                while not self._closed and not queued:
                    try:
                        self.queue.put(frame, timeout=0.5)
                        queued = True
                    except queue.Full:
                        continue
                if not queued:
                    self.server.memory.give(size)
        finally:
            try:
                self.queue.put(_CLOSE, timeout=self.limits.send_timeout_s)
            except queue.Full:
                self.close()

    # -- working ----------------------------------------------------------------------------
    def _work_loop(self) -> None:
        pending: collections.deque = collections.deque()   # (api key, version, corr, Deferred), in order
        try:
            while True:
                if pending and (len(pending) >= self.limits.max_pipelined or self.queue.empty()):
                    if not self._finish(pending.popleft()):
                        break
                    continue
                frame = self.queue.get()
                if frame is _CLOSE:
                    while pending and self._finish(pending.popleft()):
                        pass
                    break
                with self._room:
                    self._bytes -= len(frame)
                    self._room.notify_all()
                self.server.memory.give(len(frame))
                if pending and frame[:2] != _PRODUCE_KEY:   # only produce requests overlap
                    while pending:
                        if not self._finish(pending.popleft()):
                            return
                if not self._serve(frame, pending):
                    break
        finally:
            self.close()
            self.server.links.release()
            while True:   # what the reader queued and nobody will serve: its bytes back to the budget
                try:
                    left = self.queue.get_nowait()
                except queue.Empty:
                    break
                if left is not _CLOSE:
                    self.server.memory.give(len(left))

    def _finish(self, item) -> bool:
        api_key, version, corr, deferred = item
        try:
            response = deferred.finish()
        except Exception as exc:
            self.server.log_once(f"handler:{api_key}", "Kafka API %d v%d handler failed: %s: %s", api_key,
                                 version, type(exc).__name__, exc, level=logging.ERROR)
            return False
        return self._answer(api_key, version, corr, response)

    def _answer(self, api_key: int, version: int, corr: int, response) -> bool:
        if response is None:
            return True
        try:
            out = encode_response(api_key, version, corr, response)
        except Exception as exc:
            self.server.log_once(f"encode:{api_key}", "Kafka API %d v%d answer does not encode: %s: %s",
                                 api_key, version, type(exc).__name__, exc, level=logging.ERROR)
            return False
        return self._send(out)

    def _serve(self, frame: bytes, pending: collections.deque) -> bool:
        """Answer one request (or queue its ``Deferred`` answer on ``pending``); False:
        close the connection."""
        try:
            api_key, version, corr = peek_header(frame)
        except BadRequest as exc:
            self.server.log_once(f"bad:{self.peer}", "Kafka connection from %s: %s: closed", self.peer, exc)
            return False
        handler = self.server.registry.lookup(api_key, version)   # the version range is the registry's
        if handler is not None and api_key in self.handlers:
            handler = self.handlers[api_key]   # the connection's own (SASL)
        if self.auth is not None and not self.auth.done and getattr(self.auth, "expired", lambda: False)():
            self.server.log_once(f"authtime:{self.peer}", "Kafka connection from %s: not authenticated in time: "
                                 "closed", self.peer)
            return False
        if self.auth is not None and not self.auth.done and not self._allowed_before_auth(api_key):
            self.server.log_once(f"auth:{self.peer}", "Kafka connection from %s: API %d before authentication: "
                                 "closed", self.peer, api_key)
            return False
        if handler is None:
            if api_key == API_VERSIONS:
                return self._send(self._unsupported_api_versions(corr))
            self.server.log_once(f"unsupported:{self.peer}:{api_key}:{version}",
                                 "Kafka connection from %s: API %d version %d is not served: closed",
                                 self.peer, api_key, version)
            return False
        try:
            header, request = decode_request(frame, api_key, version)
        except BadRequest as exc:
            self.server.log_once(f"decode:{self.peer}", "Kafka connection from %s: %s: closed", self.peer, exc)
            return False
        principal = getattr(self.auth, "principal", None) if self.auth is not None else None
        ctx = RequestContext(api_key=api_key, api_version=version, correlation_id=corr,
                             client_id=getattr(header, "client_id", None), principal=principal,
                             peer_host=self.peer, cluster=self.server.cluster,
                             authorizer=self.server.authorizer, mesh=self.server.links.get(),
                             session=self.session)
        try:
            response = handler(ctx, request)
        except Exception as exc:   # a handler's bug: this connection ends, the listener goes on
            self.server.log_once(f"handler:{api_key}", "Kafka API %d v%d handler failed: %s: %s", api_key,
                                 version, type(exc).__name__, exc, level=logging.ERROR)
            log.debug("handler failure", exc_info=True)
            return False
        if isinstance(response, Deferred):
            pending.append((api_key, version, corr, response))
            return True
        if not self._answer(api_key, version, corr, response):
            return False
        if self.auth is not None and getattr(self.auth, "failed", False):
            return False
        return True

    def _allowed_before_auth(self, api_key: int) -> bool:
        allowed = getattr(self.auth, "allowed_before_auth", None)
        if allowed is None:
            from mesh.kafka.sasl import allowed_before_auth as allowed   # (H8's module)
        return allowed(api_key)

    def _unsupported_api_versions(self, corr: int) -> bytes:
        cls = response_class(API_VERSIONS, 0)
        resp = make(cls, {"error_code": ErrorCode.unsupported_version, "api_keys": self.api_keys()})
        return encode_response(API_VERSIONS, 0, corr, resp)

    def api_keys(self) -> list[dict]:
        return [{"api_key": k, "min_version": lo, "max_version": hi} for k, lo, hi in self.server.registry.versions()]

    def _send(self, data: bytes) -> bool:
        try:
            self.sock.sendall(data)
            return True
        except socket.timeout:
            self.server.log_once(f"slow:{self.peer}", "Kafka connection from %s does not read its answers "
                                 "(%.0f s): closed", self.peer, self.limits.send_timeout_s)
            return False
        except OSError:
            return False
