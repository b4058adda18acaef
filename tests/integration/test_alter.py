"""``mesh topic alter`` on a real 3-broker cluster: a topic grows from 2 partitions to 4,
the new partitions take records, the old ones keep theirs, and shrinking is refused with
a clear message (Kafka's CreatePartitions rules)."""
import collections
import time

import pytest
from click.testing import CliRunner

from mesh.client import Admin, Consumer, ErrorCode, MeshError, Producer, TopicPartition
from mesh.testing.launcher import wait_until
from tools.cli import main as cli

pytestmark = pytest.mark.integration


def read(bootstrap, topic, partitions, timeout_s=30):
    """Every record below each partition's high watermark, values by partition."""
    with Consumer(bootstrap=bootstrap, auto_offset_reset="earliest") as c:
        tps = [TopicPartition(topic, p) for p in partitions]
        c.assign(tps)
        want = {tp: c.end_offsets([tp])[tp] - c.beginning_offsets([tp])[tp] for tp in tps}
        out = collections.defaultdict(list)
        deadline = time.monotonic() + timeout_s
        while any(len(out[tp.partition]) < n for tp, n in want.items()):
            assert time.monotonic() < deadline, f"could not read everything back: {dict(out)}"
            for recs in c.poll_batches(500):
                for r in recs:
                    out[r.partition].append(r.value)
        return out


def test_a_topic_grows_and_keeps_its_records(cluster3):
    boot = cluster3.bootstrap
    with Admin(boot) as admin, Producer(boot, acks="all") as p:
        admin.create_topic("grow", partitions=2, replication_factor=2)
        for f in [p.send("grow", b"old-%d" % i, partition=i % 2) for i in range(10)]:
            f.get(20)
        admin.alter_topic("grow", partitions=4)                       # waits until every broker knows
        for b in cluster3.brokers:
            with Admin(b.address) as a:
                t = a.describe_topic("grow")
            assert len(t["partitions"]) == 4 and t["replication_factor"] == 2
            assert all(p_["leader"] and len(p_["replicas"]) == 2 for p_ in t["partitions"])

    with Producer(boot, acks="all") as p:                            # a new client sees 4 partitions
        for f in [p.send("grow", b"new-%d" % i, partition=3) for i in range(5)]:
            assert f.get(20).partition == 3
    got = read(boot, "grow", range(4))
    assert got[3] == [b"new-%d" % i for i in range(5)]
    assert got[0] == [b"old-%d" % i for i in range(0, 10, 2)]        # existing partitions keep their data
    assert got[1] == [b"old-%d" % i for i in range(1, 10, 2)]
    assert got[2] == []

    with Admin(boot) as admin:
        with pytest.raises(MeshError) as info:
            admin.alter_topic("grow", partitions=3)
        assert info.value.code == ErrorCode.INVALID_REQUEST
        assert "has 4 partitions: partitions can only be added" in info.value.message
        assert len(admin.describe_topic("grow")["partitions"]) == 4
    out = CliRunner().invoke(cli, ["topic", "alter", "grow", "--partitions", "2", "--bootstrap", boot])
    assert out.exit_code == 1
    assert "error: INVALID_REQUEST: topic 'grow' has 4 partitions: partitions can only be added" in out.output


def _shape(b, name):
    """(uuid, partitions, replication factor) of ``name`` as broker ``b`` lists it; None if unknown."""
    with Admin(b.address) as a:
        (t,) = a.metadata([name]).topics
    return None if t.get("error") else (t["topic_id"], len(t["partitions"]), t["replication_factor"])


def test_topic_changes_through_different_brokers_at_once_are_made_by_one_owner(cluster3):
    """Two creates of one name through two brokers both succeeded (the loser's partitions,
    acknowledged records and all, were dropped once gossip settled), and two alters through
    two brokers left a header and a partition table that never agreed again. A topic's
    owner makes every change to it, one after another."""
    import threading
    brokers = cluster3.brokers
    results = {}

    def run(i, fn):
        try:
            with Admin(brokers[i].address) as a:   # each client knows one broker only
                results[i] = fn(a)
        except MeshError as exc:
            results[i] = exc.code

    def at_once(*fns):
        results.clear()
        threads = [threading.Thread(target=run, args=(i, fn)) for i, fn in enumerate(fns)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        return [results[i] for i in range(len(fns))]

    got = at_once(*[lambda a: a.create_topic("x", 3, 1, wait_s=0)] * 3)
    assert sorted(got, key=str) == sorted([None, ErrorCode.TOPIC_EXISTS, ErrorCode.TOPIC_EXISTS], key=str), got
    got = at_once(lambda a: a.alter_topic("x", partitions=6, wait_s=0),
                  lambda a: a.alter_topic("x", replication_factor=2, wait_s=0))
    assert got == [None, None], got
    wait_until(lambda: len({_shape(b, "x") for b in brokers}) == 1 and _shape(brokers[0], "x")[1:] == (6, 2),
               30, "every broker to list x with 6 partitions at replication factor 2")
    brokers[0].stop()
    brokers[0].start()
    wait_until(lambda: _shape(brokers[0], "x") == _shape(brokers[1], "x"), 30, "the restarted broker to list x")


def test_lowering_the_replication_factor_just_after_a_broker_died_keeps_every_partition_led(cluster3):
    """The alter right after a broker was killed, before gossip convicted it (3-5 s): the
    leaders counted it as alive, removed live voters and kept it, and 3 of 6 partitions were
    left with voters [live, dead]: no quorum, no leader, and nobody to change them again. A leader now
    removes a voter only if it heard a quorum of those left within an election timeout, and
    the voter it heard least recently first."""
    from mesh.cluster.ownership import coordinator_for
    from mesh.testing.workload import topic_view
    by_id = {b.node_id: b for b in cluster3.brokers}
    owner = by_id[coordinator_for("topic:s", by_id)]   # makes the alter: it must live
    victim = [b for b in cluster3.brokers if b is not owner][-1]
    live = [b for b in cluster3.brokers if b is not victim]
    with Admin(cluster3.bootstrap) as admin, Producer(cluster3.bootstrap, acks="all") as p:
        admin.create_topic("s", partitions=6, replication_factor=3)
        for f in [p.send("s", b"v%d" % i, partition=i % 6) for i in range(60)]:
            f.get(20)
    victim.kill()
    with Admin(owner.address) as admin:
        admin.alter_topic("s", replication_factor=1, wait_s=0)

    def settled():   # one voter each, but where the dead broker is the one to keep: no removal there
        parts, _ = topic_view(live, "s")
        return parts is not None and all(q["replicas"] == [q["leader"]] or len(q["replicas"]) == 3
                                         and q["leader"] in {b.node_id for b in live} for q in parts)
    wait_until(settled, 60, "every partition led, by its only voter or by a live one of its 3 (the dead one, "
                            "the one to keep, never removed a live one)")
    with Producer(owner.address, acks="all") as p:
        for f in [p.send("s", b"after", partition=q) for q in range(6)]:
            f.get(20)
