"""Real brokers with --secrets: CURVE + ZAP authentication, forged peer traffic, the open-mode
bind check and the connection cap (issue 12)."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import pytest
import zmq

from mesh.client import Admin, Consumer, Producer, TopicPartition
from mesh.client.transport import Transport
from mesh.gossip import GossipAck2
from mesh.raft.messages import AppendRow, ReplAppend, VoteRow, ReplVote
from mesh.security import Creds, Secrets, init_secrets
from mesh.security.creds import new_keypair
from mesh.testing.launcher import ROOT, BrokerProcess, Cluster, free_port, wait_until
from mesh.wire.codec import PROTOCOL_PEER, pack
from mesh.wire.errors import ErrorCode, MeshError
from mesh.wire.messages import MetadataRequest
from mesh.wire.records import encode_batch

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    """Three secured brokers (one secrets directory), and the admin's creds."""
    root = tmp_path_factory.mktemp("secured")
    out = subprocess.run([sys.executable, "-m", "tools.cli", "security", "init", "--dir", str(root / "secrets")],
                         cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    secrets = Secrets.load(root / "secrets")
    admin = Creds.load(root / "secrets" / "admin.creds")
    c = Cluster(root / "c", 3, secrets=str(root / "secrets"), creds=admin).start()
    c.admin = admin
    c.secrets = secrets
    with Admin(c.bootstrap, creds=admin) as a:
        a.create_topic("orders", 1, 3)
    yield c
    for b in c.brokers:
        if b.proc and b.proc.poll() is None:
            try:
                b.signal(signal.SIGCONT)
            except ProcessLookupError:
                pass
        b.kill()


def _refused(fn, what: str) -> MeshError:
    t0 = time.monotonic()
    with pytest.raises(MeshError) as info:
        fn()
    took = time.monotonic() - t0
    assert info.value.code == ErrorCode.UNAUTHORIZED, info.value
    assert took < 3.0, f"{what}: refused only after {took:.1f} s"
    return info.value


def test_a_client_without_credentials_is_refused_at_once(secured, monkeypatch):
    monkeypatch.delenv("MESH_CREDS", raising=False)

    def call():
        with Admin(secured.bootstrap, request_timeout_ms=5_000) as a:
            a.list_topics()
    err = _refused(call, "no creds")
    assert "requires credentials" in err.message and "--creds" in err.message

    def produce():
        with Producer(secured.bootstrap, request_timeout_ms=5_000) as p:
            p.send("orders", b"x").get(5)
    _refused(produce, "producer without creds")


def test_unknown_key_and_wrong_cluster_key_are_refused(secured):
    pub, sec = new_keypair()
    stranger = Creds("mallory", pub, sec, secured.secrets.cluster.public_key)

    def call(creds):
        with Admin(secured.bootstrap, request_timeout_ms=5_000, creds=creds) as a:
            a.list_topics()
    err = _refused(lambda: call(stranger), "unknown key")
    assert "refused the credentials of 'mallory'" in err.message
    wrong_cluster, _ = new_keypair()
    admin = secured.admin
    err = _refused(lambda: call(Creds("admin", admin.public_key, admin.secret_key, wrong_cluster)),
                   "wrong cluster key")
    assert "cluster public key" in err.message


def test_the_cli_takes_creds(secured, tmp_path):
    env = {**os.environ, "MESH_BOOTSTRAP": secured.bootstrap}
    env.pop("MESH_CREDS", None)
    creds = tmp_path / "admin.creds"
    secured.admin.save(creds)
    ok = subprocess.run([sys.executable, "-m", "tools.cli", "topic", "list", "--creds", str(creds)],
                        cwd=ROOT, env=env, capture_output=True, text=True, timeout=30)
    assert ok.returncode == 0 and "orders" in ok.stdout, ok.stderr
    bad = subprocess.run([sys.executable, "-m", "tools.cli", "topic", "list"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=30)
    assert bad.returncode == 1 and "UNAUTHORIZED" in bad.stderr, bad.stderr
    os.chmod(creds, 0o644)
    loose = subprocess.run([sys.executable, "-m", "tools.cli", "topic", "list", "--creds", str(creds)],
                           cwd=ROOT, env=env, capture_output=True, text=True, timeout=30)
    assert loose.returncode != 0 and "chmod 600" in loose.stderr, loose.stderr


def _values(consumer) -> list[bytes]:
    return [r.value for recs in consumer.poll_batches(timeout_ms=200) for r in recs]


def _dealer(ctx, creds: Creds | None, routing_id: bytes, addr: str) -> zmq.Socket:
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.setsockopt(zmq.ROUTING_ID, routing_id)
    if creds is not None:
        creds.apply(s)
    s.connect(f"tcp://{addr}")
    return s


def _forgeries(real_peer: str) -> list[list[bytes]]:
    """A gossip ACK2 deleting topic ``orders`` and a raft append + vote at absurd terms."""
    ack2 = GossipAck2("ghost", [], ["topic/orders", 2**62, "ghost", None, True])
    batch = encode_batch([b"forged"])
    out = [pack(PROTOCOL_PEER, 0, ack2)]
    for pid in range(4):
        rows = [AppendRow(pid, 1000, 0, 0, 1, 1000, 0, 1, len(batch), 0)]
        out.append(pack(PROTOCOL_PEER, 0, ReplAppend(rows), batch))
        out.append(pack(PROTOCOL_PEER, 0, ReplVote([VoteRow(pid, 2**62, 2**40, 2**40, 0, 1)])))
    return out


def test_forged_peer_traffic_changes_nothing(secured):
    n1, n2, _ = secured.brokers
    with Admin(secured.bootstrap, creds=secured.admin) as a:
        before = a.describe_topic("orders")
    ctx = zmq.Context()
    try:
        # 1. no credentials at all: the handshake itself fails (mechanism mismatch)
        plain = _dealer(ctx, None, b"peer:" + n2.address.encode(), n1.address)
        # 2. a real principal's key (the admin's) posing as the real broker n2: without n2's
        #    link's random nonce it is another routing id: refused (not the cluster key), the
        #    real link stays up
        posing = _dealer(ctx, secured.admin, b"peer:" + n2.address.encode(), n1.address)
        # 3. the same key posing as some other broker address: delivered, refused, counted
        other = _dealer(ctx, secured.admin, b"peer:127.0.0.1:9", n1.address)
        for sock in (plain, posing, other):
            for frames in _forgeries(n2.address):
                sock.send_multipart(frames)
        wait_until(lambda: "peer message refused from b'peer:127.0.0.1:9'" in n1.log(20_000), 10,
                   "n1 to log the refused peer messages")
    finally:
        ctx.destroy(linger=0)
    # the topic is still there everywhere, same leader and epoch; the cluster replicates
    with Producer(secured.bootstrap, creds=secured.admin, request_timeout_ms=5_000) as p:
        p.send("orders", b"after the attack").get(10)
    for b in secured.brokers:   # still there everywhere; no forged term (2**62, +1000) was taken
        with Admin(b.address, creds=secured.admin) as a:
            t = a.describe_topic("orders")
        assert [p["epoch"] < before["partitions"][0]["epoch"] + 100 for p in t["partitions"]] == [True], t
    for b in secured.brokers:
        alive = {x["id"] for x in b.metadata(1000).brokers if x["status"] == "alive"}
        assert alive == {"n1", "n2", "n3"}, (b.node_id, alive)
    c = Consumer(bootstrap=secured.bootstrap, creds=secured.admin, auto_offset_reset="earliest")
    try:
        c.assign([TopicPartition("orders", 0)])
        got = []
        wait_until(lambda: got.extend(_values(c)) or b"after the attack" in got, 10)
        assert b"forged" not in got
    finally:
        c.close()


def test_secured_cluster_survives_a_leader_kill(secured):
    with Producer(secured.bootstrap, creds=secured.admin, request_timeout_ms=3_000) as p:
        for i in range(20):
            p.send("orders", f"a{i}".encode())
        p.flush(20)
        with Admin(secured.bootstrap, creds=secured.admin) as a:
            leader = a.describe_topic("orders")["partitions"][0]["leader"]
        victim = next(b for b in secured.brokers if b.node_id == leader)
        victim.kill()
        futures = [p.send("orders", f"b{i}".encode()) for i in range(20)]
        for f in futures:
            f.get(30)
    c = Consumer(bootstrap=",".join(b.address for b in secured.brokers if b is not victim),
                 creds=secured.admin, auto_offset_reset="earliest")
    try:
        c.assign([TopicPartition("orders", 0)])
        seen: set[bytes] = set()
        want = {f"a{i}".encode() for i in range(20)} | {f"b{i}".encode() for i in range(20)}
        wait_until(lambda: seen.update(_values(c)) or want <= seen, 30,
                   "every record from the surviving replicas")
    finally:
        c.close()
    # back on the same address (new links, new routing ids): its peers take the new connections
    victim.start()
    secured.wait_converged(30)


def test_open_mode_refuses_a_non_loopback_bind(tmp_path):
    port = free_port()
    out = subprocess.run([sys.executable, "-m", "tools.cli", "node", "--id", "x", "--data", str(tmp_path / "x"),
                          "--bind", f"0.0.0.0:{port}"], cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert out.returncode == 1
    assert "--insecure" in out.stderr and "--secrets" in out.stderr, out.stderr
    b = BrokerProcess("y", str(tmp_path / "y"), host="0.0.0.0").start()   # the launcher adds --insecure
    try:
        assert "WITHOUT authentication" in b.log()
    finally:
        b.stop()


def test_the_connection_cap(tmp_path):
    b = BrokerProcess("n1", str(tmp_path / "n1"), extra=["--max-connections", "3"]).start()
    held = []
    try:
        for _ in range(3):
            t = Transport()
            t.call(b.address, MetadataRequest([]), timeout_ms=5_000)
            held.append(t)
        with pytest.raises(MeshError) as info:
            with Admin(b.address, request_timeout_ms=1_000) as a:
                a.metadata([])
        assert info.value.code in (ErrorCode.TIMEOUT, ErrorCode.BROKER_UNAVAILABLE)
        held.pop().close()

        def admitted():
            with Admin(b.address, request_timeout_ms=1_000) as a:
                return a.metadata([]) is not None
        wait_until(admitted, 15, "a new connection once one closed")
        assert "too many connections" in b.log()
    finally:
        for t in held:
            t.close()
        b.stop()


def test_the_text_gateway_of_a_secured_node_needs_its_own_creds(tmp_path):
    _, admin_path = init_secrets(tmp_path / "secrets")
    admin = Creds.load(admin_path)
    port = free_port()
    out = subprocess.run([sys.executable, "-m", "tools.cli", "node", "--id", "x", "--data", str(tmp_path / "x"),
                          "--bind", f"127.0.0.1:{free_port()}", "--secrets", str(tmp_path / "secrets"),
                          "--text-port", str(port)], cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert out.returncode == 1 and "--text-creds" in out.stderr, out.stderr
    b = BrokerProcess("n1", str(tmp_path / "n1"), secrets=str(tmp_path / "secrets"), creds=admin,
                      extra=["--text-port", str(port), "--text-creds", admin_path]).start()
    try:
        with Admin(b.address, creds=admin) as a:
            a.create_topic("news", 1)
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            f = s.makefile("rwb")
            f.write(b"PUBS news hello\n")
            f.flush()
            assert f.readline().startswith(b"OK"), b.log()
    finally:
        b.stop()
