"""The telnet text protocol (after Project Kafkaesque), one command per line.

    PUBS <topic> <message>                    -> OK <partition> <offset>
    SUBS <topic> <group> [<partitions>]       -> OK <subscription id>
    CONS <topic> <subscription id> [<offset>] -> one line per record, then END
    HELP                                      -> the commands, then END
    QUIT                                      -> closes the connection

Theory of operation
-------------------
The gateway is a *client* of its own node: a thread in the node process owns a ZeroMQ
STREAM socket (raw TCP) bound to ``<node host>:<text port>`` and serves it with the public
client library (``Producer``, ``Consumer`` with a group) pointed at the node's own address,
so the node loop never blocks on it and the text protocol gets exactly the semantics of
the Python client (partitioning, leader redirects, groups, commits). The node polls
nothing for it. Parsing lines and formatting replies is ``mesh.gateway.protocol`` (pure);
this module holds the connections, the subscriptions and the socket.

``<message>``: a JSON object with any of ``Header``, ``Key``, ``Body``, e.g.
``{"Header": "h", "Key": "124", "Body": "Hello World!"}``, is a record whose key is
``Key`` (so the partition is murmur2 of it, as Kafka's), whose value is ``Body``, and
whose headers are ``Header`` (a string becomes one header named "Header"; an object, one
header per entry). Anything else is the value of a record with no key.

``SUBS`` makes a subscription of this connection (at most 16): without ``<partitions>``
it joins consumer group ``<group>`` on ``<topic>`` and shares the topic's partitions with
the group's other members (other SUBS, Python consumers, ``mesh consume --group``); with
``<partitions>`` (``0,3,5-7``; a single number is one partition id, not a count) it reads
exactly those partitions and keeps its offsets in ``<group>`` as a simple consumer (Kafka's
``assign``; such commits are refused while the group has members). A subscription starts
at the group's committed offsets, else at the earliest offset.

``CONS`` returns up to 1000 records (and about 1 MiB) of the subscription, waiting up to
0.5 s for the first; none is just ``END``. A record line is ``<partition> <offset> <json>``
with ``Key``, ``Header`` (when present), ``Body`` and ``Timestamp``; a value that is not
UTF-8 comes as ``BodyBase64``. ``<offset>`` first moves every partition the subscription
holds to that offset. Commits: the records a ``CONS`` returned are committed when the
subscription's next ``CONS`` arrives (the client asking for more is done with them), so
delivery is at-least-once; what the last ``CONS`` of a closed connection returned is not
committed and goes to the next reader. Subscriptions end with their connection (the member
leaves the group at once). As with any group member, a subscription that is not read
(``CONS``) within its session timeout (10 s) loses its partitions to others and rejoins on
its next ``CONS``.

A bad line gets ``ERR <reason>`` and the connection stays open. Limits: lines of at most
``MAX_LINE_BYTES`` (a longer one is answered ERR and skipped up to its newline), 256
connections. The gateway serves one command at a time (a slow CONS delays the others), and
pipelined PUBS lines of one read are sent together, then answered in order.
"""
from __future__ import annotations

import logging
import threading
from typing import Callable

import zmq

from mesh.gateway.protocol import (
    BYE, END, MAX_LINE_BYTES, NOT_UTF8, BadCommand, Cons, Help, Invalid, Pubs, Quit, Subs,
    error_line, help_lines, line_too_long, mesh_error_line, ok_published, ok_subscribed,
    parse_command, parse_message, parse_offset, parse_partitions, record_line, timeout_line,
)
from mesh.node.clock import now_ms as _monotonic_ms
from mesh.wire.errors import MeshError

__all__ = ["TextGateway"]

log = logging.getLogger("mesh.gateway.text")

MAX_CONNECTIONS = 256
MAX_SUBSCRIPTIONS_PER_CONNECTION = 16
CONS_MAX_RECORDS = 1000
CONS_MAX_BYTES = 1 << 20
CONS_WAIT_MS = 500
PUBS_TIMEOUT_S = 15.0
POLL_MS = 100
SESSION_TIMEOUT_MS = 10_000


class _Subscription:
    def __init__(self, sub_id: str, topic: str, group: str, consumer):
        self.id, self.topic, self.group, self.consumer = sub_id, topic, group, consumer

    def close(self, graceful: bool) -> None:
        if not graceful and self.consumer._group is not None:
            self.consumer._group.abandon()   # the node is going away: no commit, no leave
        try:
            self.consumer.close()
        except Exception as exc:  # closing must never take the gateway down
            log.warning("closing subscription %s: %s", self.id, exc)


class _Connection:
    def __init__(self, ident: bytes):
        self.ident = ident
        self.buf = bytearray()
        self.discarding = False        # inside an over-long line: skip to its newline
        self.subs: dict[str, _Subscription] = {}


class TextGateway:
    """Serves the text protocol on ``port`` for the node at ``address`` (see the module docstring)."""

    def __init__(self, address: str, port: int, max_session_timeout_ms: int = SESSION_TIMEOUT_MS,
                 now_ms: Callable[[], int] = _monotonic_ms):
        """Serve on ``port`` of ``address``'s host, as a client of the node at ``address``.
        ``max_session_timeout_ms``: the node's limit for group sessions (subscriptions ask
        for 10 s, or less if the node allows less); ``now_ms``: the node's monotonic clock."""
        self.address = address
        self.max_session_timeout_ms = max_session_timeout_ms
        self.now_ms = now_ms
        host = address.rpartition(":")[0] or "127.0.0.1"
        self._sock = zmq.Context.instance().socket(zmq.STREAM)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.SNDHWM, 10_000)
        self._sock.setsockopt(zmq.RCVHWM, 10_000)
        self._sock.bind(f"tcp://{host}:{port}")
        self.port = port
        self._conns: dict[bytes, _Connection] = {}
        self._producer = None
        self._next_sub = 1
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="mesh-text", daemon=True)
        self._thread.start()
        log.info("text protocol on %s:%d", host, port)

    # -- node hooks ---------------------------------------------------------------------
    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(5)

    # -- the loop -----------------------------------------------------------------------
    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        try:
            while not self._stop.is_set():
                if not poller.poll(POLL_MS):
                    continue
                touched: list[_Connection] = []
                for _ in range(1000):
                    try:
                        ident, data = self._sock.recv_multipart(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    except ValueError:   # not [identity, data]: cannot happen on STREAM
                        continue
                    conn = self._receive(bytes(ident), bytes(data))
                    if conn is not None and conn not in touched:
                        touched.append(conn)
                for conn in touched:
                    if conn.ident in self._conns:
                        self._serve(conn)
        except Exception:
            log.exception("text gateway stopped")
        finally:
            for conn in list(self._conns.values()):
                self._drop(conn, graceful=False)
            if self._producer is not None:
                self._producer.close(timeout=1)
            self._sock.close(linger=0)

    def _receive(self, ident: bytes, data: bytes) -> _Connection | None:
        conn = self._conns.get(ident)
        if not data:   # STREAM: an empty frame is a connect, or a disconnect of a known peer
            if conn is None:
                if len(self._conns) >= MAX_CONNECTIONS:
                    self._send_raw(ident, b"ERR too many connections\n")
                    self._send_raw(ident, b"")
                    return None
                self._conns[ident] = _Connection(ident)
            else:
                self._drop(conn, graceful=True, notify=False)
            return None
        if conn is None:   # data before the connect notification: accept it
            conn = self._conns[ident] = _Connection(ident)
        if conn.discarding:
            nl = data.find(b"\n")
            if nl < 0:
                return None
            conn.discarding = False
            data = data[nl + 1:]
        conn.buf += data
        return conn

    def _serve(self, conn: _Connection) -> None:
        out: list[bytes] = []
        pubs: list = []   # (future or error) of pipelined PUBS, answered in order
        while True:
            nl = conn.buf.find(b"\n")
            if nl < 0:
                if len(conn.buf) > MAX_LINE_BYTES:
                    conn.buf.clear()
                    conn.discarding = True
                    self._flush_pubs(pubs, out)
                    out.append(line_too_long())
                break
            raw = bytes(conn.buf[:nl])
            del conn.buf[:nl + 1]
            if len(raw) > MAX_LINE_BYTES:
                self._flush_pubs(pubs, out)
                out.append(line_too_long())
                continue
            line = raw.rstrip(b"\r")
            if not line.strip():
                continue
            try:
                text = line.decode()
            except UnicodeDecodeError:
                self._flush_pubs(pubs, out)
                out.append(NOT_UTF8)
                continue
            cmd = parse_command(text)
            if isinstance(cmd, Pubs) or (isinstance(cmd, Invalid) and cmd.verb == "PUBS"):
                pubs.append(self._pubs(cmd))   # answered in order, after the batch is sent
                continue
            self._flush_pubs(pubs, out)
            if isinstance(cmd, Quit):
                out.append(BYE)
                self._write(conn, out)
                self._drop(conn, graceful=True)
                return
            try:
                if isinstance(cmd, Invalid):
                    raise BadCommand(cmd.reason)
                if isinstance(cmd, Subs):
                    out.append(self._subs(conn, cmd))
                elif isinstance(cmd, Cons):
                    out.extend(self._cons(conn, cmd))
                elif isinstance(cmd, Help):
                    out.extend(help_lines())
            except BadCommand as exc:
                out.append(error_line(exc))
            except MeshError as exc:
                out.append(mesh_error_line(exc))
            except Exception as exc:  # a bug: answer it, keep the connection and the gateway
                log.exception("text command %r failed", text[:80])
                out.append(error_line(f"internal error: {exc}"))
        self._flush_pubs(pubs, out)
        self._write(conn, out)

    def _write(self, conn: _Connection, lines: list[bytes]) -> None:
        if lines and not self._send_raw(conn.ident, b"\n".join(lines) + b"\n"):
            self._drop(conn, graceful=True)

    def _send_raw(self, ident: bytes, data: bytes) -> bool:
        try:
            self._sock.send_multipart([ident, data], zmq.NOBLOCK)
            return True
        except zmq.ZMQError as exc:   # gone, or not reading: drop the connection
            log.debug("text client %s: %s", ident.hex(), exc)
            return False

    def _drop(self, conn: _Connection, graceful: bool, notify: bool = True) -> None:
        self._conns.pop(conn.ident, None)
        for sub in conn.subs.values():
            sub.close(graceful)
        conn.subs.clear()
        if notify:
            self._send_raw(conn.ident, b"")   # STREAM: an empty frame closes the TCP connection

    # -- commands -----------------------------------------------------------------------
    def _pubs(self, cmd: Pubs | Invalid):
        """The future of the send, or the error to answer in its place."""
        if isinstance(cmd, Invalid):
            return BadCommand(cmd.reason)
        key, value, headers = parse_message(cmd.message)
        try:
            return self._producer_().send(cmd.topic, value, key=key, headers=headers or None)
        except MeshError as exc:
            return exc

    def _flush_pubs(self, pubs: list, out: list[bytes]) -> None:
        for item in pubs:
            if isinstance(item, BadCommand):
                out.append(error_line(item))
            elif isinstance(item, MeshError):
                out.append(mesh_error_line(item))
            else:
                try:
                    md = item.get(timeout=PUBS_TIMEOUT_S)
                    out.append(ok_published(md.partition, md.offset))
                except MeshError as exc:
                    out.append(mesh_error_line(exc))
                except Exception as exc:   # a timeout of the future
                    out.append(timeout_line(exc))
        pubs.clear()

    def _producer_(self):
        if self._producer is None:
            from mesh.client import Producer
            # the same producer as every client (idempotent, acks=all, the default timeouts),
            # with a delivery deadline under PUBS_TIMEOUT_S so PUBS gets the producer's own error
            self._producer = Producer(self.address, acks="all", linger_ms=1, delivery_timeout_ms=10_000)
        return self._producer

    def _subs(self, conn: _Connection, cmd: Subs) -> bytes:
        if len(conn.subs) >= MAX_SUBSCRIPTIONS_PER_CONNECTION:
            raise BadCommand(f"at most {MAX_SUBSCRIPTIONS_PER_CONNECTION} subscriptions per connection")
        topic, group = cmd.topic, cmd.group
        from mesh.client import Consumer
        consumer = Consumer(bootstrap=self.address, auto_offset_reset="earliest", group_id=group,
                            enable_auto_commit=True, auto_commit_interval_ms=0, commit_on_close=False,
                            session_timeout_ms=self._session_timeout_ms())
        try:
            count = consumer.cluster.partitions(topic)
            if cmd.partitions is not None:
                consumer.assign([(topic, p) for p in parse_partitions(cmd.partitions, count)])
            else:
                consumer.subscribe([topic])
        except BaseException:
            consumer.close()
            raise
        sub_id = str(self._next_sub)
        self._next_sub += 1
        conn.subs[sub_id] = _Subscription(sub_id, topic, group, consumer)
        return ok_subscribed(sub_id)

    def _session_timeout_ms(self) -> int:
        """10 s, or less if this node allows less (members may not ask for more)."""
        return min(SESSION_TIMEOUT_MS, self.max_session_timeout_ms)

    def _cons(self, conn: _Connection, cmd: Cons) -> list[bytes]:
        sub = conn.subs.get(cmd.subscription)
        if sub is None:
            raise BadCommand(f"no subscription {cmd.subscription[:20]!r} on this connection (SUBS first)")
        if sub.topic != cmd.topic:
            raise BadCommand(f"subscription {sub.id} is for topic {sub.topic!r}, not {cmd.topic[:60]!r}")
        consumer = sub.consumer
        if cmd.offset is not None:
            offset = parse_offset(cmd.offset)
            held = consumer.assignment()
            if not held:
                raise BadCommand("the subscription holds no partition yet (the group is assigning): retry")
            for tp in held:
                consumer.seek(tp, offset)
        out: list[bytes] = []
        size = 0
        cut: set = set()   # partitions sought back to their first record not sent
        deadline_ms = self.now_ms() + CONS_WAIT_MS
        while not out:
            left_ms = deadline_ms - self.now_ms()
            if left_ms <= 0:
                break
            for recs in consumer.poll_batches(timeout_ms=left_ms, max_records=CONS_MAX_RECORDS):
                tp = (recs[0].topic, recs[0].partition)
                if tp in cut:
                    continue
                for r in recs:
                    if size >= CONS_MAX_BYTES:   # give the rest back: read again next time
                        consumer.seek(tp, r.offset)
                        cut.add(tp)
                        break
                    line = record_line(r)
                    out.append(line)
                    size += len(line) + 1
        out.append(END)
        return out
