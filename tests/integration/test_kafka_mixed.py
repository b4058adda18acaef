"""A cluster where one broker has no Kafka listener: the partitions it leads are still
served to Kafka clients (a listener stands in for it and forwards through the native path)."""
from __future__ import annotations

import time

import pytest

from mesh.client.admin import Admin
from mesh.testing.launcher import BrokerProcess, Cluster, wait_until

pytestmark = pytest.mark.integration

ck = pytest.importorskip("confluent_kafka")


def test_partitions_led_by_a_broker_without_a_kafka_port_are_served(tmp_path):
    c = Cluster(tmp_path / "c", 2, kafka=True).start(60)
    n3 = BrokerProcess("n3", str(tmp_path / "n3"), seeds=[c.brokers[0].address]).start()   # no --kafka-port
    try:
        with Admin(c.bootstrap) as a:
            wait_until(lambda: len([b for b in a.brokers() if b.get("status") == "alive"]) == 3, 60,
                       "three brokers alive")
            a.create_topic("mixed", partitions=6, replication_factor=1)
            wait_until(lambda: any(p.get("leader") == "n3" for p in a.describe_topic("mixed")["partitions"]),
                       60, "a partition led by n3")
        p = ck.Producer({"bootstrap.servers": c.kafka_bootstrap, "acks": "all", "message.timeout.ms": 60_000})
        for i in range(60):
            p.produce("mixed", value=b"v%d" % i, partition=i % 6)
        assert p.flush(90) == 0, "records left unacknowledged"
        cons = ck.Consumer({"bootstrap.servers": c.kafka_bootstrap, "group.id": "mixed-unused"})
        cons.assign([ck.TopicPartition("mixed", n, 0) for n in range(6)])
        got, deadline = set(), time.monotonic() + 90
        while len(got) < 60 and time.monotonic() < deadline:
            m = cons.poll(0.5)
            if m is not None and m.error() is None:
                got.add(m.value())
        cons.close()
        assert got == {b"v%d" % i for i in range(60)}
    finally:
        n3.kill()
        c.kill()
