"""A secured cluster's Kafka port, end to end, with real Kafka clients: a SCRAM user whose
ACLs allow one topic writes and reads it through kcat and confluent-kafka and is refused
on another; no SASL, a wrong password and an unknown user are refused. (Needs the Kafka
listener, mesh.kafka.server: skipped without it.)"""
from __future__ import annotations

import gc
import subprocess

import pytest

pytest.importorskip("mesh.kafka.server")
confluent_kafka = pytest.importorskip("confluent_kafka")

from mesh.client import Admin, Producer                           # noqa: E402
from mesh.security.creds import init_secrets                     # noqa: E402
from mesh.testing.launcher import Cluster, wait_until             # noqa: E402
from tests.unit.test_kafka_tls import need                       # noqa: E402

pytestmark = pytest.mark.integration

PASSWORD = "e2e-Pw-39c1"


@pytest.fixture(scope="module")
def secured_kafka(tmp_path_factory):
    root = tmp_path_factory.mktemp("ksec")
    secrets, admin_creds = init_secrets(root / "secrets")
    mp = pytest.MonkeyPatch()
    mp.setenv("MESH_CREDS", admin_creds)
    c = Cluster(root, 3, extra=["--secrets", str(root / "secrets")], kafka=True)
    try:
        c.start(timeout_s=60)   # a loaded machine: brokers and listeners start slowly
        with Admin(c.bootstrap) as admin:
            for t in ("orders", "payments"):
                admin.create_topic(t, partitions=2, replication_factor=3)
            from mesh.security.creds import new_keypair
            pub, _ = new_keypair()
            admin.add_user("alice", pub, kafka_password=PASSWORD, kafka_iterations=4096)
            admin.add_acl("alice", "read,write", "topic", "orders")
            admin.add_acl("alice", "read", "group", "g-", pattern="prefixed")
        with Producer(c.bootstrap) as p:                  # a record alice must never read
            p.send("payments", b"secret", partition=1).get(30)
        # each listener learns users and ACLs from its node within about a second
        for b in c.brokers:
            wait_until(lambda: logs_in(b.kafka_address), 30, f"alice known to {b.node_id}'s Kafka listener")
        yield c
    finally:
        gc.collect()   # a client handle left in a reference cycle closes now, not reconnecting later
        c.kill()
        mp.undo()


def logs_in(address: str) -> bool:
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient
    conf = {"bootstrap.servers": address, "security.protocol": "SASL_PLAINTEXT", "sasl.mechanisms": "SCRAM-SHA-256",
            "sasl.username": "alice", "sasl.password": PASSWORD, "log_level": 0}
    try:
        return "orders" in AdminClient(conf).list_topics(topic="orders", timeout=3).topics
    except KafkaException:
        return False


def sasl_conf(c, user="alice", password=PASSWORD, mech="SCRAM-SHA-256") -> dict:
    return {"bootstrap.servers": c.brokers[0].kafka_address, "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanisms": mech, "sasl.username": user, "sasl.password": password}


def kcat(c, *args, user="alice", password=PASSWORD, sasl=True, input_=None, timeout=60, metadata_s=15):
    """``metadata_s``: kcat's -m; a listing that must fail waits all of it (kcat retries)."""
    cmd = [need("kcat"), "-b", c.brokers[0].kafka_address, "-m", str(metadata_s)]
    if sasl:
        cmd += ["-X", "security.protocol=SASL_PLAINTEXT", "-X", "sasl.mechanisms=SCRAM-SHA-256",
                "-X", f"sasl.username={user}", "-X", f"sasl.password={password}"]
    return subprocess.run(cmd + list(args), input=input_, capture_output=True, timeout=timeout)


def test_kcat_scram_user_allowed_one_topic_refused_another(secured_kafka):
    c = secured_kafka
    r = kcat(c, "-t", "orders", "-P", "-p", "0", input_=b"k1\nk2\n")
    assert r.returncode == 0, r.stderr.decode()
    r = kcat(c, "-t", "orders", "-C", "-p", "0", "-o", "beginning", "-e", "-q")
    assert r.returncode == 0 and r.stdout.split() == [b"k1", b"k2"], r.stderr.decode()
    r = kcat(c, "-t", "payments", "-P", "-p", "0", input_=b"no\n")
    assert r.returncode != 0 or b"authoriz" in r.stderr.lower(), r.stderr.decode()
    assert b"authoriz" in r.stderr.lower(), r.stderr.decode()
    r = kcat(c, "-t", "payments", "-C", "-p", "0", "-o", "beginning", "-e", "-q")
    assert b"authoriz" in r.stderr.lower() and r.stdout == b"", r.stderr.decode()
    r = kcat(c, "-L", password="wrong", metadata_s=3)   # refused at the first connection
    assert r.returncode != 0 and b"authentication" in r.stderr.lower(), r.stderr.decode()
    r = kcat(c, "-L", sasl=False, metadata_s=3)
    assert r.returncode != 0, r.stdout.decode()


def test_confluent_kafka_scram_user_allowed_one_topic_refused_another(secured_kafka):
    from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
    c = secured_kafka
    for mech in ("SCRAM-SHA-256", "SCRAM-SHA-512"):
        errors: dict = {}
        p = Producer({**sasl_conf(c, mech=mech), "acks": "all", "message.timeout.ms": 20000})
        p.produce("orders", b"v-" + mech.encode(), partition=1,
                  on_delivery=lambda e, m: errors.setdefault("orders", e))
        p.flush(30)        # in order: the second record of orders comes after the first
        p.produce("payments", b"no", partition=1, on_delivery=lambda e, m: errors.setdefault("payments", e))
        assert p.flush(30) == 0
        assert errors["orders"] is None, errors
        assert errors["payments"] is not None and errors["payments"].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    cons = Consumer({**sasl_conf(c), "group.id": "g-1", "auto.offset.reset": "earliest",
                     "enable.auto.commit": False})
    try:
        from confluent_kafka import TopicPartition
        cons.assign([TopicPartition("orders", 1, 0)])
        got = []
        for _ in range(60):
            msg = cons.poll(1.0)
            if msg is not None and msg.error() is None:
                got.append(msg.value())
            if len(got) == 2:
                break
        assert got == [b"v-SCRAM-SHA-256", b"v-SCRAM-SHA-512"]
        meta = cons.list_topics(topic="payments", timeout=10).topics["payments"]
        assert meta.error is not None and meta.error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, meta.error
        cons.assign([TopicPartition("payments", 1, 0)])
        for _ in range(5):      # the native producer wrote one record there: alice reads nothing
            msg = cons.poll(1.0)
            assert msg is None or msg.error() is not None, msg.value()
    finally:
        cons.close()
    # no SASL at all, a wrong password, an unknown user: nothing is served
    from confluent_kafka.admin import AdminClient
    for conf in ({"bootstrap.servers": c.brokers[0].kafka_address},
                 sasl_conf(c, password="wrong"), sasl_conf(c, user="mallory")):
        admin = AdminClient({**conf, "socket.timeout.ms": 3000})
        with pytest.raises(KafkaException) as refused:   # (it waits out the timeout, as kcat's -L above)
            admin.list_topics(timeout=3)
        # the exception's traceback holds this frame, so its handle, which would go on
        # reconnecting (through the next tests' output) until a collection
        del admin, refused
        gc.collect()


def test_raw_sasl_order_and_bounds_on_the_wire(secured_kafka):
    """Byte level: the SASL APIs are advertised; anything else before authentication, an
    authenticate before the handshake, an oversize token: answered as Kafka does, then closed;
    the listener goes on serving."""
    import struct
    from tests.integration.kafka_support import connect, raw_request, read_frame
    from tests.integration.test_kafka_bad_input import _api_versions_ok, _closed
    addr = secured_kafka.brokers[1].kafka_address
    versions = _api_versions_ok(addr)          # ApiVersions is served before authentication
    assert versions[17] == (0, 1) and versions[36] == (0, 2)
    with connect(addr) as s:                   # Metadata first: closed, nothing answered
        s.sendall(raw_request(3, 1, 1, struct.pack(">i", -1)))
        assert _closed(s)
    with connect(addr) as s:                   # authenticate before the handshake: ILLEGAL_SASL_STATE
        s.sendall(raw_request(36, 0, 2, struct.pack(">i", 3) + b"abc"))
        frame = read_frame(s)
        assert frame is not None and struct.unpack_from(">ih", frame) == (2, 34)
        assert _closed(s)
    mech = b"SCRAM-SHA-256"
    with connect(addr) as s:                   # an unknown mechanism: UNSUPPORTED_SASL_MECHANISM, the list
        s.sendall(raw_request(17, 1, 3, struct.pack(">h", 6) + b"GSSAPI"))
        frame = read_frame(s)
        assert struct.unpack_from(">ih", frame) == (3, 33) and mech in frame and b"PLAIN" not in frame
        assert _closed(s)
    with connect(addr) as s:                   # a 4 KiB token: SASL_AUTHENTICATION_FAILED, closed
        s.sendall(raw_request(17, 1, 4, struct.pack(">h", len(mech)) + mech))
        assert struct.unpack_from(">ih", read_frame(s)) == (4, 0)
        s.sendall(raw_request(36, 0, 5, struct.pack(">i", 4096) + b"n" * 4096))
        frame = read_frame(s)
        assert frame is not None and struct.unpack_from(">ih", frame) == (5, 58)
        assert _closed(s)
    assert logs_in(addr)                        # and everyone else is served


def test_kafka_python_scram_idempotent_producer_and_consumer(secured_kafka):
    """kafka-python (idempotence on by default: InitProducerId needs IDEMPOTENT_WRITE, which
    write on a topic implies, as Kafka 3)."""
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition
    from kafka.errors import TopicAuthorizationFailedError
    c = secured_kafka
    sasl = dict(bootstrap_servers=c.brokers[2].kafka_address, security_protocol="SASL_PLAINTEXT",
                sasl_mechanism="SCRAM-SHA-512", sasl_plain_username="alice", sasl_plain_password=PASSWORD)
    p = KafkaProducer(**sasl, acks="all", request_timeout_ms=20000)
    try:
        md = p.send("orders", b"kp", partition=0).get(timeout=30)
        assert md.topic == "orders" and md.offset >= 0
        with pytest.raises(TopicAuthorizationFailedError):
            p.send("payments", b"no", partition=0).get(timeout=30)
    finally:
        p.close(timeout=5)
    cons = KafkaConsumer(**sasl, enable_auto_commit=False, consumer_timeout_ms=15000)
    try:
        tp = TopicPartition("orders", 0)
        cons.assign([tp])
        cons.seek(tp, md.offset)
        assert next(iter(cons)).value == b"kp"
    finally:
        cons.close()


KAFKAJS = r"""
const { Kafka } = require('kafkajs');
(async () => {
  for (const mechanism of ['scram-sha-256', 'scram-sha-512']) {
    const kafka = new Kafka({ brokers: [process.argv[2]], logLevel: 0,
                              sasl: { mechanism, username: 'alice', password: process.argv[3] } });
    const p = kafka.producer();
    await p.connect();
    await p.send({ topic: 'orders', messages: [{ value: 'js-' + mechanism }] });
    console.log('sent ' + mechanism);
    try { await p.send({ topic: 'payments', messages: [{ value: 'no' }] }); console.log('payments accepted'); }
    catch (e) { console.log('payments refused'); }
    await p.disconnect();
  }
  const bad = new Kafka({ brokers: [process.argv[2]], logLevel: 0, retry: { retries: 0 },
                          sasl: { mechanism: 'scram-sha-256', username: 'alice', password: 'wrong' } });
  try { await bad.producer().connect(); console.log('wrong password accepted'); }
  catch (e) { console.log('wrong password refused ' + e.name); }
})().catch(e => { console.log('error ' + e); process.exit(1); });
"""


def test_kafkajs_and_aiokafka_scram(secured_kafka, tmp_path):
    import asyncio
    import os
    from aiokafka import AIOKafkaProducer
    from aiokafka.errors import TopicAuthorizationFailedError
    c = secured_kafka
    addr = c.brokers[0].kafka_address

    async def aio():
        p = AIOKafkaProducer(bootstrap_servers=addr, security_protocol="SASL_PLAINTEXT", sasl_mechanism="SCRAM-SHA-256",
                             sasl_plain_username="alice", sasl_plain_password=PASSWORD, request_timeout_ms=20000)
        await p.start()
        try:
            assert (await p.send_and_wait("orders", b"aio", partition=0)).offset >= 0
            with pytest.raises(TopicAuthorizationFailedError):
                await p.send_and_wait("payments", b"no", partition=0)
        finally:
            await p.stop()
    asyncio.run(aio())
    try:
        from tests.tooling import kafkajs_modules
    except ImportError:
        pytest.skip("no tests.tooling")
    modules = kafkajs_modules()
    script = tmp_path / "sasl.js"
    script.write_text(KAFKAJS)
    r = subprocess.run([need("node", "Node.js 20"), str(script), addr, PASSWORD], capture_output=True, text=True,
                       timeout=120, env={**os.environ, "NODE_PATH": str(modules)})
    assert r.stdout.split("\n")[:5] == ["sent scram-sha-256", "payments refused", "sent scram-sha-512",
                                        "payments refused", "wrong password refused KafkaJSSASLAuthenticationError"], \
        r.stdout + r.stderr[-2000:]
