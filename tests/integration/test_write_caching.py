"""Write caching on real brokers (issue 41): an RF-3 topic with ``write.caching`` on, a
flush.ms far beyond the test (nothing it writes is synced by the timer), acks=all sends
acknowledged one by one; the leader is SIGKILLed, then a follower, each restarted: a killed
process loses nothing (the page cache holds what LMDB committed), so every acknowledged
record is read back once, at its offset, in send order."""
import re
import urllib.request

import pytest

from mesh.client import Admin, Producer
from mesh.testing.launcher import Cluster, wait_until
from tests.integration.test_replication import read_all

pytestmark = pytest.mark.integration


def _leader(addrs, topic):
    with Admin(addrs, request_timeout_ms=1000) as a:
        return a.describe_topic(topic)["partitions"][0]["leader"]


def _unsynced_commits(b) -> int:
    text = urllib.request.urlopen(b.metrics_url, timeout=5).read().decode()
    m = re.search(r"^mesh_storage_unsynced_commits_total (\d+)", text, re.M)
    return int(m.group(1)) if m else 0


def test_write_cached_acks_all_survive_sigkill_of_the_leader_and_of_a_follower(tmp_path):
    c = Cluster(tmp_path, 3, extra=["--flush-ms", "600000"], metrics=True).start()
    try:
        with Admin(c.bootstrap) as a:
            a.create_topic("wc", partitions=1, replication_factor=3, config={"write.caching": "true"})
            assert a.describe_topic("wc")["config"]["write.caching"] == 1
        acked = {}
        with Producer(c.bootstrap, linger_ms=0) as p:   # defaults: acks=all, idempotent
            i = 0

            def send(n):
                nonlocal i
                for _ in range(n):
                    v = b"v%05d" % i
                    i += 1
                    acked[v] = p.send("wc", v, partition=0).get(20).offset

            send(50)
            for b in c.brokers:   # the writes were really left unsynced on every replica
                wait_until(lambda b=b: _unsynced_commits(b) >= 10, 20, f"{b.node_id}'s unsynced commits")
            for victim_is_leader in (True, False):
                leader = wait_until(lambda: _leader(c.bootstrap, "wc"), 10, "a leader")
                victim = next(b for b in c.brokers if (b.node_id == leader) == victim_is_leader)
                victim.kill()   # SIGKILL: no clean close, no sync
                send(30)
                victim.start()
                c.wait_converged()
                send(20)
        got = read_all(c.bootstrap, "wc", 1)[0]
        values = [r.value for r in got]
        assert len(values) == len(set(values)), "a record stored twice"
        assert values == sorted(values), "stored out of send order"
        assert {r.value: r.offset for r in got if r.value in acked} == acked
        assert len(acked) == 50 + 2 * 50
    finally:
        c.kill()
