"""``--max-connections-per-ip`` (Kafka ``max.connections.per.ip``; issue 39, finding 5) with
real TCP connections to a real broker: beyond the bound, a handshake from that source
address is refused (ZAP 300: the client's ZeroMQ retries it later); other addresses are not
held back; raw connections that never speak count (more than twice the bound of them
refuse the address); a closed connection frees its slot. A 300 sends no ERROR: the refused
connection waits for the broker's handshake timer (10 s), then the client reconnects."""
from __future__ import annotations

import socket
import time

import pytest
import zmq

from mesh.testing.launcher import BrokerProcess, wait_until

pytestmark = pytest.mark.integration

BOUND = 3


class _Client:
    """A DEALER from ``source`` (ZeroMQ's ``tcp://SRC:0;DST`` form) and its handshake events."""

    def __init__(self, ctx: zmq.Context, source: str, address: str) -> None:
        self.sock = ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.RECONNECT_IVL, 100)
        self.mon = self.sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_HANDSHAKE_FAILED_AUTH)
        self.sock.connect(f"tcp://{source}:0;{address}")
        self.ok = 0
        self.refused = 0

    def poll(self) -> None:
        from zmq.utils.monitor import recv_monitor_message
        while self.mon.poll(0):
            ev = recv_monitor_message(self.mon)["event"]
            self.ok += ev == zmq.EVENT_HANDSHAKE_SUCCEEDED
            self.refused += ev == zmq.EVENT_HANDSHAKE_FAILED_AUTH

    def settled(self) -> bool:
        self.poll()
        return self.ok + self.refused > 0

    def close(self) -> None:
        self.sock.disable_monitor()
        self.mon.close(0)
        self.sock.close(0)


def _raw(source: str, address: str) -> socket.socket:
    host, _, port = address.rpartition(":")
    s = socket.socket()
    s.bind((source, 0))
    s.connect((host, int(port)))
    return s


def test_connections_beyond_the_per_ip_bound_are_refused_until_some_close(tmp_path):
    b = BrokerProcess("n1", str(tmp_path / "n1"), extra=["--max-connections-per-ip", str(BOUND)]).start()
    ctx = zmq.Context()
    clients: list[_Client] = []
    raws: list[socket.socket] = []
    try:
        # BOUND clients from 127.0.0.2: all admitted
        first = [_Client(ctx, "127.0.0.2", b.address) for _ in range(BOUND)]
        clients += first
        for c in first:
            wait_until(c.settled, 20, "a handshake")
        assert [c.ok for c in first] == [1] * BOUND and not any(c.refused for c in first)
        # one more from 127.0.0.2: held back (no handshake completes) ...
        extra = _Client(ctx, "127.0.0.2", b.address)
        clients.append(extra)
        # ... while another address is not held back
        other = _Client(ctx, "127.0.0.3", b.address)
        clients.append(other)
        wait_until(other.settled, 20, "a handshake from 127.0.0.3")
        assert other.ok == 1
        t_end = time.monotonic() + 3
        while time.monotonic() < t_end:
            extra.poll()
            assert extra.ok == 0, "a fourth connection from 127.0.0.2 was admitted"
            time.sleep(0.1)
        # one of the first closes: the extra one's next try is admitted
        first[0].close()
        clients.remove(first[0])
        t0 = time.monotonic()
        wait_until(lambda: extra.settled() and extra.ok == 1, 40, "the extra client admitted")
        print(f"\nthe 4th client from one address admitted {time.monotonic() - t0:.1f} s after one closed")
        # raw TCP connections that never speak count too: 2 x BOUND of them from 127.0.0.4
        raws += [_raw("127.0.0.4", b.address) for _ in range(2 * BOUND)]
        late = _Client(ctx, "127.0.0.4", b.address)
        clients.append(late)
        t_end = time.monotonic() + 3
        while time.monotonic() < t_end:
            late.poll()
            assert late.ok == 0, "a client behind 2 x BOUND raw connections was admitted"
            time.sleep(0.1)
        for s in raws:
            s.close()
        raws.clear()
        t0 = time.monotonic()
        wait_until(lambda: late.settled() and late.ok == 1, 40, "admitted once the raw connections closed")
        print(f"admitted {time.monotonic() - t0:.1f} s after the raw connections closed")
    finally:
        for s in raws:
            s.close()
        for c in clients:
            c.close()
        ctx.term()
        b.kill()


def _kafka_answers(s: socket.socket) -> bool:
    """An ApiVersions v0 request on ``s``; True if the Kafka listener answered it, False if
    it closed the connection."""
    import struct
    req = struct.pack(">hhih", 18, 0, 7, 1) + b"t"
    try:
        s.sendall(struct.pack(">i", len(req)) + req)
        head = s.recv(4)
    except (ConnectionResetError, BrokenPipeError):
        return False
    return len(head) == 4


def test_the_kafka_port_has_the_same_per_ip_bound(tmp_path):
    from mesh.testing.launcher import free_port
    b = BrokerProcess("n1", str(tmp_path / "n1"), extra=["--max-connections-per-ip", str(BOUND)],
                      kafka_port=free_port()).start()
    host, port = b.kafka_address.rsplit(":", 1)
    socks: list[socket.socket] = []

    def connect(source: str) -> socket.socket:
        s = socket.create_connection((host, int(port)), timeout=10, source_address=(source, 0))
        socks.append(s)
        return s
    try:
        first = [connect("127.0.0.2") for _ in range(BOUND)]
        assert all(_kafka_answers(s) for s in first)
        assert not _kafka_answers(connect("127.0.0.2"))   # one more from that address: closed
        assert _kafka_answers(connect("127.0.0.3"))        # another address is not held back
        first[0].close()                                   # a closed connection frees its place
        wait_until(lambda: _kafka_answers(connect("127.0.0.2")), 20, "a place from 127.0.0.2 again")
    finally:
        for s in socks:
            s.close()
        b.kill()
