"""The topic table (mesh/cluster/catalog.py), the leader view (mesh/cluster/leaders.py) and
the gossip key schema (mesh/cluster/keys.py)."""
from __future__ import annotations

import pytest

from mesh.cluster import keys
from mesh.cluster.catalog import Catalog, cluster_pid, topics_from_registers
from mesh.cluster.leaders import NO_LEADER, Leader, LeaderView, choose_leader, lead_claims
from mesh.wire.errors import ErrorCode, MeshError
from mesh.wire.topic_config import normalize_config
from storage.memory import MemoryStore


class Registers:
    """The part of the gossip core the catalog uses: cluster registers, one node's view."""

    def __init__(self):
        self.values: dict[str, object] = {}
        self.namespaces: dict[str, dict[str, object]] = {}

    def cluster_items(self, prefix: str = "") -> dict:
        return {k: v for k, v in sorted(self.values.items()) if k.startswith(prefix)}

    def put_cluster(self, key: str, value) -> None:
        self.values[key] = value

    def delete_cluster(self, key: str) -> None:
        self.values.pop(key, None)

    def node_items(self, node_id: str, prefix: str = "") -> dict:
        return {k: v for k, v in self.namespaces.get(node_id, {}).items() if k.startswith(prefix)}


def register(name: str, uuid: str, replicas: list[list[str]], **config) -> dict:
    return {"name": name, "uuid": uuid, "partitions": len(replicas), "replication_factor": len(replicas[0]),
            "config": normalize_config(config), "replicas": replicas}


UUID_A, UUID_B = "0123456789abcdef", "fedcba9876543210"


# -- the topic table -------------------------------------------------------------------
def test_rows_from_registers_see_only_this_nodes_partitions():
    regs = {keys.topic_key("a"): register("a", UUID_A, [["n1", "n2"], ["n2", "n3"], ["n3", "n1"]]),
            keys.topic_key("junk"): {"no": "replicas"}, "topic/odd": 3}
    topics = topics_from_registers(regs, "n1")
    assert list(topics) == ["a"]
    t = topics["a"]
    assert t.replicas == (("n1", "n2"), ("n2", "n3"), ("n3", "n1"))
    assert t.pids == (cluster_pid(UUID_A, 0), None, cluster_pid(UUID_A, 2))
    assert t.store_key == f"a#{UUID_A}"
    assert t.to_register() == regs[keys.topic_key("a")]      # the wire shape, exactly


def test_a_malformed_register_is_skipped():
    regs = {keys.topic_key("x"): {"name": "x", "replicas": [["n1"]]}}   # no uuid
    assert topics_from_registers(regs, "n1") == {}


def test_topics_are_frozen_rows():
    t = topics_from_registers({keys.topic_key("a"): register("a", UUID_A, [["n1"]])}, "n1")["a"]
    with pytest.raises(AttributeError):
        t.partitions = 2
    assert cluster_pid(UUID_A, 5) & 0x3FFF == 5
    assert cluster_pid(UUID_A, 0) != cluster_pid(UUID_B, 0)


# -- reconcile -------------------------------------------------------------------------
def make(node_id: str = "n1") -> tuple[Catalog, Registers, MemoryStore]:
    gossip, store = Registers(), MemoryStore()
    return Catalog(node_id, gossip, store), gossip, store


def test_reconcile_registers_and_drops_local_partitions():
    cat, gossip, store = make("n1")
    gossip.put_cluster(keys.topic_key("a"), register("a", UUID_A, [["n1", "n2"], ["n2", "n3"]]))
    added, removed = cat.reconcile()
    pid = cluster_pid(UUID_A, 0)
    assert (added, removed) == ({pid}, set())
    assert cat.local == {pid: ("a", 0)}
    assert store.partitions() == [(f"a#{UUID_A}", 0, pid)]
    assert cat.replicas_of(pid) == ["n1", "n2"]
    assert cat.reconcile() == (set(), set())             # nothing moved
    gossip.delete_cluster(keys.topic_key("a"))
    assert cat.reconcile() == (set(), {pid})
    assert cat.local == {} and cat.topics == {} and store.partitions() == []


def test_a_recreated_name_replaces_the_old_partitions():
    cat, gossip, store = make("n1")
    gossip.put_cluster(keys.topic_key("a"), register("a", UUID_A, [["n1"]]))
    cat.reconcile()
    gossip.put_cluster(keys.topic_key("a"), register("a", UUID_B, [["n1"]]))   # missed delete + create
    added, removed = cat.reconcile()
    assert (added, removed) == ({cluster_pid(UUID_B, 0)}, {cluster_pid(UUID_A, 0)})
    assert store.partitions() == [(f"a#{UUID_B}", 0, cluster_pid(UUID_B, 0))]


def test_a_restarted_node_finds_its_partitions_again():
    cat, gossip, store = make("n1")
    gossip.put_cluster(keys.topic_key("a"), register("a", UUID_A, [["n1"], ["n1"]]))
    cat.reconcile()
    again = Catalog("n1", gossip, store.crash())
    assert again.reconcile() == ({cluster_pid(UUID_A, 0), cluster_pid(UUID_A, 1)}, set())


def test_create_places_replicas_and_writes_the_register():
    cat, gossip, _ = make("n1")
    t = cat.create("orders", 3, 2, {"retention.ms": "60000"}, ["n1", "n2", "n3"])
    value = gossip.values[keys.topic_key("orders")]
    assert value == t.to_register()
    assert list(value) == ["name", "uuid", "partitions", "replication_factor", "config", "replicas"]
    assert value["config"]["retention.ms"] == 60000
    assert sorted(reps[0] for reps in value["replicas"]) == ["n1", "n2", "n3"]   # leaders spread
    assert all(len(set(reps)) == 2 for reps in value["replicas"])
    cat.reconcile()
    assert cat.topic("orders").uuid == t.uuid
    assert cat.leader_load() == {"n1": 1, "n2": 1, "n3": 1}


def test_create_and_lookup_errors():
    cat, gossip, _ = make("n1")
    cat.create("a", 2, 1, {}, ["n1"])
    cat.reconcile()
    cases = [
        (lambda: cat.create("a", 1, 1, {}, ["n1"]), ErrorCode.TOPIC_EXISTS),
        (lambda: cat.create("b", 0, 1, {}, ["n1"]), ErrorCode.INVALID_CONFIG),
        (lambda: cat.create("b", 1, 2, {}, ["n1"]), ErrorCode.INVALID_CONFIG),   # rf > live brokers
        (lambda: cat.topic("nope"), ErrorCode.UNKNOWN_TOPIC),
        (lambda: cat.partition("a", 2), ErrorCode.UNKNOWN_PARTITION),
        (lambda: cat.partition("a", "0"), ErrorCode.UNKNOWN_PARTITION),
        (lambda: cat.delete("nope"), ErrorCode.UNKNOWN_TOPIC),
    ]
    for fn, code in cases:
        with pytest.raises(MeshError) as info:
            fn()
        assert info.value.code == code
    t, pid = cat.partition("a", 1)
    assert t.name == "a" and pid == cluster_pid(t.uuid, 1)
    cat.delete("a")
    assert keys.topic_key("a") not in gossip.values


def test_a_partition_this_node_does_not_replicate_has_no_pid():
    cat, gossip, _ = make("n3")
    gossip.put_cluster(keys.topic_key("a"), register("a", UUID_A, [["n1", "n2"]]))
    cat.reconcile()
    assert cat.partition("a", 0)[1] is None and cat.local == {}


# -- leaders ---------------------------------------------------------------------------
def test_the_local_replica_knows_best():
    claims = {"n2": 9}
    assert choose_leader(["n1", "n2"], "n1", ("n1", 3), {"n1", "n2"}, claims.get) == Leader("n1", 3)
    # the local replica knows no leader: gossip decides
    assert choose_leader(["n1", "n2"], "n1", (None, 3), {"n1", "n2"}, claims.get) == Leader("n2", 9)


def test_the_highest_live_claim_wins():
    claims = {"n1": 4, "n2": 5, "n3": 7}
    live = {"n1", "n2"}
    assert choose_leader(["n1", "n2", "n3"], "n9", None, live, claims.get) == Leader("n2", 5)
    assert choose_leader(["n1", "n2"], "n2", None, live, claims.get) == Leader("n1", 4)   # not itself
    assert choose_leader(["n1", "n2"], "n9", None, set(), claims.get) == NO_LEADER
    tie = {"n1": 5, "n2": 5}
    assert choose_leader(["n2", "n1"], "n9", None, {"n1", "n2"}, tie.get) == Leader("n2", 5)


def test_the_leader_view_reads_claims_from_gossip():
    gossip = Registers()
    t = topics_from_registers({keys.topic_key("a"): register("a", UUID_A, [["n1", "n2"], ["n2", "n1"]])},
                              "n1")["a"]
    gossip.namespaces["n2"] = {keys.lead_key("a"): {"1": 6}}
    view = LeaderView("n1", gossip, lambda pid: ("n1", 2) if pid == t.pids[0] else (None, 0))
    assert view.leader(t, 0, {"n1", "n2"}) == Leader("n1", 2)
    assert view.leader(t, 1, {"n1", "n2"}) == Leader("n2", 6)
    assert view.leader(t, 1, {"n1"}) == NO_LEADER
    assert lead_claims(t, lambda pid: 2 if pid == t.pids[0] else None) == {"0": 2}
    assert lead_claims(t, lambda pid: None) == {}


# -- keys ------------------------------------------------------------------------------
def test_key_schema():
    assert keys.lead_key("orders") == "lead/orders"
    assert keys.topic_key("orders") == "topic/orders"
    assert keys.topic_of_key("topic/orders") == "orders" == keys.topic_of_key("lead/orders")
    assert (keys.MEMBER_KEY, keys.STATS_KEY, keys.OFFSETS_PREFIX) == ("member", "stats", "off/")
    with pytest.raises(ValueError):
        keys.topic_of_key("stats")
    assert keys.offsets_key("g/1", "t", 2) == "off/g/1/t/2"
