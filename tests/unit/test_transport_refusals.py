"""Which failed handshakes the client transport takes for a refusal (issue 39, finding 2).

Events are fed to ``Transport._on_monitor``'s classification directly (no broker): a
handshake that timed out (a paused broker) is retried, three closed by the broker at once
(a wrong cluster key) are UNAUTHORIZED, and that guess is taken back by a later handshake
that succeeds."""
import errno

import pytest

import mesh.client.transport as tr
from mesh.client.transport import Transport
from mesh.security.creds import Creds, new_keypair
from mesh.wire.errors import ErrorCode, MeshError

ADDR = "127.0.0.1:9"


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


@pytest.fixture
def transport(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(tr.time, "monotonic", clock)
    pub, sec = new_keypair()
    cluster, _ = new_keypair()
    t = Transport(creds=Creds("alice", pub, sec, cluster))
    t.clock = clock
    yield t
    t.close()


def _attempt(t: Transport, err: int, took_s: float) -> None:
    t._connected_at[ADDR] = t.clock.now   # EVENT_CONNECTED
    t.clock.now += took_s
    t._on_refused(ADDR, tr._NO_DETAIL, err)


def test_handshake_timeouts_are_retried(transport):
    for _ in range(10):   # a paused broker: each handshake dies by our HANDSHAKE_IVL (1 s)
        _attempt(transport, errno.EAGAIN, tr.HANDSHAKE_IVL_MS / 1000)
        _attempt(transport, errno.EPIPE, tr.HANDSHAKE_IVL_MS / 1000)   # even with a stale errno
    transport.check_refused()


def test_quick_closes_are_a_wrong_cluster_key(transport):
    for _ in range(2):
        _attempt(transport, errno.EPIPE, 0.002)
    transport.check_refused()
    _attempt(transport, errno.ECONNRESET, 0.002)
    with pytest.raises(MeshError) as info:
        transport.check_refused()
    assert info.value.code == ErrorCode.UNAUTHORIZED and "cluster public key" in info.value.message


def test_a_later_handshake_takes_the_guess_back(transport):
    for _ in range(3):
        _attempt(transport, errno.EPIPE, 0.002)
    assert transport._refused is not None
    transport._on_up(ADDR)   # EVENT_HANDSHAKE_SUCCEEDED
    transport.check_refused()


def test_a_definite_refusal_stays(transport):
    transport._on_refused(ADDR, tr._AUTH_FAILED, 400)
    for _ in range(3):
        _attempt(transport, errno.EPIPE, 0.002)
    with pytest.raises(MeshError) as info:
        transport.check_refused()
    assert "refused the credentials of 'alice'" in info.value.message


def test_the_monitor_pipe_cannot_fill():
    """libzmq's I/O thread writes monitor events with a blocking send: a full monitor pipe
    (a transport nobody polls while its broker refuses or flaps, ~30 events a second)
    blocked every socket of the context for good after about a minute (measured: 100 s
    unpolled with a wrong cluster key, then no socket of the context delivered anything).
    The reading end has no HWM, so the pipe has none."""
    import zmq
    from mesh.testing.launcher import free_port
    t = Transport()
    try:
        addr = f"127.0.0.1:{free_port()}"
        t.connect(addr)
        mon = t._monitor_of[t._socks[addr]]
        assert mon.getsockopt(zmq.RCVHWM) == 0
    finally:
        t.close()
