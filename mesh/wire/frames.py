"""Multipart send and receive for the hot paths, without pyzmq's per-frame overhead.

pyzmq's ``Socket.send_multipart`` type-checks every frame and builds ``SNDMORE | flags``
as an ``enum.Flag`` for each one: about 11 us for a 6-frame message, against about 2.3 us
when the backend socket's ``send`` is called with an int flag. ``recv_multipart`` asks
RCVMORE through the option machinery after each frame (about 12 us for 6 frames, against
about 7 us reading each frame's ``more``). Every request and answer of a broker and of a
client goes through these two, so they are called per request.

Same semantics as pyzmq's: ZeroMQ delivers a multipart message atomically (once the first
frame of a NOBLOCK send is queued, the others are too), errors are the same ``zmq.Again``
and ``ZMQError``. Frames are bytes-like, as the codec makes them. ``copy=False`` sends a
frame without copying it (pyzmq then frees it from its garbage-collector thread; see
``mesh.wire.codec.ZERO_COPY_MIN_BYTES`` for when that pays).
"""
from __future__ import annotations

import zmq
from zmq.backend import Socket as _BackendSocket

__all__ = ["send_frames", "recv_frames"]

_send = _BackendSocket.send
_recv = _BackendSocket.recv
_MORE_NOBLOCK = int(zmq.SNDMORE) | int(zmq.NOBLOCK)
_NOBLOCK = int(zmq.NOBLOCK)


def send_frames(sock: zmq.Socket, frames: list, copy: bool = True, track: bool = False):
    """``sock.send_multipart(frames, zmq.NOBLOCK, copy=copy)``, cheaper. ``copy`` applies to
    the last frame only (the payload; the others are small and always copied). ``track``
    (with ``copy=False``): returns the last frame's ``zmq.MessageTracker``, done once
    libzmq let go of it (written to the kernel, or dropped). Anything that is not a ZeroMQ
    socket (a test's fake) gets its own ``send_multipart``."""
    if not isinstance(sock, _BackendSocket):
        if track:
            return sock.send_multipart(frames, _NOBLOCK, copy=copy, track=True)
        return sock.send_multipart(frames, _NOBLOCK, copy=copy)
    last = len(frames) - 1
    for i in range(last):
        _send(sock, frames[i], _MORE_NOBLOCK)
    if track:
        return _send(sock, frames[last], _NOBLOCK, False, True)
    _send(sock, frames[last], _NOBLOCK, copy)


def recv_frames(sock: zmq.Socket, flags: int = _NOBLOCK) -> list:
    """``sock.recv_multipart(flags)`` (a list of bytes), cheaper; raises ``zmq.Again`` when
    nothing is waiting (with NOBLOCK)."""
    if not isinstance(sock, _BackendSocket):
        return sock.recv_multipart(flags)
    flags = int(flags)
    frame = _recv(sock, flags, False)
    parts = [frame.bytes]
    while frame.more:
        frame = _recv(sock, flags, False)
        parts.append(frame.bytes)
    return parts
