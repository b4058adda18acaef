"""mesh.node.lifecycle.directory: peer addresses follow gossip (the per-send lookup is cached by
the gossip version, never stale across a change)."""
import random

from mesh.cluster import keys, schema
from mesh.gossip import Gossip, GossipConfig
from mesh.node.lifecycle.directory import Directory


def _gossip(node_id, address, generation, seeds, now):
    g = Gossip(node_id, address, generation, seeds, random.Random(7), GossipConfig.lan(interval_ms=100), now,
               validate_entry=schema.validate_entry, register_prefixes=keys.REGISTER_PREFIXES)
    g.set_local(keys.MEMBER_KEY, {"address": address, "text_port": None, "store_id": "s-" + node_id})
    return g


def _pump(nodes, now, rounds=20):
    """Deliver every effect until quiet (addresses -> cores)."""
    for _ in range(rounds):
        queue = [(src, e) for src, g in nodes.items() for e in g.tick(now)]
        while queue:
            src, e = queue.pop(0)
            if e.dest in nodes:
                queue.extend((e.dest, x) for x in nodes[e.dest].receive(src, e.msg, now))
        now += 100
    return now


def test_address_of_follows_a_new_life_at_a_new_address():
    now = 1_000
    a = _gossip("a", "127.0.0.1:1", 1, [], now)
    b = _gossip("b", "127.0.0.1:2", 1, ["127.0.0.1:1"], now)
    d = Directory("a", "127.0.0.1:1", a, lambda: now, lambda pid: None)
    assert d.address_of("a") == "127.0.0.1:1" and d.address_of("b") is None
    now = _pump({"127.0.0.1:1": a, "127.0.0.1:2": b}, now)
    assert d.address_of("b") == "127.0.0.1:2"
    assert d.address_of("b") == "127.0.0.1:2"   # cached: same answer while gossip did not move
    b2 = _gossip("b", "127.0.0.1:3", 2, ["127.0.0.1:1"], now)   # b restarts elsewhere, newer generation
    now = _pump({"127.0.0.1:1": a, "127.0.0.1:3": b2}, now)
    assert d.address_of("b") == "127.0.0.1:3"
    assert d.node_at("127.0.0.1:3") == "b"


def test_node_at_follows_gossip_and_a_newcomer_never_takes_a_mapped_live_address():
    """A map rebuilt only on a miss gave a live broker's address to a forged row (which
    then died) for good: that broker's replication messages were taken for the forged
    node's. Rebuilt when gossip moves; a live broker mapped before keeps its address."""
    from mesh.gossip import GossipAck
    now = 1_000
    a = _gossip("a", "127.0.0.1:1", 1, [], now)
    b = _gossip("b", "127.0.0.1:2", 1, ["127.0.0.1:1"], now)
    d = Directory("a", "127.0.0.1:1", a, lambda: now, lambda pid: None)
    now = _pump({"127.0.0.1:1": a, "127.0.0.1:2": b}, now)
    assert d.node_at("127.0.0.1:2") == "b"
    # "zz" claims b's address, from itself (so it is taken for alive)
    a.receive("127.0.0.1:2", GossipAck("zz", [["zz", 1, 1, 0, 0, "127.0.0.1:2", False, 77]], [], [], [], 0), now)
    assert d.node_at("127.0.0.1:9") is None          # a miss rebuilds the map...
    assert d.node_at("127.0.0.1:2") == "b"           # ...and b, mapped before and alive, keeps it
    now = _pump({"127.0.0.1:1": a, "127.0.0.1:2": b}, now, rounds=200)   # zz goes silent, judged dead
    assert d.node_at("127.0.0.1:2") == "b"
