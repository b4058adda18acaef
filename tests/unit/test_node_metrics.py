"""mesh.node.ops.metrics without a broker: the snapshot a node's loop builds, as served."""
from types import SimpleNamespace

from prometheus_client import generate_latest

from mesh.gossip import Member
from mesh.node.ops.metrics import NodeMetrics
from mesh.wire import messages as m


class _Replicas:
    def hosts(self, pid):
        return True

    def leader(self, pid):
        return ("n1", 3) if pid == 1 else (None, 2)

    def is_leader(self, pid):
        return pid == 1

    def status(self, pid):
        return {"isr": ["n1"], "replicas": ["n1", "n2"], "followers": {"n2": {"match": 4}}}

    def commit_offset(self, pid):
        return 4

    def isr(self, pid):
        return ["n1"] if pid == 1 else []

    def quiet(self):
        return 1


def _node():
    members = [Member("n1", "127.0.0.1:1", 1, "alive", 5, 1_000, 0.0, 9),
               Member("n2", "127.0.0.1:2", 1, "alive", 5, 500, 0.0, 9)]
    groups = SimpleNamespace(list_groups=lambda: SimpleNamespace(groups=[
        {"group_id": "g", "state": "stable", "members": 2, "group_epoch": 3}]),
        committed=lambda gid: {("t", 0): (1, ""), ("gone", 0): (5, "")})
    return SimpleNamespace(
        node_id="n1", address="127.0.0.1:1", generation=7,
        clock=SimpleNamespace(wall_ms=lambda: 2_000),
        catalog=SimpleNamespace(topics={"t": SimpleNamespace(pids=[1, 2])}, local={1: ("t", 0), 2: ("t", 1)},
                                replicas_of=lambda pid: ["n1", "n2"]),
        store=SimpleNamespace(log_end=lambda pid: 10, size_bytes=lambda pid: 100, retention_deleted_batches=2),
        replicas=_Replicas(),
        gossip=SimpleNamespace(take_events=lambda: [], members=lambda now: members, node_items=lambda n, p: {},
                               stats={"rounds": 11, "malformed_shape": 1}),
        dispatch=SimpleNamespace(peer_messages_refused=0),
        groups=SimpleNamespace(core=groups))


def _served(per_partition: bool) -> str:
    mx = NodeMetrics(_node(), per_partition=per_partition)
    mx.request(b"c", 1, m.MetadataRequest(), [b"c", b"xx"])
    mx.answered(b"c", 1, m.ErrorResponse(0, ""), [b"c", b"yyy"])
    mx.refresh()
    return generate_latest(mx.registry).decode()


def test_the_snapshot_serves_every_family_from_the_node_loop():
    text = _served(True)
    for line in ['mesh_partition_leader{partition="0",topic="t"} 1.0',
                 'mesh_partition_follower_lag_records{follower="n2",partition="0",topic="t"} 6.0',
                 "mesh_under_replicated_partitions 1.0", "mesh_offline_partitions 1.0", "mesh_quiet_replicas 1.0",
                 'mesh_group_lag_records{group="g",partition="0",topic="t"} 3.0',
                 'mesh_group_rebalances_total{group="g"} 3.0',
                 'mesh_requests_total{code="NONE",op="Metadata"} 1.0',
                 "mesh_network_received_bytes_total 3.0", "mesh_network_sent_bytes_total 4.0",
                 "mesh_gossip_convergence_lag_seconds 1.5", "mesh_gossip_rounds_total 11.0",
                 'mesh_gossip_refused_messages_total{reason="shape"} 1.0',
                 "mesh_storage_retention_deleted_batches_total 2.0",
                 'mesh_broker_info{address="127.0.0.1:1",generation="7",node="n1"} 1.0']:
        assert line in text, line
    assert 'topic="gone"' not in text   # offsets of a topic that no longer exists: no series


def test_the_per_partition_switch_removes_the_per_partition_series_only():
    def samples(text):
        return [line for line in text.splitlines() if not line.startswith("#")]
    on, off = samples(_served(True)), samples(_served(False))
    for name in ("mesh_partition_log_size_bytes{", "mesh_partition_leader{", "mesh_partition_leader_epoch{",
                 "mesh_partition_log_end_offset{", "mesh_partition_high_watermark{",
                 "mesh_partition_follower_lag_records{"):
        assert any(line.startswith(name) for line in on), name
        assert not any(line.startswith(name) for line in off), name
    assert "mesh_under_replicated_partitions 1.0" in off and "mesh_offline_partitions 1.0" in off


def test_a_group_that_moves_away_takes_its_series_with_it():
    node = _node()
    mx = NodeMetrics(node)
    mx.refresh()
    assert 'mesh_group_members{group="g"} 2.0' in generate_latest(mx.registry).decode()
    node.groups.core.list_groups = lambda: SimpleNamespace(groups=[])
    mx.refresh()
    text = generate_latest(mx.registry).decode()
    assert 'group="g"' not in text and "mesh_broker_info" in text


def test_per_group_series_are_capped_to_the_most_lagging_groups():
    """Issue 39 finding 10: 5,000 groups made a scrape grow from 52 KB to 3.1 MB."""
    from mesh.node.ops.metrics import GROUP_SERIES_MAX
    node = _node()
    n = GROUP_SERIES_MAX * 4
    node.groups.core.list_groups = lambda: SimpleNamespace(groups=[
        {"group_id": f"g{i}", "state": "stable", "members": 1, "group_epoch": 1} for i in range(n)])
    node.groups.core.committed = lambda gid: {("t", 0): (4 - (gid == "g7"), "")}   # only g7 lags
    mx = NodeMetrics(node)
    mx.refresh()
    text = generate_latest(mx.registry).decode()
    assert text.count("mesh_group_members{") == GROUP_SERIES_MAX
    assert 'mesh_group_lag_records{group="g7",partition="0",topic="t"} 1.0' in text   # the lagging one stays
    assert f"mesh_groups_coordinated {float(n)}" in text
