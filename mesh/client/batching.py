"""The producer's batches: one open batch of one partition (``_Batch``, with the
sequencer's state from ``SeqBatch``), the batching decision (``lingered``: which open
batches close now; the producer's module doc explains the policy), checked headers and
fresh producer ids. Split from ``mesh.client.producer`` (the I/O and the public API)."""
from __future__ import annotations

import os

from mesh.client.future import BatchFuture
from mesh.client.sequencer import SeqBatch

__all__ = ["lingered"]


def _checked_headers(headers) -> list:
    """[[name str, value bytes or None], ...] of ``send``'s headers (pairs); TypeError else."""
    out = []
    for pair in headers:
        k, v = pair
        if v is not None and not isinstance(v, (bytes, bytearray)):
            raise TypeError(f"header {k!r}: value must be bytes or None, not {type(v).__name__}")
        out.append([k if k.__class__ is str else str(k), None if v is None else bytes(v)])
    return out


class _Batch(SeqBatch):
    """One batch of records of one partition; the sequencer's state is in ``SeqBatch``."""
    __slots__ = ("topic", "partition", "tp", "values", "keys", "timestamps", "headers", "nbytes",
                 "created", "future", "payload", "closed")

    def __init__(self, topic: str, partition: int, now: float, delivery_s: float):
        # SeqBatch.__init__(self, 0, deadline), inlined (a call less per request; a unit
        # test checks that every SeqBatch slot is set)
        self.count, self.seq, self.producer_id, self.attempts, self.rid = 0, -1, -1, 0, None
        self.sent_at_ms, self.sent_to, self.deadline_ms = 0.0, "", (now + delivery_s) * 1000
        self.probe, self.ordinal, self.unresolved, self.appended = None, -1, 0, False
        self.topic, self.partition = topic, partition
        self.tp = (topic, partition)
        self.values: list = []
        self.keys: list | None = None
        self.timestamps: list = []
        self.headers: list | None = None
        self.nbytes = 0
        self.created = now
        self.future = BatchFuture()
        self.payload: bytes | None = None
        self.closed = False


def lingered(open_batches, ready_tps, idle, now: float, linger_s: float,
             slack_s: float = 0.0) -> tuple[list, float | None]:
    """The batching decision (see the module doc): which ``open_batches`` close now, and
    when the earliest of the others reaches ``linger_s`` (None if none is left open).
    ``ready_tps``: partitions with a closed batch not yet handed to the sequencer (busy);
    ``idle(tp)``: the sequencer has nothing unfinished of ``tp``. ``slack_s``: a batch due
    within it closes now (a driver that waits whole ticks and rounds to the nearest one
    passes half a tick), so the next deadline returned is at least that far away."""
    close, next_at = [], None
    for b in open_batches:
        tp = (b.topic, b.partition)
        due = b.created + linger_s
        if due < now + slack_s or due <= now or (tp not in ready_tps and idle(tp)):
            close.append(b)
        elif next_at is None or due < next_at:
            next_at = due
    return close, next_at


def _new_producer_id() -> int:
    return int.from_bytes(os.urandom(8), "big") >> 2
