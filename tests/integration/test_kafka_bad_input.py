"""Hostile input on a Kafka port: a clear answer or a closed connection, and the listener
keeps serving everyone else."""
from __future__ import annotations

import socket
import struct

import pytest

from tests.integration.kafka_support import connect, kcluster, raw_request, read_frame  # noqa: F401

pytestmark = pytest.mark.integration


def _api_versions_ok(address: str) -> dict[int, tuple[int, int]]:
    """ApiVersions v0 on a fresh connection: {api key: (min, max)}."""
    with connect(address) as s:
        s.sendall(raw_request(18, 0, 99))
        frame = read_frame(s)
    assert frame is not None
    corr, err, n = struct.unpack_from(">ihi", frame)
    assert (corr, err) == (99, 0)
    out = {}
    for i in range(n):
        k, lo, hi = struct.unpack_from(">hhh", frame, 10 + 6 * i)
        out[k] = (lo, hi)
    return out


def _closed(s: socket.socket) -> bool:
    try:
        return read_frame(s) is None
    except (ConnectionResetError, BrokenPipeError):
        return True


def test_advertised_versions_are_exactly_the_served_set(kcluster):
    versions = _api_versions_ok(kcluster.brokers[0].kafka_address)
    assert versions == {0: (0, 9), 1: (4, 12), 2: (1, 7), 3: (1, 12), 18: (0, 3), 19: (2, 5), 20: (1, 4),
                        22: (0, 4), 32: (1, 4), 37: (0, 3),
                        # the classic group APIs (mesh.kafka.groups)
                        8: (2, 8), 9: (1, 8), 10: (0, 4), 11: (0, 7), 12: (0, 4), 13: (0, 4), 14: (0, 5),
                        15: (0, 5), 16: (0, 4)}


def test_unknown_api_key_and_version_close_the_connection(kcluster):
    addr = kcluster.brokers[0].kafka_address
    # unknown key, too new, too old, transactions, Produce v2 (advertised from 0, refused when used)
    for key, version in ((999, 0), (3, 13), (1, 3), (26, 0), (0, 2)):
        with connect(addr) as s:
            s.sendall(raw_request(key, version, 7))
            assert _closed(s), (key, version)
    assert _api_versions_ok(addr)


def test_api_versions_of_an_unknown_version_answers_v0_unsupported(kcluster):
    with connect(kcluster.brokers[1].kafka_address) as s:
        s.sendall(raw_request(18, 42, 5))
        frame = read_frame(s)
    corr, err, n = struct.unpack_from(">ihi", frame)
    assert (corr, err) == (5, 35) and n > 0   # UNSUPPORTED_VERSION, with the ranges to pick from


def test_oversized_negative_and_garbage_frames(kcluster):
    addr = kcluster.brokers[2].kafka_address
    with connect(addr) as s:
        s.sendall(struct.pack(">i", 100 << 20 | 1) + b"x" * 1000)   # over socket.request.max.bytes
        assert _closed(s)
    with connect(addr) as s:
        s.sendall(struct.pack(">i", -5))
        assert _closed(s)
    with connect(addr) as s:
        s.sendall(b"\x00\x00\x00\x10" + b"\xff" * 16)   # a frame of garbage: api key -1
        assert _closed(s)
    with connect(addr) as s:   # a Metadata v9 (flexible) frame that ends in the middle of its body
        s.sendall(raw_request(3, 9, 1, body=b"\x05\x01"))
        assert _closed(s)
    with connect(addr) as s:
        s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        assert _closed(s)
    assert _api_versions_ok(addr)


def test_a_client_that_never_reads_does_not_stop_the_others(kcluster):
    addr = kcluster.brokers[0].kafka_address
    hogs = []
    for _ in range(4):
        s = connect(addr)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        hogs.append(s)
        frame = raw_request(18, 0, 1)
        try:
            s.settimeout(2.0)
            for _ in range(20_000):   # ~0.5 MB of requests whose answers nobody reads
                s.sendall(frame)
        except (socket.timeout, BlockingIOError, OSError):
            pass   # the listener stopped reading: pushed back, as it should
    try:
        for _ in range(5):
            assert _api_versions_ok(addr)
    finally:
        for s in hogs:
            s.close()
    assert _api_versions_ok(addr)
