"""confluent-kafka and kafka-python, unmodified, against the Kafka listeners of a real 3-broker
cluster: idempotent producers, consumers with assign(), the admin client."""
from __future__ import annotations

import time

import pytest

from tests.integration.kafka_support import kcluster, new_topic  # noqa: F401 (fixture)
from mesh.testing.launcher import wait_until

pytestmark = pytest.mark.integration

ck = pytest.importorskip("confluent_kafka")
kafka = pytest.importorskip("kafka")
admin = pytest.importorskip("confluent_kafka.admin")


def _confluent_read(bootstrap: str, topic: str, partitions: int, n: int, timeout_s: float = 60.0) -> list:
    c = ck.Consumer({"bootstrap.servers": bootstrap, "group.id": "unused", "enable.auto.commit": False})
    try:
        c.assign([ck.TopicPartition(topic, p, ck.OFFSET_BEGINNING) for p in range(partitions)])
        got = []
        deadline = time.monotonic() + timeout_s
        while len(got) < n and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is None:
                continue
            assert m.error() is None, m.error()
            got.append((m.partition(), m.offset(), m.key(), m.value(), m.headers()))
        return got
    finally:
        c.close()


def test_confluent_idempotent_producer_and_assigned_consumer(kcluster):
    topic = new_topic(kcluster, "cf", partitions=3)
    p = ck.Producer({"bootstrap.servers": kcluster.kafka_bootstrap, "enable.idempotence": True, "acks": "all",
                     "linger.ms": 2, "compression.type": "lz4"})
    delivered, errors = [], []

    def done(err, msg):
        (errors if err else delivered).append(err or (msg.partition(), msg.offset(), msg.key()))

    for i in range(3000):
        p.produce(topic, key=b"k%d" % i, value=b"v%d" % i if i % 10 else None, partition=i % 3,
                  headers=[("i", str(i).encode())], on_delivery=done)
        if i % 500 == 0:
            p.poll(0)
    assert p.flush(60) == 0
    assert errors == []
    assert len(delivered) == 3000
    got = _confluent_read(kcluster.kafka_bootstrap, topic, 3, 3000)
    assert len(got) == 3000
    by_part: dict[int, list] = {}
    for part, off, key, value, headers in got:
        by_part.setdefault(part, []).append((off, key, value, headers))
    for part, rows in by_part.items():
        assert [r[0] for r in rows] == list(range(1000))   # every record once, in send order
        idx = [int(r[1][1:]) for r in rows]
        assert idx == sorted(idx) and all(i % 3 == part for i in idx)
        assert all(r[3] == [("i", str(i).encode())] for r, i in zip(rows, idx))
        assert [r[2] for r in rows] == [b"v%d" % i if i % 10 else None for i in idx]   # tombstones stay None
    # what the producer was told is what is stored
    assert sorted((pt, off) for pt, off, _k in delivered) == sorted((pt, off) for pt, off, *_ in got)


def test_confluent_admin_create_list_delete(kcluster):
    adm = admin.AdminClient({"bootstrap.servers": kcluster.brokers[2].kafka_address})
    name = f"adm-{int(time.time() * 1000) % 100000}"
    futures = adm.create_topics([admin.NewTopic(name, num_partitions=4, replication_factor=2)],
                                request_timeout=30)
    futures[name].result(30)
    md = adm.list_topics(timeout=10)
    assert name in md.topics and len(md.topics[name].partitions) == 4
    assert all(len(pm.replicas) == 2 for pm in md.topics[name].partitions.values())
    again = adm.create_topics([admin.NewTopic(name, 1, 1)], request_timeout=30)[name]
    with pytest.raises(ck.KafkaException) as exc:
        again.result(30)
    assert exc.value.args[0].code() == ck.KafkaError.TOPIC_ALREADY_EXISTS
    adm.delete_topics([name], request_timeout=30)[name].result(30)
    wait_until(lambda: name not in adm.list_topics(timeout=10).topics, 20, "topic gone")


def test_kafka_python_produce_and_consume_with_assign(kcluster):
    topic = new_topic(kcluster, "kp", partitions=2)
    prod = kafka.KafkaProducer(bootstrap_servers=kcluster.kafka_bootstrap.split(","), acks="all",
                               compression_type="gzip")
    assert prod.config["enable_idempotence"]   # kafka-python 3 turns it on by default
    futs = [prod.send(topic, key=b"a%d" % i, value=b"b%d" % i, headers=[("h", b"%d" % i)], partition=i % 2)
            for i in range(400)]
    prod.flush(30)
    meta = [f.get(10) for f in futs]
    assert sorted(m.offset for m in meta if m.partition == 0) == list(range(200))
    prod.close(5)
    cons = kafka.KafkaConsumer(bootstrap_servers=kcluster.kafka_bootstrap.split(","), enable_auto_commit=False,
                               consumer_timeout_ms=3000)
    tps = [kafka.TopicPartition(topic, 0), kafka.TopicPartition(topic, 1)]
    cons.assign(tps)
    cons.seek_to_beginning()
    rows = []
    deadline = time.monotonic() + 60
    while len(rows) < 400 and time.monotonic() < deadline:
        for recs in cons.poll(timeout_ms=500).values():
            rows.extend(recs)
    assert len(rows) == 400
    assert {(r.partition, r.offset, r.key, r.value, tuple(r.headers)) for r in rows} == {
        (i % 2, i // 2, b"a%d" % i, b"b%d" % i, (("h", b"%d" % i),)) for i in range(400)}
    assert cons.end_offsets(tps) == {tps[0]: 200, tps[1]: 200}
    assert cons.beginning_offsets(tps) == {tps[0]: 0, tps[1]: 0}
    cons.close()


def test_confluent_admin_describe_configs(kcluster):
    """AdminClient.describe_configs (DescribeConfigs): a topic's configs as the mesh keeps
    them (one set at creation, the others defaults), an unknown topic refused."""
    from mesh.client import Admin
    from mesh.wire.topic_config import TOPIC_DEFAULTS
    name = f"cfg-{int(time.time() * 1000) % 100000}"
    with Admin(kcluster.bootstrap) as a:
        a.create_topic(name, 1, 3, {"retention.ms": 3_600_000})
    adm = admin.AdminClient({"bootstrap.servers": kcluster.brokers[1].kafka_address})
    res = admin.ConfigResource(admin.ResourceType.TOPIC, name)
    configs = adm.describe_configs([res], request_timeout=30)[res].result(30)
    assert set(configs) == set(TOPIC_DEFAULTS)
    assert configs["retention.ms"].value == "3600000" and not configs["retention.ms"].is_default
    assert configs["retention.ms"].source == admin.ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    mmb = configs["max.message.bytes"]
    assert mmb.value == str(TOPIC_DEFAULTS["max.message.bytes"]) and mmb.is_default
    assert mmb.source == admin.ConfigSource.DEFAULT_CONFIG.value
    assert not mmb.is_read_only and not mmb.is_sensitive
    gone = admin.ConfigResource(admin.ResourceType.TOPIC, name + "-none")
    with pytest.raises(ck.KafkaException) as exc:
        adm.describe_configs([gone], request_timeout=30)[gone].result(30)
    assert exc.value.args[0].code() == ck.KafkaError.UNKNOWN_TOPIC_OR_PART


def test_confluent_admin_create_partitions(kcluster):
    """AdminClient.create_partitions (CreatePartitions): the topic grows, every broker's
    Metadata shows the new partitions with leaders and a producer can write to them; a count
    not above the current one is refused."""
    name = new_topic(kcluster, "grow", partitions=2, rf=2)
    adm = admin.AdminClient({"bootstrap.servers": kcluster.brokers[0].kafka_address})
    adm.create_partitions([admin.NewPartitions(name, 5)], request_timeout=30)[name].result(30)
    for b in kcluster.brokers:
        other = admin.AdminClient({"bootstrap.servers": b.kafka_address})
        wait_until(lambda: len(other.list_topics(name, timeout=10).topics[name].partitions) == 5
                   and all(pm.leader >= 0 for pm in other.list_topics(name, timeout=10).topics[name].partitions.values()),
                   30, f"5 partitions with leaders seen through {b.kafka_address}")
    p = ck.Producer({"bootstrap.servers": kcluster.brokers[1].kafka_address, "acks": "all"})
    p.produce(name, b"into-four", partition=4)
    assert p.flush(30) == 0
    got = _confluent_read(kcluster.brokers[2].kafka_address, name, 5, 1)
    assert [(g[0], g[3]) for g in got] == [(4, b"into-four")]
    with pytest.raises(ck.KafkaException) as exc:
        adm.create_partitions([admin.NewPartitions(name, 3)], request_timeout=30)[name].result(30)
    assert exc.value.args[0].code() == ck.KafkaError.INVALID_PARTITIONS
