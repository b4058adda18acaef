"""The sequencer against a fake leader that keeps the real dedup state (``ProducerStates``
over a ``MemoryStore``), through a seeded lossy network: requests lost, replies lost,
refusals before the append, errors after it, late and reordered replies, timeouts.

Checked on every seed: each batch is stored at most once and in append order; every
acknowledged batch was stored, at the offset it was acknowledged with; the window is
never exceeded, so no DUPLICATE_SEQUENCE answer ever comes back; a failure that says
"not written" was not written; a batch that was sent is never sent under another
producer id. A failure prints its seed."""
from __future__ import annotations

import heapq
import itertools
import random
from typing import NamedTuple

import pytest

from mesh.client.sequencer import RetryPolicy, SeqBatch, Sequencer
from mesh.node.data.producer_state import ProducerStates
from mesh.wire.errors import ErrorCode, MeshError
from mesh.wire.topic_config import RECENT_BATCHES
from storage.memory import MemoryStore

TP = ("t", 0)
TIMEOUT_MS = 200
TICK_MS = 5


class Header(NamedTuple):
    producer_id: int
    base_sequence: int
    record_count: int


class B(SeqBatch):
    __slots__ = ("name", "ids")

    def __init__(self, name: int, count: int, deadline_ms=None):
        super().__init__(count, deadline_ms)
        self.name = name
        self.ids: set[int] = set()   # every producer id it was sent under


class FakeLeader:
    """One partition's leader: dedup check, append, answer (the data path's rules)."""

    def __init__(self):
        self.store = MemoryStore()
        self.states = ProducerStates(self.store)
        self.log: list[tuple[int, int, int, int]] = []   # (batch name, producer id, seq, base offset)
        self.end = 0

    def produce(self, name: int, h: Header) -> tuple[int, int, bool]:
        """(error, base offset, rejected)."""
        try:
            dup = self.states.check(0, h)
        except MeshError as exc:
            return exc.code, -1, True
        if dup is not None:
            return ErrorCode.NONE, dup, False
        base = self.end
        self.end += h.record_count
        self.log.append((name, h.producer_id, h.base_sequence, base))
        self.states.stage(0, h, base)
        self.store.commit()
        self.states.committed()
        return ErrorCode.NONE, base, False


def run(seed: int, batches: int, fault: float, deadline_ms: float | None):
    rng = random.Random(seed)
    ids = itertools.count(1000)
    pol = RetryPolicy(max_in_flight=5, backoff_ms=20, backoff_max_ms=200, jitter=0.2)
    seq = Sequencer(pol, producer_id=next(ids), new_producer_id=ids.__next__, rng=random.Random(seed))
    leader = FakeLeader()
    net: list = []            # (time, order, kind, payload): the network's pending deliveries
    order = itertools.count()
    last_arrival = 0.0        # requests arrive in send order (one connection)
    rids = itertools.count(1)
    all_batches: list[B] = []
    done: dict[int, object] = {}
    dup_answers = 0
    now = 0.0
    faults_until = batches * 4 * TICK_MS
    while now < 600_000:
        faulty = now < faults_until
        if len(all_batches) < batches and rng.random() < 0.5:
            b = B(len(all_batches), rng.randint(1, 3),
                  None if deadline_ms is None else now + deadline_ms)
            all_batches.append(b)
            seq.append(TP, b)
        while (b := seq.next_to_send(TP, now)) is not None:
            seq.assign(TP, b)
            oldest = seq.unfinished(TP)[0]
            assert b.ordinal - oldest.ordinal < RECENT_BATCHES - 1, f"window exceeded (seed={seed})"
            b.ids.add(b.producer_id)
            rid = next(rids)
            seq.sent(TP, b, rid, now, "leader:1")
            if faulty and rng.random() < fault:
                continue                                  # the request is lost
            last_arrival = max(last_arrival, now + rng.uniform(0, 30))
            heapq.heappush(net, (last_arrival, next(order), "req", (rid, b.name, Header(b.producer_id, b.seq, b.count))))
        for d in seq.take_done():
            done[d.batch.name] = d
        # the network and the leader
        while net and net[0][0] <= now:
            _, _, kind, item = heapq.heappop(net)
            if kind == "req":
                rid, name, h = item
                if faulty and rng.random() < fault:
                    answer = (ErrorCode.NOT_LEADER, -1, True)     # refused before the append
                else:
                    answer = leader.produce(name, h)
                    if faulty and answer[0] == ErrorCode.NONE and rng.random() < fault:
                        answer = (rng.choice([ErrorCode.TIMEOUT, ErrorCode.NOT_LEADER]), -1, False)  # after it
                if faulty and rng.random() < fault:
                    continue                              # the reply is lost
                heapq.heappush(net, (now + rng.uniform(1, 60), next(order), "rep", (rid, answer)))
            else:
                rid, (err, base, rejected) = item
                dup_answers += err == ErrorCode.DUPLICATE_SEQUENCE
                seq.on_reply(rid, err, now, base_offset=base, rejected=rejected)
        seq.expire(now, TIMEOUT_MS)
        for d in seq.take_done():
            done[d.batch.name] = d
        assert seq.busy_partitions() == [tp for tp in seq.partitions() if seq.unfinished(tp)], seed
        if len(all_batches) == batches and not seq.busy() and not net:
            break
        now += TICK_MS
    assert not seq.busy(), f"did not finish (seed={seed})"
    return leader, all_batches, done, dup_answers


def check(seed, leader, all_batches, done, dup_answers):
    stored = [name for name, *_ in leader.log]
    assert len(stored) == len(set(stored)), f"a batch stored twice (seed={seed}): {stored}"
    assert stored == sorted(stored), f"stored out of append order (seed={seed}): {stored}"
    assert dup_answers == 0, f"DUPLICATE_SEQUENCE answered (seed={seed}): the window was exceeded"
    at = {name: base for name, _, _, base in leader.log}
    assert set(done) == {b.name for b in all_batches}
    for b in all_batches:
        assert len(b.ids) <= 1, f"batch {b.name} sent under producer ids {b.ids} (seed={seed})"
        d = done[b.name]
        if d.error is None:
            assert b.name in at and d.base_offset == at[b.name], (seed, b.name, d)
        elif not d.error.maybe_written:
            assert b.name not in at, f"batch {b.name} said not written, but was (seed={seed})"


@pytest.mark.parametrize("seed", range(12))
def test_faults_without_a_deadline_store_everything_once_in_order(seed):
    leader, all_batches, done, dups = run(seed, batches=150, fault=0.15, deadline_ms=None)
    check(seed, leader, all_batches, done, dups)
    assert all(d.error is None for d in done.values()), f"seed={seed}"


@pytest.mark.parametrize("seed", range(12))
def test_faults_with_a_delivery_deadline_fail_honestly_and_never_duplicate(seed):
    leader, all_batches, done, dups = run(seed, batches=150, fault=0.3, deadline_ms=400)
    check(seed, leader, all_batches, done, dups)
