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
