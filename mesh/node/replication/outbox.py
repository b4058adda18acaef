"""The send side of the node's ROUTER: bounded backlogs, byte-rate quotas, gone clients.

Theory of operation
-------------------
Every answer to a client goes through ``Outbox.send(ident, frames)`` (or ``send_now``,
the same without its checks, while nothing is held or backlogged: ``busy``):

- Normally it is sent at once (NOBLOCK). ZeroMQ keeps at most ``SNDHWM`` messages per
  client pipe; a full pipe (EAGAIN) puts the answer in the client's backlog, sent in
  order on later turns (``flush``). A backlog holds at most ``max_backlog_bytes`` (but
  always at least one answer): past that, answers to this client are dropped (logged once
  per client, counted in ``dropped``), as NATS drops messages to a slow consumer. So a
  client that never reads costs at most SNDHWM x the largest answer (fetch_max_bytes plus
  one batch) in ZeroMQ plus ``max_backlog_bytes`` here.
- EHOSTUNREACH (the client's pipe is gone: it disconnected, or ZeroMQ heartbeats found it
  dead) drops its backlog and calls ``on_gone(ident)`` once, so the data path forgets the
  fetches it had parked.
- Quotas (Kafka-style, per client identity, 0 = off): ``charge(kind, ident, nbytes)``
  returns how long the client's answer must wait so that its byte rate comes back under
  the quota: a leaky bucket per client that allows a burst of one second's worth. An
  answer with a delay is held in a heap until it is due; a client's later answers queue
  behind it, so order is kept. Held answers count against the same ``max_backlog_bytes``
  per client (but always at least one answer): a throttled client that keeps pipelining
  requests gets the excess answers dropped (counted in ``dropped``; its requests time out
  and are retried), so throttling can never make the broker hold unbounded memory.
  Delaying answers slows a client that waits for them; one that does not (acks=0, or a
  pipeline that ignores its held answers) would write at any rate, so the dispatcher
  refuses its batches (THROTTLED, not written, not charged) while its answers already
  wait (acks=0: it is over its rate and burst) or wait more than 10 s. A batch is judged
  by the debt before it, so one larger than the burst still goes in once the client is
  back under its rate.
- Unread answers (``mesh.node.limits.answer_budget``): answers of at least ``TRACK_MIN_BYTES``
  are sent without copying and tracked until libzmq lets go of them; ``refusal(ident)``
  says when a new fetch answer must not be queued (the client's unread bytes, or the
  node's in all, with backlogs and held answers, are at their bound), and the dispatcher
  answers THROTTLED instead.
"""
from __future__ import annotations

import collections
import errno
import heapq
import logging
from typing import Callable

import zmq

from mesh.node.limits.answer_budget import TRACK_MIN_BYTES, AnswerBudget
from mesh.node.limits.ratelog import RateLimitedLog
from mesh.wire.codec import ZERO_COPY_MIN_BYTES
from mesh.wire.frames import send_frames

__all__ = ["Outbox", "ByteRateQuota"]

log = logging.getLogger("mesh.node.replication.outbox")

_BURST_MS = 1000
_MAX_CLIENTS = 100_000   # quota state is dropped for clients idle past their debt beyond this


class ByteRateQuota:
    """A leaky bucket per client: ``charge`` -> the delay in ms (0 under the rate)."""

    def __init__(self, bytes_per_s: int):
        self.rate_per_ms = bytes_per_s / 1000.0
        self._ready: dict[bytes, float] = {}   # when each client's debt is paid (ms)

    def charge(self, ident: bytes, nbytes: int, now_ms: int) -> int:
        ready = max(self._ready.get(ident, 0.0), now_ms) + nbytes / self.rate_per_ms
        if len(self._ready) >= _MAX_CLIENTS and ident not in self._ready:
            self._ready = {k: t for k, t in self._ready.items() if t > now_ms}
        self._ready[ident] = ready
        return max(0, int(ready - now_ms - _BURST_MS))

    def debt_ms(self, ident: bytes, now_ms: int) -> int:
        """How long the client's answers wait now, before anything more is charged."""
        return max(0, int(self._ready.get(ident, now_ms) - now_ms - _BURST_MS))


class Outbox:
    def __init__(self, router: zmq.Socket, now_ms: Callable[[], int], max_backlog_bytes: int = 4 << 20,
                 produce_bytes_per_s: int = 0, fetch_bytes_per_s: int = 0,
                 budget: AnswerBudget | None = None):
        self.router = router
        self.budget = budget
        self.principal_of: Callable[[bytes], str | None] = lambda ident: None   # secured: the dispatcher's
        self.now_ms = now_ms
        self.max_backlog_bytes = max_backlog_bytes
        self.on_gone: Callable[[bytes], None] = lambda ident: None
        self.quotas = {"produce": ByteRateQuota(produce_bytes_per_s) if produce_bytes_per_s > 0 else None,
                       "fetch": ByteRateQuota(fetch_bytes_per_s) if fetch_bytes_per_s > 0 else None}
        self._backlog: dict[bytes, collections.deque] = {}
        self._backlog_bytes: dict[bytes, int] = {}
        self._held: list[tuple[int, int, bytes, list]] = []   # (due ms, seq, ident, frames)
        self._held_count: dict[bytes, list[int]] = {}   # ident -> [answers held, latest due ms, bytes]
        self._seq = 0
        self.dropped = 0
        self.throttled = 0
        self._rlog = RateLimitedLog(log)

    # -- quotas -------------------------------------------------------------------------
    def charge(self, kind: str, ident: bytes, nbytes: int) -> int:
        """Account ``nbytes`` of ``kind`` ("produce" or "fetch") to the client; the delay (ms)
        its answer must wait (0 when quotas are off or the client is under its rate)."""
        q = self.quotas[kind]
        if q is None:
            return 0
        delay = q.charge(bytes(ident), nbytes, self.now_ms())
        if delay:
            self.throttled += 1
        return delay

    def debt_ms(self, kind: str, ident: bytes) -> int:
        """``ByteRateQuota.debt_ms`` (0 when quotas are off)."""
        q = self.quotas[kind]
        return 0 if q is None else q.debt_ms(bytes(ident), self.now_ms())

    # -- unread answers -----------------------------------------------------------------
    def refusal(self, ident: bytes, nbytes: int) -> str | None:
        """Why a fetch answer of ``nbytes`` to ``ident`` must not be queued now (None: it may)."""
        budget = self.budget
        if budget is None:
            return None
        ident = bytes(ident)
        held = self._held_count.get(ident)
        mine = self._backlog_bytes.get(ident, 0) + (held[2] if held else 0)
        others = 0
        if self._backlog_bytes or self._held_count:
            others = sum(self._backlog_bytes.values()) + sum(h[2] for h in self._held_count.values())
        return budget.refusal(ident, nbytes, mine, others, self.principal_of(ident))

    def _send_frames(self, ident: bytes, frames: list) -> None:
        last = len(frames[-1])
        if self.budget is not None and last >= TRACK_MIN_BYTES:
            self.budget.sent(ident, send_frames(self.router, frames, copy=False, track=True), last,
                             self.principal_of(bytes(ident)))
        else:
            send_frames(self.router, frames, copy=last < ZERO_COPY_MIN_BYTES)

    # -- sending ------------------------------------------------------------------------
    def send(self, ident: bytes, frames: list, delay_ms: int = 0) -> None:
        """``frames`` start with ``ident``."""
        if delay_ms > 0 or (self._held_count and ident in self._held_count):
            held = self._held_count.setdefault(ident, [0, 0, 0])
            size = sum(len(f) for f in frames)
            if held[0] and held[2] + size > self.max_backlog_bytes:
                self.dropped += 1
                self._rlog.warning(("throttled", bytes(ident)), "client %s keeps sending while throttled (%d bytes "
                                   "of answers held): dropping answers", bytes(ident).hex(), held[2])
                return
            self._seq += 1
            due = max(self.now_ms() + max(0, delay_ms), held[1])   # never before an earlier answer
            held[0] += 1
            held[1] = due
            held[2] += size
            heapq.heappush(self._held, (due, self._seq, ident, frames))
            return
        if self._backlog and ident in self._backlog:
            self._queue(ident, frames)
            return
        self._send_now(ident, frames)

    @property
    def busy(self) -> bool:
        """Some answer is held or backlogged: ``send`` must keep order (``send_now`` may not be used)."""
        return bool(self._held_count or self._backlog)

    def _send_now(self, ident: bytes, frames: list) -> bool:
        """False if the pipe is full (the frames go to the client's backlog). Public as
        ``send_now``: what ``send`` does without a delay while nothing is ``busy``."""
        try:
            self._send_frames(ident, frames)
        except zmq.Again:
            self._queue(ident, frames)
            return False
        except zmq.ZMQError as exc:
            if exc.errno == errno.EHOSTUNREACH:
                self._gone(ident)
            else:
                self._rlog.warning(("send", bytes(ident)), "dropping reply to %s: %s", bytes(ident).hex(), exc)
        return True

    send_now = _send_now

    def _queue(self, ident: bytes, frames: list) -> None:
        q = self._backlog.get(ident)
        size = sum(len(f) for f in frames)
        if q is None:
            q = self._backlog[ident] = collections.deque()
            self._backlog_bytes[ident] = 0
        elif self._backlog_bytes[ident] + size > self.max_backlog_bytes:
            self.dropped += 1
            self._rlog.warning(("slow", bytes(ident)), "client %s does not read its answers (backlog of %d "
                               "bytes): dropping answers", bytes(ident).hex(), self._backlog_bytes[ident])
            return
        q.append(frames)
        self._backlog_bytes[ident] += size

    def _gone(self, ident: bytes) -> None:
        self._backlog.pop(ident, None)
        self._backlog_bytes.pop(ident, None)
        self.on_gone(bytes(ident))

    def flush(self) -> None:
        """Send held answers that are due and backlogs, in order, until pipes are full."""
        if self.budget is not None:
            self.budget.reap()
        if self._held:
            now = self.now_ms()
            while self._held and self._held[0][0] <= now:
                _, _, ident, frames = heapq.heappop(self._held)
                held = self._held_count[ident]
                held[0] -= 1
                held[2] -= sum(len(f) for f in frames)
                if not held[0]:
                    del self._held_count[ident]
                if ident in self._backlog:
                    self._queue(ident, frames)
                else:
                    self._send_now(ident, frames)
        for ident in list(self._backlog):
            q = self._backlog.get(ident)
            while q:
                frames = q[0]
                try:
                    self._send_frames(ident, frames)
                except zmq.Again:
                    break
                except zmq.ZMQError as exc:
                    if exc.errno == errno.EHOSTUNREACH:
                        self._gone(ident)
                        q = None
                        break
                    self._rlog.warning(("send", bytes(ident)), "dropping reply to %s: %s", bytes(ident).hex(), exc)
                q.popleft()
                self._backlog_bytes[ident] -= sum(len(f) for f in frames)
            if q is not None and not q:
                del self._backlog[ident]
                del self._backlog_bytes[ident]

    def next_due_ms(self) -> int | None:
        """When ``flush`` has work (now_ms scale): a held answer's due time, or soon when a
        backlog waits for its pipe to drain; None if nothing waits."""
        if self._backlog:
            return self.now_ms() + 5
        return self._held[0][0] if self._held else None

    def backlog_bytes(self) -> int:
        return sum(self._backlog_bytes.values())
