"""kcat (librdkafka 2.0.2) against the Kafka listeners of a real 3-broker cluster."""
from __future__ import annotations

import json
import subprocess

import pytest

from mesh.client.consumer import Consumer
from mesh.testing.launcher import wait_until
from tests.integration.kafka_support import kcluster, new_topic  # noqa: F401 (fixture)
from tests.tooling import need

pytestmark = pytest.mark.integration


def kcat(*args, input: bytes | None = None, timeout_s: float = 60.0) -> subprocess.CompletedProcess:
    need("kcat", "apt-get install kcat")   # a missing kcat skips, and fails under CI
    return subprocess.run(["kcat", *args], input=input, capture_output=True, timeout=timeout_s)


def test_metadata_from_any_broker_lists_every_broker_and_leader(kcluster):
    topic = new_topic(kcluster, "kl", partitions=3)
    ports = {int(b.kafka_port) for b in kcluster.brokers}
    for b in kcluster.brokers:
        def listed():
            out = kcat("-b", b.kafka_address, "-L", "-J", "-t", topic)
            md = json.loads(out.stdout)
            return md if len(md["topics"][0]["partitions"]) == 3 and all(
                p["leader"] in (1, 2, 3) for p in md["topics"][0]["partitions"]) else None
        md = wait_until(listed, 30, f"kcat -L at {b.node_id}")
        assert sorted(br["id"] for br in md["brokers"]) == [1, 2, 3]   # n1 -> 1, n2 -> 2, n3 -> 3
        assert {int(br["name"].rsplit(":", 1)[1]) for br in md["brokers"]} == ports
        parts = md["topics"][0]["partitions"]
        assert [p["partition"] for p in parts] == [0, 1, 2]
        assert all(sorted(r["id"] for r in p["replicas"]) == [1, 2, 3] for p in parts)


@pytest.mark.parametrize("codec", ["none", "gzip", "snappy", "lz4", "zstd"])
def test_produce_and_consume_every_codec_byte_for_byte(kcluster, codec):
    topic = new_topic(kcluster, f"kz-{codec}")
    # values with bytes kcat passes through as they are (no delimiter inside): binary-ish, unicode
    values = [f"value-{i}-{codec}-\u00e9\u4e2d-".encode() + bytes(range(1, 9)) * (i + 1) for i in range(50)]
    keys = [f"key-{i}".encode() for i in range(50)]
    data = b"".join(k + b"\t" + v + b"\n" for k, v in zip(keys, values))
    out = kcat("-b", kcluster.kafka_bootstrap, "-P", "-t", topic, "-p", "0", "-K", "\t", "-z", codec,
               "-H", "trace=abc", "-H", "empty=", input=data)
    assert out.returncode == 0, out.stderr.decode()
    out = kcat("-b", kcluster.brokers[1].kafka_address, "-C", "-t", topic, "-p", "0", "-o", "beginning", "-e",
               "-f", "%o|%k|%h|%s\\n")
    assert out.returncode == 0, out.stderr.decode()
    lines = out.stdout.split(b"\n")[:-1]
    assert len(lines) == 50
    for i, line in enumerate(lines):
        off, k, h, v = line.split(b"|", 3)
        assert (int(off), k, v) == (i, keys[i], values[i])
        assert h == b"trace=abc,empty="
    # and the mesh stored the same bytes (its own consumer reads them)
    c = Consumer(bootstrap=kcluster.bootstrap, auto_offset_reset="earliest")
    try:
        from mesh.wire.types import TopicPartition
        c.assign([TopicPartition(topic, 0)])
        c.seek_to_beginning(TopicPartition(topic, 0))
        got = []
        wait_until(lambda: got.extend(r for rs in c.poll(500).values() for r in rs) or len(got) >= 50, 30,
                   "native consumer")
        assert [(r.offset, r.key, r.value) for r in got] == [(i, keys[i], values[i]) for i in range(50)]
        assert [list(map(tuple, r.headers)) for r in got] == [[("trace", b"abc"), ("empty", b"")]] * 50
    finally:
        c.close()


def test_producing_to_an_unknown_topic_creates_it(kcluster):
    topic = "auto-created-topic"
    out = kcat("-b", kcluster.kafka_bootstrap, "-P", "-t", topic, input=b"one\ntwo\n")
    assert out.returncode == 0, out.stderr.decode()
    out = kcat("-b", kcluster.brokers[2].kafka_address, "-C", "-t", topic, "-o", "beginning", "-e", "-f", "%s\\n")
    assert out.returncode == 0, out.stderr.decode()
    assert sorted(out.stdout.split()) == [b"one", b"two"]
    from mesh.client.admin import Admin
    with Admin(kcluster.bootstrap) as a:
        t = a.describe_topic(topic)
    assert len(t["partitions"]) == 1 and t["replication_factor"] == 3
