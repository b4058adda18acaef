"""The open-loop rate schedule (``bench.pacing``) and the producer loops that follow it:
records are due at ``t0 + k / rate`` whatever the broker does, and each event row's
intended time is the schedule's, so latency counts the queueing of a late record."""
from __future__ import annotations

import pytest

from bench.pacing import RateSchedule
from bench.producer_worker import _produce_batches, _produce_records
from bench.scenarios import Workload

S = 1_000_000_000


def test_records_are_due_at_fixed_intervals_from_t0():
    s = RateSchedule(t0_ns=5 * S, rate_per_s=1000)
    assert [s.due_ns(k) for k in range(4)] == [5 * S, 5 * S + 1_000_000, 5 * S + 2_000_000, 5 * S + 3_000_000]
    assert s.due_by(5 * S - 1) == 0
    assert s.due_by(5 * S) == 1                    # record 0 is due at t0
    assert s.due_by(5 * S + 2_500_000) == 3        # records 0, 1, 2
    assert s.wait_s(3, 5 * S + 2_500_000) == pytest.approx(0.0005)
    assert s.wait_s(1, 5 * S + 2_500_000) == 0.0   # late: send now, never wait


def test_schedule_limits_by_count_and_by_end():
    s = RateSchedule(0, 100, total=7)
    assert s.due_by(10 * S) == 7 and s.done(7) and not s.done(6)
    e = RateSchedule(0, 100, end_ns=S)             # 1 s at 100/s: records 0..99
    assert e.count_before_end() == 100 and e.due_by(5 * S) == 100
    assert e.due_ns(99) < S <= e.due_ns(100)
    odd = RateSchedule(3, 3, end_ns=S + 3)         # rounding at the edge: 3 records, not 4
    assert odd.count_before_end() == 3
    with pytest.raises(AssertionError):
        RateSchedule(0, 0)


class _Clock:
    """A clock the loop reads and a sleep that advances it: no real time passes."""

    def __init__(self, t0: int):
        self.now = t0
        self.sleeps: list[float] = []

    def __call__(self) -> int:
        return self.now

    def sleep(self, s: float) -> None:
        self.sleeps.append(s)
        self.now += int(s * S) + 1


class _Future:
    def __init__(self):
        self.cbs, self.errbacks = [], []

    def add_callback(self, fn):
        self.cbs.append(fn)

    def add_errback(self, fn):
        self.errbacks.append(fn)

    def add_done_callback(self, fn):
        self.cbs.append(fn)

    def exception(self):
        return None


class _FakeProducer:
    """Records what was sent; each send costs ``cost_ns`` of the fake clock (a slow client
    or a full buffer), so later records are sent after they were due."""

    def __init__(self, clock: _Clock, cost_ns: int):
        self.clock, self.cost_ns = clock, cost_ns
        self.sent: list[tuple[int, bytes]] = []
        self.futures: list[_Future] = []

    def send(self, topic, value, key=None, timestamp_ms=None):
        self.clock.now += self.cost_ns
        self.sent.append((self.clock.now, value))
        self.futures.append(_Future())
        return self.futures[-1]

    def send_batch(self, topic, values, partition=None, keys=None, timestamp_ms=None):
        self.clock.now += self.cost_ns
        self.sent.append((self.clock.now, values[0]))
        self.futures.append(_Future())
        return self.futures[-1]


def _stamp(value: bytes) -> int:
    from bench.worker_common import STAMP
    return STAMP.unpack_from(value)[0]


def test_send_loop_stamps_due_times_and_measures_latency_from_them():
    """10 records at 1,000/s, each send() costing 3 ms: the client falls behind; every
    value carries its due time (not its send time) and the row's intended time is the
    last record's due time, so the ack latency includes the time spent behind."""
    t0 = 100 * S
    clock = _Clock(t0)
    p = _FakeProducer(clock, cost_ns=3_000_000)
    w = Workload(message_bytes=16, batch=0, rate=1000, messages=10)
    rows: list = []
    progress = [0]
    _produce_records(p, w, "t", 10, RateSchedule(t0, 1000, 10), None, b"m" * 8, rows, progress, 0,
                     clock=clock, sleep=clock.sleep)
    assert len(p.sent) == 10
    assert [_stamp(v) for _, v in p.sent] == [(t0 + k * 1_000_000) // 1000 for k in range(10)]
    assert all(send_ns > _stamp(v) * 1000 for send_ns, v in p.sent[1:])  # sent late, stamped on time
    assert sum(r[3] for r in rows) == 10
    last = rows[-1]
    assert last[2] == t0 + 9_000_000                   # intended = record 9's due time
    ack_ns = clock.now + 1_000_000                     # the broker answers 1 ms after the last send
    clock.now = ack_ns
    for f in p.futures:
        for cb in f.cbs:
            cb(type("Md", (), {"partition": 0})())
    assert last[5] == ack_ns
    latency_ms = (last[5] - last[2]) / 1e6             # what the Spark job computes per row
    assert latency_ms == pytest.approx(10 * 3 + 1 - 9)  # 22 ms: 21 behind schedule + 1 for the ack
    assert progress[0] == 10


def test_send_loop_waits_for_the_schedule_when_ahead():
    t0 = 0
    clock = _Clock(t0)
    p = _FakeProducer(clock, cost_ns=0)
    w = Workload(message_bytes=16, batch=0, rate=100, messages=5)
    rows: list = []
    _produce_records(p, w, "t", 5, RateSchedule(t0, 100, 5), None, b"m" * 8, rows, [0], 0,
                     clock=clock, sleep=clock.sleep)
    assert len(p.sent) == 5 and clock.sleeps                 # it slept between records
    # each record is sent when due (the fake sleep overshoots by 1 ns), 10 ms apart
    assert [s for s, _ in p.sent] == [0] + [k * 10_000_000 + 1 for k in range(1, 5)]
    assert [r[2] for r in rows] == [k * 10_000_000 for k in range(5)]


def test_batch_loop_paces_whole_batches_and_stamps_their_due_time():
    t0 = 7 * S
    clock = _Clock(t0)
    p = _FakeProducer(clock, cost_ns=0)
    w = Workload(message_bytes=16, batch=10, rate=1000, messages=40, partitions=2)
    rows: list = []
    _produce_batches(p, w, "t", 40, RateSchedule(t0, 1000, 40), None, None, 0, 2, b"m" * 8, rows, [0], 0,
                     clock=clock, sleep=clock.sleep)
    assert [r[2] for r in rows] == [t0 + k * 10_000_000 for k in range(4)]   # 10 records = 10 ms apart
    assert [r[0] for r in rows] == [0, 1, 0, 1]                               # round robin
    assert [_stamp(v) * 1000 for _, v in p.sent] == [r[2] for r in rows]
