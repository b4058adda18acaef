"""Offsets by time through the Kafka port: kafka-python's and confluent-kafka's
``offsets_for_times`` against records whose timestamps the producer set."""
from __future__ import annotations

import time

import pytest

from tests.integration.kafka_support import kcluster, new_topic  # noqa: F401 (fixture)

pytestmark = pytest.mark.integration

ck = pytest.importorskip("confluent_kafka")
kafka = pytest.importorskip("kafka")


def test_offsets_for_times_from_kafka_python_and_confluent_kafka(kcluster):
    topic = new_topic(kcluster, "times")
    t0 = int(time.time() * 1000) - 60_000
    p = kafka.KafkaProducer(bootstrap_servers=kcluster.kafka_bootstrap, acks="all")
    for i in range(10):
        p.send(topic, f"r{i}".encode(), partition=0, timestamp_ms=t0 + i * 1000).get(timeout=30)
    p.close()

    c = kafka.KafkaConsumer(bootstrap_servers=kcluster.kafka_bootstrap)
    tp = kafka.TopicPartition(topic, 0)
    try:
        got = c.offsets_for_times({tp: t0 + 4_500})[tp]
        assert (got.offset, got.timestamp) == (5, t0 + 5_000)
        assert c.offsets_for_times({tp: t0})[tp].offset == 0
        assert c.offsets_for_times({tp: t0 + 60_000})[tp] is None    # after the last record
    finally:
        c.close()

    cc = ck.Consumer({"bootstrap.servers": kcluster.kafka_bootstrap, "group.id": "times-unused"})
    try:
        [res] = cc.offsets_for_times([ck.TopicPartition(topic, 0, t0 + 8_000)], timeout=30)
        assert res.error is None and res.offset == 8
    finally:
        cc.close()
