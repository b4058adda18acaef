"""A broker that lost its disk never costs an acknowledged record (issues 17 and 13).

Real brokers; one broker's disk damaged at a time (wipe, rollback, truncate, flip), the
cluster waited on until fully replicated again between faults, and a leader kill at the
end: every acknowledged record must still be readable, and every partition back to its
replication factor. Small data (2,000 records): each test takes seconds.
"""
import os

import pytest

from mesh.client import Admin, Producer
from mesh.testing.diskfaults import (flip, leader_broker, read_back, restore, snapshot, truncate, wait_in_sync,
                                     wipe)
from mesh.testing.launcher import BrokerProcess, Cluster, wait_until

pytestmark = pytest.mark.integration

N = 2_000


def produce(bootstrap, n, tag=b"r", start=0):
    """n records acks=all to t/0; returns {value: offset} of those acknowledged."""
    acked = {}
    with Producer(bootstrap, acks="all", linger_ms=2, delivery_timeout_ms=20_000) as p:
        futs = [(b"%s-%06d" % (tag, i), p.send("t", b"%s-%06d" % (tag, i), partition=0))
                for i in range(start, start + n)]
        p.flush(30)
        for v, f in futs:
            try:
                acked[v] = f.get(30).offset
            except Exception:
                pass
    return acked


@pytest.fixture
def cluster(tmp_path):
    c = Cluster(tmp_path, 3).start()
    with Admin(c.bootstrap) as a:
        a.create_topic("t", 1, 3)
    yield c
    c.stop()


def followers(c):
    lead = leader_broker(c.brokers, "t")
    return lead, [b for b in c.brokers if b is not lead]


def check_all_readable(c, acked):
    got = read_back(c.bootstrap, "t", 1, len(acked), timeout_s=60)
    lost = [v for v in acked if v not in got]
    assert not lost, f"{len(lost)} of {len(acked)} acknowledged records lost (e.g. {lost[:3]})"
    assert all(got[v][1] == off for v, off in acked.items()), "a record moved"


def kill_leader_and_check(c, acked):
    lead = leader_broker(c.brokers, "t")
    lead.kill()
    others = [b for b in c.brokers if b is not lead]
    wait_until(lambda: leader_broker(others, "t"), 30, "a new leader")
    check_all_readable(c, acked)
    lead.start()
    wait_in_sync(c.brokers, "t", len(acked))


def test_wiped_followers_then_a_leader_kill_lose_nothing(cluster):
    c = cluster
    acked = produce(c.bootstrap, N)
    assert len(acked) == N
    lead, (f, g) = followers(c)
    wipe(f)
    wait_in_sync(c.brokers, "t", N)
    wipe(g)
    wait_in_sync(c.brokers, "t", N)
    assert "lost state" in f.log(1 << 20) and "lost state" in g.log(1 << 20)
    kill_leader_and_check(c, acked)


def test_a_rolled_back_then_a_wiped_follower_then_a_leader_kill(cluster, tmp_path):
    c = cluster
    acked = produce(c.bootstrap, N // 4, b"early")
    lead, (f, g) = followers(c)
    copy = str(tmp_path / "f-copy")
    snapshot(f, copy)
    f.wait_ready()
    acked.update(produce(c.bootstrap, N, b"late"))
    wait_in_sync(c.brokers, "t", len(acked))
    restore(f, copy)                 # its log end goes back; its term and identity too
    wait_in_sync(c.brokers, "t", len(acked))
    assert "lost state" in f.log(1 << 20)
    wipe(g)
    wait_in_sync(c.brokers, "t", len(acked))
    kill_leader_and_check(c, acked)


def test_a_flipped_batch_on_the_leader_is_repaired_not_served(cluster):
    c = cluster
    acked = produce(c.bootstrap, N // 2)
    acked.update(produce(c.bootstrap, N // 2, start=N // 2))   # a second batch: the flip is not the tail
    lead = leader_broker(c.brokers, "t")
    assert flip(lead, b"r-000500")        # not in the tail batch: recovery does not see it, a read does
    lead.wait_ready()
    wait_until(lambda: leader_broker(c.brokers, "t") is lead, 30, f"{lead.node_id} to lead again (preferred)")
    check_all_readable(c, acked)          # it hands over and refills: never serves the flipped copy
    wait_in_sync(c.brokers, "t", N)
    said = lead.log(1 << 22)
    assert 1 <= said.count("fails its CRC check") <= 3, "found once, logged once"
    lead.stop()                           # its own copy was refilled: no CRC failure left
    lead.start()
    wait_in_sync(c.brokers, "t", N)
    assert lead.log(1 << 22).count("fails its CRC check") == said.count("fails its CRC check")
    kill_leader_and_check(c, acked)


def test_a_truncated_store_is_refused_then_rejoins_empty(cluster):
    c = cluster
    acked = produce(c.bootstrap, N)
    lead, (f, _) = followers(c)
    line = truncate(f)
    assert "data.mdb" in line
    wait_until(lambda: any(n.startswith(f.node_id + ".refused-") for n in os.listdir(os.path.dirname(f.data_dir))),
               20, "the refused directory moved aside")
    wait_in_sync(c.brokers, "t", N)
    kill_leader_and_check(c, acked)


def test_a_second_broker_on_the_same_data_dir_is_refused(cluster, tmp_path):
    c = cluster
    acked = produce(c.bootstrap, 100)
    b = c.brokers[1]
    twin = BrokerProcess(b.node_id, b.data_dir, seeds=[c.brokers[0].address],
                         log_path=str(tmp_path / "twin.log"))
    twin.start(wait=False)
    assert twin.wait_stopped(20) == 1
    assert "in use by another broker" in twin.log()
    assert b.alive()
    check_all_readable(c, acked)
