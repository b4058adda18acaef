"""The gossip value schema (mesh/cluster/schema.py): every value the brokers write passes
(built with the real writers), and careless or hostile values are refused with a reason."""
from __future__ import annotations

import socket

import pytest

from mesh.cluster import keys
from mesh.cluster.catalog import Topic, topic_registers
from mesh.cluster.schema import REGISTER_PREFIXES, validate_entry
from mesh.groups.offsets import encode_chunk
from mesh.node.loop import Node, NodeConfig
from mesh.security.acl import AclRule
from mesh.wire import messages as m
from mesh.wire.topic_config import normalize_config

NOW_MS = 1_800_000_000_000
UUID = "0123456789abcdef"
KEY = "rq:A<Y=d5{9jzRc*8lsOIb%d@1$ycX3cKd?@Jvu?"   # 40 characters of Z85


def ok(key, value):
    why = validate_entry(key, value, NOW_MS)
    assert why is None, why


def bad(key, value, now_ms=NOW_MS):
    why = validate_entry(key, value, now_ms)
    assert isinstance(why, str) and why, f"{key} = {value!r:.200} was accepted"
    return why


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def node(tmp_path):
    n = Node(NodeConfig(node_id="n1", bind=f"127.0.0.1:{_port()}", data_dir=str(tmp_path), sync=False,
                        text_port=_port()))
    yield n
    n.close()


def test_every_value_a_broker_writes_passes(node):
    """A real node (in process): create topics (one wide), elect, publish; then every entry
    of its gossip state is valid."""
    h = node.handlers
    for name, parts in (("small", 3), ("wide", 2100)):
        h.on_create_topic(b"c", 1, m.CreateTopicRequest(name, parts, 1, {"retention.ms": 60_000}), None)
    for _ in range(3):
        node._after_turn()
    node.replicas.recovering = lambda pid: True              # recovering/ entries too (RF 1 never refills)
    node.publish.stats()
    mine = node.gossip.node_items("n1")
    assert {k.split("/")[0] for k in mine} == {"member", "lead", "stats", "recovering", "load"}
    assert keys.lead_key("wide", 4) in mine and keys.stats_key("wide", 4) in mine
    registers = node.gossip.cluster_items()
    assert len([k for k in registers if k.startswith(keys.TPARTS_PREFIX)]) == 1 + 3
    for key, value in [*mine.items(), *registers.items()]:
        ok(key, value)
        assert key.startswith(REGISTER_PREFIXES) == (key in registers)


def test_other_writers_pass():
    ok(*encode_chunk(("g/1", "t", 2), {64: [10, "meta", NOW_MS], 95: [0, "", NOW_MS - 5]}))
    ok(*encode_chunk(("g/1", "t", 0), {1: [-1, "", NOW_MS]}))   # a deleted group's tombstone
    rule = AclRule("alice", "allow", ("read", "describe"), "topic", "orders", "prefixed")
    ok(keys.acl_key(rule.id), rule.to_register())
    ok(keys.acl_key("0" * 16), AclRule("*", "deny", ("all",), "cluster", "cluster").to_register())
    ok(keys.user_key("alice"), {"name": "alice", "public_key": KEY})
    wide = Topic("w", UUID, 10_000, 16, normalize_config({}), ((tuple(f"node-{i}" for i in range(16))),) * 10_000)
    for key, value in topic_registers(wide).items():
        ok(key, value)


def header(**changes):
    v = {"name": "t", "uuid": UUID, "partitions": 3, "replication_factor": 2, "config": normalize_config({}),
         "chunks": 1}
    v.update(changes)
    return v


@pytest.mark.parametrize("key,value", [
    ("nonsense", 1),
    ("stats", {}),                                               # the old single-key schema
    (keys.topic_key("t"), None),                                 # a live None
    (keys.topic_key("t"), header(name="u")),                     # another name than the key's
    (keys.topic_key("t"), header(uuid="not hex at all!")),
    (keys.topic_key("t"), header(uuid="ABCDEF0123456789")),
    (keys.topic_key("t"), header(partitions=10_001)),
    (keys.topic_key("t"), header(partitions=True)),
    (keys.topic_key("t"), header(chunks=4)),
    (keys.topic_key("t"), header(replication_factor=0)),
    (keys.topic_key("t"), header(config={"retention.ms": 1})),   # not normalized
    (keys.topic_key("t"), header(config={**normalize_config({}), "evil": 1})),
    (keys.topic_key("t"), {**header(), "extra": 1}),
    (keys.topic_key("bad/name"), header(name="bad/name")),
    (keys.tparts_key("t", UUID, 0), {"first": 0, "replicas": []}),
    (keys.tparts_key("t", UUID, 0), {"first": 0, "replicas": [["n1", "n1"]]}),
    (keys.tparts_key("t", UUID, 0), {"first": 0, "replicas": [["n1"]] * 1001}),
    (keys.tparts_key("t", UUID, 0), {"first": 9_999, "replicas": [["n1"]] * 2}),
    (keys.tparts_key("t", UUID, 0), {"first": -1, "replicas": [["n1"]]}),
    (keys.tparts_key("t", UUID, 0), {"first": 0, "replicas": [[""]]}),
    (keys.tparts_key("t", UUID, 0), {"first": 0, "replicas": [["x" * 256]]}),
    (keys.tparts_key("t", UUID, 0), {"first": 0, "replicas": [[3]]}),
    ("tparts/t/" + UUID + "/01", {"first": 0, "replicas": [["n1"]]}),
    ("tparts/t/0/0", {"first": 0, "replicas": [["n1"]]}),
    (keys.lead_key("t", 0), {"0": 2 ** 64 - 1}),
    (keys.lead_key("t", 0), {"0": -1}),
    (keys.lead_key("t", 0), {"600": 1}),                          # partition outside the chunk
    (keys.lead_key("t", 0), {}),
    (keys.lead_key("t", 0), {"00": 1}),
    (keys.lead_key("t", 20), {"10240": 1}),                       # beyond MAX_PARTITIONS
    ("lead/t", {"0": 1}),                                        # the old unchunked key
    (keys.stats_key("t", 0), {"0": [0, 1]}),
    (keys.stats_key("t", 0), {"0": [0, 1, 2 ** 53]}),
    (keys.stats_key("t", 0), {"0": [0.5, 1, 1]}),
    (keys.recovering_key("t", 0), [3, 1]),
    (keys.recovering_key("t", 1), [3]),
    (keys.recovering_key("t", 0), []),
    (keys.MEMBER_KEY, {"address": "h:1", "text_port": 70_000, "store_id": "ab"}),
    (keys.MEMBER_KEY, {"address": "h:1", "store_id": "ab"}),
    (keys.offsets_key("g", "t", 0), {"g": "g", "t": "t", "o": {"0": [1, "", NOW_MS + 61_000]}}),
    (keys.offsets_key("g", "t", 0), {"g": "g", "t": "t", "o": {"32": [1, "", NOW_MS]}}),
    (keys.offsets_key("g", "t", 0), {"g": "h", "t": "t", "o": {}}),
    (keys.offsets_key("g", "t", 0), {"g": "g", "t": "t", "o": {"0": [-2, "", NOW_MS]}}),
    (keys.offsets_key("g", "t", 0), {"g": "g", "t": "t", "o": {"0": [1, "x" * 257, NOW_MS]}}),
    (keys.user_key("alice"), {"name": "bob", "public_key": KEY}),
    (keys.user_key("alice"), {"name": "alice", "public_key": KEY[:39]}),
    (keys.user_key("al ice"), {"name": "al ice", "public_key": KEY}),
    (keys.acl_key("xyz"), AclRule("alice", "allow", ("read",), "topic", "t").to_register()),
    (keys.acl_key(UUID), {**AclRule("alice", "allow", ("read",), "topic", "t").to_register(), "operations": []}),
    (keys.acl_key(UUID), {**AclRule("alice", "allow", ("read",), "topic", "t").to_register(),
                          "operations": ["read", "read"]}),
    (keys.acl_key(UUID), {**AclRule("alice", "allow", ("read",), "topic", "t").to_register(), "permission": "maybe"}),
    (keys.acl_key(UUID), {**AclRule("alice", "allow", ("read",), "topic", "t").to_register(), "name": ""}),
])
def test_careless_values_are_refused(key, value):
    bad(key, value)


def test_deep_or_odd_values_never_raise():
    nested: list = []
    for _ in range(10_000):
        nested = [nested]
    for key in (keys.topic_key("t"), keys.lead_key("t", 0), keys.MEMBER_KEY, keys.offsets_key("g", "t", 0)):
        for value in (nested, {1: 2}, {"0": nested}, b"bytes", 1.5, "s"):
            bad(key, value)
    assert validate_entry(3, {}, NOW_MS)   # not a string key


def test_elastic_registers():
    ok(keys.pconf_key("t", UUID, 3), {"v": 2, "t": 5, "voters": ["n1", "n4"], "learners": ["n2"], "committed": False})
    ok(keys.broker_key("n3"), {"state": "draining"})
    ok(keys.reassign_key("t", UUID, 0), {"replicas": ["n4", "n1"]})
    ok(keys.LOAD_KEY, {"bytes": 10, "replicas": 3, "leaders": 1})
    bad = [
        (keys.pconf_key("t", UUID, 3), {"v": 0, "t": 5, "voters": ["n1"], "learners": [], "committed": True}),
        (keys.pconf_key("t", UUID, 3), {"v": 1, "t": 5, "voters": ["n1"], "learners": ["n1"], "committed": True}),
        (keys.pconf_key("t", UUID, 3), {"v": 1, "t": 5, "voters": [], "learners": [], "committed": True}),
        (keys.pconf_key("t", "nothex", 3), {"v": 1, "t": 5, "voters": ["n1"], "learners": [], "committed": True}),
        (keys.broker_key("n3"), {"state": "gone"}),
        (keys.reassign_key("t", UUID, 0), {"replicas": ["n1", "n1"]}),
        (keys.LOAD_KEY, {"bytes": -1, "replicas": 3, "leaders": 1}),
    ]
    for key, value in bad:
        assert validate_entry(key, value, NOW_MS) is not None, (key, value)
