"""Prometheus metrics (issue 16) against three real brokers with --metrics-port.

One cluster for the module (starting three brokers is the slow part); the tests run in
file order and the last one kills and restarts a follower.
"""
import shutil
import signal
import subprocess
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from mesh.client import Admin, Consumer, Producer
from mesh.testing.launcher import Cluster, wait_until

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def mcluster(tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("metrics"), 3, metrics=True).start()
    yield c
    for b in c.brokers:
        if b.proc and b.proc.poll() is None:
            try:
                b.signal(signal.SIGCONT)
            except ProcessLookupError:
                pass
        b.kill()


def raw(b) -> str:
    with urllib.request.urlopen(b.metrics_url, timeout=5) as r:
        assert r.status == 200
        return r.read().decode()


def scrape(b) -> dict:
    """{(sample name, sorted label items): value}"""
    out = {}
    for fam in text_string_to_metric_families(raw(b)):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(samples: dict, name: str, **labels) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def total(cluster, name: str, **labels) -> float:
    return sum(value(scrape(b), name, **labels) for b in cluster.brokers if b.alive())


def test_every_broker_serves_valid_metrics_and_counters_move(mcluster):
    n1, n2, n3 = mcluster.brokers
    for b in mcluster.brokers:
        s = scrape(b)
        assert value(s, "mesh_broker_info", node=b.node_id, address=b.address, generation="1") == 1
        wait_until(lambda: value(scrape(b), "mesh_gossip_members", state="alive") == 3, 5,
                   f"{b.node_id}'s metrics to show 3 live members")   # refreshed once a second
        assert ("process_cpu_seconds_total", ()) in s
    with Admin(n1.address) as a:
        a.create_topic("m", partitions=3, replication_factor=3)
    with Producer(n2.address) as p:
        for i in range(300):
            p.send("m", b"v%d" % i, key=b"k%d" % i)
        p.flush()
    wait_until(lambda: total(mcluster, "mesh_topic_appended_records_total", topic="m") == 300, 10,
               "300 appended records counted by the leaders")
    assert total(mcluster, "mesh_topic_appended_bytes_total", topic="m") > 300
    assert total(mcluster, "mesh_requests_total", op="Produce", code="NONE") >= 1
    assert total(mcluster, "mesh_produce_ack_latency_seconds_count", acks="all") >= 1
    assert total(mcluster, "mesh_network_received_bytes_total") > 300
    assert total(mcluster, "mesh_storage_sync_duration_seconds_count") > 0
    # every broker hosts all three partitions (rf 3): per-partition series everywhere
    for b in mcluster.brokers:
        s = scrape(b)
        for p in range(3):
            assert value(s, "mesh_partition_log_end_offset", topic="m", partition=str(p)) >= 0
            assert ("mesh_partition_high_watermark", (("partition", str(p)), ("topic", "m"))) in s
    leaders = sum(value(scrape(b), "mesh_partition_leader", topic="m", partition="0") for b in mcluster.brokers)
    assert leaders == 1
    with Consumer("m", bootstrap=n3.address, auto_offset_reset="earliest") as c:
        got = []
        wait_until(lambda: got.extend(r for rs in c.poll_batches(200) for r in rs) or len(got) >= 300, 20, "300 records")
    wait_until(lambda: total(mcluster, "mesh_topic_fetched_bytes_total", topic="m") > 300, 10, "fetched bytes counted")
    assert total(mcluster, "mesh_requests_total", op="Fetch", code="NONE") >= 1
    assert total(mcluster, "mesh_gossip_sent_bytes_total") > 0 and total(mcluster, "mesh_gossip_rounds_total") > 0
    if shutil.which("promtool") is None:
        pytest.skip("promtool is not installed (Debian package prometheus): exposition not checked by promtool")
    for b in mcluster.brokers:
        r = subprocess.run(["promtool", "check", "metrics"], input=raw(b), capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, f"{b.node_id}: promtool check metrics: {r.stdout}{r.stderr}"


def _lag(cluster, group: str, topic: str) -> float | None:
    """The group's lag on partition 0 as its coordinator exports it (None: nobody does)."""
    for b in cluster.brokers:
        s = scrape(b)
        key = ("mesh_group_lag_records", tuple(sorted({"group": group, "topic": topic, "partition": "0"}.items())))
        if key in s:
            return s[key]
    return None


def _consume_and_commit(boot: str, group: str, n: int) -> None:
    with Consumer("lagged", bootstrap=boot, group_id=group, auto_offset_reset="earliest",
                  enable_auto_commit=False) as c:
        got = []
        wait_until(lambda: got.extend(r for rs in c.poll_batches(200) for r in rs) or len(got) >= n, 20,
                   f"{n} records")
        c.commit()


def test_group_lag_appears_when_a_group_stops_consuming_and_returns_to_zero(mcluster):
    n1, n2, n3 = mcluster.brokers
    with Admin(n1.address) as a:
        a.create_topic("lagged", partitions=1, replication_factor=3)
    with Producer(n1.address) as p:
        for i in range(10):
            p.send("lagged", b"a%d" % i, partition=0)
        p.flush()
    _consume_and_commit(n2.address, "lg", 10)
    wait_until(lambda: _lag(mcluster, "lg", "lagged") == 0, 10, "lag 0 after the first commit")
    with Producer(n3.address) as p:   # the group has stopped consuming
        for i in range(7):
            p.send("lagged", b"b%d" % i, partition=0)
        p.flush()
    wait_until(lambda: _lag(mcluster, "lg", "lagged") == 7, 10, "lag 7 while the group is away")
    assert total(mcluster, "mesh_group_committed_offset", group="lg", topic="lagged", partition="0") == 10
    _consume_and_commit(n3.address, "lg", 7)
    wait_until(lambda: _lag(mcluster, "lg", "lagged") == 0, 10, "lag back to 0 once it caught up")
    assert total(mcluster, "mesh_group_rebalances_total", group="lg") >= 1


def test_under_replicated_rises_when_a_follower_dies_and_falls_when_it_returns(mcluster):
    with Admin(mcluster.brokers[0].address) as a:
        a.create_topic("ur", partitions=1, replication_factor=3)
        leader = a.describe_topic("ur")["partitions"][0]["leader"]
    lead = next(b for b in mcluster.brokers if b.node_id == leader)
    follower = next(b for b in mcluster.brokers if b.node_id != leader)
    assert value(scrape(lead), "mesh_under_replicated_partitions") == 0
    follower.kill()
    wait_until(lambda: value(scrape(lead), "mesh_under_replicated_partitions") >= 1, 20,
               f"{leader} to count ur/0 under-replicated without {follower.node_id}")
    follower.start()
    seen = {}

    def healed():
        seen.update({b.node_id: value(scrape(b), "mesh_under_replicated_partitions") for b in mcluster.brokers})
        return sum(seen.values()) == 0
    try:
        wait_until(healed, 30, f"no partition under-replicated once {follower.node_id} is back")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; under-replicated per broker: {seen}") from None
    assert value(scrape(lead), "mesh_offline_partitions") == 0
