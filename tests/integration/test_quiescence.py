"""Quiescence on real brokers: idle partitions go quiet (no ticks, no heartbeat rows), and
a broker killed while everything is quiet still has its partitions led elsewhere, with
nothing acknowledged lost (``mesh.raft.manager``, "Quiescence")."""
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from mesh.client import Admin, Producer
from mesh.testing.diskfaults import partition_state, read_back
from mesh.testing.launcher import Cluster, wait_until

pytestmark = pytest.mark.integration

PARTS = 12


def quiet_replicas(b) -> float:
    with urllib.request.urlopen(b.metrics_url, timeout=5) as r:
        text = r.read().decode()
    for fam in text_string_to_metric_families(text):
        if fam.name == "mesh_quiet_replicas":
            return fam.samples[0].value
    raise AssertionError("no mesh_quiet_replicas on /metrics")


def produce_everywhere(bootstrap: str, per_partition: int, tag: bytes) -> dict:
    acked = {}
    with Producer(bootstrap, acks="all", delivery_timeout_ms=30_000) as p:
        futs = [(b"%s-%d-%d" % (tag, part, i), p.send("q", b"%s-%d-%d" % (tag, part, i), partition=part))
                for part in range(PARTS) for i in range(per_partition)]
        p.flush(40)
        for v, f in futs:
            acked[v] = f.get(40).offset   # every one must be acknowledged
    return acked


def test_quiet_partitions_of_a_killed_broker_are_led_again_and_lose_nothing(tmp_path):
    c = Cluster(tmp_path, 3, metrics=True).start()
    try:
        with Admin(c.bootstrap) as a:
            a.create_topic("q", PARTS, 3)
        acked = produce_everywhere(c.bootstrap, 20, b"before")
        # every replica of every partition goes quiet once the writes stop
        wait_until(lambda: sum(quiet_replicas(b) for b in c.brokers) == 3 * PARTS, 60,
                   "every replica quiet")
        st = partition_state(c.brokers, "q")
        counts = {b.node_id: sum(1 for p in st if p["leader"] == b.node_id) for b in c.brokers}
        victim = max(c.brokers, key=lambda b: counts[b.node_id])
        assert counts[victim.node_id] > 0
        others = [b for b in c.brokers if b is not victim]
        victim.kill()
        t0 = time.monotonic()

        def led_elsewhere():
            s = partition_state(others, "q")
            return s is not None and all(p["leader"] != victim.node_id for p in s)
        wait_until(led_elsewhere, 60, "every partition led by a live broker")
        print(f"{counts[victim.node_id]} quiet partitions led again {time.monotonic() - t0:.2f} s after kill -9")
        acked.update(produce_everywhere(c.bootstrap, 5, b"after"))   # every partition takes writes
        got = read_back(c.bootstrap, "q", PARTS, len(acked), timeout_s=60)
        lost = [v for v in acked if v not in got]
        assert not lost, f"{len(lost)} of {len(acked)} acknowledged records lost (e.g. {lost[:3]})"
        victim.start()
        wait_until(lambda: sum(quiet_replicas(b) for b in c.brokers) == 3 * PARTS, 90,
                   "quiet again once the killed broker is back and caught up")
    finally:
        c.stop()
