"""Real multi-node clusters: gossip membership, failure detection, metadata everywhere."""

import pytest

from mesh.client import Admin, Consumer, Producer
from mesh.testing.launcher import BrokerProcess, Cluster, wait_until

pytestmark = pytest.mark.integration


def statuses(addr):
    with Admin(addr, request_timeout_ms=1000) as a:
        return {b["id"]: b for b in a.metadata([]).brokers}


def all_see(cluster_nodes, pred, what, timeout_s=10):
    for b in cluster_nodes:
        wait_until(lambda: pred(statuses(b.address)), timeout_s, f"{b.node_id} to see {what}")


@pytest.fixture
def cluster(tmp_path):
    c = Cluster(tmp_path, 3).start()
    all_see(c.brokers, lambda s: len(s) == 3 and all(x["status"] == "alive" for x in s.values()),
            "three alive members")
    yield c
    for b in c.brokers:
        b.kill()


def test_three_nodes_form_a_cluster_and_a_fourth_joins_through_any_seed(cluster, tmp_path):
    n4 = BrokerProcess("n4", str(tmp_path / "n4"), seeds=[cluster.brokers[1].address]).start()
    try:
        all_see(cluster.brokers + [n4], lambda s: s.get("n4", {}).get("status") == "alive", "n4 alive", 5)
    finally:
        n4.kill()


def test_topics_are_described_identically_everywhere_and_deletes_stick(cluster):
    n1, n2, n3 = cluster.brokers
    with Admin(n2.address) as a:
        a.create_topic("everywhere", partitions=6, config={"retention.ms": 3600000})

    def describe(b):
        with Admin(b.address) as a:
            t = a.describe_topic("everywhere")
        return (t["config"], [(p["partition"], p["leader"], p["replicas"]) for p in t["partitions"]])
    views = [describe(b) for b in cluster.brokers]
    assert views[0] == views[1] == views[2]
    leaders = [l for _, l, _ in views[0][1]]
    assert sorted(set(leaders)) == ["n1", "n2", "n3"] and max(map(leaders.count, set(leaders))) == 2

    # produce through one bootstrap, consume through another: clients follow the leaders
    with Producer(n3.address) as p:
        for i in range(600):
            p.send("everywhere", b"m%d" % i, key=b"k%d" % i)
    for b in cluster.brokers:   # at once, from any broker: each leader is asked its offsets first hand
        with Admin(b.address) as a:
            parts = a.describe_topic("everywhere")["partitions"]
        assert sum(p["high_watermark"] for p in parts) == sum(p["log_end"] for p in parts) == 600, (b.node_id, parts)
    with Consumer("everywhere", bootstrap=n1.address, auto_offset_reset="earliest") as c:
        got = []
        wait_until(lambda: got.extend(r for rs in c.poll_batches(200) for r in rs) or len(got) >= 600, 20, "600 records")
    assert sorted(r.value for r in got) == sorted(b"m%d" % i for i in range(600))

    # n3 is away while the topic is deleted; when it returns the topic stays deleted
    assert n3.stop() == 0
    with Admin(n1.address) as a:
        a.delete_topic("everywhere")
    n3.start()
    all_see(cluster.brokers, lambda s: s["n3"]["status"] == "alive", "n3 back")
    for b in cluster.brokers:
        with Admin(b.address) as a:
            wait_until(lambda: "everywhere" not in a.list_topics(), 5, f"{b.node_id} to forget the topic")
    with Admin(n3.address) as a:
        assert "everywhere" not in a.list_topics()


def test_kill9_is_detected_and_a_restart_rejoins_with_a_higher_generation(cluster):
    n1, n2, n3 = cluster.brokers
    gen_before = statuses(n1.address)["n2"]["generation"]
    n2.kill()
    all_see([n1, n3], lambda s: s["n2"]["status"] == "dead", "n2 dead", 10)
    n2.start()
    all_see(cluster.brokers, lambda s: s["n2"]["status"] == "alive" and s["n2"]["generation"] > gen_before,
            "n2 alive with a new generation", 10)


def test_sigterm_leaves_gracefully(cluster):
    n1, n2, n3 = cluster.brokers
    assert n3.stop() == 0
    all_see([n1, n2], lambda s: s["n3"]["status"] == "left", "n3 left", 3)


def test_a_node_whose_seed_is_down_keeps_trying_and_joins_later(tmp_path):
    seed = BrokerProcess("s1", str(tmp_path / "s1"))
    late = BrokerProcess("s2", str(tmp_path / "s2"), seeds=[seed.address]).start()
    try:
        wait_until(lambda: "retrying seeds" in late.log(), 10, "s2 to say it is retrying its seed")
        seed.start()
        all_see([seed, late], lambda s: len(s) == 2 and all(x["status"] == "alive" for x in s.values()),
                "s1 and s2 together", 15)
    finally:
        late.kill()
        seed.kill()
