"""``mesh topic alter`` on a real 3-broker cluster: a topic grows from 2 partitions to 4,
the new partitions take records, the old ones keep theirs, and shrinking is refused with
a clear message (Kafka's CreatePartitions rules)."""
import collections
import time

import pytest
from click.testing import CliRunner

from mesh.client import Admin, Consumer, ErrorCode, MeshError, Producer, TopicPartition
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
