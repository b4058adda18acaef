"""The elastic mesh against real brokers (issue 14): data follows membership.

A producer (acks=all, idempotent) and a consumer run throughout each test
(``mesh.testing.workload``); at the end the topic is read back and nothing acknowledged
may be lost, doubled or reordered. Each test waits on conditions with deadlines (metadata
polled from a live broker), never on sleeps.
"""
import pytest

from mesh.client import Admin, Producer
from mesh.testing.launcher import BrokerProcess, Cluster, wait_until
from mesh.testing.workload import Workload, balanced as settled, placement_counts as counts, topic_view as view

pytestmark = pytest.mark.integration

FAST = ["--replace-dead-after", "4s"]


def check(w: Workload):
    w.stop()
    verdict = w.check()
    assert verdict.ok(), str(verdict)
    assert verdict.acked > 100, f"the producer got too few acknowledgements: {verdict} {dict(w.errors)}"
    return verdict


def test_add_broker_then_decommission_then_reassign(tmp_path):
    c = Cluster(tmp_path, 3, extra=FAST).start()
    n4 = w = None
    try:
        with Admin(c.bootstrap) as a:
            a.create_topic("e", 12, 2)
        w = Workload(c.bootstrap, "e", 12, rate_per_s=300).start()
        wait_until(lambda: w.acked, 20, "first acknowledgements")
        # a new broker takes its share: 24 replicas -> 6 each, 12 preferred leaders -> 3 each
        n4 = BrokerProcess("n4", str(tmp_path / "n4"), seeds=[c.brokers[0].address], extra=FAST).start()
        everyone = c.brokers + [n4]
        wait_until(lambda: settled(everyone, "e", ["n1", "n2", "n3", "n4"], 2), 120,
                   "n4 to take its share of replicas and leaderships")
        parts, brokers = view(everyone, "e")
        assert counts(parts)[0]["n4"] == 6
        # drain n3: everything moves off it, leaderships first; then it can stop for good
        with Admin(c.bootstrap) as a:
            a.decommission("n3")
        wait_until(lambda: (view(everyone, "e")[1] or {}).get("n3", {}).get("state") == "drained", 120,
                   "n3 to be drained")
        assert settled(everyone, "e", ["n1", "n2", "n4"], 2)
        c.brokers[2].stop()
        # a manual move of partition 0 to n1,n4 (in that order: n1 preferred)
        with Admin(n4.address) as a:
            a.reassign("e", 0, ["n4", "n1"])
        wait_until(lambda: (view(everyone, "e")[0] or [{}])[0].get("replicas") == ["n4", "n1"], 60,
                   "partition 0 to be on n4,n1")
        # a higher replication factor: each partition's leader adds a replica
        with Admin(n4.address) as a:
            a.alter_topic("e", replication_factor=3)
        wait_until(lambda: settled(everyone, "e", ["n1", "n2", "n4"], 3, spread_leaders=False), 120,
                   "every partition to reach 3 replicas")
        check(w)
    finally:
        if w is not None:
            w.stop()      # never leave its threads behind to load the rest of the suite
        if n4 is not None:
            n4.kill()
        c.kill()


def test_dead_broker_replaced_and_leader_killed_mid_move(tmp_path):
    # small catch-up budget so the manual move below is still in progress when its leader dies
    c = Cluster(tmp_path, 4, extra=FAST + ["--move-rate-bytes", "200000"]).start()
    w = None
    try:
        with Admin(c.bootstrap) as a:
            a.create_topic("d", 8, 3)
        w = Workload(c.bootstrap, "d", 8, rate_per_s=300).start()
        wait_until(lambda: len(w.acked) > 200, 30, "first acknowledgements")
        victim = c.brokers[3]
        victim.kill()                      # for good: its replicas are re-created after 4 s
        live = c.brokers[:3]
        wait_until(lambda: settled(live, "d", ["n1", "n2", "n3"], 3, spread_leaders=False), 120,
                   "every partition back to 3 replicas without n4")
        # a move whose leader is killed while the new replica is still a learner: 3 MB in
        # partition 0 take n4 seconds to copy at 200 kB/s
        with Producer(c.bootstrap, acks="all") as p:
            for _ in range(30):
                p.send_batch("d", [b"x" * 100] * 1000, partition=0).result(30)
        victim.start()                      # back: added again only as balancing needs it
        c.wait_converged()                  # a reassignment names live brokers only
        # partition 0 with a leader (n4's return may move leaderships: a moment without one)
        p0 = wait_until(lambda: next((p for p in (view(live, "d")[0] or []) if p["partition"] == 0
                                      and p.get("leader") in {"n1", "n2", "n3"}), None), 30, "a leader of partition 0")
        target = [x for x in p0["replicas"] if x != p0["leader"]] + ["n4"]
        with Admin(c.bootstrap) as a:
            a.reassign("d", 0, target)
        with Admin(c.bootstrap) as a:   # the move shows while n4 refills (3 MB at 200 kB/s)
            wait_until(lambda: any(mv["partition"] == 0 and mv["adding"] == ["n4"] and mv["bytes_remaining"] > 0
                                   for mv in a.list_moves().moves), 30, "the move of partition 0 to n4 to show")
        old_leader = next(b for b in c.brokers if b.node_id == p0["leader"])
        old_leader.kill()
        wait_until(lambda: (view(c.brokers, "d")[0] or [{}])[0].get("replicas") == target, 120,
                   f"partition 0 to reach {target} under a new leader")
        old_leader.start()
        # the returned broker's stale copies are gone: it hosts exactly what configs name
        def hosts_only_named():
            parts, brokers = view(c.brokers, "d")
            named = sum(1 for p in parts if "n4" in p["replicas"] + (p.get("learners") or []))
            return brokers["n4"].get("replicas") == named
        wait_until(hosts_only_named, 60, "n4 to drop the replicas it no longer holds")
        check(w)
    finally:
        if w is not None:
            w.stop()
        c.kill()
