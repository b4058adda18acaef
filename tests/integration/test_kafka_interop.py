"""The native client and Kafka clients on one topic: the same records at the same offsets."""
from __future__ import annotations

import time

import pytest

from mesh.client.consumer import Consumer
from mesh.client.producer import Producer
from mesh.testing.launcher import wait_until
from mesh.wire.types import TopicPartition
from tests.integration.kafka_support import kcluster, new_topic  # noqa: F401 (fixture)

pytestmark = pytest.mark.integration
ck = pytest.importorskip("confluent_kafka")


def test_native_producer_kafka_consumer(kcluster):
    # stamped in 2023: under the default retention.ms (7 days by record time, as Kafka's) a
    # retention pass would delete every batch but each partition's last
    topic = new_topic(kcluster, "n2k", partitions=2, config={"retention.ms": -1})
    p = Producer(kcluster.bootstrap)
    futs = [p.send(topic, b"value-%d" % i, key=b"key-%d" % i if i % 3 else None, partition=i % 2,
                   headers=[("n", b"%d" % i), ("bin", bytes([0, 255, i % 256]))], timestamp_ms=1_700_000_000_000 + i)
            for i in range(500)]
    p.flush(30)
    metas = [f.get(10) for f in futs]
    sent = {(m.partition, m.offset): i for i, m in enumerate(metas)}
    p.close()
    c = ck.Consumer({"bootstrap.servers": kcluster.kafka_bootstrap, "group.id": "unused",
                     "enable.auto.commit": False})
    c.assign([ck.TopicPartition(topic, 0, 0), ck.TopicPartition(topic, 1, 0)])
    got = {}
    deadline = time.monotonic() + 60
    while len(got) < 500 and time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is not None:
            assert m.error() is None, m.error()
            got[(m.partition(), m.offset())] = (m.key(), m.value(), m.headers(), m.timestamp()[1])
    c.close()
    assert set(got) == set(sent)
    for at, i in sent.items():
        assert got[at] == (b"key-%d" % i if i % 3 else None, b"value-%d" % i,
                           [("n", b"%d" % i), ("bin", bytes([0, 255, i % 256]))], 1_700_000_000_000 + i)


def test_kafka_producer_native_consumer(kcluster):
    topic = new_topic(kcluster, "k2n", partitions=1, config={"retention.ms": -1})   # stamped in 2020 (above)
    p = ck.Producer({"bootstrap.servers": kcluster.kafka_bootstrap, "enable.idempotence": True,
                     "compression.type": "zstd"})
    acked = {}
    for i in range(300):
        p.produce(topic, key=b"k%d" % i, value=None if i % 7 == 0 else (b"" if i % 7 == 1 else b"v%d" % i),
                  headers=[("h", b"%d" % i)], partition=0, timestamp=1_600_000_000_000 + i,
                  on_delivery=lambda err, m, i=i: acked.__setitem__(i, None if err else m.offset()))
    assert p.flush(60) == 0
    assert sorted(acked.values()) == list(range(300))
    c = Consumer(bootstrap=kcluster.bootstrap, auto_offset_reset="earliest")
    tp = TopicPartition(topic, 0)
    c.assign([tp])
    rows = []
    wait_until(lambda: rows.extend(r for rs in c.poll(500).values() for r in rs) or len(rows) >= 300, 30,
               "native consumer")
    c.close()
    for r in rows:
        i = int(r.key[1:])
        assert r.offset == acked[i]
        assert r.timestamp == 1_600_000_000_000 + i
        assert [tuple(h) for h in r.headers] == [("h", b"%d" % i)]
        # a tombstone (None) stays None; an empty value stays empty
        assert r.value == (None if i % 7 == 0 else (b"" if i % 7 == 1 else b"v%d" % i))
