"""Kafka passwords on a real secured cluster: `mesh user add --kafka-password-file` stores
SCRAM credentials with the user, gossip carries them to every broker, the Kafka listener's
view (KAFKA_SECURITY with the broker's keypair) reads them from any node and a SASL
session logs in with them; nobody but a broker may read them; the password itself is in
no data directory and no log."""
from __future__ import annotations

import os

import pytest
from click.testing import CliRunner
from kafka.net.sasl.scram import ScramClient
from kio.schema.errors import ErrorCode as KafkaError

from mesh.client import Admin
from mesh.client.transport import Transport
from mesh.kafka.authorizer import KafkaAuthorizer, SecurityView, fetch_from_node
from mesh.kafka.sasl import SaslSession
from mesh.kafka.security import ListenerSecurity
from mesh.security.creds import Secrets, init_secrets
from mesh.testing.launcher import Cluster, wait_until
from mesh.wire import messages as m
from mesh.wire.errors import ErrorCode, MeshError
from tools.cli import main as cli

pytestmark = pytest.mark.integration

PASSWORD = "Kafka-Pw-7f3a9c!q"


def login(view: SecurityView, user: str, password: str, mech: str) -> tuple[bool, str | None]:
    s = SaslSession(view.lookup)
    assert s.handshake(mech) == KafkaError.none
    client = ScramClient(user, password, mech)
    reply, err, _ = s.authenticate(client.first_message())
    if err != KafkaError.none:
        return False, None
    client.process_server_first_message(reply)
    reply, err, principal = s.authenticate(client.final_message())
    if err != KafkaError.none:
        return False, None
    client.process_server_final_message(reply)
    return s.done, principal


def polled(view: SecurityView, cond):
    """A condition for wait_until: poll the node once, then look."""
    def check() -> bool:
        view.poll()
        return cond()
    return check


def test_kafka_passwords_on_a_secured_cluster(tmp_path, monkeypatch):
    secrets, admin_creds = init_secrets(tmp_path / "secrets")
    monkeypatch.setenv("MESH_CREDS", admin_creds)
    c = Cluster(tmp_path, 3, extra=["--secrets", str(tmp_path / "secrets")])
    try:
        c.start(timeout_s=60)   # a loaded machine: brokers and listeners start slowly
        pw_file = tmp_path / "alice.pw"
        pw_file.write_text(PASSWORD + "\n")
        run = CliRunner().invoke
        b = ["--bootstrap", c.brokers[0].address]
        r = run(cli, ["user", "add", "alice", "--out", str(tmp_path / "alice.creds"),
                      "--kafka-password-file", str(pw_file), "--creds", admin_creds] + b)
        assert r.exit_code == 0, r.output
        assert "Kafka password set" in r.output
        r = run(cli, ["user", "list", "--creds", admin_creds] + b)
        assert r.exit_code == 0 and "kafka: SCRAM-SHA-256,SCRAM-SHA-512" in r.output, r.output
        r = run(cli, ["acl", "add", "--principal", "alice", "--allow", "read,write", "--topic", "orders",
                      "--creds", admin_creds] + b)
        assert r.exit_code == 0, r.output

        # every broker has them (gossip), and the listener's view reads them with the broker's keys
        broker_creds = Secrets.load(tmp_path / "secrets").creds()
        for broker in c.brokers:
            view = SecurityView(fetch_from_node(broker.address, broker_creds))
            wait_until(polled(view, lambda: view.lookup("alice", "SCRAM-SHA-512") is not None
                              and len(view.state.table) == 1), 20, f"alice on {broker.node_id}")
            assert set(view.state.credentials) == {"alice"}
            assert login(view, "alice", PASSWORD, "SCRAM-SHA-256") == (True, "alice")
            assert login(view, "alice", PASSWORD, "SCRAM-SHA-512") == (True, "alice")
            assert login(view, "alice", "wrong", "SCRAM-SHA-256") == (False, None)
            a = KafkaAuthorizer(view)
            assert a.allowed("alice", "WRITE", "TOPIC", "orders") and not a.allowed("alice", "WRITE", "TOPIC", "payments")
            view.fetch.close()

        # the object the listener builds at start: the same, with a poller thread
        sec = ListenerSecurity.start(c.brokers[0].address, secrets_dir=tmp_path / "secrets", refresh_s=0.1)
        try:
            assert sec.secured and sec.wait_ready(20)
            wait_until(lambda: sec.view.lookup("alice", "SCRAM-SHA-256") is not None, 20, "the listener's view")
            session = sec.new_session()
            assert session is not None and "PLAIN" not in session.mechanisms
            assert login(sec.view, "alice", PASSWORD, "SCRAM-SHA-256") == (True, "alice")
            assert sec.authorizer.allowed("alice", "READ", "TOPIC", "orders")
            assert not sec.authorizer.allowed("alice", "READ", "TOPIC", "payments")
        finally:
            sec.close()

        # users may not read them: a superuser neither, and alice not her own
        for creds in (admin_creds, str(tmp_path / "alice.creds")):
            t = Transport(creds=creds)
            try:
                with pytest.raises(MeshError) as e:
                    t.call(c.brokers[1].address, m.KafkaSecurityRequest(), timeout_ms=5000)
                assert e.value.code == ErrorCode.UNAUTHORIZED
            finally:
                t.close()

        # a new password replaces the old one; a removed user cannot log in any more
        pw_file.write_text("second-" + PASSWORD + "\n")
        r = run(cli, ["user", "kafka-password", "alice", "--kafka-password-file", str(pw_file),
                      "--kafka-iterations", "4096", "--creds", admin_creds] + b)
        assert r.exit_code == 0 and "Kafka password of alice set" in r.output, r.output
        r = run(cli, ["user", "kafka-password", "nobody", "--kafka-password-file", str(pw_file),
                      "--creds", admin_creds] + b)
        assert r.exit_code != 0 and "no user named nobody" in r.output
        with Admin(c.bootstrap) as admin:
            view = SecurityView(fetch_from_node(c.brokers[2].address, broker_creds))
            wait_until(polled(view, lambda: login(view, "alice", "second-" + PASSWORD, "SCRAM-SHA-256")[0]),
                       20, "the new password")
            assert login(view, "alice", PASSWORD, "SCRAM-SHA-256") == (False, None)
            admin.remove_user("alice")
            wait_until(polled(view, lambda: view.lookup("alice", "SCRAM-SHA-256") is None), 20, "removal")
            assert not KafkaAuthorizer(view).allowed("alice", "WRITE", "TOPIC", "orders")
            view.fetch.close()
    finally:
        c.stop()
    # the password is nowhere on disk: data directories, snapshots, logs
    needles = [PASSWORD.encode(), ("second-" + PASSWORD).encode()]
    scanned = 0
    for root, _, files in os.walk(tmp_path):
        for f in files:
            path = os.path.join(root, f)
            if path == str(pw_file):
                continue
            tail = b""
            with open(path, "rb") as fh:
                while chunk := fh.read(1 << 22):
                    scanned += len(chunk)
                    window = tail + chunk
                    assert not any(n in window for n in needles), f"the password is in {path}"
                    tail = window[-64:]
    assert scanned > 0
