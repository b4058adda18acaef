"""The topic table (mesh/cluster/catalog.py), the leader view (mesh/cluster/leaders.py) and
the gossip key schema (mesh/cluster/keys.py)."""
from __future__ import annotations

import pytest

from mesh.cluster import keys
from mesh.cluster.catalog import Catalog, Topic, cluster_pid, split_replicas, topic_registers, topics_from_registers
from mesh.cluster.leaders import NO_LEADER, Leader, LeaderView, choose_leader, lead_claims
from mesh.wire.errors import ErrorCode, MeshError
from mesh.wire.topic_config import normalize_config
from storage.memory import MemoryStore


class Registers:
    """The part of the gossip core the catalog uses: cluster registers, one node's view."""

    def __init__(self):
        self.values: dict[str, object] = {}
        self.namespaces: dict[str, dict[str, object]] = {}
        self.version = 0

    def cluster_items(self, prefix: str = "") -> dict:
        return {k: v for k, v in sorted(self.values.items()) if k.startswith(prefix)}

    def put_cluster(self, key: str, value) -> None:
        self.values[key] = value
        self.version += 1

    def delete_cluster(self, key: str) -> None:
        self.values.pop(key, None)
        self.version += 1

    def node_items(self, node_id: str, prefix: str = "") -> dict:
        return {k: v for k, v in self.namespaces.get(node_id, {}).items() if k.startswith(prefix)}

    def cluster_hash(self) -> tuple:
        return (self.version,)


def topic(name: str, uuid: str, replicas: list[list[str]], **config) -> Topic:
    return Topic(name=name, uuid=uuid, partitions=len(replicas), replication_factor=len(replicas[0]),
                 config=normalize_config(config), replicas=tuple(tuple(r) for r in replicas))


def registers(name: str, uuid: str, replicas: list[list[str]], **config) -> dict:
    return topic_registers(topic(name, uuid, replicas, **config))


UUID_A, UUID_B = "0123456789abcdef", "fedcba9876543210"


# -- the topic table -------------------------------------------------------------------
def test_rows_from_registers_see_only_this_nodes_partitions():
    regs = {**registers("a", UUID_A, [["n1", "n2"], ["n2", "n3"], ["n3", "n1"]]),
            keys.topic_key("junk"): {"no": "replicas"}, "topic/odd": 3}
    topics, _ = topics_from_registers(regs, "n1")
    assert list(topics) == ["a"]
    t = topics["a"]
    assert t.replicas == (("n1", "n2"), ("n2", "n3"), ("n3", "n1"))
    assert t.pids == (cluster_pid(UUID_A, 0), None, cluster_pid(UUID_A, 2))
    assert t.store_key == f"a#{UUID_A}"
    assert topic_registers(t) == registers("a", UUID_A, [["n1", "n2"], ["n2", "n3"], ["n3", "n1"]])
    assert regs[keys.topic_key("a")] == {"name": "a", "uuid": UUID_A, "partitions": 3, "replication_factor": 2,
                                         "config": normalize_config({}), "chunks": 1}
    assert regs[keys.tparts_key("a", UUID_A, 0)] == {"first": 0, "replicas": [["n1", "n2"], ["n2", "n3"],
                                                                              ["n3", "n1"]]}


def test_a_topic_is_pending_until_every_chunk_is_there():
    regs = registers("w", UUID_A, [["n1"]] * 2500)
    assert [k for k in regs if k.startswith(keys.TPARTS_PREFIX)] == [
        keys.tparts_key("w", UUID_A, k) for k in range(3)]
    assert regs[keys.topic_key("w")]["chunks"] == 3
    assert topics_from_registers(regs, "n1")[0]["w"].partitions == 2500
    partial = dict(regs)
    del partial[keys.tparts_key("w", UUID_A, 1)]
    assert topics_from_registers(partial, "n1")[0] == {}
    other = {**partial, keys.tparts_key("w", UUID_B, 1): regs[keys.tparts_key("w", UUID_A, 1)]}
    assert topics_from_registers(other, "n1")[0] == {}               # another incarnation's chunk
    shifted = {**regs, keys.tparts_key("w", UUID_A, 1): {"first": 999, "replicas": [["n1"]] * 1000}}
    assert topics_from_registers(shifted, "n1")[0] == {}             # chunks must be consecutive


def test_chunks_are_bounded_in_partitions_and_bytes():
    chunks = split_replicas([["n1", "n2", "n3"]] * 10_000)
    assert len(chunks) == 10 and all(len(c["replicas"]) == 1000 for c in chunks)
    assert [c["first"] for c in chunks] == list(range(0, 10_000, 1000))
    long_ids = [["x" * 200 + str(i) for i in range(16)]] * 100
    chunks = split_replicas(long_ids)
    assert sum(len(c["replicas"]) for c in chunks) == 100
    from mesh.gossip.rows import size_of
    assert all(size_of(c) < 2 * keys.TPARTS_CHUNK_BYTES for c in chunks)


def test_a_malformed_register_is_skipped():
    regs = {keys.topic_key("x"): {"name": "x", "chunks": 1}, keys.tparts_key("x", UUID_A, 0): {"first": 0}}
    assert topics_from_registers(regs, "n1")[0] == {}
    regs = {**registers("y", UUID_A, [["n1"]]), keys.tparts_key("y", UUID_A, 0): {"first": 0, "replicas": 7}}
    assert topics_from_registers(regs, "n1")[0] == {}


def test_unchanged_registers_reuse_their_rows():
    regs = registers("a", UUID_A, [["n1"]] * 3)
    first, memo = topics_from_registers(regs, "n1")
    again, _ = topics_from_registers(regs, "n1", memo)
    assert again["a"] is first["a"]
    copied = {k: dict(v) for k, v in regs.items()}
    assert topics_from_registers(copied, "n1", memo)[0]["a"] is not first["a"]


def test_topics_are_frozen_rows():
    t = topics_from_registers(registers("a", UUID_A, [["n1"]]), "n1")[0]["a"]
    with pytest.raises(AttributeError):
        t.partitions = 2
    assert cluster_pid(UUID_A, 5) & 0x3FFF == 5
    assert cluster_pid(UUID_A, 0) != cluster_pid(UUID_B, 0)


# -- reconcile -------------------------------------------------------------------------
def make(node_id: str = "n1") -> tuple[Catalog, Registers, MemoryStore]:
    gossip, store = Registers(), MemoryStore()
    return Catalog(node_id, gossip, store), gossip, store


def put(gossip: Registers, regs: dict) -> None:
    for k, v in regs.items():
        gossip.put_cluster(k, v)


def test_reconcile_registers_and_drops_local_partitions():
    cat, gossip, store = make("n1")
    put(gossip, registers("a", UUID_A, [["n1", "n2"], ["n2", "n3"]]))
    added, removed = cat.reconcile()
    pid = cluster_pid(UUID_A, 0)
    assert (added, removed) == ({pid}, set())
    assert cat.local == {pid: ("a", 0)}
    assert store.partitions() == [(f"a#{UUID_A}", 0, pid)]
    assert cat.replicas_of(pid) == ["n1", "n2"]
    assert cat.reconcile() == (set(), set())             # nothing moved
    cat.delete("a")
    assert gossip.values == {}                           # header and chunks tombstoned
    assert cat.reconcile() == (set(), {pid})
    assert cat.local == {} and cat.topics == {} and store.partitions() == []


class CountingStore(MemoryStore):
    def __init__(self):
        super().__init__()
        self.commits = 0

    def commit(self):
        self.commits += 1
        super().commit()


def test_a_wide_topic_is_registered_with_one_commit():
    gossip, store = Registers(), CountingStore()
    cat = Catalog("n1", gossip, store)
    put(gossip, registers("w", UUID_A, [["n1"]] * 10_000))
    added, _ = cat.reconcile()
    assert len(added) == 10_000 and store.commits == 1
    assert len(store.partitions()) == 10_000
    assert cat.reconcile() == (set(), set()) and store.commits == 1   # unchanged: no store work
    gossip.values[keys.tparts_key("w", UUID_A, 9)] = {"first": 9000, "replicas": [["n2"]] * 1000}  # unhashed
    for _ in range(61):                                # calls 3..63
        assert cat.reconcile() == (set(), set())       # the bucket hashes say nothing moved ...
    added, removed = cat.reconcile()                   # ... until the periodic full rebuild
    assert not added and not removed                   # kept: a stray goes only on evidence (configs rule 3)
    assert len(cat.strays()) == 1000


def test_a_recreated_name_replaces_the_old_partitions():
    cat, gossip, store = make("n1")
    put(gossip, registers("a", UUID_A, [["n1"]]))
    cat.reconcile()
    put(gossip, registers("a", UUID_B, [["n1"]]))        # missed delete + create
    added, removed = cat.reconcile()
    assert (added, removed) == ({cluster_pid(UUID_B, 0)}, {cluster_pid(UUID_A, 0)})
    assert store.partitions() == [(f"a#{UUID_B}", 0, cluster_pid(UUID_B, 0))]


def test_a_restarted_node_finds_its_partitions_again():
    cat, gossip, store = make("n1")
    put(gossip, registers("a", UUID_A, [["n1"], ["n1"]]))
    cat.reconcile()
    again = Catalog("n1", gossip, store.crash())
    assert again.reconcile() == ({cluster_pid(UUID_A, 0), cluster_pid(UUID_A, 1)}, set())


def test_create_places_replicas_and_writes_the_registers():
    cat, gossip, _ = make("n1")
    t = cat.create("orders", 3, 2, {"retention.ms": "60000"}, ["n1", "n2", "n3"])
    assert gossip.values == topic_registers(t)
    header = gossip.values[keys.topic_key("orders")]
    assert list(header) == ["name", "uuid", "partitions", "replication_factor", "config", "chunks"]
    assert header["config"]["retention.ms"] == 60000
    reps = gossip.values[keys.tparts_key("orders", t.uuid, 0)]["replicas"]
    assert sorted(r[0] for r in reps) == ["n1", "n2", "n3"]   # leaders spread
    assert all(len(set(r)) == 2 for r in reps)
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
        (lambda: cat.create("b", 10_001, 1, {}, ["n1"]), ErrorCode.INVALID_CONFIG),
        (lambda: cat.create("b", 1, 2, {}, ["n1"]), ErrorCode.INVALID_CONFIG),   # rf > live brokers
        (lambda: cat.create("b", 1, 17, {}, [f"n{i}" for i in range(20)]), ErrorCode.INVALID_CONFIG),
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


# -- alter -----------------------------------------------------------------------------
def test_alter_adds_partitions_and_keeps_the_old_ones():
    cat, gossip, store = make("n1")
    t = cat.create("a", 2, 2, {}, ["n1", "n2", "n3"])
    cat.reconcile()
    old_chunk = gossip.values[keys.tparts_key("a", t.uuid, 0)]
    new = cat.alter("a", 5, 0, ["n1", "n2", "n3"])
    assert new.uuid == t.uuid and new.partitions == 5 and new.replication_factor == 2
    assert new.replicas[:2] == t.replicas                           # existing partitions untouched
    assert all(len(set(r)) == 2 for r in new.replicas)
    leaders = [r[0] for r in new.replicas]
    assert max(leaders.count(n) for n in "n1 n2 n3".split()) == 2    # spread over the whole topic
    assert gossip.values[keys.tparts_key("a", t.uuid, 0)] is not old_chunk
    assert gossip.values == topic_registers(new)
    added, removed = cat.reconcile()
    assert removed == set()
    assert {cluster_pid(t.uuid, p) for p in range(2) if "n1" in t.replicas[p]} <= set(cat.local)
    assert added == {cluster_pid(t.uuid, p) for p in range(2, 5) if "n1" in new.replicas[p]}
    assert cat.topic("a").partitions == 5


def test_alter_writes_only_the_chunks_that_change_then_the_header():
    cat, gossip, _ = make("n1")
    put(gossip, registers("w", UUID_A, [["n1"]] * 1500))
    cat.reconcile()
    writes = []
    gossip.put_cluster = lambda k, v: writes.append(k) or Registers.put_cluster(gossip, k, v)
    cat.alter("w", 2100, 0, ["n1"])
    assert writes == [keys.tparts_key("w", UUID_A, 1), keys.tparts_key("w", UUID_A, 2), keys.topic_key("w")]
    assert cat.reconcile()[1] == set() and cat.topic("w").partitions == 2100


def test_alter_replication_factor_changes_the_header_only():
    cat, gossip, _ = make("n1")
    t = cat.create("a", 3, 1, {}, ["n1", "n2", "n3"])
    cat.reconcile()
    chunk = gossip.values[keys.tparts_key("a", t.uuid, 0)]
    new = cat.alter("a", 0, 3, ["n1", "n2", "n3"])
    assert new.replicas == t.replicas and gossip.values[keys.tparts_key("a", t.uuid, 0)] is chunk
    assert gossip.values[keys.topic_key("a")]["replication_factor"] == 3
    cat.reconcile()
    assert cat.topic("a").replication_factor == 3
    assert cat.alter("a", 0, 3, ["n1"]) is cat.topic("a")           # unchanged: a no-op
    both = cat.alter("a", 4, 2, ["n1", "n2", "n3"])
    assert both.replication_factor == 2 and len(both.replicas[3]) == 2   # new partitions at the new RF


def test_alter_errors():
    cat, _, _ = make("n1")
    cat.create("a", 3, 1, {}, ["n1", "n2"])
    cat.reconcile()
    cases = [
        (lambda: cat.alter("a", 2, 0, ["n1"]), ErrorCode.INVALID_REQUEST, "can only be added"),
        (lambda: cat.alter("a", 3, 0, ["n1"]), ErrorCode.INVALID_REQUEST, "has 3 partitions"),
        (lambda: cat.alter("a", 0, 0, ["n1"]), ErrorCode.INVALID_REQUEST, "nothing to alter"),
        (lambda: cat.alter("a", "4", 0, ["n1"]), ErrorCode.INVALID_REQUEST, "integers"),
        (lambda: cat.alter("a", 10_001, 0, ["n1"]), ErrorCode.INVALID_CONFIG, "partitions must be"),
        (lambda: cat.alter("a", 0, 17, [f"n{i}" for i in range(20)]), ErrorCode.INVALID_CONFIG, "1..16"),
        (lambda: cat.alter("a", 0, 3, ["n1", "n2"]), ErrorCode.INVALID_CONFIG, "2 live"),
        (lambda: cat.alter("a", 0, -1, ["n1", "n2"]), ErrorCode.INVALID_CONFIG, "1..16"),
        (lambda: cat.alter("nope", 4, 0, ["n1"]), ErrorCode.UNKNOWN_TOPIC, "nope"),
        (lambda: cat.alter(["a"], 4, 0, ["n1"]), ErrorCode.INVALID_REQUEST, "invalid topic name"),
    ]
    for fn, code, text in cases:
        with pytest.raises(MeshError) as info:
            fn()
        assert info.value.code == code and text in info.value.message, info.value.message


def _alter_elsewhere(regs: dict, partitions: int) -> dict:
    """The registers another broker writes when it alters the topic in ``regs``."""
    other, gossip, _ = make("n9")
    put(gossip, regs)
    other.reconcile()
    name = next(v["name"] for k, v in regs.items() if k.startswith(keys.TOPIC_PREFIX))
    before = dict(gossip.values)
    other.alter(name, partitions, 0, ["n1", "n2"])
    return {k: v for k, v in gossip.values.items() if before.get(k) is not v}


@pytest.mark.parametrize("header_first", [True, False])
def test_an_alter_arriving_in_pieces_never_drops_a_partition(header_first):
    cat, gossip, store = make("n1")
    put(gossip, registers("a", UUID_A, [["n1", "n2"], ["n1", "n2"]]))
    cat.reconcile()
    old_row = cat.topic("a")
    changed = _alter_elsewhere(dict(gossip.values), 4)
    header = {k: v for k, v in changed.items() if k.startswith(keys.TOPIC_PREFIX)}
    chunks = {k: v for k, v in changed.items() if k.startswith(keys.TPARTS_PREFIX)}
    put(gossip, header if header_first else chunks)                 # half of the alter has arrived
    assert cat.reconcile() == (set(), set())
    assert cat.topic("a") is old_row and len(store.partitions()) == 2
    assert cat.reconcile() == (set(), set())                         # and stays so, call after call
    if not header_first:
        with pytest.raises(MeshError, match="being changed"):         # the table is in between
            cat.alter("a", 5, 0, ["n1", "n2"])
    put(gossip, chunks if header_first else header)                 # the rest arrives
    added, removed = cat.reconcile()
    assert removed == set() and cat.topic("a").partitions == 4
    assert added == {cluster_pid(UUID_A, p) for p in (2, 3) if "n1" in cat.topic("a").replicas[p]}


def test_a_node_restarted_mid_alter_keeps_its_partitions():
    cat, gossip, store = make("n1")
    put(gossip, registers("a", UUID_A, [["n1"], ["n1"]]))
    cat.reconcile()
    put(gossip, {k: v for k, v in _alter_elsewhere(dict(gossip.values), 3).items()
                 if k.startswith(keys.TOPIC_PREFIX)})                # the header, not the chunk
    store = store.crash()
    again = Catalog("n1", gossip, store)
    assert again.reconcile() == (set(), set())
    assert "a" not in again.topics and len(store.partitions()) == 2  # pending, and nothing dropped
    put(gossip, registers("a", UUID_B, [["n2"]]))                    # a re-created name: the old data goes
    assert again.reconcile() == (set(), set()) and store.partitions() == []


def test_a_partition_this_node_does_not_replicate_has_no_pid():
    cat, gossip, _ = make("n3")
    put(gossip, registers("a", UUID_A, [["n1", "n2"]]))
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
    t = topics_from_registers(registers("a", UUID_A, [["n1", "n2"], ["n2", "n1"]]), "n1")[0]["a"]
    gossip.namespaces["n2"] = {keys.lead_key("a", 0): {"1": 6}}
    view = LeaderView("n1", gossip, lambda pid: ("n1", 2) if pid == t.pids[0] else (None, 0))
    assert view.leader(t, 0, {"n1", "n2"}) == Leader("n1", 2)
    assert view.leader(t, 1, {"n1", "n2"}) == Leader("n2", 6)
    assert view.leader(t, 1, {"n1"}) == NO_LEADER
    gossip.namespaces["n2"] = {keys.lead_key("a", 0): {"1": 7}}
    assert view.leader(t, 1, {"n1", "n2"}) == Leader("n2", 6)     # read once per gossip version
    gossip.version += 1
    assert view.leader(t, 1, {"n1", "n2"}) == Leader("n2", 7)
    assert lead_claims(t, lambda pid: 2 if pid == t.pids[0] else None) == {keys.lead_key("a", 0): {"0": 2}}
    assert lead_claims(t, lambda pid: None) == {}


def test_lead_claims_are_chunked():
    wide = topics_from_registers(registers("w", UUID_A, [["n1"]] * 1200), "n1")[0]["w"]
    claims = lead_claims(wide, lambda pid: 3)
    assert sorted(claims) == sorted(keys.lead_key("w", k) for k in range(3))
    assert len(claims[keys.lead_key("w", 2)]) == 1200 - 2 * keys.PARTITION_CHUNK
    assert list(lead_claims(wide, lambda pid: 3, chunks=[1])) == [keys.lead_key("w", 1)]
    view = LeaderView("n9", Registers(), lambda pid: None)
    view.gossip.namespaces["n1"] = claims
    assert view.leader(wide, 1100, {"n1"}) == Leader("n1", 3)


# -- keys ------------------------------------------------------------------------------
def test_key_schema():
    assert keys.lead_key("orders", 2) == "lead/orders/2"
    assert keys.stats_key("orders", 0) == "stats/orders/0"
    assert keys.recovering_key("orders", 1) == "recovering/orders/1"
    assert keys.topic_key("orders") == "topic/orders"
    assert keys.tparts_key("orders", UUID_A, 3) == f"tparts/orders/{UUID_A}/3"
    for key in ("topic/orders", "lead/orders/1", "stats/orders/0", "recovering/orders/4",
                f"tparts/orders/{UUID_A}/0"):
        assert keys.topic_of_key(key) == "orders"
    assert keys.chunk_of(keys.PARTITION_CHUNK - 1) == 0 and keys.chunk_of(keys.PARTITION_CHUNK) == 1
    assert (keys.MEMBER_KEY, keys.OFFSETS_PREFIX) == ("member", "off/")
    with pytest.raises(ValueError):
        keys.topic_of_key("member")
    assert keys.offsets_key("g/1", "t", 2) == "off/g/1/t/2"


def test_the_partitions_of_all_topics_together_are_bounded(monkeypatch):
    """Only partitions per topic were bounded: topic after topic, every broker holds the whole
    table and may host a replica of each (its replication core takes at most 100,000)."""
    import mesh.cluster.catalog as catalog_module
    monkeypatch.setattr(catalog_module, "MAX_CLUSTER_PARTITIONS", 10)
    cat, _, _ = make("n1")
    cat.create("a", 6, 1, {}, ["n1"])
    cat.reconcile()
    with pytest.raises(MeshError, match="holds 6 partitions; at most 10 in all") as info:
        cat.create("b", 5, 1, {}, ["n1"])
    assert info.value.code == ErrorCode.INVALID_CONFIG
    cat.create("b", 4, 1, {}, ["n1"])
    cat.reconcile()
    with pytest.raises(MeshError, match="asked for 1 more"):
        cat.alter("a", 7, 0, ["n1"])


def test_alter_sets_configs_and_an_old_register_without_compaction_keys_stays_valid():
    from mesh.cluster.schema import validate_entry
    cat, gossip, _ = make("n1")
    t = cat.create("c", 2, 1, {"retention.ms": "1000"}, ["n1"])
    cat.reconcile()
    assert "cleanup.policy" not in gossip.values[keys.topic_key("c")]["config"]   # set keys only
    new = cat.alter("c", 0, 0, ["n1"], {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.25"})
    assert new.replicas == t.replicas and new.config["cleanup.policy"] == 1
    assert new.config["min.cleanable.dirty.ratio"] == 250 and new.config["retention.ms"] == 1000
    header = gossip.values[keys.topic_key("c")]
    assert header["config"] == new.config
    assert validate_entry(keys.topic_key("c"), header, 0) is None
    cat.reconcile()
    assert cat.topic("c").config["cleanup.policy"] == 1
    assert cat.alter("c", 0, 0, ["n1"], {"cleanup.policy": "compact"}) is cat.topic("c")   # no change
    with pytest.raises(MeshError):
        cat.alter("c", 0, 0, ["n1"], {"cleanup.policy": "sometimes"})
    with pytest.raises(MeshError):
        cat.alter("c", 0, 0, ["n1"], {"min.cleanable.dirty.ratio": "1.5"})
