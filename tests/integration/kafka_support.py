"""Shared by the Kafka listener tests: a 3-broker cluster with Kafka ports, and helpers."""
from __future__ import annotations

import itertools
import signal
import socket
import struct

import pytest

from mesh.client.admin import Admin
from mesh.testing.launcher import Cluster

_names = itertools.count(1)


@pytest.fixture(scope="module")
def kcluster(tmp_path_factory):
    """Three brokers n1..n3, each with a Kafka listener (``kafka_bootstrap``)."""
    c = Cluster(tmp_path_factory.mktemp("kafka"), 3, kafka=True).start(60)
    yield c
    for b in c.brokers:
        if b.proc and b.proc.poll() is None:
            try:
                b.signal(signal.SIGCONT)
            except ProcessLookupError:
                pass
    c.stop()


def new_topic(cluster, prefix: str, partitions: int = 1, rf: int = 3, config: dict | None = None) -> str:
    name = f"{prefix}-{next(_names)}"
    with Admin(cluster.bootstrap) as a:
        a.create_topic(name, partitions, rf, config=config)
    return name


def raw_request(api_key: int, version: int, correlation_id: int, body: bytes = b"", client_id: bytes = b"t") -> bytes:
    """A request frame with header v1 (non-flexible): size, key, version, correlation id, client id."""
    head = struct.pack(">hhih", api_key, version, correlation_id, len(client_id)) + client_id
    msg = head + body
    return struct.pack(">i", len(msg)) + msg


def read_frame(sock: socket.socket) -> bytes | None:
    """One response frame, or None when the listener closed the connection."""
    def exact(n):
        buf = b""
        while len(buf) < n:
            chunk = sock.recv(n - len(buf))
            if not chunk:
                return None
            buf += chunk
        return buf
    head = exact(4)
    if head is None:
        return None
    return exact(struct.unpack(">i", head)[0])


def connect(address: str, timeout_s: float = 20.0) -> socket.socket:
    host, port = address.rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=timeout_s)


def kio_call(sock: socket.socket, request, correlation_id: int = 1, client_id: str = "test"):
    """Send a kio request dataclass, return the decoded kio response (None: closed)."""
    import io

    from kio.index import load_response_schema
    from kio.serial import entity_reader, entity_writer
    from kio.static.primitive import i16, i32

    header_cls = request.__header_schema__
    buf = io.BytesIO()
    entity_writer(header_cls)(buf, header_cls(request_api_key=i16(request.__api_key__),
                                              request_api_version=i16(request.__version__),
                                              correlation_id=i32(correlation_id), client_id=client_id))
    entity_writer(type(request))(buf, request)
    body = buf.getvalue()
    sock.sendall(struct.pack(">i", len(body)) + body)
    frame = read_frame(sock)
    if frame is None:
        return None
    resp_cls = load_response_schema(request.__api_key__, request.__version__)
    _h, used = entity_reader(resp_cls.__header_schema__)(frame, 0)
    return entity_reader(resp_cls)(frame, used)[0]
