"""The listener's server alone (no broker): answers in request order with pipelined
produce requests, ApiVersions from the registry, bad frames close only their connection."""
from __future__ import annotations

import datetime
import io
import socket
import struct
import threading
import time

from kio.schema.errors import ErrorCode as K
from kio.schema.produce.v9 import request as pr
from kio.serial import entity_reader, entity_writer
from kio.static.primitive import i16, i32, i32Timedelta

from mesh.kafka.build import make
from mesh.kafka.codec import response_class
from mesh.kafka.context import Deferred
from mesh.kafka.link import MeshLinks
from mesh.kafka.server import KafkaServer, Registry
from mesh.testing.launcher import wait_until


def _frame(req, corr: int) -> bytes:
    h = req.__header_schema__
    buf = io.BytesIO()
    entity_writer(h)(buf, h(request_api_key=i16(req.__api_key__), request_api_version=i16(req.__version__),
                            correlation_id=i32(corr), client_id="t"))
    entity_writer(type(req))(buf, req)
    return struct.pack(">i", len(buf.getvalue())) + buf.getvalue()


def _read(sock) -> bytes | None:
    def exact(n):
        b = b""
        while len(b) < n:
            c = sock.recv(n - len(b))
            if not c:
                return None
            b += c
        return b
    head = exact(4)
    return None if head is None else exact(struct.unpack(">i", head)[0])


def _produce(topic: str) -> pr.ProduceRequest:
    return pr.ProduceRequest(acks=i16(1), timeout=i32Timedelta.parse(datetime.timedelta(seconds=1)),
                             topic_data=(pr.TopicProduceData(name=topic, partition_data=(
                                 pr.PartitionProduceData(index=i32(0), records=None),)),))


def test_pipelined_produce_answers_in_request_order():
    reg = Registry()
    started, lock = [], threading.Lock()
    fast_started = threading.Event()
    overlapped = []

    def produce(ctx, req):
        name = req.topic_data[0].name
        with lock:
            started.append(name)
        if name == "fast":
            fast_started.set()
        if name == "slow":   # the reader has queued the other two (pipelining overlaps queued requests only)
            wait_until(lambda: sum(c.queue.qsize() for c in srv._conns) >= 2, 10, "the next requests queued")

        def finish():
            if name == "slow":   # pipelined: the next request starts while this one still waits
                overlapped.append(fast_started.wait(10))
            return make(response_class(0, ctx.api_version), {"throttle_time": 0, "responses": [
                {"name": name, "partition_responses": [{"index": 0, "error_code": K.none, "base_offset": 7}]}]})
        return Deferred(finish)

    reg.register(0, 3, 9, produce)
    srv = KafkaServer("127.0.0.1", 0, reg, cluster=None, links=MeshLinks("127.0.0.1:1"))
    try:
        with socket.create_connection(("127.0.0.1", srv.port), timeout=30) as s:
            s.sendall(_frame(_produce("slow"), 1) + _frame(_produce("fast"), 2) + _frame(_produce("fast2"), 3))
            corrs = [struct.unpack_from(">i", _read(s))[0] for _ in range(3)]
        assert corrs == [1, 2, 3]   # answered in request order, the slow one first
        assert started == ["slow", "fast", "fast2"]
        assert overlapped == [True], "the second request did not start while the first waited: not pipelined"
    finally:
        srv.close()


def test_api_versions_follow_the_registry_and_bad_frames_close_one_connection():
    reg = Registry()

    def api_versions(ctx, req):
        keys = [{"api_key": k, "min_version": lo, "max_version": hi} for k, lo, hi in reg.versions()]
        return make(response_class(18, ctx.api_version), {"error_code": 0, "api_keys": keys, "throttle_time": 0})

    reg.register(18, 0, 3, api_versions)
    reg.register(1, 4, 12, lambda ctx, req: None)
    srv = KafkaServer("127.0.0.1", 0, reg, cluster=None, links=MeshLinks("127.0.0.1:1"))
    try:
        v0 = struct.pack(">hhih", 18, 0, 9, 1) + b"t"
        with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as bad:
            bad.sendall(struct.pack(">i", 200 << 20))
            assert _read(bad) is None
        with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
            s.sendall(struct.pack(">i", len(v0)) + v0)
            frame = _read(s)
        corr, err, n = struct.unpack_from(">ihi", frame)
        assert (corr, err, n) == (9, 0, 2)
        assert [struct.unpack_from(">hhh", frame, 10 + 6 * i) for i in range(n)] == [(1, 4, 12), (18, 0, 3)]
    finally:
        srv.close()


def test_large_size_prefixes_share_one_memory_budget_and_give_it_back():
    from mesh.kafka.server import ServerLimits
    reg = Registry()
    reg.register(18, 0, 3, lambda ctx, req: make(response_class(18, ctx.api_version), {
        "error_code": 0, "api_keys": [], "throttle_time": 0}))
    srv = KafkaServer("127.0.0.1", 0, reg, cluster=None, links=MeshLinks("127.0.0.1:1"),
                      limits=ServerLimits(max_request_bytes=1 << 20, max_queued_bytes=1 << 20))
    try:
        hogs = [socket.create_connection(("127.0.0.1", srv.port), timeout=10) for _ in range(5)]
        for h in hogs:   # each announces 1 MiB and sends 10 bytes of it
            h.sendall(struct.pack(">i", 1 << 20) + b"x" * 10)
        deadline = time.monotonic() + 5
        while srv.memory.used < 1 << 20 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert srv.memory.used == 1 << 20   # one reserved; the others wait for room, allocating nothing
        for h in hogs:
            h.close()
        deadline = time.monotonic() + 5
        while srv.memory.used and time.monotonic() < deadline:
            time.sleep(0.01)
        assert srv.memory.used == 0
        v0 = struct.pack(">hhih", 18, 0, 3, 1) + b"t"
        with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
            s.sendall(struct.pack(">i", len(v0)) + v0)
            assert struct.unpack_from(">ih", _read(s)) == (3, 0)
    finally:
        srv.close()


def test_connections_per_source_address_are_bounded_and_freed_on_close():
    """Kafka's max.connections.per.ip: one more connection from that address is closed at
    once; another address is served; a closed connection frees its place."""
    from mesh.kafka.server import ServerLimits
    reg = Registry()
    reg.register(18, 0, 3, lambda ctx, req: make(response_class(18, ctx.api_version), {
        "error_code": 0, "api_keys": [], "throttle_time": 0}))
    srv = KafkaServer("127.0.0.1", 0, reg, cluster=None, links=MeshLinks("127.0.0.1:1"),
                      limits=ServerLimits(max_connections_per_ip=2))
    v0 = struct.pack(">hhih", 18, 0, 5, 1) + b"t"

    def served(s) -> bool:
        s.sendall(struct.pack(">i", len(v0)) + v0)
        frame = _read(s)
        return frame is not None and struct.unpack_from(">ih", frame) == (5, 0)

    def connect(source: str = "127.0.0.1"):
        return socket.create_connection(("127.0.0.1", srv.port), timeout=10, source_address=(source, 0))
    try:
        first = [connect(), connect()]
        assert all(served(s) for s in first)
        with connect() as third:
            assert _read(third) is None   # closed by the listener before anything was read
        with connect("127.0.0.2") as other:
            assert served(other)
        first.pop().close()
        deadline = time.monotonic() + 10
        while srv._per_ip.get("127.0.0.1") != 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert srv._per_ip.get("127.0.0.1") == 1
        with connect() as again:
            assert served(again)
        first[0].close()
    finally:
        srv.close()
