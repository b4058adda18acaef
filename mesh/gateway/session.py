"""One text-protocol connection: its thread, its lines, its client objects.

Theory of operation
-------------------
A ``Session`` is a thread that owns one accepted TCP socket and everything its commands
need: a ``Producer`` (made at the first PUBS) and one ``Consumer`` per subscription, all
on the gateway's own ZeroMQ context. Nothing is shared with other sessions except the
gateway's counters (connections, subscriptions), so whatever blocks here (a CONS waiting
for records or for a group assignment, a PUBS waiting for a leader, a client that does not
read) blocks this connection only (see ``mesh.gateway.text`` for the commands).

The thread reads with a short timeout (``READ_POLL_S``) so it notices the gateway
stopping and its own idle time, which counts from the end of the last complete command
(or from the connection's start): blank lines, and the bytes of a line not finished yet,
are no command. After ``idle_timeout_ms`` without one it answers ``ERR idle for <ms> ms:
closing`` and closes, so a line that was started must be finished within
``idle_timeout_ms`` of the previous command (else ``ERR idle for <ms> ms (a line was
started and not finished): closing``): a client that trickles bytes (one a second, never a
newline) holds its slot no longer than a silent one, and the gateway's eviction of idle
connections counts the same way (``idle_ms``). Complete lines are served in order; consecutive
PUBS lines already received are sent together (at most ``MAX_PIPELINED_PUBS``) and
answered in order. Answers are written with ``WRITE_TIMEOUT_S``: a client that does not
take them is disconnected. When the session ends its subscriptions close (leaving their
groups; abandoned, without commit or leave, when the node is going away), its producer
is flushed for at most a second and closed, and the gateway forgets it. A producer whose
I/O thread failed is dropped (closed) at the next PUBS, which makes a new one.

CONS is at-least-once: the records a CONS takes from its consumer count as consumed (the
next CONS commits them), so if the CONS fails after taking them (anything raised before
its answer is built), each partition it took from is sought back to the first record it
took, and the next CONS delivers them again.
"""
from __future__ import annotations

import logging
import socket
import threading
from dataclasses import dataclass

import zmq

from mesh.gateway.protocol import (
    BYE, END, MAX_LINE_BYTES, NOT_UTF8, BadCommand, Cons, Help, Invalid, Pubs, Quit, Subs,
    error_line, help_lines, line_too_long, mesh_error_line, ok_published, ok_subscribed,
    parse_command, parse_message, parse_offset, parse_partitions, pubs_error_line, record_line,
)
from mesh.wire.errors import MeshError

__all__ = ["Limits", "Session"]

log = logging.getLogger("mesh.gateway.text")

READ_POLL_S = 0.25
READ_CHUNK_BYTES = 64 << 10
WRITE_TIMEOUT_S = 10.0
MAX_PIPELINED_PUBS = 1000
CONS_MAX_RECORDS = 1000
CONS_MAX_BYTES = 1 << 20
SUBSCRIPTION_FETCH_BYTES = 1 << 20   # a subscription's fetches (its read-ahead is about two of them)
CONS_WAIT_MS = 500
JOIN_WAIT_MS = 5_000          # a CONS of a member with no partitions yet waits for them this long
CONS_SLICE_MS = 100
PUBS_TIMEOUT_S = 15.0
PRODUCER_BUFFER_BYTES = 8 << 20
PRODUCER_MAX_BLOCK_MS = 10_000


@dataclass(frozen=True, slots=True)
class Limits:
    idle_timeout_ms: int
    max_subscriptions_per_connection: int
    max_subscriptions: int
    session_timeout_ms: int


class _Gone(Exception):
    """The client is gone or does not read: end the session."""


class _Subscription:
    def __init__(self, sub_id: str, topic: str, group: str, consumer):
        self.id, self.topic, self.group, self.consumer = sub_id, topic, group, consumer
        self.pending_offset: int | None = None   # a CONS offset for partitions not given yet

    def close(self, graceful: bool) -> None:
        if not graceful and self.consumer._group is not None:
            self.consumer._group.abandon()   # the node is going away: no commit, no leave
        try:
            self.consumer.close()
        except Exception as exc:  # closing must never take the gateway down
            log.warning("closing subscription %s: %s", self.id, exc)


class Session(threading.Thread):
    """One connection (see the module docstring). ``gateway`` is the ``TextGateway``."""

    def __init__(self, gateway, sock: socket.socket, peer):
        super().__init__(name=f"mesh-text-{peer[1] if isinstance(peer, tuple) else peer}", daemon=True)
        self.gw = gateway
        self.sock = sock
        self.peer = peer
        self.buf = bytearray()
        self.discarding = False        # inside an over-long line: skip to its newline
        self.subs: dict[str, _Subscription] = {}
        self._next_sub = 0
        self.producer = None
        self._stop_event = threading.Event()
        self._logged_bug = False
        self.last_ms = gateway.now_ms()   # the end of the last complete command (or the start)
        self.busy = False                 # serving a command (never idle then)
        self.evicted = False

    def stop(self) -> None:
        self._stop_event.set()

    def idle_ms(self, now_ms: int) -> int:
        """How long since the client's last complete command, with nothing in progress (0
        while serving one); bytes of an unfinished line and blank lines do not count."""
        return 0 if self.busy else now_ms - self.last_ms

    def evict(self) -> None:
        """Close this (idle) connection to make room for a new one."""
        self.evicted = True
        self._stop_event.set()

    def _stopping(self) -> bool:
        return self._stop_event.is_set() or self.gw.stopping()

    # -- the thread -----------------------------------------------------------------------
    def run(self) -> None:
        try:
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._serve()
        except _Gone:
            pass
        except Exception:   # a bug: this connection ends, the gateway and the node go on
            log.exception("text session %s failed", self.peer)
        finally:
            self._end()

    def _serve(self) -> None:
        idle_ms = self.gw.limits.idle_timeout_ms
        self.last_ms = self.gw.now_ms()
        while not self._stopping():
            self.sock.settimeout(READ_POLL_S)
            try:
                data = self.sock.recv(READ_CHUNK_BYTES)
            except socket.timeout:
                data = None
            except OSError:
                return
            if data is not None:
                if not data:
                    return
                self.busy = True
                try:
                    commands, more = self._feed(data)
                finally:
                    self.busy = False
                if commands:
                    self.last_ms = self.gw.now_ms()
                if not more:
                    return
            # checked after every read, not only a silent one: bytes that trickle in are no command
            if self.gw.now_ms() - self.last_ms >= idle_ms:
                unfinished = " (a line was started and not finished)" if self.buf or self.discarding else ""
                self._write([error_line(f"idle for {idle_ms} ms{unfinished}: closing")])
                return
        if self.evicted:
            self._write([error_line("idle while the gateway is full: closing to make room")])

    def _end(self) -> None:
        graceful = not self.gw.stopping()
        for sub in self.subs.values():
            sub.close(graceful)
            self.gw.release_subscription()
        self.subs.clear()
        if self.producer is not None:
            try:
                self.producer.close(timeout=1)
            except Exception as exc:
                log.warning("text session %s: closing its producer: %s", self.peer, exc)
        try:
            self.sock.close()
        except OSError:
            pass
        self.gw.session_ended(self)

    def _write(self, lines: list[bytes]) -> None:
        if not lines:
            return
        try:
            self.sock.settimeout(WRITE_TIMEOUT_S)
            self.sock.sendall(b"\n".join(lines) + b"\n")
        except OSError as exc:   # gone, or not reading its answers: end the session
            log.debug("text client %s: %s", self.peer, exc)
            raise _Gone() from exc

    # -- lines ----------------------------------------------------------------------------
    def _feed(self, data: bytes) -> tuple[int, bool]:
        """Serve the complete lines received so far: (how many commands, i.e. lines not
        blank, were answered; False after QUIT)."""
        commands = 0
        if self.discarding:
            nl = data.find(b"\n")
            if nl < 0:
                return commands, True
            self.discarding = False
            commands += 1   # the over-long line, answered when it began
            data = data[nl + 1:]
        self.buf += data
        out: list[bytes] = []
        pubs: list = []   # (future or error) of pipelined PUBS, answered in order
        while True:
            nl = self.buf.find(b"\n")
            if nl < 0:
                if len(self.buf) > MAX_LINE_BYTES:
                    self.buf.clear()
                    self.discarding = True
                    self._flush_pubs(pubs, out)
                    out.append(line_too_long())
                break
            raw = bytes(self.buf[:nl])
            del self.buf[:nl + 1]
            if len(raw) > MAX_LINE_BYTES:
                commands += 1
                self._flush_pubs(pubs, out)
                out.append(line_too_long())
                continue
            line = raw.rstrip(b"\r")
            if not line.strip():
                continue   # no command: the idle clock goes on
            commands += 1
            try:
                text = line.decode()
            except UnicodeDecodeError:
                self._flush_pubs(pubs, out)
                out.append(NOT_UTF8)
                continue
            cmd = parse_command(text)
            if isinstance(cmd, Pubs) or (isinstance(cmd, Invalid) and cmd.verb == "PUBS"):
                pubs.append(self._guard(text, self._pubs, cmd))   # answered in order, once sent
                if len(pubs) >= MAX_PIPELINED_PUBS:
                    self._flush_pubs(pubs, out)
                continue
            self._flush_pubs(pubs, out)
            if isinstance(cmd, Quit):
                out.append(BYE)
                self._write(out)
                return commands, False
            result = self._guard(text, self._command, cmd)
            if isinstance(result, Exception):
                out.append(self._error(result))
            else:
                out.extend(result)
            self._write(out)   # answer each command as soon as it is served
            out = []
        self._flush_pubs(pubs, out)
        self._write(out)
        return commands, True

    def _guard(self, text: str, fn, cmd):
        """``fn(cmd)``, or the exception to answer in its place (a bug is logged once per session)."""
        try:
            return fn(cmd)
        except (BadCommand, MeshError) as exc:
            return exc
        except zmq.ZMQError as exc:   # e.g. the gateway's own context is out of sockets
            return BadCommand(f"gateway resources exhausted ({exc}); try again later")
        except Exception as exc:  # a bug: answer it, keep the connection and the gateway
            if not self._logged_bug:
                self._logged_bug = True
                log.exception("text command %r failed", text[:80])
            return BadCommand(f"internal error: {exc}")

    @staticmethod
    def _error(exc: Exception) -> bytes:
        return mesh_error_line(exc) if isinstance(exc, MeshError) else error_line(exc)

    def _command(self, cmd) -> list[bytes]:
        if isinstance(cmd, Invalid):
            raise BadCommand(cmd.reason)
        if isinstance(cmd, Subs):
            return [self._subs(cmd)]
        if isinstance(cmd, Cons):
            return self._cons(cmd)
        if isinstance(cmd, Help):
            return help_lines()
        raise BadCommand("unknown command")

    # -- PUBS -----------------------------------------------------------------------------
    def _pubs(self, cmd: Pubs | Invalid):
        """The future of the send."""
        if isinstance(cmd, Invalid):
            raise BadCommand(cmd.reason)
        key, value, headers = parse_message(cmd.message)
        return self._producer().send(cmd.topic, value, key=key, headers=headers or None)

    def _flush_pubs(self, pubs: list, out: list[bytes]) -> None:
        for item in pubs:
            if isinstance(item, MeshError):   # send() refused it: nothing was queued
                out.append(pubs_error_line(item))
                continue
            if isinstance(item, Exception):
                out.append(self._error(item))
                continue
            try:
                md = item.get(timeout=PUBS_TIMEOUT_S)
                out.append(ok_published(md.partition, md.offset))
            except Exception as exc:   # a MeshError (maybe written or not), or a timeout of the future
                out.append(pubs_error_line(exc))
        pubs.clear()

    def _producer(self):
        if self.producer is not None and self.producer.failed is not None:
            # its I/O thread failed: every send would fail from now on (its futures have
            # failed already, each with its maybe_written): make a new one
            dead, self.producer = self.producer, None
            log.warning("text session %s: its producer failed (%s); making a new one", self.peer, dead.failed)
            try:
                dead.close(timeout=1)
            except Exception as exc:
                log.warning("text session %s: closing its failed producer: %s", self.peer, exc)
        if self.producer is None:
            from mesh.client import Producer
            # the same producer as every client (idempotent, acks=all), with a delivery
            # deadline under PUBS_TIMEOUT_S so PUBS gets the producer's own error, and a
            # smaller buffer: there may be one per connection
            self.producer = Producer(self.gw.address, acks="all", linger_ms=1, delivery_timeout_ms=10_000,
                                     buffer_memory=PRODUCER_BUFFER_BYTES, max_block_ms=PRODUCER_MAX_BLOCK_MS,
                                     context=self.gw.ctx, creds=self.gw.creds)
        return self.producer

    # -- SUBS -----------------------------------------------------------------------------
    def _subs(self, cmd: Subs) -> bytes:
        limits = self.gw.limits
        if len(self.subs) >= limits.max_subscriptions_per_connection:
            raise BadCommand(f"at most {limits.max_subscriptions_per_connection} subscriptions per connection")
        if not self.gw.reserve_subscription():
            raise BadCommand(f"the gateway holds its limit of {limits.max_subscriptions} subscriptions; "
                             f"try again later")
        try:
            from mesh.client import Consumer
            consumer = Consumer(bootstrap=self.gw.address, auto_offset_reset="earliest", group_id=cmd.group,
                                enable_auto_commit=True, auto_commit_interval_ms=0, commit_on_close=False,
                                session_timeout_ms=limits.session_timeout_ms, context=self.gw.ctx,
                                creds=self.gw.creds, fetch_max_bytes=SUBSCRIPTION_FETCH_BYTES,
                                max_partition_fetch_bytes=SUBSCRIPTION_FETCH_BYTES)
            try:
                count = consumer.cluster.partitions(cmd.topic)
                if cmd.partitions is not None:
                    consumer.assign([(cmd.topic, p) for p in parse_partitions(cmd.partitions, count)])
                else:
                    consumer.subscribe([cmd.topic])
            except BaseException:
                consumer.close()
                raise
        except BaseException:
            self.gw.release_subscription()
            raise
        self._next_sub += 1
        sub_id = str(self._next_sub)                # numbered per connection: 1, 2, ...
        self.subs[sub_id] = _Subscription(sub_id, cmd.topic, cmd.group, consumer)
        return ok_subscribed(sub_id)

    # -- CONS -----------------------------------------------------------------------------
    def _cons(self, cmd: Cons) -> list[bytes]:
        sub = self.subs.get(cmd.subscription)
        if sub is None:
            raise BadCommand(f"no subscription {cmd.subscription[:20]!r} on this connection (SUBS first)")
        if sub.topic != cmd.topic:
            raise BadCommand(f"subscription {sub.id} is for topic {sub.topic!r}, not {cmd.topic[:60]!r}")
        consumer = sub.consumer
        if cmd.offset is not None:
            offset = parse_offset(cmd.offset)
            held = consumer.assignment()
            sub.pending_offset = None if held else offset   # none held yet: for the first ones given
            for tp in held:
                consumer.seek(tp, offset)
        out: list[bytes] = []
        taken: dict = {}   # partition -> the first offset this CONS took from the consumer
        try:
            self._take_records(sub, out, taken)
        except BaseException:
            # the records taken count as consumed (the next CONS would commit them), but none
            # is answered: give them back so they are delivered again (at-least-once)
            for tp, offset in taken.items():
                try:
                    consumer.seek(tp, offset)
                except Exception as exc:   # e.g. no longer assigned: its new owner reads from the commit
                    log.warning("text session %s: giving back %s from %d: %s", self.peer, tp, offset, exc)
            raise
        out.append(END)
        return out

    def _take_records(self, sub: _Subscription, out: list[bytes], taken: dict) -> None:
        """Poll ``sub`` into ``out`` (record lines); ``taken`` gets the first offset taken
        of each partition, as soon as it is taken."""
        consumer = sub.consumer
        size = 0
        cut: set = set()   # partitions sought back to their first record not sent
        joining = not consumer.assignment()   # a new member: wait for partitions, then for records
        deadline_ms = self.gw.now_ms() + (JOIN_WAIT_MS if joining else CONS_WAIT_MS)
        while not out and not self._stopping():
            left_ms = deadline_ms - self.gw.now_ms()
            if left_ms <= 0:
                break
            batches = consumer.poll_batches(timeout_ms=min(left_ms, CONS_SLICE_MS), max_records=CONS_MAX_RECORDS)
            for recs in batches:
                taken.setdefault((recs[0].topic, recs[0].partition), recs[0].offset)
            if joining and consumer.assignment():
                joining = False
                deadline_ms = self.gw.now_ms() + CONS_WAIT_MS
                if sub.pending_offset is not None:
                    for tp in consumer.assignment():   # held nothing before: every batch is of these
                        consumer.seek(tp, sub.pending_offset)
                    sub.pending_offset = None
                    taken.clear()   # given back by the seeks: nothing of them is taken now
                    continue
            for recs in batches:
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
