"""Client failover on real brokers: a producer with the default settings gets its next send
acknowledged by a new leader within a few seconds of a SIGSTOP of the leader, of a kill -9
of the (new) leader, and of a SIGTERM of the leader after that, which hands its leadership
over before it stops (controlled shutdown: its log says so); nothing acknowledged is stored
twice or out of send order."""
import re
import signal
import time

import pytest

from mesh.client import Admin, Producer
from mesh.testing.launcher import wait_until
from tests.integration.test_replication import read_all

pytestmark = pytest.mark.integration

RECOVERY_S = 5.0   # the cluster elects in ~1-2 s; the client must follow in about that


def _leader(addrs, topic):
    with Admin(addrs, request_timeout_ms=1000) as a:
        return a.describe_topic(topic)["partitions"][0]["leader"]


def test_the_next_send_after_a_paused_or_killed_leader_is_acknowledged_within_seconds(cluster3):
    c = cluster3
    with Admin(c.bootstrap) as a:
        a.create_topic("fo", partitions=1, replication_factor=3)
    acked = {}
    with Producer(c.bootstrap, linger_ms=0) as p:   # defaults: acks=all, idempotent
        i = 0

        def send_and_wait(timeout_s):
            nonlocal i
            v = b"v%05d" % i
            i += 1
            md = p.send("fo", v, partition=0).get(timeout_s)
            acked[v] = md.offset
            return md

        for _ in range(20):
            send_and_wait(10)
        recovery = {}
        for fault in ("pause", "kill", "stop"):
            leader = wait_until(lambda: _leader(c.bootstrap, "fo"), 10, "a leader")
            victim = next(b for b in c.brokers if b.node_id == leader)
            others = ",".join(b.address for b in c.brokers if b is not victim)
            if fault == "pause":
                victim.signal(signal.SIGSTOP)
            elif fault == "kill":
                victim.kill()
            else:
                victim.signal(signal.SIGTERM)
                wait_until(lambda: "stopping: handing over" in victim.log(), 10, "the stop to begin")
            t0 = time.monotonic()
            send_and_wait(RECOVERY_S + 5)       # the first send made after the fault
            recovery[fault] = time.monotonic() - t0
            if fault == "stop":
                assert victim.wait_stopped() == 0
                said = re.findall(r"handed over (\d+) partitions in \d+ ms; still leading (\d+)", victim.log())
                assert said and said[-1] == ("1", "0"), f"no handover before the stop: {victim.log()}"
            assert _leader(others, "fo") not in (None, leader)
            for _ in range(20):
                send_and_wait(10)
            if fault == "pause":
                victim.signal(signal.SIGCONT)
            else:
                victim.start()
            c.wait_converged()
        for _ in range(20):
            send_and_wait(10)
    got = read_all(c.bootstrap, "fo", 1)[0]
    values = [r.value for r in got]
    assert len(values) == len(set(values)), "a record stored twice"
    assert values == sorted(values), "stored out of send order"
    assert {r.value: r.offset for r in got if r.value in acked} == acked
    assert len(acked) == 20 + 3 * 21 + 20
    print(f"first acknowledgement after the fault: {recovery}")
    for fault, s in recovery.items():
        assert s < RECOVERY_S, f"first acknowledgement {s:.1f} s after the {fault}: {recovery}"


def test_a_broker_restarted_after_a_graceful_stop_leads_its_partitions_again(cluster3):
    """Kafka keeps the replica order through restarts: a broker that stops gracefully (its
    leaderships handed over) and comes back within the balancer's grace is still its
    partitions' preferred replica, so it leads them again once it has caught up."""
    c = cluster3
    with Admin(c.bootstrap) as a:
        a.create_topic("back", partitions=3, replication_factor=3)

    def parts():
        with Admin(c.bootstrap, request_timeout_ms=1000) as a:
            return a.describe_topic("back")["partitions"]

    wait_until(lambda: all(p["leader"] == p["replicas"][0] for p in parts()), 30, "preferred leaders")
    victim = next(b for b in c.brokers if b.node_id == parts()[0]["leader"])
    with Producer(c.bootstrap, linger_ms=0) as p:
        for i in range(10):
            p.send("back", b"before-%d" % i, partition=0).get(10)
        victim.signal(signal.SIGTERM)
        assert victim.wait_stopped() == 0
        assert parts()[0]["replicas"][0] == victim.node_id, "the stopped broker lost its place"
        p.send("back", b"while-away", partition=0).get(10)
        victim.start()
        wait_until(lambda: parts()[0]["leader"] == victim.node_id, 30,
                   f"{victim.node_id} to lead partition 0 again")
        p.send("back", b"after", partition=0).get(10)


def test_a_broker_whose_store_fills_up_moves_its_leaderships_and_the_cluster_goes_on(tmp_path):
    """n3's store is small. Once full it drops the appends it has no room for (a put that
    does not fit would fail its whole turn, and the rollback drop every leadership it
    holds), refuses client batches for the partitions it leads and hands those over; with
    n1 and n2 a quorum, every send is acknowledged and every acknowledged record is read
    back."""
    from mesh.testing.launcher import Cluster
    c = Cluster(tmp_path, 3)
    c.brokers[2].extra = c.brokers[2].extra + ["--max-storage-bytes", str(4 << 20)]
    c.start()
    try:
        with Admin(c.bootstrap) as a:
            a.create_topic("fill", partitions=3, replication_factor=3)
        value = b"v" * 1000
        acked = []
        with Producer(c.bootstrap, acks="all", delivery_timeout_ms=30_000) as p:
            def burst(n):
                futs = [(i, p.send_batch("fill", [value] * 20, partition=i % 3)) for i in range(n)]
                for i, f in futs:
                    acked.append((i % 3, f.result(40)))
            deadline = time.monotonic() + 90
            while not re.search(r"store (is )?full", c.brokers[2].log(tail_chars=1 << 20)):
                assert time.monotonic() < deadline, "n3's store never filled"
                burst(30)
            burst(60)   # with n3 full: all of it acknowledged
        got = read_all(c.bootstrap, "fill", 3)
        for part, base in acked:
            assert [r.value for r in got[part][base:base + 20]] == [value] * 20
        assert all(b.alive() for b in c.brokers)
        assert "rebuilding the replication core" not in c.brokers[2].log(tail_chars=1 << 20)
    finally:
        c.kill()
