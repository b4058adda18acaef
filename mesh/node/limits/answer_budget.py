"""Bytes of answers a node holds for clients that have not read them, per client and in all.

An answer sent on the ROUTER waits in the client's ZeroMQ pipe (up to ``SNDHWM`` of them)
until libzmq writes it to the kernel; one that finds the pipe full waits in the outbox's
backlog. SNDHWM counts messages, not bytes: a reader that sends 40 fetches of 4 MB on
each of 15 connections and never reads had the broker hold 16 answers per connection
(+60 MiB each, 170 -> 1,075 MiB RSS: issue 39 finding 5). So every answer of at least
``TRACK_MIN_BYTES`` is sent without copying and tracked (``zmq.MessageTracker``: done when
libzmq lets go of it), and ``AnswerBudget`` adds up the bytes still held per client and in
all, with the outbox's backlogs and held answers. ``refusal(ident)`` says why a new fetch
answer must not be queued: the client already has ``per_client`` bytes unread (one answer
is always allowed: the check is on what is queued before it), or the node has half of
``total`` unread in all (``queued_max_answer_bytes``; Kafka bounds the other side with
``queued.max.request.bytes``) and the client has some unread too (a client that reads is
still served), or ``total`` (anyone). Answers under ``TRACK_MIN_BYTES``
are never refused. The data path then answers THROTTLED (retriable, a
few bytes) instead of the records, and the reader's next fetch is served once it reads.
A principal (secured mode) has at most a quarter of ``total`` unread over all its
connections, so one user cannot take the budget from the others. A client's memory is then
at most ``per_client`` plus one answer, a principal's a quarter of ``total`` plus one answer
per connection, the node's ``total`` plus one answer, however many connections a reader opens.
"""
from __future__ import annotations

import collections

__all__ = ["AnswerBudget", "TRACK_MIN_BYTES"]

TRACK_MIN_BYTES = 32 << 10   # smaller answers are copied, untracked (SNDHWM x this per pipe at most)


class AnswerBudget:
    def __init__(self, per_client: int, total: int):
        self.per_client = per_client
        self.total = total
        self._tracked: collections.deque = collections.deque()   # (tracker, ident, bytes), oldest first
        self._bytes: dict[bytes, int] = {}   # ident -> tracked bytes not yet let go by libzmq
        self.tracked_bytes = 0
        self.refused = 0

    def sent(self, ident: bytes, tracker, nbytes: int, principal: str | None = None) -> None:
        if tracker is None or tracker.done:
            return
        keys = (bytes(ident),) if principal is None else (bytes(ident), ("principal", principal))
        self._tracked.append((tracker, keys, nbytes))
        for k in keys:
            self._bytes[k] = self._bytes.get(k, 0) + nbytes
        self.tracked_bytes += nbytes

    def reap(self) -> None:
        """Forget the answers libzmq let go of (it writes each pipe in order, but pipes
        drain at their own pace: every entry is looked at; there are at most about
        ``total / TRACK_MIN_BYTES`` of them)."""
        if not self._tracked:
            return
        keep = collections.deque()
        counts = self._bytes
        for entry in self._tracked:
            if entry[0].done:
                n = entry[2]
                for k in entry[1]:
                    left = counts[k] - n
                    if left:
                        counts[k] = left
                    else:
                        del counts[k]
                self.tracked_bytes -= n
            else:
                keep.append(entry)
        self._tracked = keep

    def queued(self, ident: bytes) -> int:
        return self._bytes.get(bytes(ident), 0)

    def refusal(self, ident: bytes, nbytes: int, other_client: int, other_total: int,
                principal: str | None = None) -> str | None:
        """Why a new answer of ``nbytes`` to ``ident`` must not be queued (None: it may).
        ``other_*``: the outbox's backlog and held bytes, of this client and in all.
        Answers under ``TRACK_MIN_BYTES`` always go (SNDHWM bounds them); past half of
        ``total`` only a client with nothing unread gets one (so readers are still served
        while others hold the budget), past ``total`` nobody."""
        if nbytes < TRACK_MIN_BYTES:
            return None
        mine = self.queued(ident) + other_client
        total = self.tracked_bytes + other_total
        theirs = self._bytes.get(("principal", principal), 0) if principal is not None else 0
        if mine < self.per_client and total < self.total // 2 and theirs < self.total // 4:
            return None
        self.reap()
        mine = self.queued(ident) + other_client
        total = self.tracked_bytes + other_total
        theirs = self._bytes.get(("principal", principal), 0) if principal is not None else 0
        if theirs >= self.total // 4:
            self.refused += 1
            return (f"not sent: {theirs} bytes of earlier answers to {principal}'s connections are not read yet "
                    f"(at most a quarter of queued_max_answer_bytes, {self.total // 4}); read them, then fetch again")
        if mine >= self.per_client:
            self.refused += 1
            return (f"not sent: {mine} bytes of earlier answers to this client are not read yet "
                    f"(at most {self.per_client}); read them, then fetch again")
        if (total >= self.total // 2 and mine) or total >= self.total:
            self.refused += 1
            return (f"not sent: this broker holds {total} bytes of answers clients have not read "
                    f"(queued_max_answer_bytes {self.total}); fetch again later")
        return None
