"""Issue 39 on a secured broker. Finding 7: a co-writer with write (and read) on a shared
topic reads another producer's batch headers and writes under its producer id and next
sequence: refused (UNAUTHORIZED), and the victim's next records are stored where its
answers say. Finding 10: a group consumer without rights on its group raises
UNAUTHORIZED instead of polling nothing for ever."""
from __future__ import annotations

import time

import pytest

from mesh.client import Admin, Consumer, Producer
from mesh.client.transport import Transport
from mesh.security.creds import init_secrets
from mesh.testing.launcher import Cluster, wait_until
from mesh.wire import messages as m
from mesh.wire.codec import PROTOCOL_CLIENT, pack
from mesh.wire.errors import ErrorCode, MeshError
from mesh.wire.records import encode_batch, iter_batches
from tests.integration.test_acl import new_user

pytestmark = pytest.mark.integration


def test_a_co_writer_cannot_write_under_another_principals_producer_id(tmp_path, monkeypatch):
    secrets, admin_creds = init_secrets(tmp_path / "secrets")
    monkeypatch.setenv("MESH_CREDS", admin_creds)
    c = Cluster(tmp_path, 1, extra=["--secrets", str(tmp_path / "secrets")]).start()
    try:
        with Admin(c.bootstrap) as admin:
            admin.create_topic("shared", 1, 1)
            alice = new_user(admin, secrets, tmp_path, "alice")
            mallory = new_user(admin, secrets, tmp_path, "mallory")
            for who in ("alice", "mallory"):
                admin.add_acl(who, "write,read,describe", "topic", "shared")
        addr = c.brokers[0].address
        with Producer(c.bootstrap, creds=alice, acks=-1) as p:
            first = p.send("shared", b"alice-1", partition=0).get(20)
            t = Transport(creds=mallory)
            try:
                resp, payload = t.call(addr, m.FetchRequest([["shared", 0, 0, 1 << 20]], max_wait_ms=0),
                                       timeout_ms=5000)
                h = [h for h, _ in iter_batches(payload or b"")][-1]
                assert h.producer_id >= 0
                forged = encode_batch([b"mallory"], producer_id=h.producer_id,
                                      base_sequence=h.base_sequence + h.record_count)
                with pytest.raises(MeshError) as info:
                    t.call(addr, m.ProduceRequest("shared", 0, -1), forged, timeout_ms=5000)
                assert info.value.code == ErrorCode.UNAUTHORIZED and "another principal" in info.value.message
            finally:
                t.close()
            second = p.send("shared", b"alice-2", partition=0).get(20)
        assert second.offset == first.offset + 1
        with Consumer(bootstrap=c.bootstrap, auto_offset_reset="earliest", creds=alice) as cons:
            cons.assign([("shared", 0)])
            got: list[bytes] = []
            wait_until(lambda: got.extend(r.value for b in cons.poll_batches(200) for r in b) or len(got) >= 2,
                       20, "alice's two records")
        assert got == [b"alice-1", b"alice-2"]
    finally:
        c.kill()


def test_a_group_consumer_without_rights_raises_instead_of_returning_nothing(tmp_path, monkeypatch):
    secrets, admin_creds = init_secrets(tmp_path / "secrets")
    monkeypatch.setenv("MESH_CREDS", admin_creds)
    c = Cluster(tmp_path, 1, extra=["--secrets", str(tmp_path / "secrets")]).start()
    try:
        with Admin(c.bootstrap) as admin:
            admin.create_topic("t", 1, 1)
            nobody = new_user(admin, secrets, tmp_path, "nobody")   # no ACL at all
        with Producer(c.bootstrap) as p:
            p.send("t", b"x", partition=0).get(20)
        cons = Consumer("t", bootstrap=c.bootstrap, group_id="g", auto_offset_reset="earliest", creds=nobody)
        try:
            deadline = time.monotonic() + 20
            with pytest.raises(MeshError) as info:
                while time.monotonic() < deadline:
                    cons.poll(200)
            assert info.value.code == ErrorCode.UNAUTHORIZED
        finally:
            cons.close()
    finally:
        c.kill()


def test_one_reader_with_many_connections_holds_a_quarter_of_the_answer_budget(tmp_path, monkeypatch):
    """Issue 39 finding 5, per principal: mallory's 10 connections of 40 unread 4 MB fetches
    hold at most a quarter of --queued-max-answer-bytes, and alice's 4 MB fetch is served."""
    import zmq

    from tests.integration.test_bounds import rss_mib
    secrets, admin_creds = init_secrets(tmp_path / "secrets")
    monkeypatch.setenv("MESH_CREDS", admin_creds)
    c = Cluster(tmp_path, 1, extra=["--secrets", str(tmp_path / "secrets"),
                                    "--queued-max-answer-bytes", str(64 << 20)]).start()
    socks = []
    try:
        with Admin(c.bootstrap) as admin:
            admin.create_topic("big", 1, 1)
            users = {n: new_user(admin, secrets, tmp_path, n) for n in ("alice", "mallory")}
            for n in users:
                admin.add_acl(n, "read", "topic", "big")
        with Producer(c.bootstrap, acks=-1) as p:
            for f in [p.send_batch("big", [b"x" * 1000] * 1000, partition=0) for _ in range(6)]:
                f.result(20)
        b = c.brokers[0]
        before = rss_mib(b)
        fetch = m.FetchRequest([["big", 0, 0, 4 << 20]], 0, 1, 8 << 20)
        for _ in range(10):
            s = zmq.Context.instance().socket(zmq.DEALER)
            s.setsockopt(zmq.LINGER, 0)
            s.setsockopt(zmq.RCVHWM, 1)
            s.setsockopt(zmq.RCVBUF, 4096)
            users["mallory"].apply(s)
            s.connect(f"tcp://{b.address}")
            socks.append(s)
            for rid in range(40):
                s.send_multipart(pack(PROTOCOL_CLIENT, rid + 1, fetch))
        peak, last_change, t0 = before, time.monotonic(), time.monotonic()
        while time.monotonic() - last_change < 3 and time.monotonic() - t0 < 60:   # until it stops growing
            now = rss_mib(b)
            if now > peak + 1:
                peak, last_change = now, time.monotonic()
            time.sleep(0.1)
        t = Transport(creds=users["alice"])
        try:
            deadline = time.monotonic() + 30
            while True:   # served once mallory's fetches were handled (and refused)
                resp, payload = t.call(b.address, fetch, timeout_ms=10_000)
                if len(payload or b"") >= 1 << 20 or time.monotonic() > deadline:
                    break
            assert isinstance(resp, m.FetchResponse) and len(payload) >= 1 << 20
        finally:
            t.close()
        grown = max(peak, rss_mib(b)) - before
        print(f"\nmallory 10 x 40 unread 4 MB fetches: broker RSS +{grown:.0f} MiB")
        assert grown < 120, grown   # a quarter of 64 MiB, one answer per connection, slack
    finally:
        for s in socks:
            s.close()
        c.kill()
