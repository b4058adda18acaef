"""An idempotent Kafka producer while the leader of its partition is killed with SIGKILL, or
paused with SIGSTOP and resumed: every acknowledged record is read back exactly once, in
send order."""
from __future__ import annotations

import threading
import time

import pytest

from mesh.client.admin import Admin
from mesh.testing.launcher import Cluster, wait_until

pytestmark = pytest.mark.integration
ck = pytest.importorskip("confluent_kafka")


def _leader_of(cluster, topic: str) -> str:
    with Admin(cluster.bootstrap) as a:
        return a.metadata([topic]).topics[0]["partitions"][0]["leader"]


@pytest.mark.parametrize("fault", ["kill", "pause"])
def test_idempotent_producer_survives_a_leader_kill(tmp_path, fault):
    c = Cluster(tmp_path, 3, kafka=True).start(60)
    try:
        topic = "fo"
        with Admin(c.bootstrap) as a:
            a.create_topic(topic, 1, 3)
        p = ck.Producer({"bootstrap.servers": c.kafka_bootstrap, "enable.idempotence": True, "acks": "all",
                         "linger.ms": 5, "message.timeout.ms": 120_000, "request.timeout.ms": 10_000})
        acked: list[int] = []
        failed: list = []
        lock = threading.Lock()

        def done(err, msg):
            with lock:
                if err:
                    failed.append(err)
                else:
                    acked.append((msg.offset(), int(msg.value())))

        stop = threading.Event()
        sent = [0]

        def produce():
            i = 0
            while not stop.is_set():
                try:
                    p.produce(topic, value=b"%d" % i, partition=0, on_delivery=done)
                    i += 1
                except BufferError:
                    pass
                p.poll(0.001 if i % 50 == 0 else 0)
            sent[0] = i

        t = threading.Thread(target=produce, daemon=True)
        t.start()
        wait_until(lambda: len(acked) > 500, 60, "records acknowledged before the kill")
        leader = _leader_of(c, topic)
        victim = next(b for b in c.brokers if b.node_id == leader)
        if fault == "kill":
            victim.kill()
        else:
            victim.pause()   # SIGSTOP: its connections stay open, nothing answers
        before = len(acked)
        wait_until(lambda: len(acked) > before + 500, 90, f"records acknowledged after the {fault}")
        if fault == "pause":
            victim.resume()
        stop.set()
        t.join(10)
        assert p.flush(120) == 0
        assert failed == []
        assert len(acked) == sent[0]
        live = next(b for b in c.brokers if b.alive())
        cons = ck.Consumer({"bootstrap.servers": live.kafka_address, "group.id": "unused",
                            "enable.auto.commit": False})
        cons.assign([ck.TopicPartition(topic, 0, 0)])
        got = []
        deadline = time.monotonic() + 90
        while len(got) < len(acked) and time.monotonic() < deadline:
            m = cons.poll(0.5)
            if m is not None and m.error() is None:
                got.append((m.offset(), int(m.value())))
        cons.close()
        values = [v for _, v in got]
        assert values == list(range(sent[0]))          # every record once, in send order
        assert sorted(acked) == got                     # at the offsets the producer was told
    finally:
        c.kill()
