"""The telnet text protocol (after Project Kafkaesque), one command per line.

    PUBS <topic> <message>                    -> OK <partition> <offset>
    SUBS <topic> <group> [<partitions>]       -> OK <subscription id>
    CONS <topic> <subscription id> [<offset>] -> one line per record, then END
    HELP                                      -> the commands, then END
    QUIT                                      -> closes the connection

Theory of operation
-------------------
The gateway is a *client* of its own node: it serves TCP on ``<node host>:<text port>``
with the public client library (``Producer``, ``Consumer`` with a group) pointed at the
node's own address, so the node loop never blocks on it and the text protocol gets
exactly the semantics of the Python client (partitioning, leader redirects, groups,
commits). The node polls nothing for it; it runs it in a process of its own
(``mesh.gateway.process``), so the gateway's per-record Python work never holds the GIL
the node loop needs. Parsing lines and formatting replies is
``mesh.gateway.protocol`` (pure); one connection's commands are ``mesh.gateway.session``;
this module holds the listening socket and the limits.

**One client never stalls another.** Each connection is served by a thread of its own
(``mesh.gateway.session.Session``) with client objects of its own (one ``Producer``,
made at its first PUBS; one ``Consumer`` per SUBS): a CONS waiting for records, a PUBS
waiting for a partition's leader, a client that does not read its answers, each blocks
only its own thread. The number of threads is bounded by the connection limit. (The
alternative, one selector thread with a state machine per connection, would need every
client call to be non-blocking; the client library's calls block, by design.)

**Its own limits, which cannot starve the broker.** The gateway's clients use a ZeroMQ
context of their own (never ``zmq.Context.instance()``, which the broker's sockets use),
capped at ``max_sockets``; at most ``max_connections`` connections. When they are all
taken, a new one closes the connection idle longest if it has been idle (no command in
progress) for ``evict_idle_ms`` (``ERR idle while the gateway is full ...``), so idle
clients cannot lock everyone out; else the new one gets ``ERR too many connections ...``
and is closed. Each is closed after ``idle_timeout_ms`` without a command
(``ERR idle ...``; blank lines and the bytes of an unfinished line are no command, so a line
that was started must be finished within ``idle_timeout_ms`` of the previous command) or
when it does not take its answers within
``WRITE_TIMEOUT_S``; at most ``max_subscriptions_per_connection`` subscriptions per
connection and ``max_subscriptions`` in all (beyond: ``ERR``, the connection stays open).

``<message>``: a JSON object with any of ``Header``, ``Key``, ``Body``, e.g.
``{"Header": "h", "Key": "124", "Body": "Hello World!"}``, is a record whose key is
``Key`` (so the partition is murmur2 of it, as Kafka's), whose value is ``Body``, and
whose headers are ``Header`` (a string becomes one header named "Header"; an object, one
header per entry). ``"Body": null`` is a null value (a tombstone; ``CONS`` shows it as
``"Body": null``, an empty value as ``""``). Anything else is the value of a record with no key. PUBS writes with
acks=all (idempotent), as every other path of the project.

``SUBS`` makes a subscription of this connection: without ``<partitions>`` it joins
consumer group ``<group>`` on ``<topic>`` and shares the topic's partitions with the
group's other members (other SUBS, Python consumers, ``mesh consume --group``); with
``<partitions>`` (``0,3,5-7``; a single number is one partition id, not a count) it reads
exactly those partitions and keeps its offsets in ``<group>`` as a simple consumer (Kafka's
``assign``; such commits are refused while the group has members). A subscription starts
at the group's committed offsets, else at the earliest offset.

``CONS`` returns up to 1000 records (and about 1 MiB) of the subscription, waiting up to
0.5 s for the first (and, while a new group member has no partitions yet, up to 5 s for
its assignment); none is just ``END``. A record line is ``<partition> <offset> <json>``
with ``Key``, ``Header`` (when present), ``Body`` and ``Timestamp``; a value that is not
UTF-8 comes as ``BodyBase64``, and a field that is not bytes at all (only a low-level client
can store one) as ``KeyRepr``/``HeaderRepr``/``BodyRepr`` (``mesh.gateway.protocol``). A
batch that cannot be decoded (stored by an older broker, which did not check columns) is
answered once ``ERR CORRUPT_MESSAGE: ...`` naming it, then skipped (a group member does
not stop on it: ``mesh.client.consumer``). ``<offset>`` moves every partition the subscription holds
to that offset; one that holds none yet (``SUBS`` then ``CONS t <id> 0`` at once) moves
the partitions it is given first. Commits: the records a ``CONS`` returned are committed
when the subscription's next ``CONS`` arrives (the client asking for more is done with
them), so delivery is at-least-once; what the last ``CONS`` of a closed connection
returned is not committed and goes to the next reader. Subscriptions end with their
connection (the member leaves the group at once). As with any group member, a
subscription that is not read (``CONS``) within its session timeout (10 s) loses its
partitions to others and rejoins on its next ``CONS``.

A bad line gets ``ERR <reason>`` and the connection stays open. Lines are at most
``MAX_LINE_BYTES`` (a longer one is answered ERR and skipped up to its newline).
Pipelined PUBS lines are sent together, then answered in order.
"""
from __future__ import annotations

import logging
import socket
import threading
import time
from typing import Callable

import zmq

from mesh.gateway.session import Limits, Session
from mesh.clock import now_ms as _monotonic_ms

__all__ = ["TextGateway", "DEFAULT_MAX_CONNECTIONS", "DEFAULT_IDLE_TIMEOUT_MS", "DEFAULT_EVICT_IDLE_MS",
           "DEFAULT_MAX_SUBSCRIPTIONS", "DEFAULT_MAX_SUBSCRIPTIONS_PER_CONNECTION"]

log = logging.getLogger("mesh.gateway.text")

DEFAULT_MAX_CONNECTIONS = 64
DEFAULT_IDLE_TIMEOUT_MS = 300_000
DEFAULT_MAX_SUBSCRIPTIONS_PER_CONNECTION = 16
DEFAULT_MAX_SUBSCRIPTIONS = 256
DEFAULT_MAX_SOCKETS = 4096     # the gateway's own ZeroMQ context
DEFAULT_EVICT_IDLE_MS = 10_000
SESSION_TIMEOUT_MS = 10_000
ACCEPT_POLL_S = 0.2
CLOSE_WAIT_S = 5.0


class TextGateway:
    """Serves the text protocol on ``port`` for the node at ``address`` (see the module docstring)."""

    def __init__(self, address: str, port: int, max_session_timeout_ms: int = SESSION_TIMEOUT_MS,
                 now_ms: Callable[[], int] = _monotonic_ms, *,
                 max_connections: int = DEFAULT_MAX_CONNECTIONS,
                 idle_timeout_ms: int = DEFAULT_IDLE_TIMEOUT_MS,
                 max_subscriptions_per_connection: int = DEFAULT_MAX_SUBSCRIPTIONS_PER_CONNECTION,
                 max_subscriptions: int = DEFAULT_MAX_SUBSCRIPTIONS,
                 max_sockets: int = DEFAULT_MAX_SOCKETS,
                 evict_idle_ms: int = DEFAULT_EVICT_IDLE_MS, creds=None):
        """Serve on ``port`` of ``address``'s host, as a client of the node at ``address``.
        ``max_session_timeout_ms``: the node's limit for group sessions (subscriptions ask
        for 10 s, or less if the node allows less); ``now_ms``: the node's monotonic clock;
        the rest: the limits of the module docstring."""
        for name, v in (("max_connections", max_connections), ("idle_timeout_ms", idle_timeout_ms),
                        ("max_subscriptions_per_connection", max_subscriptions_per_connection),
                        ("max_subscriptions", max_subscriptions), ("max_sockets", max_sockets),
                        ("evict_idle_ms", evict_idle_ms)):
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"text gateway: {name} must be a positive integer, not {v!r}")
        self.address = address
        self.port = port
        self.max_connections = max_connections
        self.evict_idle_ms = evict_idle_ms
        self.now_ms = now_ms
        self.limits = Limits(idle_timeout_ms=idle_timeout_ms,
                             max_subscriptions_per_connection=max_subscriptions_per_connection,
                             max_subscriptions=max_subscriptions,
                             session_timeout_ms=min(SESSION_TIMEOUT_MS, max_session_timeout_ms))
        host = address.rpartition(":")[0] or "127.0.0.1"
        self._listener = socket.create_server((host, port), backlog=128, reuse_port=False)
        self._listener.settimeout(ACCEPT_POLL_S)
        self.ctx = zmq.Context()               # the gateway's own: never the broker's
        self.creds = creds                      # a secured node: the principal its clients act as
        self.ctx.set(zmq.MAX_SOCKETS, max_sockets)
        self._lock = threading.Lock()
        self._sessions: set[Session] = set()
        self._subscriptions = 0                 # in all sessions, under _lock
        self._stop = threading.Event()
        self.refused = 0                        # connections refused by the limit (a counter)
        self.evicted = 0                        # idle connections closed to make room (a counter)
        self._thread = threading.Thread(target=self._accept_loop, name="mesh-text", daemon=True)
        self._thread.start()
        log.info("text protocol on %s:%d (at most %d connections)", host, port, max_connections)

    # -- node hooks ---------------------------------------------------------------------
    def close(self) -> None:
        """Stop accepting, end every session (subscriptions abandoned: the node is going
        away), and free the gateway's context."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(CLOSE_WAIT_S)
        with self._lock:
            sessions = list(self._sessions)
        for s in sessions:
            s.stop()
        deadline = time.monotonic() + CLOSE_WAIT_S     # for all of them together
        for s in sessions:
            s.join(max(0.0, deadline - time.monotonic()))
        if not any(s.is_alive() for s in sessions):
            self.ctx.destroy(linger=0)

    def connections(self) -> int:
        with self._lock:
            return len(self._sessions)

    # -- what sessions ask of the gateway -------------------------------------------------
    def reserve_subscription(self) -> bool:
        """Count one more subscription; False when the gateway holds ``max_subscriptions``.
        Ids are the session's own (1, 2, ... on each connection)."""
        with self._lock:
            if self._subscriptions >= self.limits.max_subscriptions:
                return False
            self._subscriptions += 1
            return True

    def release_subscription(self) -> None:
        with self._lock:
            self._subscriptions -= 1

    def session_ended(self, session: Session) -> None:
        with self._lock:
            self._sessions.discard(session)

    def stopping(self) -> bool:
        return self._stop.is_set()

    # -- accepting ------------------------------------------------------------------------
    def _accept_loop(self) -> None:
        try:
            while not self._stop.is_set():
                try:
                    conn, peer = self._listener.accept()
                except (socket.timeout, BlockingIOError):
                    continue
                except OSError as exc:   # out of descriptors, a reset before accept: keep serving
                    log.warning("text gateway: accept failed: %s", exc)
                    self._stop.wait(ACCEPT_POLL_S)
                    continue
                self._admit(conn, peer)
        except Exception:   # a bug: never take the node down with it
            log.exception("text gateway stopped accepting")
        finally:
            self._listener.close()

    def _admit(self, conn: socket.socket, peer) -> None:
        with self._lock:
            full = len(self._sessions) >= self.max_connections
            if full:   # make room: the connection idle longest, if it has been idle long enough
                now = self.now_ms()
                victim = max(self._sessions, key=lambda s: s.idle_ms(now), default=None)
                if victim is not None and victim.idle_ms(now) >= self.evict_idle_ms:
                    victim.evict()
                    self._sessions.discard(victim)   # its thread ends within READ_POLL_S
                    self.evicted += 1
                    full = False
            if not full:
                session = Session(self, conn, peer)
                self._sessions.add(session)
        if full:
            self.refused += 1
            try:
                conn.settimeout(1.0)
                conn.sendall(f"ERR too many connections (at most {self.max_connections}); "
                             f"try again later\n".encode())
            except OSError:
                pass
            conn.close()
            return
        try:
            session.start()
        except RuntimeError as exc:   # no thread to be had: refuse this one, keep the rest
            log.warning("text gateway: cannot start a session for %s: %s", peer, exc)
            self.session_ended(session)
            conn.close()
