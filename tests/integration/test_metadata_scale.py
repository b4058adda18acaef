"""Metadata that scales, on real brokers: a topic whose replica table and stats used to
overflow one gossip value (issue 13: 'gossip entry ... is 66929 bytes', then a crash loop)
is created in one call, every broker lists it with leaders, stats of partitions led
elsewhere travel by gossip, records go in and out, and a restart loads it all again."""
import time

import pytest

from mesh.client import Admin, Consumer, Producer
from mesh.cluster.keys import PARTITION_CHUNK
from mesh.testing.launcher import Cluster, wait_until
from mesh.wire.messages import MetadataRequest

pytestmark = pytest.mark.integration

PARTITIONS = 6000   # RF 1 on two brokers: the old one-value replica table (72 KB) was refused


def _meta(b, name):
    """Broker ``b``'s own metadata answer for topic ``name`` (its topics list)."""
    with Admin(b.address, request_timeout_ms=5000) as a:
        resp, _ = a.transport.call(b.address, MetadataRequest([name]), timeout_ms=5000)
    return resp.topics


def consume(bootstrap, tps, expected, timeout_s=15):
    got = {}
    with Consumer(bootstrap=bootstrap, auto_offset_reset="earliest") as c:
        c.assign(tps)
        deadline = time.monotonic() + timeout_s
        while sum(map(len, got.values())) < expected:
            assert time.monotonic() < deadline, f"consumed {got}"
            for tp, recs in c.poll(500).items():
                got.setdefault(tp.partition, []).extend(r.value for r in recs)
    return got


def test_a_wide_topic_is_created_served_and_reloaded(tmp_path):
    c = Cluster(tmp_path, 2).start()
    try:
        n1, n2 = c.brokers
        t0 = time.monotonic()
        with Admin(c.bootstrap) as a:
            a.create_topic("wide", partitions=PARTITIONS, replication_factor=1, wait_s=20)
        created_s = time.monotonic() - t0
        assert created_s < 15, f"create took {created_s:.1f} s"
        (t,) = _meta(n1, "wide")
        parts = t["partitions"]
        assert len(parts) == PARTITIONS and all(p["leader"] for p in parts)
        # one partition led by each broker, far into the table (past the first chunks)
        far = [next(p["partition"] for p in reversed(parts) if p["leader"] == b.node_id) for b in (n1, n2)]
        assert min(far) >= 2 * PARTITION_CHUNK
        with Producer(c.bootstrap, acks="all") as p:
            futures = [p.send("wide", b"v%d" % q, partition=q) for q in far for _ in range(3)]
            assert all(f.get(10).offset >= 0 for f in futures)
        # n1 describes n2's partition from n2's stats chunk in gossip (and the reverse)
        def stats_arrived():
            for b, q in ((n1, far[1]), (n2, far[0])):
                b.check_running()
                if _meta(b, "wide")[0]["partitions"][q]["log_end"] != 3:
                    return False
            return True
        wait_until(stats_arrived, 15, "stats of the far partitions to reach the other broker")
        assert consume(c.bootstrap, [("wide", q) for q in far], 6) == {q: [b"v%d" % q] * 3 for q in far}
        c.stop()
        c.start()
        wait_until(lambda: all(len(_meta(b, "wide")[0].get("partitions", [])) == PARTITIONS and
                               all(p["leader"] for p in _meta(b, "wide")[0]["partitions"]) for b in c.brokers),
                   20, "both brokers to list the wide topic with leaders after a restart")
        assert consume(c.bootstrap, [("wide", q) for q in far], 6) == {q: [b"v%d" % q] * 3 for q in far}
        for b in c.brokers:
            b.check_running()
    finally:
        c.kill()
