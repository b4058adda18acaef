"""Issue 39 on real brokers: dense bodies (finding 4), unread answers over many
connections (finding 5). Each case runs the attack with real sockets and checks what the
broker holds (RSS from /proc) and that a victim is still served."""
from __future__ import annotations

import threading
import time

import msgpack
import pytest
import zmq

from mesh.client import Admin, Producer
from mesh.testing.launcher import BrokerProcess
from mesh.wire import messages as m
from mesh.wire.codec import PROTOCOL_CLIENT, unpack
from mesh.wire.errors import ErrorCode
from tests.integration.test_bounds import MiB, answer, dealer, healthy, request, rss_mib

pytestmark = pytest.mark.integration


class Victim(threading.Thread):
    """acks=all produces one after the other; ``latencies`` (s) of each."""

    def __init__(self, address: str, topic: str = "ok"):
        super().__init__(daemon=True)
        self.address, self.topic = address, topic
        self.latencies: list[float] = []
        self.stop = threading.Event()

    def run(self) -> None:
        with Producer(self.address, acks=-1) as p:
            while not self.stop.is_set():
                t0 = time.monotonic()
                p.send(self.topic, b"victim", partition=0).get(60)
                self.latencies.append(time.monotonic() - t0)

    def finish(self) -> list[float]:
        self.stop.set()
        self.join(90)
        return self.latencies


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    b = BrokerProcess("h1", str(tmp_path_factory.mktemp("load") / "h1")).start()
    with Admin(b.address) as a:
        a.create_topic("ok", partitions=1)
        a.create_topic("big", partitions=1)
    yield b
    b.stop()


def test_dense_bodies_are_refused_fast_and_a_victim_is_served_meanwhile(broker):
    """50 pipelined FetchRequests, each ~1 MB of a million empty lists: each is refused
    (INVALID_REQUEST, max_body_containers) after a few ms of the loop, not 0.1-0.8 s."""
    body = msgpack.packb([[[[]] * 99_000 for _ in range(10)], 0, 1, 1 << 20])
    victim = Victim(broker.address)
    victim.start()
    while not victim.latencies:
        time.sleep(0.05)
    s = dealer(broker)
    t0 = time.monotonic()
    for rid in range(1, 51):
        s.send_multipart([PROTOCOL_CLIENT, rid.to_bytes(8, "big"), b"FETCH", body])
    reasons = []
    for _ in range(50):
        msg, _ = answer(s, 60_000)
        reasons.append((msg.error, msg.message) if isinstance(msg, m.ErrorResponse) else msg)
    took = time.monotonic() - t0
    during = [x for x in victim.finish()[1:]]
    print(f"\n50 dense bodies refused in {took:.2f} s; victim produces during: {len(during)}, "
          f"max {max(during, default=0) * 1000:.0f} ms")
    assert all(r[0] == int(ErrorCode.INVALID_REQUEST) and "max_body_containers" in r[1] for r in reasons), reasons[:2]
    assert took < 15, took
    healthy(broker)
    s.close()


def _unread_fetch_attack(b: BrokerProcess, connections: int = 15, fetches: int = 40) -> tuple[list, float]:
    """A reader that opens ``connections`` and sends ``fetches`` fetches of 4 MB on each,
    never reading: (its sockets, the broker's RSS growth in MiB once they were handled)."""
    before = rss_mib(b)
    socks = [dealer(b, rcvhwm=1) for _ in range(connections)]
    for s in socks:
        for _ in range(fetches):
            request(s, m.FetchRequest([["big", 0, 0, 4 * MiB]], 0, 1, 8 * MiB))
    peak, last_change, t0 = before, time.monotonic(), time.monotonic()
    while time.monotonic() - last_change < 3 and time.monotonic() - t0 < 60:   # until it stops growing
        now = rss_mib(b)
        if now > peak + 1:
            peak, last_change = now, time.monotonic()
        time.sleep(0.1)
    return socks, peak - before


def test_unread_fetch_answers_over_many_connections_are_bounded(tmp_path):
    b = BrokerProcess("h5", str(tmp_path / "h5"), extra=["--queued-max-answer-bytes", str(64 * MiB)]).start()
    try:
        with Admin(b.address) as a:
            a.create_topic("big", partitions=1)
            a.create_topic("ok", partitions=1)
        with Producer(b.address, acks=-1) as p:
            for f in [p.send_batch("big", [b"x" * 1000] * 1000, partition=0) for _ in range(6)]:
                f.result(20)
        socks, grown = _unread_fetch_attack(b)
        victim = Victim(b.address)
        victim.start()
        while len(victim.latencies) < 5:
            time.sleep(0.05)
        lat = victim.finish()
        print(f"\nRSS grew {grown:.0f} MiB under 15 x 40 unread 4 MB fetches; victim produce max "
              f"{max(lat) * 1000:.0f} ms")
        # 64 MiB in all (plus one answer per connection in flight and the allocator's slack);
        # it grew ~900 MiB before the bound
        assert grown < 200, f"broker RSS grew {grown:.0f} MiB"
        # a reader that reads is served: its fetch gets records
        s = dealer(b)
        request(s, m.FetchRequest([["big", 0, 0, 1 * MiB]], 0, 1, 1 * MiB))
        msg, payload = answer(s, 30_000)
        assert isinstance(msg, (m.FetchResponse, m.ErrorResponse))
        for x in socks:
            x.close()
        s.close()
        healthy(b)
    finally:
        b.stop()
