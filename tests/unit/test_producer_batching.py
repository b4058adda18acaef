"""The producer's batching decision (``mesh.client.batching.lingered``) over a real
sequencer: a batch of an idle partition goes at once, a busy partition's batch waits for
its requests in flight or ``linger_ms``, whichever comes first. No sockets, no clock."""
import random

from mesh.client.batching import lingered
from mesh.client.sequencer import RetryPolicy, SeqBatch, Sequencer
from mesh.wire.errors import ErrorCode

A, B = ("t", 0), ("t", 1)


class Open:
    def __init__(self, tp, created):
        self.topic, self.partition = tp
        self.created = created


def sequencer():
    return Sequencer(RetryPolicy(max_in_flight=5), producer_id=7, rng=random.Random(1))


def send_one(seq, tp, rid, now_ms=0.0):
    b = SeqBatch(1)
    seq.append(tp, b)
    assert seq.next_to_send(tp, now_ms) is b
    seq.sent(tp, b, rid, now_ms)
    return b


def test_an_idle_partition_sends_at_once_whatever_the_linger():
    seq = sequencer()
    a = Open(A, created=10.0)
    close, next_at = lingered([a], (), seq.idle, now=10.0, linger_s=60.0)
    assert close == [a] and next_at is None


def test_a_busy_partition_lingers_until_its_request_finishes():
    seq = sequencer()
    send_one(seq, A, rid=1)
    a, b = Open(A, created=10.0), Open(B, created=10.0)
    close, next_at = lingered([a, b], (), seq.idle, now=10.001, linger_s=0.005)
    assert close == [b] and next_at == 10.005          # B is idle; A waits, at most the linger
    seq.on_reply(1, ErrorCode.NONE, 2.0, base_offset=0)
    close, next_at = lingered([a], (), seq.idle, now=10.002, linger_s=0.005)
    assert close == [a] and next_at is None            # the answer came first: A goes now


def test_linger_ms_is_the_upper_bound_while_busy():
    seq = sequencer()
    send_one(seq, A, rid=1)
    a = Open(A, created=10.0)
    assert lingered([a], (), seq.idle, now=10.0049, linger_s=0.005) == ([], 10.005)
    assert lingered([a], (), seq.idle, now=10.005, linger_s=0.005) == ([a], None)


def test_a_closed_batch_not_yet_handed_over_makes_its_partition_busy():
    seq = sequencer()
    a = Open(A, created=10.0)
    assert lingered([a], {A}, seq.idle, now=10.0, linger_s=0.005) == ([], 10.005)


def test_a_partition_backing_off_is_busy_and_idle_once_everything_finished():
    seq = sequencer()
    send_one(seq, A, rid=1)
    seq.on_reply(1, ErrorCode.NOT_LEADER, 1.0)          # retriable: queued again, backing off
    assert not seq.idle(A) and seq.next_to_send(A, 2.0) is None
    a = Open(A, created=10.0)
    assert lingered([a], (), seq.idle, now=10.0, linger_s=0.005) == ([], 10.005)
    b = seq.next_to_send(A, 10_000.0)
    seq.sent(A, b, 2, 10_000.0)
    seq.on_reply(2, ErrorCode.NONE, 10_001.0, base_offset=0)
    assert seq.idle(A) and lingered([a], (), seq.idle, now=10.0, linger_s=0.005) == ([a], None)


def test_a_batch_due_within_the_slack_closes_now():
    """The I/O thread waits whole milliseconds, rounded to the nearest: a batch due 0.4 ms
    from now closes now rather than 0.6 ms late; the next deadline is at least 0.5 ms away."""
    seq = sequencer()
    send_one(seq, A, rid=1)
    a, b = Open(A, created=10.0), Open(A, created=10.25)
    close, next_at = lingered([a, b], (), seq.idle, now=10.0046, linger_s=0.005, slack_s=0.0005)
    assert close == [a] and next_at == 10.255
    assert lingered([b], (), seq.idle, now=10.2544, linger_s=0.005, slack_s=0.0005) == ([], 10.255)
    assert lingered([b], (), seq.idle, now=10.2546, linger_s=0.005, slack_s=0.0005) == ([b], None)
