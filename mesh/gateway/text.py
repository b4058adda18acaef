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
nothing for it (``socket`` is None).

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

import base64
import json
import logging
import threading
import time

import zmq

from mesh.wire.errors import MeshError

__all__ = ["TextGateway", "parse_message", "parse_partitions", "MAX_LINE_BYTES"]

log = logging.getLogger("mesh.gateway.text")

MAX_LINE_BYTES = (1 << 20) + (64 << 10)
MAX_CONNECTIONS = 256
MAX_SUBSCRIPTIONS_PER_CONNECTION = 16
CONS_MAX_RECORDS = 1000
CONS_MAX_BYTES = 1 << 20
CONS_WAIT_MS = 500
PUBS_TIMEOUT_S = 15.0
POLL_MS = 100
SESSION_TIMEOUT_MS = 10_000
HELP = ["PUBS <topic> <message>                    -> OK <partition> <offset>",
        "SUBS <topic> <group> [<partitions>]       -> OK <subscription id>",
        "CONS <topic> <subscription id> [<offset>] -> records, then END",
        "QUIT"]


class _Bad(Exception):
    """A bad command line: answered ``ERR <reason>``."""


def parse_message(text: str) -> tuple[bytes | None, bytes, list]:
    """(key, value, headers) of a PUBS message (see the module docstring)."""
    if text.startswith("{"):
        try:
            obj = json.loads(text)
        except ValueError:
            obj = None
        if isinstance(obj, dict):
            fields = {k.lower(): v for k, v in obj.items() if isinstance(k, str)}
            if fields.keys() & {"header", "key", "body"}:
                key = fields.get("key")
                body = fields.get("body", "")
                header = fields.get("header")
                if header is None:
                    headers = []
                elif isinstance(header, dict):
                    headers = [(str(k), _text_bytes(v)) for k, v in header.items()]
                else:
                    headers = [("Header", _text_bytes(header))]
                return (None if key is None else _text_bytes(key)), _text_bytes(body), headers
    return None, text.encode(), []


def _text_bytes(v) -> bytes:
    return (v if isinstance(v, str) else json.dumps(v, separators=(",", ":"))).encode()


def parse_partitions(spec: str, count: int) -> list[int]:
    """``0,3,5-7`` -> [0, 3, 5, 6, 7], each within [0, count)."""
    out: set[int] = set()
    for part in spec.split(","):
        lo, dash, hi = part.strip().partition("-")
        if not lo.isdigit() or (dash and not hi.isdigit()):
            raise _Bad(f"partitions must look like 0,3,5-7, not {spec[:40]!r}")
        a, b = int(lo), int(hi) if dash else int(lo)
        if a > b or b >= count:
            raise _Bad(f"partitions {part!r}: the topic has partitions 0..{count - 1}")
        out.update(range(a, b + 1))
    return sorted(out)


def _record_line(r) -> bytes:
    obj: dict = {}
    if r.key is not None:
        obj["Key"] = _decode(r.key)
    if r.headers:
        if len(r.headers) == 1 and r.headers[0][0] == "Header":
            obj["Header"] = _decode(r.headers[0][1])
        else:
            obj["Header"] = {k: _decode(v) for k, v in r.headers}
    try:
        obj["Body"] = r.value.decode()
    except UnicodeDecodeError:
        obj["BodyBase64"] = base64.b64encode(r.value).decode()
    obj["Timestamp"] = r.timestamp
    return f"{r.partition} {r.offset} {json.dumps(obj, ensure_ascii=False)}".encode()


def _decode(b: bytes) -> str:
    return b.decode(errors="replace")


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
    """Serves the text protocol for ``node`` on ``port`` (see the module docstring)."""

    def __init__(self, node, port: int):
        self.node = node
        self.address = node.address
        host = node.address.rpartition(":")[0] or "127.0.0.1"
        self._sock = zmq.Context.instance().socket(zmq.STREAM)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.SNDHWM, 10_000)
        self._sock.setsockopt(zmq.RCVHWM, 10_000)
        self._sock.bind(f"tcp://{host}:{port}")
        self.port = port
        self.socket = None   # served by our own thread: the node loop polls nothing
        self._conns: dict[bytes, _Connection] = {}
        self._producer = None
        self._next_sub = 1
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="mesh-text", daemon=True)
        self._thread.start()
        log.info("text protocol on %s:%d", host, port)

    # -- node hooks ---------------------------------------------------------------------
    def on_readable(self) -> None:
        """Unused: the gateway's own thread serves the socket."""

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
                    out.append(f"ERR line longer than {MAX_LINE_BYTES} bytes".encode())
                break
            raw = bytes(conn.buf[:nl])
            del conn.buf[:nl + 1]
            if len(raw) > MAX_LINE_BYTES:
                self._flush_pubs(pubs, out)
                out.append(f"ERR line longer than {MAX_LINE_BYTES} bytes".encode())
                continue
            line = raw.rstrip(b"\r")
            if not line.strip():
                continue
            try:
                text = line.decode()
            except UnicodeDecodeError:
                self._flush_pubs(pubs, out)
                out.append(b"ERR the line is not UTF-8")
                continue
            cmd, _, rest = text.lstrip().partition(" ")
            cmd = cmd.upper()
            if cmd == "PUBS":
                pubs.append(self._pubs(rest))
                continue
            self._flush_pubs(pubs, out)
            if cmd == "QUIT":
                out.append(b"BYE")
                self._write(conn, out)
                self._drop(conn, graceful=True)
                return
            try:
                if cmd == "SUBS":
                    out.append(self._subs(conn, rest))
                elif cmd == "CONS":
                    out.extend(self._cons(conn, rest))
                elif cmd == "HELP":
                    out.extend(h.encode() for h in HELP)
                    out.append(b"END")
                else:
                    raise _Bad(f"unknown command {cmd[:20]!r}; try HELP")
            except _Bad as exc:
                out.append(f"ERR {exc}".encode())
            except MeshError as exc:
                out.append(f"ERR {exc.code.name}: {exc.message}".encode())
            except Exception as exc:  # a bug: answer it, keep the connection and the gateway
                log.exception("text command %r failed", text[:80])
                out.append(f"ERR internal error: {exc}".encode())
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
    def _pubs(self, rest: str):
        topic, _, message = rest.partition(" ")
        if not topic or not message:
            return _Bad("usage: PUBS <topic> <message>")
        key, value, headers = parse_message(message)
        try:
            return self._producer_().send(topic, value, key=key, headers=headers or None)
        except MeshError as exc:
            return exc

    def _flush_pubs(self, pubs: list, out: list[bytes]) -> None:
        for item in pubs:
            if isinstance(item, _Bad):
                out.append(f"ERR {item}".encode())
            elif isinstance(item, MeshError):
                out.append(f"ERR {item.code.name}: {item.message}".encode())
            else:
                try:
                    md = item.get(timeout=PUBS_TIMEOUT_S)
                    out.append(f"OK {md.partition} {md.offset}".encode())
                except MeshError as exc:
                    out.append(f"ERR {exc.code.name}: {exc.message}".encode())
                except Exception as exc:   # a timeout of the future
                    out.append(f"ERR TIMEOUT: {exc or 'no acknowledgement'}".encode())
        pubs.clear()

    def _producer_(self):
        if self._producer is None:
            from mesh.client import Producer
            self._producer = Producer(self.address, acks=1, linger_ms=1, delivery_timeout_ms=10_000,
                                      request_timeout_ms=5_000, client_id="text-gateway")
        return self._producer

    def _subs(self, conn: _Connection, rest: str) -> bytes:
        args = rest.split()
        if len(args) not in (2, 3):
            raise _Bad("usage: SUBS <topic> <group> [<partitions>]")
        if len(conn.subs) >= MAX_SUBSCRIPTIONS_PER_CONNECTION:
            raise _Bad(f"at most {MAX_SUBSCRIPTIONS_PER_CONNECTION} subscriptions per connection")
        topic, group = args[0], args[1]
        from mesh.client import Consumer
        consumer = Consumer(bootstrap=self.address, auto_offset_reset="earliest", group_id=group,
                            enable_auto_commit=True, auto_commit_interval_ms=0, commit_on_close=False,
                            session_timeout_ms=self._session_timeout_ms())
        try:
            count = consumer.cluster.partitions(topic)
            if len(args) == 3:
                consumer.assign([(topic, p) for p in parse_partitions(args[2], count)])
            else:
                consumer.subscribe([topic])
        except BaseException:
            consumer.close()
            raise
        sub_id = str(self._next_sub)
        self._next_sub += 1
        conn.subs[sub_id] = _Subscription(sub_id, topic, group, consumer)
        return f"OK {sub_id}".encode()

    def _session_timeout_ms(self) -> int:
        """10 s, or less if this node allows less (members may not ask for more)."""
        groups = getattr(self.node, "groups", None)
        limit = groups.config.max_session_timeout_ms if groups is not None else SESSION_TIMEOUT_MS
        return min(SESSION_TIMEOUT_MS, limit)

    def _cons(self, conn: _Connection, rest: str) -> list[bytes]:
        args = rest.split()
        if len(args) not in (2, 3):
            raise _Bad("usage: CONS <topic> <subscription id> [<offset>]")
        sub = conn.subs.get(args[1])
        if sub is None:
            raise _Bad(f"no subscription {args[1][:20]!r} on this connection (SUBS first)")
        if sub.topic != args[0]:
            raise _Bad(f"subscription {sub.id} is for topic {sub.topic!r}, not {args[0][:60]!r}")
        consumer = sub.consumer
        if len(args) == 3:
            if not args[2].isdigit():
                raise _Bad(f"offset must be a non-negative integer, not {args[2][:20]!r}")
            held = consumer.assignment()
            if not held:
                raise _Bad("the subscription holds no partition yet (the group is assigning): retry")
            for tp in held:
                consumer.seek(tp, int(args[2]))
        out: list[bytes] = []
        size = 0
        cut: set = set()   # partitions sought back to their first record not sent
        deadline = time.monotonic() + CONS_WAIT_MS / 1000
        while not out:
            left_ms = int((deadline - time.monotonic()) * 1000)
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
                    line = _record_line(r)
                    out.append(line)
                    size += len(line) + 1
        out.append(b"END")
        return out
