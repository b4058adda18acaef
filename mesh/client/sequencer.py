"""The idempotent-producer sequencer: what to send, resend, finish or fail, per partition.

Sans-I/O: no sockets, no clock (every call that needs the time takes ``now_ms``), no
threads, no global random (jitter comes from the ``random.Random`` passed in, fresh
producer ids from the callable passed in). Two drivers run it, each with its own I/O: the
``Producer``'s I/O thread (``mesh.client.producer``) and the Spark sink's write tasks
(``mesh.spark.sink``; the text gateway's PUBS go through a ``Producer``). Tests drive it
by hand (``tests/unit/test_sequencer.py``).

Theory of operation
-------------------
A driver hands over closed batches (``append``); per partition they wait in one ordered
deque of unfinished batches, each with its ordinal (the how-many-th batch of the
partition). A batch is *in flight* while it has the request id of its last attempt
(``batch.rid``), *queued* otherwise. The broker remembers the last ``RECENT_BATCHES``
batches of each producer per partition and answers a retry of one of them with its
original offsets. The ``window`` is one less: then even when a new leader cuts every
unacknowledged batch from its log (and its memory), the last acknowledged batch is still
remembered, so the broker knows where the producer's sequence stands. The rules:

1. Numbering. A batch gets the partition's producer id and the sequence number of its
   first record when it is first sent, or earlier when the driver calls ``assign`` (the
   Spark sink numbers at once, as it encodes at once). Once sent, a batch keeps its
   producer id and sequences for good: it is only ever re-sent as it was (a batch still
   unsent when its partition takes a fresh producer id is numbered again; so is one that
   certainly was not written, under rule 8). A partition
   without a producer id (-1: not idempotent) numbers nothing.
2. Sending (``next_to_send``). Batches go out in deque order, at most ``max_in_flight``
   of a partition at once, none past the window (a batch goes out only if fewer than
   ``window`` batches separate it from the oldest unfinished one, acknowledged ones
   between them included, so that one is still remembered by the broker when it is
   retried), none while the partition backs off or waits, none after a batch whose fate
   is being probed (rule 7), none while a fresh producer id waits (rule 6); a queued batch
   past its delivery deadline fails (rule 5) instead of going out.
3. Success. NONE: the batch is done with its base offset. DUPLICATE_SEQUENCE: the broker
   has the batch's sequences but no longer remembers the batch, so it was stored before:
   done, with base offset -1 (Kafka's rule; rule 7 for re-cut replays). The partition's
   run of failures and its backoff start again from zero. Answers may come in any order.
   An answer to an attempt given up on (rule 4) still counts if it is a success and the
   batch is unfinished; otherwise it is ignored.
4. Retry (a retriable error, a request timeout or a dropped connection: ``on_reply`` /
   ``retry`` / ``expire``). Unless the batch is out of attempts (``retries``), past its
   delivery deadline, or the partition failed more than ``max_failures`` times in a row,
   the batch and every in-flight batch of its partition go back to the queue, in order,
   with the same producer id and sequences, and the partition backs off (doubling, or
   growing linearly, up to ``backoff_max_ms``, with optional jitter); except after a
   NOT_LEADER naming another broker as the leader, unless the retry before it was such a
   one: the driver follows that hint and the batches go there at once (Kafka's KIP-951),
   so a redirect to an elected leader costs a round trip, not a backoff, and two brokers
   pointing at each other cannot make a tight loop (every other retry backs off). (A
   leader handing over holds produce requests until its target has won, then names it.) The broker drops
   what it already has (answering with the original offsets), so order and exactly-once
   both hold. ``wait`` holds a partition back without counting a failure (no leader
   known yet: nothing was sent).
5. Failure (a non-retriable error, rule 4 giving up, or the delivery deadline: ``fail``).
   The batch fails, and so does every later batch of the partition, queued or in flight
   (with a sequence missing before them, they cannot be stored in order). Earlier
   unfinished batches carry on. Each failed batch says whether it may have been written
   (``SeqBatch.maybe_written``, on the error as ``MeshError.maybe_written``): True once an
   attempt of it got no answer (timeout, dropped connection, attempt given up on) or an
   answer given after the broker appended it (a ``ProduceResponse`` error; the driver
   passes ``rejected=True`` for an ``ErrorResponse``, which a broker gives only before
   appending anything); a later batch may have been written only if it and the failed
   batch both may have.
6. A fresh producer id (with ``new_producer_id``; the Spark sink keeps its id) after a
   numbered batch failed, as Kafka's epoch bump: only once no batch of the old id can
   still be in doubt, i.e. when every earlier batch of the partition has finished.
   Batches appended meanwhile wait; then they are numbered from sequence 0 under the new
   id. A possibly written batch is never re-sent under a new id.
7. Re-cut replays (``probe_duplicates``: the Spark sink, whose replayed batches may be
   cut differently). DUPLICATE_SEQUENCE for a one-record batch: done (written before).
   For a batch [f, l]: the broker has sequence f but remembers no batch [f, l]: every
   in-flight batch of the partition goes back to the queue and record l alone is sent
   (``batch.probe``, made by ``batch.single``); nothing after the batch goes out
   meanwhile. NONE or DUPLICATE_SEQUENCE for the probe: the whole batch is written
   (done). OUT_OF_ORDER: the broker's last sequence is inside [f, l); the batch is
   replaced by its records one by one (written ones come back as duplicates).
8. Lost producer state. OUT_OF_ORDER_SEQUENCE refusing (before any append) the *oldest*
   unfinished batch of its partition, not at sequence 0: every earlier batch was
   acknowledged, so a broker with the partition's state of the id would expect exactly
   this batch. It has lost that state (the topic was deleted and created again, or the
   state expired; Kafka says UNKNOWN_PRODUCER_ID) or never had it (a deposed leader). If
   no unfinished batch of the partition may have been written (``maybe_written``), none
   can be: a later batch is stored only after this one, which no attempt stored. Then the
   partition takes a fresh producer id at once and every unfinished batch is numbered
   again from 0 and sent again, in order (attempts in flight are forgotten: no success can
   come of them), within its attempts and delivery deadline. Otherwise (a later batch was
   refused: an earlier one is still in flight; or some batch is in doubt) it is a retry
   (rule 4). Without ``new_producer_id`` (the Spark sink keeps its id) it is a retry too.
   Doubt: an attempt given up on (rule 4) leaves its batch in doubt until its late answer
   comes; a late refusal ends that doubt, a late error after an append does not. Before
   this rule such a producer waited out its delivery timeout (60 s by default), then failed.
9. Sequence wrap. Sequences are 31-bit (the batch header's int32). A batch whose records
   would pass ``MAX_SEQUENCE`` is numbered under a fresh producer id, from 0, once nothing
   of the old id is unfinished (as rule 6). (Before, the 2,147,483,648th record of a
   partition, about 48 minutes at 750,000 records/s, could not be encoded.)

Outputs are pulled: ``take_done()`` returns the finished batches (``Done``: base offset,
or the error), in the order they finished. ``busy_partitions()`` lists only the partitions
with unfinished batches (kept as they change), so a driver's round costs nothing per idle
partition.
"""
from __future__ import annotations

import collections
import random
from dataclasses import dataclass
from typing import Callable, Iterable, NamedTuple

from mesh.wire.errors import ErrorCode, MeshError, retriable
from mesh.wire.topic_config import RECENT_BATCHES

__all__ = ["SeqBatch", "RetryPolicy", "Sequencer", "Done", "Outcome",
           "DONE", "RETRY", "FAILED", "PROBE", "SPLIT"]

TP = tuple  # (topic, partition)

# what ``on_reply`` did with an answer
DONE, RETRY, FAILED, PROBE, SPLIT = "done", "retry", "failed", "probe", "split"

_STALE_MAX = 4096  # attempts given up on whose late success still counts (rule 3)
MAX_SEQUENCE = (1 << 31) - 1   # rule 9: the last sequence a batch header can carry
_tuple_new = tuple.__new__


class SeqBatch:
    """What the sequencer keeps per batch; drivers subclass it with their payload."""
    __slots__ = ("count", "seq", "producer_id", "attempts", "rid", "sent_at_ms", "sent_to",
                 "deadline_ms", "probe", "ordinal", "unresolved", "appended")

    def __init__(self, count: int = 0, deadline_ms: float | None = None):
        self.count = count                  # records
        self.seq = -1                       # first sequence number; -1 until numbered
        self.producer_id = -1
        self.attempts = 0                   # times sent
        self.rid: int | None = None         # request id of the attempt in flight
        self.sent_at_ms = 0.0
        self.sent_to = ""
        self.deadline_ms = deadline_ms      # delivery deadline; None: none
        self.probe: SeqBatch | None = None  # rule 7: record l alone, while probing
        self.ordinal = -1                   # the how-many-th batch of its partition (rule 2)
        self.unresolved = 0                 # rule 8: attempts given up on, no answer yet
        self.appended = False               # an answer came after an append (or none will come)

    @property
    def maybe_written(self) -> bool:
        """Rule 5: some attempt may have stored it (an answer after an append, or an attempt
        given up on that no answer has settled yet)."""
        return self.appended or self.unresolved > 0

    def single(self, i: int) -> "SeqBatch":
        """Record ``i`` alone as a one-record batch (same producer id, sequence seq + i).
        Only needed with ``probe_duplicates``."""
        raise NotImplementedError


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    max_in_flight: int = 5
    window: int = RECENT_BATCHES - 1      # rule 2: less than what the broker remembers per producer
    retries: int | None = None            # attempts after the first, per batch; None: no limit
    max_failures: int | None = None       # failed rounds in a row, per partition; None: no limit
    backoff_ms: float = 100.0
    backoff_max_ms: float = 1_000.0
    linear_backoff: bool = False          # backoff_ms * failures, instead of doubling
    jitter: float = 0.0                   # the backoff is scaled by 1 +- jitter (rng)
    probe_duplicates: bool = False        # rule 7
    follow_hints: bool = True             # rule 4: a first NOT_LEADER naming another broker: no backoff


class Done(NamedTuple):
    tp: TP
    batch: SeqBatch
    base_offset: int = -1
    error: MeshError | None = None
    duplicate: bool = False   # the broker had it already (rules 3 and 7)
    gave_up: bool = False     # failed because rule 4 gave up, not by a non-retriable error


class Outcome(NamedTuple):
    tp: TP
    batch: SeqBatch
    action: str                         # DONE, RETRY, FAILED, PROBE or SPLIT
    replaced_by: tuple = ()             # SPLIT: the one-record batches


class _Partition:
    __slots__ = ("batches", "producer_id", "next_seq", "next_ordinal", "backoff_until_ms", "backoff_ms",
                 "failures", "renew", "followed")

    def __init__(self, producer_id: int):
        self.batches: collections.deque[SeqBatch] = collections.deque()  # unfinished, in order
        self.producer_id = producer_id
        self.next_seq = 0
        self.next_ordinal = 0
        self.backoff_until_ms = 0.0
        self.backoff_ms = 0.0
        self.failures = 0    # failed rounds since the last success
        self.renew = False   # rule 6: a fresh producer id once the old one is out of doubt
        self.followed = False  # rule 4: the last retry followed a NOT_LEADER hint at once


class Sequencer:
    def __init__(self, policy: RetryPolicy, producer_id: int = -1,
                 new_producer_id: Callable[[], int] | None = None, rng: random.Random | None = None):
        assert 1 <= policy.max_in_flight <= policy.window
        self.policy = policy
        self.producer_id = producer_id
        self._new_producer_id = new_producer_id
        self._rng = rng if rng is not None else random.Random(0)
        self._parts: dict[TP, _Partition] = {}
        self._active: dict[TP, _Partition] = {}   # the partitions with unfinished batches
        self._by_rid: dict[int, tuple[TP, SeqBatch]] = {}
        self._stale: collections.OrderedDict[int, tuple[TP, SeqBatch]] = collections.OrderedDict()
        self._done: list[Done] = []
        self._held_until_ms = 0.0   # the latest end of any backoff (next_backoff_ms: none once past)

    # -- state ------------------------------------------------------------------------------
    def partitions(self) -> list[TP]:
        return list(self._parts)

    def busy_partitions(self) -> list[TP]:
        """The partitions with some batch unfinished (the only ones ``next_to_send`` can
        give a batch of)."""
        return list(self._active)

    def producer_id_of(self, tp: TP) -> int:
        p = self._parts.get(tp)
        return self.producer_id if p is None else p.producer_id

    def busy(self) -> bool:
        """Some batch is still unfinished (queued or in flight)."""
        return bool(self._active)

    def idle(self, tp: TP) -> bool:
        """Nothing of ``tp`` is unfinished (queued or in flight): a driver that lingers only
        while a partition is busy sends a new batch of an idle one at once."""
        p = self._parts.get(tp)
        return p is None or not p.batches

    def in_flight(self, tp: TP | None = None) -> int:
        if tp is None:
            return len(self._by_rid)
        return sum(1 for b in self._parts[tp].batches if b.rid is not None)

    def unfinished(self, tp: TP) -> list[SeqBatch]:
        p = self._parts.get(tp)
        return list(p.batches) if p else []

    def backoff_until_ms(self, tp: TP) -> float:
        return self._parts[tp].backoff_until_ms

    def next_backoff_ms(self, now_ms: float) -> float | None:
        """The earliest end of a backoff that holds queued batches back, if any."""
        if self._held_until_ms <= now_ms:
            return None   # (the common case: no partition backs off; no walk)
        ends = [p.backoff_until_ms for p in self._active.values()
                if p.backoff_until_ms > now_ms and any(b.rid is None for b in p.batches)]
        return min(ends, default=None)

    def take_done(self) -> list[Done]:
        out, self._done = self._done, []
        return out

    # -- input ------------------------------------------------------------------------------
    def append(self, tp: TP, batch: SeqBatch) -> None:
        """A closed batch, after every batch appended before it to ``tp``."""
        p = self._parts.get(tp)
        if p is None:
            p = self._parts[tp] = _Partition(self.producer_id)
        batch.ordinal = p.next_ordinal
        p.next_ordinal += 1
        p.batches.append(batch)
        self._active[tp] = p

    def assign(self, tp: TP, batch: SeqBatch) -> bool:
        """Rule 1: number ``batch`` if it is not numbered under the partition's producer id;
        True if it was (numbered again), so its payload must be encoded again."""
        p = self._parts[tp]
        if p.producer_id < 0 or (batch.seq >= 0 and batch.producer_id == p.producer_id):
            return False
        assert batch.attempts == 0 or not batch.maybe_written, \
            "a batch that may have been written is never numbered again (rules 1 and 8)"
        batch.seq = p.next_seq
        batch.producer_id = p.producer_id
        p.next_seq += batch.count
        return True

    def next_to_send(self, tp: TP, now_ms: float) -> SeqBatch | None:
        """Rule 2: the next batch of ``tp`` to send now, or None. The driver then sends it
        (``sent``), or calls ``wait`` (no leader known), ``retry`` or ``fail``."""
        p = self._parts.get(tp)
        if p is None or p.backoff_until_ms > now_ms or not p.batches:
            return None
        oldest = p.batches[0].ordinal
        in_flight = 0
        for b in p.batches:
            if b.rid is not None:
                if b.probe is not None:
                    return None
                in_flight += 1
                continue
            if in_flight >= self.policy.max_in_flight or b.ordinal - oldest >= self.policy.window:
                return None
            if b.deadline_ms is not None and b.deadline_ms <= now_ms:
                self.fail(tp, b, MeshError(ErrorCode.TIMEOUT, "delivery_timeout_ms passed"))
                return None  # rule 5 failed it and every later batch
            if (not p.renew and self._new_producer_id is not None and p.producer_id >= 0
                    and not (b.seq >= 0 and b.producer_id == p.producer_id)
                    and p.next_seq + b.count - 1 > MAX_SEQUENCE):
                p.renew = True   # rule 9
            if p.renew and not (b.seq >= 0 and b.producer_id == p.producer_id):
                if b is not p.batches[0]:
                    return None  # rule 6: an earlier batch of the old id is still in doubt
                self._renew(p)
            return b
        return None

    def sent(self, tp: TP, batch: SeqBatch, rid: int | None, now_ms: float, address: str = "") -> None:
        """``batch`` (or its probe) went out as request ``rid``; None: no answer will come
        (acks=0), so it is done at once."""
        if batch.seq < 0 or batch.producer_id != self._parts[tp].producer_id:
            self.assign(tp, batch)   # (numbered already, the common case: no call)
        batch.attempts += 1
        batch.sent_at_ms = now_ms
        batch.sent_to = address
        if rid is None:
            self._finish(tp, batch, Done(tp, batch, -1))
            return
        batch.rid = rid
        self._by_rid[rid] = (tp, batch)

    def on_reply(self, rid: int, error: int, now_ms: float, base_offset: int = -1, message: str = "",
                 leader: str | None = None, rejected: bool = False) -> Outcome | None:
        """The answer to request ``rid`` (rules 3-7); None if no batch waits for it.
        ``rejected``: the broker refused the request before appending anything (an
        ``ErrorResponse``), so this attempt did not write it."""
        entry = self._by_rid.pop(rid, None)
        if entry is None:
            return self._late(rid, error, base_offset, rejected)
        tp, b = entry
        b.rid = None
        p = self._parts[tp]
        if error == 0 and b.probe is None:   # rule 3, NONE: the common case first (as _succeed)
            p.failures = 0
            p.backoff_ms = 0.0
            p.followed = False
            done = _tuple_new(Done, (tp, b, base_offset, None, False, False))   # Done(tp, b, base_offset),
            if p.batches and p.batches[0] is b:                                   # without the namedtuple's
                p.batches.popleft()                                               # Python-level __new__
                if not p.batches:
                    self._active.pop(tp, None)
                self._done.append(done)
            else:
                self._finish(tp, b, done)
            return _tuple_new(Outcome, (tp, b, DONE, ()))
        dup = error == ErrorCode.DUPLICATE_SEQUENCE
        if b.probe is not None:
            return self._probed(tp, p, b, error, now_ms, base_offset, message, rejected)
        if dup and b.count > 1 and self.policy.probe_duplicates:
            self._drop_in_flight(tp, p)
            b.probe = b.single(b.count - 1)
            return Outcome(tp, b, PROBE)
        if error == ErrorCode.NONE or dup:
            self._succeed(tp, p, b, -1 if dup else base_offset, duplicate=dup)
            return Outcome(tp, b, DONE)
        if not rejected:
            b.appended = True
        elif error == ErrorCode.OUT_OF_ORDER_SEQUENCE and self._restart(tp, p, b, now_ms):
            return Outcome(tp, b, RETRY)   # rule 8
        err = MeshError(error, message, leader=leader)
        if retriable(error):
            return Outcome(tp, b, RETRY if self.retry(tp, b, err, now_ms) else FAILED)
        self.fail(tp, b, err)
        return Outcome(tp, b, FAILED)

    def expire(self, now_ms: float, timeout_ms: float, gone: Iterable[str] = ()) -> list[tuple[TP, SeqBatch, MeshError]]:
        """Rule 4 for requests sent to a connection that dropped (``gone`` addresses) or
        unanswered for longer than ``timeout_ms``: [(tp, batch, error)] retried (or given
        up on), at most one per partition and call."""
        gone = set(gone)
        out = []
        for rid, (tp, b) in list(self._by_rid.items()):
            if rid not in self._by_rid:
                continue  # put back in the queue by an earlier retry of its partition
            if b.sent_to in gone:
                err = MeshError(ErrorCode.BROKER_UNAVAILABLE, f"connection to {b.sent_to} dropped")
            elif now_ms - b.sent_at_ms > timeout_ms:
                err = MeshError(ErrorCode.TIMEOUT, f"no answer within {timeout_ms / 1000:g} s")
            else:
                continue
            del self._by_rid[rid]
            self._remember_stale(rid, tp, b)
            b.rid = None
            out.append((tp, b, err))
            self.retry(tp, b, err, now_ms)
        return out

    def retry(self, tp: TP, batch: SeqBatch, err: MeshError, now_ms: float) -> bool:
        """Rule 4; False if it gave up (then rule 5 failed the batch)."""
        p = self._parts[tp]
        pol = self.policy
        p.failures += 1
        if ((pol.retries is not None and batch.attempts > pol.retries)
                or (batch.deadline_ms is not None and now_ms >= batch.deadline_ms)
                or (pol.max_failures is not None and p.failures > pol.max_failures)):
            self._fail(tp, p, batch, err, gave_up=True)
            return False
        self._drop_in_flight(tp, p)
        if (pol.follow_hints and not p.followed and err.code == ErrorCode.NOT_LEADER and err.leader
                and err.leader != batch.sent_to):
            p.followed = True
            return True   # the broker named another leader: go there now (rule 4)
        p.followed = False
        if pol.linear_backoff:
            p.backoff_ms = min(pol.backoff_max_ms, pol.backoff_ms * p.failures)
        else:
            p.backoff_ms = min(pol.backoff_max_ms, max(pol.backoff_ms, p.backoff_ms * 2))
        self._hold(p, now_ms, p.backoff_ms)
        return True

    def wait(self, tp: TP, now_ms: float) -> None:
        """Hold ``tp`` back for one base backoff without counting a failure (rule 4): the
        driver knows no leader to send to (it refreshes its metadata meanwhile)."""
        self._hold(self._parts[tp], now_ms, self.policy.backoff_ms)

    def fail(self, tp: TP, batch: SeqBatch, err: MeshError) -> None:
        """Rule 5 for a non-retriable error (or a deadline)."""
        self._fail(tp, self._parts[tp], batch, err, gave_up=False)

    # -- internals --------------------------------------------------------------------------
    def _hold(self, p: _Partition, now_ms: float, delay_ms: float) -> None:
        if self.policy.jitter:
            delay_ms *= 1 - self.policy.jitter + 2 * self.policy.jitter * self._rng.random()
        p.backoff_until_ms = max(p.backoff_until_ms, now_ms + delay_ms)
        self._held_until_ms = max(self._held_until_ms, p.backoff_until_ms)

    def _late(self, rid: int, error: int, base_offset: int, rejected: bool = False) -> Outcome | None:
        """Rule 3: the answer to an attempt given up on. A success still finishes the batch;
        a refusal ends the doubt that attempt left (rule 8)."""
        entry = self._stale.pop(rid, None)
        if entry is None:
            return None
        tp, b = entry
        b.unresolved -= 1
        if error != ErrorCode.NONE and error != ErrorCode.DUPLICATE_SEQUENCE and not rejected:
            b.appended = True
        p = self._parts.get(tp)
        if p is None or b not in p.batches or b.probe is not None:
            return None
        if error == ErrorCode.NONE or (error == ErrorCode.DUPLICATE_SEQUENCE
                                       and not (self.policy.probe_duplicates and b.count > 1)):
            dup = error != ErrorCode.NONE
            if b.rid is not None:
                self._by_rid.pop(b.rid, None)  # the retry in flight: its answer no longer matters
                b.rid = None
            self._succeed(tp, p, b, -1 if dup else base_offset, duplicate=dup)
            return Outcome(tp, b, DONE)
        return None

    def _remember_stale(self, rid: int, tp: TP, b: SeqBatch) -> None:
        """An attempt given up on: its batch is in doubt until its answer comes (if ever:
        one forgotten past ``_STALE_MAX`` leaves the doubt for good)."""
        if b.probe is None:
            b.unresolved += 1
            self._stale[rid] = (tp, b)
            while len(self._stale) > _STALE_MAX:
                self._stale.popitem(last=False)[1][1].appended = True   # no answer will count
        else:
            b.appended = True

    def _restart(self, tp: TP, p: _Partition, b: SeqBatch, now_ms: float) -> bool:
        """Rule 8: the partition lost the producer id's state; start again under a fresh
        id if nothing unfinished may have been written. False: not the case (retry)."""
        pol = self.policy
        if (self._new_producer_id is None or not p.batches or p.batches[0] is not b or b.seq <= 0
                or any(x.maybe_written for x in p.batches)
                or (pol.retries is not None and b.attempts > pol.retries)
                or (b.deadline_ms is not None and now_ms >= b.deadline_ms)):
            return False
        for x in p.batches:
            if x.rid is not None:   # refused too, or to be: no success can come of it
                self._by_rid.pop(x.rid, None)
                x.rid = None
            x.seq, x.producer_id = -1, -1
        p.renew = False
        self._renew(p)
        return True

    def _renew(self, p: _Partition) -> None:
        """Rule 6: nothing of the old producer id is in doubt any more."""
        p.renew = False
        p.producer_id = self._new_producer_id()
        p.next_seq = 0

    def _probed(self, tp: TP, p: _Partition, b: SeqBatch, error: int, now_ms: float, base_offset: int,
                message: str, rejected: bool) -> Outcome:
        if error in (ErrorCode.NONE, ErrorCode.DUPLICATE_SEQUENCE):
            b.probe = None  # record l was next, or older than the last sequence: all written
            self._succeed(tp, p, b, base_offset, duplicate=True)
            return Outcome(tp, b, DONE)
        if error == ErrorCode.OUT_OF_ORDER_SEQUENCE:
            singles = tuple(b.single(i) for i in range(b.count))
            i = p.batches.index(b)
            later = list(p.batches)[i + 1:]
            for k, x in enumerate(singles):
                x.ordinal = b.ordinal + k
            for x in later:  # the singles take count slots of the broker's window
                x.ordinal += b.count - 1
            p.next_ordinal += b.count - 1
            p.batches = collections.deque(list(p.batches)[:i] + list(singles) + later)
            return Outcome(tp, b, SPLIT, singles)
        if not rejected:
            b.appended = True
        err = MeshError(error, message or "probe")
        if retriable(error):
            return Outcome(tp, b, RETRY if self.retry(tp, b, err, now_ms) else FAILED)
        self.fail(tp, b, err)
        return Outcome(tp, b, FAILED)

    def _drop_in_flight(self, tp: TP, p: _Partition) -> None:
        """Forget the partition's outstanding attempts: their fate is unknown (a late
        success still counts, rule 3)."""
        for x in p.batches:
            if x.rid is not None:
                self._by_rid.pop(x.rid, None)
                self._remember_stale(x.rid, tp, x)
                x.rid = None

    def _succeed(self, tp: TP, p: _Partition, b: SeqBatch, base_offset: int, duplicate: bool) -> None:
        p.failures = 0
        p.backoff_ms = 0.0
        p.followed = False
        self._finish(tp, b, Done(tp, b, base_offset, duplicate=duplicate))

    def _fail(self, tp: TP, p: _Partition, b: SeqBatch, err: MeshError, gave_up: bool) -> None:
        if b.rid is not None:
            self._by_rid.pop(b.rid, None)
            b.rid = None
            b.appended = True
        self._finish(tp, b, Done(tp, b, -1, _error(err, err.message, b.maybe_written), gave_up=gave_up))
        later = [x for x in p.batches if x.ordinal > b.ordinal]
        p.batches = collections.deque(x for x in p.batches if x.ordinal < b.ordinal)
        if not p.batches:
            self._active.pop(tp, None)
        for x in later:
            if x.rid is not None:
                self._by_rid.pop(x.rid, None)
                x.rid = None
                x.appended = True
            written = x.maybe_written and b.maybe_written
            self._done.append(Done(tp, x, -1, _error(err, f"an earlier batch failed: {err.message}", written)))
        if self._new_producer_id is not None and b.seq >= 0 and b.producer_id == p.producer_id:
            p.renew = True  # rule 6
            if not p.batches:
                self._renew(p)

    def _finish(self, tp: TP, b: SeqBatch, done: Done) -> None:
        p = self._parts[tp]
        if p.batches and p.batches[0] is b:
            p.batches.popleft()
        else:
            try:
                p.batches.remove(b)
            except ValueError:
                pass
        if not p.batches:
            self._active.pop(tp, None)
        self._done.append(done)


def _error(err: MeshError, message: str, maybe_written: bool) -> MeshError:
    return MeshError(err.code, message, leader=err.leader, maybe_written=maybe_written)
