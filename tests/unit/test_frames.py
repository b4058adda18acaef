"""mesh.wire.frames: the hot-path multipart send/receive behave as pyzmq's own."""
import itertools

import pytest
import zmq

from mesh.wire.frames import recv_frames, send_frames

_NAMES = itertools.count()


@pytest.fixture
def pair():
    ctx = zmq.Context.instance()
    name = f"inproc://test-frames-{next(_NAMES)}"
    a, b = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
    a.bind(name)
    b.connect(name)
    yield a, b
    a.close(linger=0)
    b.close(linger=0)


def test_frames_round_trip_like_send_multipart(pair):
    a, b = pair
    msgs = [[b"one"], [b"mesh/1", b"\0" * 8, b"PRODUCE", b"body", b"x" * 100_000],
            [b"", b"", b"last"], [b"mesh/1", bytearray(b"buf"), memoryview(b"view")]]
    for frames in msgs:
        send_frames(a, frames)
    send_frames(a, [b"head", b"y" * (2 << 20)], copy=False)   # the payload without a copy
    for frames in msgs:
        assert recv_frames(b, zmq.NOBLOCK) == [bytes(f) for f in frames]
    got = recv_frames(b)
    assert got == [b"head", b"y" * (2 << 20)] and all(type(f) is bytes for f in got)
    with pytest.raises(zmq.Again):
        recv_frames(b)   # nothing waiting: Again, as recv_multipart(NOBLOCK)
    a.send_multipart([b"from", b"pyzmq"])
    assert recv_frames(b) == [b"from", b"pyzmq"]
    send_frames(a, [b"to", b"pyzmq"])
    assert b.recv_multipart() == [b"to", b"pyzmq"]


def test_send_frames_raises_again_on_a_full_pipe_and_sends_nothing_partial():
    ctx = zmq.Context.instance()
    r = ctx.socket(zmq.DEALER)
    r.setsockopt(zmq.SNDHWM, 1)
    r.setsockopt(zmq.LINGER, 0)
    r.setsockopt(zmq.IMMEDIATE, 1)
    r.connect("tcp://127.0.0.1:1")   # never connects: with IMMEDIATE nothing can be queued
    try:
        with pytest.raises(zmq.Again):
            send_frames(r, [b"a", b"b", b"c"])
    finally:
        r.close(linger=0)


class _Fake:
    def __init__(self):
        self.sent = []

    def send_multipart(self, frames, flags=0, copy=True):
        self.sent.append((frames, copy))

    def recv_multipart(self, flags=0):
        return [b"fake"]


def test_a_fake_socket_gets_its_own_multipart_methods():
    f = _Fake()
    send_frames(f, [b"x", b"y"], copy=False)
    assert f.sent == [([b"x", b"y"], False)] and recv_frames(f) == [b"fake"]
