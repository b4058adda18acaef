"""mesh.gossip input checks (R8, ``mesh.gossip.checks``): every message and every snapshot
entry is checked before anything is applied or persisted; one test per check.

Nodes are driven by hand through the tiny synchronous network of ``test_gossip`` (every
message through the real msgpack codec). Time is an int; nothing sleeps.
"""
from __future__ import annotations

import random

import msgpack
import pytest

from mesh.gossip import Gossip, GossipAck, GossipAck2, GossipConfig, GossipSyn
from mesh.gossip.rows import MAX_COUNTER, MAX_GENERATION
from tests.unit.test_gossip import Net, wire

T0 = 1_700_000_000_000                    # wall-clock ms: stamps are comparable to it
SKEW = 60_000
CFG = GossipConfig(dead_after_ms=3_000, tombstone_gc_ms=3_600_000, max_clock_skew_ms=SKEW)
REGISTERS = ("topic/", "user/")


def validate(key, value, now_ms):
    """A small schema: topics need a 16-hex uuid; node keys are "k..." ints; nothing else."""
    if key.startswith("topic/"):
        uuid = value.get("uuid") if isinstance(value, dict) else None
        if not (isinstance(uuid, str) and len(uuid) == 16 and all(c in "0123456789abcdef" for c in uuid)):
            return "uuid is not 16 hex characters"
        return None
    if key.startswith("user/"):
        raise RuntimeError("validator bug")
    if key.startswith("k"):
        return None if type(value) is int else "not an int"
    return "unknown key"


def node(node_id, seeds=(), gen=1, now=T0, snapshot=None, checked=True):
    extra = dict(validate_entry=validate, register_prefixes=REGISTERS) if checked else {}
    return Gossip(node_id, f"addr-{node_id}", gen, list(seeds), random.Random(node_id),
                  CFG, now, snapshot=snapshot, **extra)


def pair(checked=True):
    a = node("a", checked=checked)
    b = node("b", seeds=[a.address], checked=checked)
    net = Net(a, b)
    net.now = T0
    net.run(1_000)
    return a, b, net


TOPIC = {"uuid": "0123456789abcdef"}


def refused(g: Gossip, msg, kind: str, now: int) -> str:
    v, n = g.version, g.stats[f"malformed_{kind}"]
    assert g.receive("addr-b", wire(msg), now) == []
    assert g.stats[f"malformed_{kind}"] == n + 1 and g.version == v, g.take_refused()
    why = g.take_refused()
    assert why and g.take_refused() is None
    g.check_invariants()
    return why


# ---------------------------------------------------------------- stamps --------------

def test_a_register_stamped_in_the_future_is_refused_whole_and_the_topic_survives():
    """The issue's attack: an ACK2 deleting a topic with stamp 2**62 (and 2**64-1)."""
    a, b, net = pair()
    a.put_cluster("topic/orders", TOPIC)
    net.run(1_000)
    for stamp in (2 ** 64 - 1, 2 ** 62, 2 ** 53 - 1, net.now + SKEW + 1):
        msg = GossipAck2("b", [], ["topic/orders", stamp, "ghost", None, True, "topic/x", 1, "b", TOPIC, False])
        why = refused(a, msg, "stamp", net.now)
        assert "later than now" in why
    assert a.cluster_items() == {"topic/orders": TOPIC}


def test_a_stamp_within_the_skew_is_taken_and_old_lamport_stamps_are_simply_older():
    a, b, net = pair()
    a.receive("addr-b", wire(GossipAck2("b", [], ["topic/old", 7, "b", TOPIC, False])), net.now)
    assert a.cluster_stamp("topic/old") == (7, "b", False)            # an old snapshot's stamp
    a.put_cluster("topic/old", {"uuid": "fedcba9876543210"})
    clock = a.cluster_stamp("topic/old")[0]
    assert net.now <= clock <= net.now + 10                           # hybrid: about wall-clock ms
    ahead = net.now + SKEW - 1
    a.receive("addr-b", wire(GossipAck2("b", [], ["topic/new", ahead, "b", TOPIC, False])), net.now)
    assert a.cluster_stamp("topic/new") == (ahead, "b", False)


def test_a_gc_clock_in_the_future_is_refused():
    a, b, net = pair()
    syn = b._syn()
    forged = GossipSyn("b", syn.digest, syn.cluster, 2 ** 62)
    refused(a, forged, "stamp", net.now)
    assert a._registers.gc_clock < net.now


def test_a_kill_of_a_stamp_younger_than_the_tombstone_horizon_is_refused():
    a, b, net = pair()
    a.put_cluster("topic/orders", TOPIC)
    clock, writer, _ = a.cluster_stamp("topic/orders")
    a.receive("addr-b", wire(GossipAck("b", [], [], [], ["topic/orders", clock, writer, None, True], 0)), net.now)
    assert a.cluster_items() == {"topic/orders": TOPIC} and a.stats["kills_refused"] == 1


# ---------------------------------------------------------------- bounds --------------

@pytest.mark.parametrize("row", [
    ["x", MAX_GENERATION, 1, 0, 0, "addr-x", False, 0],
    ["x", 2 ** 62, 1, 0, 0, "127.0.0.1:9", False, 0],
    ["x", 1, MAX_COUNTER + 1, 0, 0, "addr-x", False, 0],
    ["x", 1, 2 ** 48, 0, 0, "addr-x", False, 0],   # a heartbeat no life reaches (a forged view of a real node)
    ["x", 1, 1, 2 ** 60, 0, "addr-x", False, 0],
    ["x", 1, 1, 0, -1, "addr-x", False, 0],
    ["", 1, 1, 0, 0, "addr-x", False, 0],
    ["x", 1, 1, 0, 0, "a" * 256, False, 0],
])
def test_membership_rows_out_of_bounds_are_refused(row):
    a, b, net = pair()
    refused(a, GossipAck("b", [row], [], [], [], 0), "bounds", net.now)
    assert a.status_of("x") is None


def test_a_forged_generation_for_real_nodes_is_refused_everywhere():
    """The issue's attack: rows for two real brokers at generation 2**62, dead address."""
    a, b, net = pair()
    net.add(node("c", seeds=[a.address]))
    net.run(2_000)
    forged = [["b", 2 ** 62, 1, 0, 0, "127.0.0.1:9", False, 0], ["c", 2 ** 62, 1, 0, 0, "127.0.0.1:9", False, 0]]
    refused(a, GossipSyn("b", forged + [["b", *a.digest_entry("b")]], [], 0), "bounds", net.now)
    net.run(3_000)
    assert a.live_members(net.now) == ["a", "b", "c"] and a.digest_entry("b")[0] == 1


@pytest.mark.parametrize("delta", [
    ["b", MAX_GENERATION, 0, 1, 0, False, ["k1", 1, 1, False]],
    ["b", 1, 0, MAX_COUNTER + 1, 0, False, []],
    ["b", 1, 0, 1, MAX_COUNTER + 1, False, []],
    ["", 1, 0, 1, 0, False, []],
    ["b", 1, 0, 1, 0, False, ["", 1, 1, False]],
])
def test_deltas_out_of_bounds_are_refused(delta):
    a, b, net = pair()
    refused(a, GossipAck2("b", [delta], []), "bounds", net.now)


def test_bucket_hashes_beyond_32_bits_are_refused():
    a, b, net = pair()
    syn = b._syn()
    refused(a, GossipSyn("b", syn.digest, [2 ** 40] * 16, 0), "bounds", net.now)


# ---------------------------------------------------------------- entries -------------

def test_a_value_the_validator_refuses_drops_the_whole_message_and_is_never_persisted():
    """The issue's case: a topic whose uuid is not hex (it used to kill the broker for good)."""
    a, b, net = pair()
    msg = GossipAck2("b", [], ["topic/fine", net.now, "b", TOPIC, False,
                               "topic/bad", net.now, "b", {"uuid": "not-hex-at-all!!"}, False])
    assert "uuid is not 16 hex" in refused(a, msg, "entry", net.now)
    assert a.cluster_items() == {}                                   # not even the good one
    assert "topic/" not in repr(a.snapshot()["cluster"])


def test_a_validator_that_raises_is_a_refusal():
    a, b, net = pair()
    why = refused(a, GossipAck2("b", [], ["user/x", net.now, "b", {"name": "x"}, False]), "entry", net.now)
    assert "validator failed" in why


def test_key_namespaces_registers_only_under_their_prefixes_and_node_keys_outside_them():
    a, b, net = pair()
    b.set_local("k1", 5)
    net.run(1_000)
    mv = b.digest_entry("b")[2]
    refused(a, GossipAck2("b", [["b", 1, mv, mv + 1, 0, False, ["topic/orders", mv + 1, TOPIC, False]]], []),
            "entry", net.now)
    refused(a, GossipAck2("b", [], ["k1", net.now, "b", 1, False]), "entry", net.now)
    refused(a, GossipAck2("b", [["b", 1, mv, mv + 1, 0, False, ["k2", mv + 1, "str", False]]], []),
            "entry", net.now)
    assert a.node_items("b") == {"k1": 5}


def test_a_tombstone_carrying_a_value_is_refused():
    a, b, net = pair()
    refused(a, GossipAck2("b", [], ["topic/orders", net.now, "b", TOPIC, True]), "entry", net.now)


def test_own_writes_that_peers_would_refuse_raise_at_once():
    a, b, net = pair()
    with pytest.raises(ValueError, match="uuid"):
        a.put_cluster("topic/t", {"uuid": "xyz"})
    with pytest.raises(ValueError, match="not a cluster register key"):
        a.put_cluster("k1", 1)
    with pytest.raises(ValueError, match="cluster register key"):
        a.set_local("topic/t", TOPIC)
    a.set_local("k1", 1)
    a.put_cluster("topic/t", TOPIC)
    a.delete_cluster("topic/t")                                    # tombstones need no value


def test_without_a_validator_only_shapes_bounds_and_stamps_are_checked():
    a, b, net = pair(checked=False)
    a.receive("addr-b", wire(GossipAck2("b", [], ["anything", net.now, "b", {"x": 1}, False])), net.now)
    assert a.cluster_items() == {"anything": {"x": 1}}
    refused(a, GossipAck2("b", [], ["other", 2 ** 62, "b", 1, False]), "stamp", net.now)


# ---------------------------------------------------------------- hello ---------------

def test_a_hello_without_the_senders_own_row_gets_nothing():
    """The issue's case: a SYN with an empty member list was answered with the whole state."""
    a, b, net = pair()
    a.put_cluster("topic/orders", TOPIC)
    refused(a, GossipSyn("x", [], [], 0), "hello", net.now)
    refused(a, GossipSyn("x", [["y", 1, 0, 0, 0, "addr-b", False, 0]], [], 0), "hello", net.now)
    # its own row, but another address than the one it came from
    refused(a, GossipSyn("x", [["x", 1, 0, 0, 0, "elsewhere", False, 0]], [], 0), "hello", net.now)
    # a joining node presents itself: it gets what a joiner needs
    out = a.receive("addr-x", wire(GossipSyn("x", [["x", 1, 0, 0, 0, "addr-x", False, 0]], [], 0)), net.now)
    assert len(out) == 1 and type(out[0].msg) is GossipAck


# ---------------------------------------------------------------- snapshots -----------

def _snapshot_of(b: Gossip) -> dict:
    return msgpack.unpackb(msgpack.packb(b.snapshot(), use_bin_type=True), raw=False, strict_map_key=False)


def test_bad_snapshot_entries_are_dropped_with_a_warning_and_relearned_from_peers():
    a, b, net = pair()
    a.set_local("k1", 1)
    a.set_local("k2", 2)
    a.put_cluster("topic/good", TOPIC)
    net.run(1_000)
    snap = _snapshot_of(b)
    c = snap["cluster"]
    c += ["topic/bad", 5, "a", {"uuid": "zz"}, False, net.now,          # non-hex uuid
          "topic/future", 2 ** 62, "a", TOPIC, False, net.now,           # stamp 2**62
          "k9", 5, "a", 1, False, net.now]                               # a node key as a register
    snap["clock"] = 2 ** 62
    snap["cluster_gc"] = 2 ** 62
    nodes = snap["nodes"]
    a_row = next(n for n in nodes if n[0] == "a")
    a_row[9][2] = "not an int"                                           # k1's value in a's namespace
    nodes.append(["ghost", 2 ** 62, 1, 0, 0, "127.0.0.1:9", False, "alive", 0, []])
    nodes.append(["short"])
    snap["graveyard"].append(["dead", 2 ** 62, 0, 0])
    b2 = node("b", gen=2, now=net.now, snapshot=snap)
    b2.check_invariants()
    assert len(b2.load_warnings) == 9 and b2.stats["snapshot_dropped"] == 9
    assert b2.cluster_items() == {"topic/good": TOPIC}
    assert b2.digest_entry("ghost") is None and b2.node_items("a") == {}
    assert b2.digest_entry("a")[2] == 0                                  # versions back to 0: relearn
    b2.put_cluster("topic/mine", TOPIC)
    assert b2.cluster_stamp("topic/mine")[0] <= net.now + 10             # the stored clock was ignored
    net.nodes[b2.address] = b2
    net.run(2_000)
    assert b2.node_items("a") == {"k1": 1, "k2": 2}
    b2.check_invariants()


def test_snapshot_rows_keep_their_life_and_older_snapshots_load_with_life_0():
    a, b, net = pair()
    life = b.digest_entry("a")[6]
    snap = _snapshot_of(b)
    assert life and node("b", gen=2, now=net.now, snapshot=snap).digest_entry("a")[6] == life
    old = _snapshot_of(b)
    for n in old["nodes"]:
        del n[10:]                                                       # as written before lives
    assert node("b", gen=2, now=net.now, snapshot=old).digest_entry("a")[6] == 0
    bad = _snapshot_of(b)
    next(n for n in bad["nodes"] if n[0] == "a")[10] = 2 ** 32           # a life out of range
    b2 = node("b", gen=2, now=net.now, snapshot=bad)
    assert b2.digest_entry("a") is None and any("life" in w for w in b2.load_warnings)


def test_a_snapshot_of_another_node_or_not_older_is_still_refused():
    a, b, net = pair()
    snap = _snapshot_of(b)
    from mesh.gossip.snapshot import ForeignSnapshot
    with pytest.raises(ValueError):
        node("b", gen=1, now=net.now, snapshot=snap)
    with pytest.raises(ForeignSnapshot):   # its own type: the way out is --rejoin-empty, not --reset-gossip
        node("c", gen=2, now=net.now, snapshot=snap)
    with pytest.raises(ValueError) as info:
        node("b", gen=2, now=net.now, snapshot=dict(snap, format=-1))
    assert not isinstance(info.value, ForeignSnapshot)
