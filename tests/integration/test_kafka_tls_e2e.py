"""A secured broker whose Kafka port speaks TLS (--kafka-tls-cert/--kafka-tls-key): SASL_SSL
with PLAIN (offered only over TLS, checked against the SCRAM credentials) and SCRAM through
confluent-kafka and kcat; a plaintext client gets nothing. (Needs the listener with TLS:
skipped without it.)"""
from __future__ import annotations

import inspect
import subprocess

import pytest

server = pytest.importorskip("mesh.kafka.server")
pytest.importorskip("confluent_kafka")
if "ssl_context" not in inspect.signature(server.KafkaServer).parameters:
    pytest.skip("the Kafka listener does not wrap its sockets with TLS yet", allow_module_level=True)

from mesh.client import Admin                                     # noqa: E402
from mesh.security.creds import init_secrets, new_keypair        # noqa: E402
from mesh.testing.launcher import Cluster, wait_until             # noqa: E402
from tests.unit.test_kafka_tls import need, self_signed          # noqa: E402

pytestmark = pytest.mark.integration

PASSWORD = "tls-Pw-5e2a"


def conf(c, cert, mech="PLAIN", password=PASSWORD, protocol="SASL_SSL") -> dict:
    return {"bootstrap.servers": c.brokers[0].kafka_address, "security.protocol": protocol,
            "ssl.ca.location": cert, "sasl.mechanisms": mech, "sasl.username": "bob",
            "sasl.password": password, "log_level": 0}


def lists_topics(config: dict) -> bool:
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient
    try:
        return "orders" in AdminClient({**config, "socket.timeout.ms": 4000}).list_topics(timeout=5).topics
    except KafkaException:
        return False


def test_sasl_ssl_plain_and_scram(tmp_path, monkeypatch):
    from confluent_kafka import Producer
    cert, key = self_signed(tmp_path)
    secrets, admin_creds = init_secrets(tmp_path / "secrets")
    monkeypatch.setenv("MESH_CREDS", admin_creds)
    c = Cluster(tmp_path, 1, extra=["--secrets", str(tmp_path / "secrets"), "--kafka-tls-cert", cert,
                                    "--kafka-tls-key", key], kafka=True)
    try:
        c.start(timeout_s=60)   # a loaded machine: brokers and listeners start slowly
        with Admin(c.bootstrap) as admin:
            admin.create_topic("orders", partitions=1, replication_factor=1)
            admin.add_user("bob", new_keypair()[0], kafka_password=PASSWORD, kafka_iterations=4096)
            admin.add_acl("bob", "read,write", "topic", "orders")
        wait_until(lambda: lists_topics(conf(c, cert)), 30, "bob over SASL_SSL/PLAIN")
        for mech in ("PLAIN", "SCRAM-SHA-512"):
            errors = []
            p = Producer({**conf(c, cert, mech), "acks": "all", "message.timeout.ms": 20000})
            p.produce("orders", mech.encode(), on_delivery=lambda e, m: errors.append(e))
            assert p.flush(30) == 0 and errors == [None], errors
        assert not lists_topics(conf(c, cert, password="wrong"))
        assert not lists_topics(conf(c, cert, protocol="SASL_PLAINTEXT"))     # plaintext at a TLS port
        cmd = [need("kcat"), "-b", c.brokers[0].kafka_address, "-X", "security.protocol=SASL_SSL",
               "-X", f"ssl.ca.location={cert}", "-X", "sasl.mechanisms=PLAIN",
               "-X", "sasl.username=bob", "-X", f"sasl.password={PASSWORD}",
               "-t", "orders", "-C", "-o", "beginning", "-e", "-q"]
        r = subprocess.run(cmd, capture_output=True, timeout=60)
        if r.returncode != 0 and b"All broker connections are down" in r.stderr:
            # kcat gives up at its first failed connection; seen once in a full suite run on a
            # loaded host (the listener's log has the reason): one more try, the first kept
            print(f"kcat's first try failed: {r.stderr.decode()}\n{c.brokers[0].log(3000)}")
            r = subprocess.run(cmd, capture_output=True, timeout=60)
        assert r.returncode == 0 and r.stdout.split() == [b"PLAIN", b"SCRAM-SHA-512"], r.stderr.decode()
    finally:
        c.stop()


def test_a_bad_tls_file_stops_the_node_at_start_with_the_reason(tmp_path):
    import os
    import sys
    from mesh.testing.launcher import free_port
    cert, key = self_signed(tmp_path)
    os.chmod(key, 0o644)
    for c, k, why in ((cert, key, "readable by others"), (key, key, "cannot load")):
        if why == "cannot load":
            os.chmod(key, 0o600)
        r = subprocess.run([sys.executable, "-m", "tools.cli", "node", "--id", "n1", "--data", str(tmp_path / why),
                            "--bind", f"127.0.0.1:{free_port()}", "--kafka-port", str(free_port()),
                            "--kafka-tls-cert", c, "--kafka-tls-key", k], capture_output=True, timeout=120)
        assert r.returncode != 0 and why in r.stderr.decode() + r.stdout.decode(), r.stderr.decode()[-2000:]
