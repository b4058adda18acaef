"""The idempotent-producer sequencer, driven by hand: no sockets, no clock, no threads."""
import itertools
import random

import pytest

from mesh.client.sequencer import (
    DONE, FAILED, PROBE, RETRY, SPLIT, Done, Outcome, RetryPolicy, SeqBatch, Sequencer,
)
from mesh.wire.errors import ErrorCode, MeshError

TP = ("t", 0)
OTHER = ("t", 1)
NONE, NOT_LEADER, OUT_OF_ORDER = ErrorCode.NONE, ErrorCode.NOT_LEADER, ErrorCode.OUT_OF_ORDER_SEQUENCE


class B(SeqBatch):
    __slots__ = ("name",)

    def __init__(self, name, count=1, deadline_ms=None):
        super().__init__(count, deadline_ms)
        self.name = name

    def single(self, i):
        s = B(f"{self.name}[{i}]")
        s.seq, s.producer_id = self.seq + i, self.producer_id
        return s

    def __repr__(self):
        return f"B({self.name}, seq={self.seq})"


class Driver:
    """What Producer._io_loop does around the sequencer, with a fake network: request ids
    count up, ``sent`` records (rid, batch name, producer id, seq) in send order."""

    def __init__(self, seq):
        self.seq = seq
        self.rids = itertools.count(1)
        self.sent = []

    def pump(self, now_ms, tps=None):
        out = []
        for tp in tps or self.seq.partitions():
            while (b := self.seq.next_to_send(tp, now_ms)) is not None:
                self.seq.assign(tp, b)
                rid = next(self.rids)
                self.seq.sent(tp, b, rid, now_ms, "leader-a:1")
                sent = (rid, (b.probe or b).name, b.producer_id, (b.probe or b).seq)
                self.sent.append(sent)
                out.append(sent)
        return out


def make(policy=None, producer_ids=None, n=0, count=1, tp=TP):
    ids = producer_ids or itertools.count(1000).__next__
    seq = Sequencer(policy or RetryPolicy(max_in_flight=3, retries=5, jitter=0.2),
                    producer_id=7, new_producer_id=ids, rng=random.Random(1))
    batches = [B(f"b{i}", count) for i in range(n)]
    for b in batches:
        seq.append(tp, b)
    return seq, Driver(seq), batches


def names(done):
    return [d.batch.name for d in done]


def test_batches_are_numbered_in_order_and_pipelined_up_to_max_in_flight():
    seq, d, bs = make(n=5, count=3)
    sent = d.pump(0)
    assert [(name, pid, s) for _, name, pid, s in sent] == [("b0", 7, 0), ("b1", 7, 3), ("b2", 7, 6)]
    assert d.pump(1) == []  # three in flight: the window is full
    seq.on_reply(sent[0][0], NONE, 2, base_offset=100)
    assert [(name, s) for _, name, _, s in d.pump(3)] == [("b3", 9)]
    assert [(x.tp, x.batch.name, x.base_offset, x.error) for x in seq.take_done()] == [(TP, "b0", 100, None)]


def test_replies_out_of_order_finish_each_batch_and_ignore_unknown_ids():
    seq, d, bs = make(n=3)
    r0, r1, r2 = [rid for rid, *_ in d.pump(0)]
    assert seq.on_reply(r2, NONE, 1, base_offset=12).action == DONE
    assert seq.on_reply(r0, NONE, 1, base_offset=10).action == DONE
    assert seq.on_reply(r0, NONE, 1) is None   # a duplicate answer: nobody waits for it
    assert seq.on_reply(999, NONE, 1) is None
    assert seq.on_reply(r1, NONE, 1, base_offset=11).action == DONE
    assert [(x.batch.name, x.base_offset) for x in seq.take_done()] == [("b2", 12), ("b0", 10), ("b1", 11)]
    assert not seq.busy()


def test_a_success_gives_the_same_done_and_outcome_whether_oldest_or_not():
    """on_reply's fast path (plain NONE) builds its namedtuples without their __new__."""
    seq, d, bs = make(n=2)
    r0, r1 = [rid for rid, *_ in d.pump(0)]
    out1 = seq.on_reply(r1, NONE, 1, base_offset=11)   # not the oldest unfinished batch
    out0 = seq.on_reply(r0, NONE, 1, base_offset=10)   # the oldest
    assert (out1, out0) == (Outcome(TP, bs[1], DONE), Outcome(TP, bs[0], DONE))
    assert type(out0) is Outcome and out0.replaced_by == ()
    done = seq.take_done()
    assert done == [Done(TP, bs[1], 11), Done(TP, bs[0], 10)] and all(type(x) is Done for x in done)
    assert done[0].error is None and not done[0].duplicate and not done[0].gave_up and not seq.busy()


def test_busy_partitions_are_those_with_unfinished_batches():
    seq, d, bs = make(n=2)
    seq.append(OTHER, B("o0"))
    seq.append(OTHER, B("o1"))
    assert seq.busy_partitions() == [TP, OTHER] and seq.busy()
    sent = {name: rid for rid, name, *_ in d.pump(0)}
    assert set(sent) == {"b0", "b1", "o0", "o1"}
    seq.on_reply(sent["b1"], NONE, 1, base_offset=1)      # out of order: TP still has b0
    assert seq.busy_partitions() == [TP, OTHER]
    seq.on_reply(sent["b0"], NONE, 1, base_offset=0)
    assert seq.busy_partitions() == [OTHER]
    seq.on_reply(sent["o0"], ErrorCode.INVALID_REQUEST, 1)  # fails o0 and o1 (rule 5)
    assert seq.busy_partitions() == [] and not seq.busy() and set(seq.partitions()) == {TP, OTHER}
    seq.append(TP, B("b2"))
    assert seq.busy_partitions() == [TP]


def test_a_lost_reply_times_out_and_resends_it_and_everything_after_with_the_same_sequences():
    seq, d, bs = make(n=4)
    first = d.pump(0)
    assert [s for *_, s in first] == [0, 1, 2]
    assert seq.expire(5_000, timeout_ms=10_000) == []
    retried = seq.expire(10_001, timeout_ms=10_000)
    assert [(tp, b.name, e.code) for tp, b, e in retried] == [(TP, "b0", ErrorCode.TIMEOUT)]  # one per partition
    assert seq.in_flight() == 0
    until = seq.backoff_until_ms(TP)
    assert 10_001 + 80 <= until <= 10_001 + 120   # backoff 100 ms +- 20 % jitter
    assert d.pump(until - 1) == []
    again = d.pump(until)
    assert [(name, pid, s) for _, name, pid, s in again] == [("b0", 7, 0), ("b1", 7, 1), ("b2", 7, 2)]
    for rid, *_ in again[1:]:
        seq.on_reply(rid, NONE, until + 2)
    # the lost reply shows up late: a success still counts, and the retry's answer is moot
    assert seq.on_reply(first[0][0], NONE, until + 3, base_offset=40).action == DONE
    assert seq.on_reply(again[0][0], NONE, until + 4) is None
    assert [(x.batch.name, x.base_offset) for x in seq.take_done()] == [("b1", -1), ("b2", -1), ("b0", 40)]


def test_a_retriable_error_puts_the_batch_and_every_later_in_flight_one_back_in_order():
    seq, d, bs = make(n=5)
    r0, r1, r2 = [rid for rid, *_ in d.pump(0)]
    assert seq.on_reply(r0, NONE, 1).action == DONE
    out = seq.on_reply(r1, ErrorCode.NOT_ENOUGH_REPLICAS, 2)
    assert (out.tp, out.batch.name, out.action) == (TP, "b1", RETRY)
    assert [b.name for b in seq.unfinished(TP)] == ["b1", "b2", "b3", "b4"]
    assert seq.in_flight(TP) == 0             # b2 went back to the queue too
    resent = d.pump(seq.backoff_until_ms(TP))
    assert [(name, s) for _, name, _, s in resent] == [("b1", 1), ("b2", 2), ("b3", 3)]
    assert bs[1].attempts == 2 and bs[3].attempts == 1
    assert seq.on_reply(r2, ErrorCode.NOT_LEADER, 300) is None   # a stale failure: ignored


def test_leader_change_not_leader_then_the_new_leader_takes_the_same_sequences():
    seq, d, bs = make(n=3)
    sent = d.pump(0)
    out = seq.on_reply(sent[0][0], NOT_LEADER, 1, message="not the leader", leader="leader-b:1")
    assert out.action == RETRY and out.batch.name == "b0"
    done = seq.take_done()
    assert done == []
    # the driver follows the hint (cluster.set_leader) and sends again after the backoff
    resent = d.pump(seq.backoff_until_ms(TP))
    assert [(n, p, s) for _, n, p, s in resent] == [("b0", 7, 0), ("b1", 7, 1), ("b2", 7, 2)]
    for rid, *_ in reversed(resent):
        assert seq.on_reply(rid, NONE, 500).action == DONE
    assert names(seq.take_done()) == ["b2", "b1", "b0"]


def test_not_leader_naming_another_broker_is_followed_at_once_but_never_twice_in_a_row():
    seq, d, bs = make(RetryPolicy(max_in_flight=3, backoff_ms=100), n=2)
    sent = d.pump(0)
    out = seq.on_reply(sent[0][0], NOT_LEADER, 5, leader="leader-b:1")
    assert out.action == RETRY and out.batch.name == "b0"
    assert seq.backoff_until_ms(TP) <= 5            # no backoff: the hint goes to the new leader now
    again = d.pump(5)
    assert [(n, s_) for _, n, _, s_ in again] == [("b0", 0), ("b1", 1)]   # same sequences, in order
    # a second hint right after (stale: two brokers pointing at each other) backs off as
    # any retry does, so hints cannot make a tight loop
    seq.on_reply(again[0][0], NOT_LEADER, 6, leader="leader-c:1")
    assert seq.backoff_until_ms(TP) == 106
    assert d.pump(50) == []
    # after a retry that backed off, a hint is followed at once again
    third = d.pump(106)
    seq.on_reply(third[0][0], NOT_LEADER, 110, leader="leader-d:1")
    assert seq.backoff_until_ms(TP) == 106 and len(d.pump(110)) == 2
    # a success ends the run: the next hint is followed at once
    for rid, *_ in d.sent[-2:]:
        seq.on_reply(rid, NONE, 120)
    seq.append(TP, B("b2"))
    (rid, *_), = d.pump(120)
    seq.on_reply(rid, NOT_LEADER, 130, leader="leader-e:1")
    assert seq.backoff_until_ms(TP) == 106


@pytest.mark.parametrize("leader", [None, "", "leader-a:1"])
def test_not_leader_without_a_new_leader_backs_off(leader):
    seq, d, bs = make(RetryPolicy(max_in_flight=3, backoff_ms=100), n=1)
    (rid, *_), = d.pump(0)
    assert seq.on_reply(rid, NOT_LEADER, 5, leader=leader).action == RETRY
    assert seq.backoff_until_ms(TP) == 105          # no hint, or it names the broker that refused


def test_backoff_doubles_up_to_its_cap_and_resets_after_a_success():
    seq, d, bs = make(RetryPolicy(max_in_flight=1, backoff_ms=100, backoff_max_ms=300), n=2)
    now, waits = 0, []
    for _ in range(4):
        (rid, *_), = d.pump(now)
        seq.on_reply(rid, NOT_LEADER, now)
        waits.append(seq.backoff_until_ms(TP) - now)
        now = seq.backoff_until_ms(TP)
    assert waits == [100, 200, 300, 300]
    (rid, *_), = d.pump(now)
    seq.on_reply(rid, NONE, now)
    (rid, *_), = d.pump(now)
    seq.on_reply(rid, NOT_LEADER, now)
    assert seq.backoff_until_ms(TP) - now == 100


def test_linear_backoff_and_a_partition_that_keeps_failing_gives_up_with_everything_after_it():
    policy = RetryPolicy(max_in_flight=5, max_failures=3, backoff_ms=100, backoff_max_ms=1_000, linear_backoff=True)
    seq, d, bs = make(policy, n=2)
    now = 0
    for i in range(1, 4):
        (rid, *_), _ = d.pump(now)
        assert seq.on_reply(rid, ErrorCode.TIMEOUT, now).action == RETRY
        assert seq.backoff_until_ms(TP) - now == 100 * i
        now = seq.backoff_until_ms(TP)
    (rid, *_), _ = d.pump(now)
    assert seq.on_reply(rid, ErrorCode.TIMEOUT, now).action == FAILED
    done = seq.take_done()
    assert [(x.batch.name, x.gave_up, x.error.maybe_written) for x in done] == [("b0", True, True),
                                                                               ("b1", False, True)]
    assert not seq.busy()


def test_a_batch_out_of_attempts_or_past_its_deadline_fails_and_so_do_the_queued_ones():
    seq, d, bs = make(RetryPolicy(max_in_flight=1, retries=1), n=3)
    (rid, *_), = d.pump(0)
    assert seq.on_reply(rid, NOT_LEADER, 1).action == RETRY
    (rid, *_), = d.pump(seq.backoff_until_ms(TP))
    assert seq.on_reply(rid, NOT_LEADER, 2_000).action == FAILED   # two attempts, retries=1
    done = seq.take_done()
    assert [(x.batch.name, x.error.code, x.gave_up) for x in done] == [
        ("b0", NOT_LEADER, True), ("b1", NOT_LEADER, False), ("b2", NOT_LEADER, False)]
    # delivery deadline: a queued batch past it fails instead of going out
    seq, d, _ = make()
    seq.append(TP, B("late", deadline_ms=50))
    assert d.pump(50) == []
    (x,) = seq.take_done()
    assert x.batch.name == "late" and x.error.code == ErrorCode.TIMEOUT


def test_a_non_retriable_error_fails_every_later_batch_and_renews_the_producer_id():
    seq, d, bs = make(n=5, producer_ids=iter([41, 42]).__next__)
    sent = d.pump(0)                                 # b0, b1, b2 in flight; b3, b4 queued
    out = seq.on_reply(sent[0][0], ErrorCode.MESSAGE_TOO_LARGE, 1, rejected=True)
    assert out.action == FAILED
    done = seq.take_done()
    assert names(done) == ["b0", "b1", "b2", "b3", "b4"]
    # refused before any append: b0 was not written, so nothing after it can have been
    assert [x.error.maybe_written for x in done] == [False] * 5
    assert seq.on_reply(sent[1][0], NONE, 2) is None   # a failed batch's late answer: ignored
    assert seq.producer_id_of(TP) == 41 and seq.producer_id_of(OTHER) == 7
    seq.append(TP, B("new"))
    (_, name, pid, s), = d.pump(2)
    assert (name, pid, s) == ("new", 41, 0)          # a fresh id restarts at sequence 0


def test_no_fresh_producer_id_while_an_earlier_batch_is_in_doubt():
    seq, d, bs = make(RetryPolicy(max_in_flight=3, backoff_ms=100), n=3, producer_ids=iter([41, 42]).__next__)
    r0, r1, r2 = [rid for rid, *_ in d.pump(0)]
    # b1 is refused for good (not written); b0 is still in flight: its fate is unknown
    assert seq.on_reply(r1, ErrorCode.UNAUTHORIZED, 1, rejected=True).action == FAILED
    assert [(x.batch.name, x.error.maybe_written) for x in seq.take_done()] == [("b1", False), ("b2", False)]
    seq.append(TP, B("new"))
    assert d.pump(2) == []                           # b0 of producer 7 is in doubt: "new" waits
    assert seq.producer_id_of(TP) == 7
    assert seq.on_reply(r0, ErrorCode.NOT_LEADER, 3).action == RETRY
    again = d.pump(seq.backoff_until_ms(TP))
    assert [(n, p, s) for _, n, p, s in again] == [("b0", 7, 0)]   # re-sent as it was; "new" still waits
    assert seq.on_reply(again[0][0], NONE, 500, base_offset=9).action == DONE
    (_, name, pid, s), = d.pump(501)
    assert (name, pid, s) == ("new", 41, 0)          # nothing of producer 7 is in doubt any more


def test_a_possibly_written_batch_is_never_resent_under_a_new_producer_id():
    seq, d, bs = make(RetryPolicy(max_in_flight=2, retries=0), n=3, producer_ids=iter([41, 42]).__next__)
    d.pump(0)
    assert seq.expire(10_001, timeout_ms=10_000)      # b0 timed out, out of attempts (retries=0)
    done = seq.take_done()
    assert [(x.batch.name, x.error.code, x.error.maybe_written) for x in done] == [
        ("b0", ErrorCode.TIMEOUT, True), ("b1", ErrorCode.TIMEOUT, True), ("b2", ErrorCode.TIMEOUT, False)]
    seq.append(TP, B("new"))
    assert [(n, p, s) for _, n, p, s in d.pump(10_002)] == [("new", 41, 0)]
    assert [(n, p, s) for _, n, p, s in d.sent[:2]] == [("b0", 7, 0), ("b1", 7, 1)]
    assert len(d.sent) == 3                           # b0 and b1 were sent once each, under 7 only


def test_duplicate_sequence_means_stored_before_and_completes_with_offset_minus_one():
    seq, d, bs = make(n=2, count=3)
    sent = d.pump(0)
    out = seq.on_reply(sent[0][0], ErrorCode.DUPLICATE_SEQUENCE, 1, message="older than the batches kept",
                       rejected=True)
    assert out.action == DONE
    assert seq.on_reply(sent[1][0], NONE, 1, base_offset=77).action == DONE
    assert [(x.batch.name, x.base_offset, x.duplicate, x.error) for x in seq.take_done()] == [
        ("b0", -1, True, None), ("b1", 77, False, None)]
    assert seq.producer_id_of(TP) == 7               # no new producer id


def test_a_retry_answered_with_the_original_offsets_is_a_plain_success():
    seq, d, bs = make(n=2)
    first = d.pump(0)
    seq.on_reply(first[0][0], ErrorCode.NOT_LEADER, 1, leader="leader-b:1")
    again = d.pump(seq.backoff_until_ms(TP))
    assert [(n, s) for _, n, _, s in again] == [("b0", 0), ("b1", 1)]
    # the new leader had both (replicated before the change): their original offsets come back
    seq.on_reply(again[1][0], NONE, 300, base_offset=11)
    seq.on_reply(again[0][0], NONE, 300, base_offset=10)
    assert [(x.batch.name, x.base_offset, x.duplicate) for x in seq.take_done()] == [
        ("b1", 11, False), ("b0", 10, False)]


def test_the_window_is_never_exceeded_while_the_oldest_batch_is_unacknowledged():
    policy = RetryPolicy(max_in_flight=3, window=5, backoff_ms=100)
    seq, d, bs = make(policy, n=12)
    sent = d.pump(0)
    assert [n for _, n, *_ in sent] == ["b0", "b1", "b2"]
    for rid, *_ in sent[1:]:
        seq.on_reply(rid, NONE, 1)                   # b1, b2 acknowledged; b0's answer is lost
    more = d.pump(2)
    assert [n for _, n, *_ in more] == ["b3", "b4"]  # b0..b4: five batches, the window
    for rid, *_ in more:
        seq.on_reply(rid, NONE, 3)
    assert d.pump(4) == []                           # nothing past the window, though only b0 is in flight
    assert seq.in_flight(TP) == 1
    seq.expire(20_000, timeout_ms=10_000)
    again = d.pump(seq.backoff_until_ms(TP))
    assert [(n, s) for _, n, _, s in again] == [("b0", 0)]   # the broker still remembers it
    seq.on_reply(again[0][0], NONE, 20_200, base_offset=0)
    assert [n for _, n, *_ in d.pump(20_201)] == ["b5", "b6", "b7"]


def test_a_late_success_of_an_attempt_given_up_on_finishes_the_batch():
    seq, d, bs = make(n=2)
    sent = d.pump(0)
    seq.on_reply(sent[1][0], ErrorCode.NOT_ENOUGH_REPLICAS, 1)     # b0 and b1 back to the queue
    assert seq.on_reply(sent[0][0], NONE, 2, base_offset=5).action == DONE
    assert [(x.batch.name, x.base_offset) for x in seq.take_done()] == [("b0", 5)]
    assert [n for _, n, *_ in d.pump(seq.backoff_until_ms(TP))] == ["b1"]


def test_wait_holds_a_partition_without_counting_a_failure():
    seq, d, bs = make(RetryPolicy(max_in_flight=1, retries=0, backoff_ms=100), n=1)
    b = seq.next_to_send(TP, 0)
    for now in range(0, 5_000, 100):
        seq.wait(TP, now)                            # no leader known, many times
        assert seq.next_to_send(TP, now) is None
    assert seq.next_to_send(TP, 5_000) is b and seq.take_done() == []


def test_a_dropped_connection_retries_what_was_sent_there():
    seq, d, bs = make(n=2)
    d.pump(0)
    seq.append(OTHER, B("o"))
    d.pump(0, [OTHER])
    assert seq.expire(1, 10_000, gone={"elsewhere:1"}) == []
    out = seq.expire(1, 10_000, gone={"leader-a:1"})
    assert sorted((tp, b.name, e.code) for tp, b, e in out) == [
        (TP, "b0", ErrorCode.BROKER_UNAVAILABLE), (OTHER, "o", ErrorCode.BROKER_UNAVAILABLE)]
    assert seq.in_flight() == 0 and seq.next_backoff_ms(1) is not None


def test_acks_0_batches_are_done_when_sent():
    seq, _, _ = make(n=1)
    b = seq.next_to_send(TP, 0)
    seq.sent(TP, b, None, 0)
    (x,) = seq.take_done()
    assert x.batch is b and x.base_offset == -1 and x.error is None and not seq.busy()


def test_partitions_are_independent():
    seq, d, _ = make(n=1)
    seq.append(OTHER, B("o", 4))
    sent = d.pump(0)
    assert sorted((n, s) for _, n, _, s in sent) == [("b0", 0), ("o", 0)]
    seq.on_reply(sent[0][0], NOT_LEADER, 1)
    assert seq.backoff_until_ms(OTHER) == 0 and seq.in_flight(OTHER) == 1


SINK = RetryPolicy(max_in_flight=5, max_failures=50, backoff_ms=100, linear_backoff=True,
                   probe_duplicates=True)


def test_sink_a_duplicate_one_record_batch_was_written_before():
    seq, d, bs = make(SINK, n=2)
    sent = d.pump(0)
    out = seq.on_reply(sent[0][0], ErrorCode.DUPLICATE_SEQUENCE, 1)
    assert out.action == DONE
    (x,) = seq.take_done()
    assert x.duplicate and x.error is None


def test_sink_a_duplicate_multi_record_batch_is_probed_with_its_last_record():
    seq, d, bs = make(SINK, n=3, count=4)
    sent = d.pump(0)
    out = seq.on_reply(sent[1][0], ErrorCode.DUPLICATE_SEQUENCE, 1)
    assert out.action == PROBE and bs[1].probe.seq == 7
    assert seq.in_flight(TP) == 0   # in-flight ones went back to the queue
    again = d.pump(2)   # b0 again (it was in flight), then record 3 of b1 alone, then nothing
    assert [(n, s) for _, n, _, s in again] == [("b0", 0), ("b1[3]", 7)]
    assert d.pump(3) == []
    assert seq.on_reply(again[0][0], NONE, 4).action == DONE
    assert seq.on_reply(again[1][0], ErrorCode.DUPLICATE_SEQUENCE, 4).action == DONE
    done = seq.take_done()
    assert [(x.batch.name, x.duplicate) for x in done] == [("b0", False), ("b1", True)]
    assert [(n, s) for _, n, _, s in d.pump(5)] == [("b2", 8)]


def test_sink_a_probe_out_of_order_sends_the_records_one_by_one():
    seq, d, bs = make(SINK, n=2, count=3)
    sent = d.pump(0)
    seq.on_reply(sent[0][0], ErrorCode.DUPLICATE_SEQUENCE, 1)
    (probe,) = d.pump(2)
    out = seq.on_reply(probe[0], ErrorCode.OUT_OF_ORDER_SEQUENCE, 3)
    assert out.action == SPLIT and [b.name for b in out.replaced_by] == ["b0[0]", "b0[1]", "b0[2]"]
    resent = d.pump(4)
    assert [(n, s) for _, n, _, s in resent] == [("b0[0]", 0), ("b0[1]", 1), ("b0[2]", 2), ("b1", 3)]
    results = [ErrorCode.DUPLICATE_SEQUENCE, ErrorCode.DUPLICATE_SEQUENCE, NONE, NONE]
    for (rid, *_), code in zip(resent, results):
        assert seq.on_reply(rid, code, 5).action == DONE
    assert [(x.batch.name, x.duplicate) for x in seq.take_done()] == [
        ("b0[0]", True), ("b0[1]", True), ("b0[2]", False), ("b1", False)]
    assert not seq.busy()


def test_sink_keeps_its_producer_id_when_a_batch_fails():
    seq = Sequencer(SINK, producer_id=5)
    seq.append(TP, B("x"))
    seq.append(TP, B("y"))
    d = Driver(seq)
    sent = d.pump(0)
    assert seq.on_reply(sent[0][0], ErrorCode.INVALID_REQUEST, 1, rejected=True).action == FAILED
    assert seq.producer_id_of(TP) == 5
    assert [(x.batch.name, x.error.code) for x in seq.take_done()] == [
        ("x", ErrorCode.INVALID_REQUEST), ("y", ErrorCode.INVALID_REQUEST)]


def test_retry_without_a_leader_keeps_order():
    seq, d, bs = make(n=3)
    sent = d.pump(0)
    seq.on_reply(sent[0][0], NONE, 1)
    b = seq.next_to_send(TP, 1)
    assert b is None  # b1 and b2 in flight, nothing queued
    seq.append(TP, B("b3"))
    b = seq.next_to_send(TP, 1)
    assert b.name == "b3"
    assert seq.retry(TP, b, MeshError(ErrorCode.LEADER_NOT_AVAILABLE, "no leader known"), 1)
    assert [x.name for x in seq.unfinished(TP)] == ["b1", "b2", "b3"]
    assert [(n, s) for _, n, _, s in d.pump(seq.backoff_until_ms(TP))] == [("b1", 1), ("b2", 2), ("b3", 3)]


UNKNOWN_PRODUCER = ErrorCode.OUT_OF_ORDER_SEQUENCE   # (for a first batch not at 0: Kafka's UNKNOWN_PRODUCER_ID)


def test_lost_producer_state_starts_the_partition_again_under_a_fresh_id_at_once():
    """The topic was deleted and created again (or the id's state expired): the broker has
    no state of producer 7 and refuses sequence 3. Before rule 8 the producer retried until
    its delivery timeout (60 s by default), then failed the batch."""
    seq, d, bs = make(RetryPolicy(max_in_flight=3, backoff_ms=100), n=5, producer_ids=iter([41, 42]).__next__)
    r0, r1, r2 = [rid for rid, *_ in d.pump(0)]
    for rid in (r0, r1, r2):
        seq.on_reply(rid, NONE, 1, base_offset=rid)
    r3, r4 = [rid for rid, *_ in d.pump(2)]           # b3 (seq 3) and b4 (seq 4) in flight
    assert seq.on_reply(r3, UNKNOWN_PRODUCER, 3, rejected=True).action == RETRY
    again = d.pump(3)                                 # at once, no backoff: numbered again from 0
    assert [(n, p, s) for _, n, p, s in again] == [("b3", 41, 0), ("b4", 41, 1)]
    assert seq.on_reply(r4, UNKNOWN_PRODUCER, 4, rejected=True) is None   # the forgotten attempt
    for rid, *_ in again:
        assert seq.on_reply(rid, NONE, 5, base_offset=rid).action == DONE
    assert names(seq.take_done()) == ["b0", "b1", "b2", "b3", "b4"]


def test_lost_producer_state_is_a_plain_retry_unless_it_is_certain():
    # a later batch refused: an earlier one is still in flight (the state may come with it)
    seq, d, bs = make(RetryPolicy(max_in_flight=3, backoff_ms=100), n=3, producer_ids=iter([41]).__next__)
    r0, r1, r2 = [rid for rid, *_ in d.pump(0)]
    assert seq.on_reply(r1, UNKNOWN_PRODUCER, 1, rejected=True).action == RETRY
    assert seq.producer_id_of(TP) == 7 and [b.seq for b in bs] == [0, 1, 2]
    # some batch may have been written (an attempt timed out): never numbered again
    seq, d, bs = make(RetryPolicy(max_in_flight=3, backoff_ms=100), n=3, producer_ids=iter([41]).__next__)
    r0, r1, r2 = [rid for rid, *_ in d.pump(0)]
    seq.on_reply(r0, NONE, 1, base_offset=0)
    seq.expire(10_001, timeout_ms=10_000)             # b1 and b2 in doubt, sent again
    r1, r2 = [rid for rid, *_ in d.pump(seq.backoff_until_ms(TP))]
    assert seq.on_reply(r1, UNKNOWN_PRODUCER, 10_500, rejected=True).action == RETRY
    assert seq.producer_id_of(TP) == 7 and [b.seq for b in bs[1:]] == [1, 2]
    # the sink keeps its producer id
    sink = Sequencer(SINK, producer_id=5)
    sink.append(TP, B("x"))
    sink.append(TP, B("y"))
    sd = Driver(sink)
    rx, ry = [rid for rid, *_ in sd.pump(0)]
    sink.on_reply(rx, NONE, 1, base_offset=0)
    assert sink.on_reply(ry, UNKNOWN_PRODUCER, 3, rejected=True).action == RETRY
    assert sink.producer_id_of(TP) == 5


def test_a_partition_near_the_sequence_limit_goes_on_under_a_fresh_id_from_zero():
    """Rule 9: the batch header's sequence is an int32; the batch that would pass it waits
    for the ones before it, then starts a fresh producer id at 0 (before: struct.error)."""
    from mesh.client.sequencer import MAX_SEQUENCE
    from mesh.wire.records import encode_batch
    seq, d, bs = make(RetryPolicy(max_in_flight=3), n=3, count=2, producer_ids=iter([41]).__next__)
    seq._parts[TP].next_seq = MAX_SEQUENCE - 3        # room for b0 and b1, not for b2
    sent = d.pump(0)
    assert [(n, p, s) for _, n, p, s in sent] == [("b0", 7, MAX_SEQUENCE - 3), ("b1", 7, MAX_SEQUENCE - 1)]
    encode_batch([b"a", b"b"], producer_id=7, base_sequence=MAX_SEQUENCE - 1)   # the last that fits
    seq.on_reply(sent[0][0], NONE, 1, base_offset=0)
    assert d.pump(2) == []                            # b1 of producer 7 is unfinished: b2 waits
    seq.on_reply(sent[1][0], NONE, 3, base_offset=2)
    assert [(n, p, s) for _, n, p, s in d.pump(4)] == [("b2", 41, 0)]


def test_a_late_refusal_of_an_attempt_given_up_on_ends_its_doubt():
    """Rule 8 after a leader change: the old leader refused b1, b2 and b3 (NOT_LEADER), the
    retry gave up on b2's and b3's attempts before their answers came; the new topic then
    refused b1. Before, b2 and b3 stayed in doubt for good and the producer waited out its
    delivery timeout (found by review)."""
    seq, d, bs = make(RetryPolicy(max_in_flight=3, backoff_ms=100), n=4, producer_ids=iter([41]).__next__)
    r0, r1, r2 = [rid for rid, *_ in d.pump(0)]
    seq.on_reply(r0, NONE, 1, base_offset=0)
    (r3, *_), = d.pump(2)
    assert seq.on_reply(r1, NOT_LEADER, 3, leader="leader-b:1", rejected=True).action == RETRY
    assert [b.maybe_written for b in bs[1:]] == [False, True, True]      # b2, b3: no answer yet
    again = d.pump(4)
    assert [n for _, n, _, _ in again] == ["b1", "b2", "b3"]
    seq.on_reply(r2, NOT_LEADER, 5, rejected=True)                      # the late refusals
    assert [b.maybe_written for b in bs[1:]] == [False, False, True]
    seq.on_reply(r3, NOT_LEADER, 5, rejected=True)
    assert not any(b.maybe_written for b in bs)
    assert seq.on_reply(again[0][0], OUT_OF_ORDER, 6, rejected=True).action == RETRY   # rule 8
    assert [(n, p, s) for _, n, p, s in d.pump(7)] == [("b1", 41, 0), ("b2", 41, 1), ("b3", 41, 2)]


def test_lost_producer_state_keeps_to_the_retry_budget_and_late_appends_stay_in_doubt():
    seq, d, bs = make(RetryPolicy(max_in_flight=2, retries=0), n=2, producer_ids=iter([41]).__next__)
    r0, r1 = [rid for rid, *_ in d.pump(0)]
    seq.on_reply(r0, NONE, 1, base_offset=0)
    assert seq.on_reply(r1, OUT_OF_ORDER, 2, rejected=True).action == FAILED   # retries=0: no re-send
    # an attempt given up on whose late answer came after an append stays in doubt
    seq, d, bs = make(RetryPolicy(max_in_flight=2, backoff_ms=100), n=2, producer_ids=iter([41]).__next__)
    r0, r1 = [rid for rid, *_ in d.pump(0)]
    seq.expire(10_001, timeout_ms=10_000)
    seq.on_reply(r1, ErrorCode.NOT_ENOUGH_REPLICAS, 10_002)             # appended, then failed
    assert bs[1].maybe_written and bs[1].appended


def test_an_error_code_this_version_does_not_know_is_unknown_not_a_crash():
    """A newer broker's code stopped an older client's I/O thread (ValueError)."""
    assert ErrorCode(999) is ErrorCode.UNKNOWN and MeshError(999).code is ErrorCode.UNKNOWN
    seq, d, bs = make(n=1)
    (r0, *_), = d.pump(0)
    assert seq.on_reply(r0, 999, 1, rejected=True).action == FAILED
