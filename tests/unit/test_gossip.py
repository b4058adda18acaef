"""mesh.gossip: the Scuttlebutt state machine, one rule at a time.

Each test drives nodes by hand through a tiny synchronous network (every message goes
through the real msgpack codec). Time is an int; nothing sleeps.
"""
from __future__ import annotations

import random
from collections import deque

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mesh.wire.effects import Send
from mesh.gossip import ALIVE, DEAD, LEFT, SUSPECT, Gossip, GossipAck, GossipAck2, GossipConfig, GossipSyn
from mesh.wire.codec import REGISTRY, decode_body, encode_body

CFG = GossipConfig(dead_after_ms=3_000, tombstone_gc_ms=30_000)


def make(node_id: str, seeds=(), gen: int = 1, cfg: GossipConfig = CFG, now: int = 0,
         snapshot=None) -> Gossip:
    # (a node made again later, as a rolled-back copy restarts, draws another life: now in the seed)
    return Gossip(node_id, f"addr-{node_id}", gen, list(seeds), random.Random(f"t/{node_id}/{gen}/{now or ''}"),
                  cfg, now, snapshot=snapshot)


def wire(msg):
    return decode_body(type(msg).OP, encode_body(msg))


class Net:
    """Synchronous delivery in FIFO order; ``cut`` drops messages touching those addresses."""

    def __init__(self, *nodes: Gossip) -> None:
        self.nodes = {n.address: n for n in nodes}
        self.now = 0
        self.cut: set[str] = set()
        self.sent: list[tuple[str, Send]] = []

    def add(self, n: Gossip) -> Gossip:
        self.nodes[n.address] = n
        return n

    def deliver(self, src: str, sends: list[Send]) -> None:
        q = deque((src, s) for s in sends)
        while q:
            src, s = q.popleft()
            self.sent.append((src, s))
            dst = self.nodes.get(s.dest)
            if dst is None or src in self.cut or s.dest in self.cut:
                continue
            for r in dst.receive(src, wire(s.msg), self.now):
                q.append((s.dest, r))

    def run(self, ms: int, step_ms: int = 50, paused: set[str] = frozenset()) -> None:
        end = self.now + ms
        while self.now < end:
            self.now += step_ms
            for addr, n in list(self.nodes.items()):
                if addr not in paused:
                    self.deliver(addr, n.tick(self.now))
            for n in self.nodes.values():
                n.check_invariants()


def pair(**kw):
    a = make("a", **kw)
    b = make("b", seeds=[a.address], **kw)
    net = Net(a, b)
    net.run(1_000)
    return a, b, net


# ---------------------------------------------------------------- messages -------------

def test_messages_are_registered_frozen_and_round_trip():
    for op, cls in ((b"GOSSIP_SYN", GossipSyn), (b"GOSSIP_ACK", GossipAck), (b"GOSSIP_ACK2", GossipAck2)):
        assert REGISTRY[op] is cls
        assert cls.__dataclass_params__.frozen and hasattr(cls, "__slots__")
    syn = GossipSyn("a", [["a", 1, 2, 3, 0, "addr-a", False, 0]], [], 0)
    assert wire(syn).digest == [["a", 1, 2, 3, 0, "addr-a", False, 0]]
    with pytest.raises(AttributeError):
        syn.node_id = "b"  # type: ignore[misc]


def test_config_is_validated():
    with pytest.raises(ValueError):
        GossipConfig(interval_ms=0)
    with pytest.raises(ValueError):
        GossipConfig(max_delta_bytes=10)
    with pytest.raises(ValueError):
        GossipConfig(seed_probe_prob=2.0)


def test_a_node_alone_probes_its_seed_with_backoff():
    n = make("x", seeds=["addr-seed"])
    probes = []
    for t in range(0, 20_000, 50):
        for s in n.tick(t):
            assert s.dest == "addr-seed" and isinstance(s.msg, GossipSyn)
            probes.append(t)
    assert n.isolated
    gaps = [b - a for a, b in zip(probes, probes[1:])]
    assert gaps == sorted(gaps) and gaps[-1] <= CFG.seed_retry_max_ms + CFG.interval_ms
    assert len(probes) < 20_000 // CFG.interval_ms // 3      # backed off, not every round


# ---------------------------------------------------------------- exchange ------------

def test_join_pulls_state_and_pushes_own_namespace():
    a = make("a")
    a.set_local("member", {"rack": "r1"})
    a.put_cluster("topic/orders", {"partitions": 3})
    b = make("b", seeds=[a.address])
    b.set_local("member", {"rack": "r2"})
    net = Net(a, b)
    net.run(1_000)
    assert b.node_items("a") == {"member": {"rack": "r1"}}
    assert a.node_items("b") == {"member": {"rack": "r2"}}
    assert b.cluster_items() == {"topic/orders": {"partitions": 3}}
    assert a.live_members(net.now) == b.live_members(net.now) == ["a", "b"]
    assert not a.isolated and not b.isolated


def test_push_pull_one_exchange_carries_both_directions():
    a, b, net = pair()
    a.set_local("x", 1)
    b.set_local("y", 2)
    syn = a._syn()
    (ack,) = b.receive(a.address, wire(syn), net.now)
    assert isinstance(ack.msg, GossipAck) and ack.dest == a.address
    assert [d[0] for d in ack.msg.deltas] == ["b"]            # what a lacks
    assert a.node_items("b") == {}
    (ack2,) = a.receive(b.address, wire(ack.msg), net.now)
    assert a.node_items("b") == {"y": 2}
    assert isinstance(ack2.msg, GossipAck2) and [d[0] for d in ack2.msg.deltas] == ["a"]
    assert b.receive(a.address, wire(ack2.msg), net.now) == []
    assert b.node_items("a") == {"x": 1}


def test_idle_exchange_is_just_a_digest():
    a, b, net = pair()
    net.run(400)
    # only heartbeats differ: the SYN is not answered, and it carries no deltas
    sends = a.tick(net.now + 1_000)
    assert len(sends) == 1
    assert b.receive(a.address, wire(sends[0].msg), net.now + 1_000) == []


def test_deltas_are_oldest_first_bounded_and_always_a_prefix():
    cfg = GossipConfig(max_delta_bytes=4_000)
    a = make("a", cfg=cfg)
    for i in range(200):
        a.set_local(f"k{i:03d}", "v" * 100)
    b = make("b", seeds=[a.address], cfg=cfg)
    net = Net(a, b)
    sizes = []
    for _ in range(200):
        net.run(50)
        sizes += [len(encode_body(s.msg)) for _, s in net.sent if isinstance(s.msg, (GossipAck, GossipAck2))]
        net.sent.clear()
        ver = b.digest_entry("a")
        if ver is not None:
            have = sorted(int(k[1:]) for k in b.node_items("a"))
            assert have == list(range(len(have)))              # a prefix, oldest first
        if len(b.node_items("a")) == 200:
            break
    assert len(b.node_items("a")) == 200
    assert max(sizes) <= 4_000 + 1_000                     # the bound plus headers and digest
    assert a.stats["truncated"] > 0


def test_entries_that_cannot_fit_one_message_are_refused():
    a = make("a", cfg=GossipConfig(max_delta_bytes=2_000))
    with pytest.raises(ValueError):
        a.set_local("big", "x" * 5_000)
    with pytest.raises(ValueError):
        a.put_cluster("big", "x" * 5_000)
    with pytest.raises(TypeError):
        a.set_local("obj", object())
    with pytest.raises(ValueError):
        a.set_local("", 1)


def test_version_moves_on_state_changes_not_on_heartbeats():
    a, b, net = pair()
    v = a.version
    net.run(2_000)
    assert a.version == v
    a.set_local("k", 1)
    assert a.version > v
    v = a.version
    a.set_local("k", 1)                                    # same value: no new version
    assert a.version == v and a.digest_entry("a")[2] == 1


# ---------------------------------------------------------------- identity ------------

def test_a_newer_generation_replaces_the_namespace():
    a, b, net = pair()
    a.set_local("old-only", 1)
    a.set_local("both", "old")
    net.run(1_000)
    assert b.node_items("a") == {"both": "old", "old-only": 1}
    a2 = make("a", gen=2, now=net.now, snapshot=a.snapshot())
    a2.set_local("both", "new")
    net.add(a2)
    net.run(1_000)
    assert b.digest_entry("a")[0] == 2
    assert b.node_items("a") == {"both": "new"}              # replaced, not merged


def test_generation_must_increase_on_restore():
    a, b, net = pair()
    with pytest.raises(ValueError):
        make("a", gen=1, snapshot=a.snapshot())
    with pytest.raises(ValueError):
        make("zz", gen=5, snapshot=a.snapshot())


def test_someone_else_claiming_our_id_at_a_higher_generation_is_counted_not_obeyed():
    a, b, net = pair()
    rogue = [["a", 9, 1, 0, 0, "addr-rogue", False, 0], ["b", 1, 1, 0, 0, "addr-b", False, 0]]
    a.receive("addr-rogue", GossipSyn("a", rogue, [], 0), net.now)
    assert a.stats["identity_conflicts"] == 1
    assert a.digest_entry("a")[0] == 1


# ---------------------------------------------------------------- tombstones ----------

def test_delete_spreads_as_a_tombstone():
    a, b, net = pair()
    a.set_local("k", 1)
    net.run(1_000)
    a.delete_local("k")
    net.run(1_000)
    assert b.node_items("a") == {}
    assert b.entry_version("a", "k")[2] is True


def test_a_peer_behind_the_gc_horizon_gets_a_reset_and_nothing_resurrects():
    a, b, net = pair()
    c = net.add(make("c", seeds=[a.address]))
    for i in range(6):
        a.set_local(f"k{i}", i)
    net.run(2_000)
    assert c.node_items("a") == {f"k{i}": i for i in range(6)}
    snap_c = c.snapshot()
    del net.nodes[c.address]                      # c goes away for longer than the horizon
    for i in range(0, 6, 2):
        a.delete_local(f"k{i}")
    net.run(CFG.tombstone_gc_ms * 2)
    assert a.digest_entry("a")[3] > 0                # gc version: tombstones collected
    assert b.entry_version("a", "k0") is None
    c2 = net.add(make("c", seeds=[a.address], gen=2, now=net.now, snapshot=snap_c))
    assert c2.node_items("a") == {f"k{i}": i for i in range(6)}   # stale, from its disk
    net.run(2_000)
    assert c2.node_items("a") == {"k1": 1, "k3": 3, "k5": 5}
    assert a.stats["resets_sent"] + b.stats["resets_sent"] >= 1
    assert c2.stats["resets_applied"] >= 1
    net.run(1_000)
    assert b.node_items("a") == {"k1": 1, "k3": 3, "k5": 5}  # and c2 did not re-infect b


# ---------------------------------------------------------------- cluster store -------

def test_cluster_registers_last_writer_wins_and_deletes_beat_older_writes():
    a, b, net = pair()
    a.put_cluster("topic/t", {"v": 1})
    net.run(20)
    net.now += 5
    b.tick(net.now)
    b.put_cluster("topic/t", {"v": 2})                      # later stamp
    net.run(1_000)
    assert a.cluster_items() == b.cluster_items() == {"topic/t": {"v": 2}}
    b.delete_cluster("topic/t")
    net.run(1_000)
    assert a.cluster_items() == {} and a.cluster_stamp("topic/t")[2] is True
    assert a.cluster_hash() == b.cluster_hash()


def test_a_deleted_register_offered_by_a_stale_peer_is_killed_not_stored():
    a, b, net = pair()
    a.put_cluster("topic/gone", {"v": 1})
    a.put_cluster("topic/kept", {"v": 1})
    net.run(1_000)
    stale = b.snapshot()
    del net.nodes[b.address]
    a.delete_cluster("topic/gone")
    net.run(CFG.tombstone_gc_ms * 2)
    assert a.cluster_stamp("topic/gone") is None            # tombstone collected
    b2 = net.add(make("b", seeds=[a.address], gen=2, now=net.now, snapshot=stale))
    assert "topic/gone" in b2.cluster_items()
    net.run(2_000)
    assert a.cluster_items() == b2.cluster_items() == {"topic/kept": {"v": 1}}
    assert a.cluster_stamp("topic/gone") is None            # never stored again
    assert a.stats["stale_cluster_killed"] >= 1 and b2.stats["stale_cluster_dropped"] >= 1


def test_cluster_items_prefix_and_sorting():
    a = make("a")
    for k in ("topic/b", "topic/a", "config/x"):
        a.put_cluster(k, k)
    assert list(a.cluster_items("topic/")) == ["topic/a", "topic/b"]


# ---------------------------------------------------------------- liveness ------------

def test_silence_leads_to_suspect_then_dead_and_a_heartbeat_revives():
    a, b, net = pair()
    net.run(3_000)
    t0 = net.now
    while a.status_of("b") == ALIVE:
        net.run(50, paused={b.address})
    t_suspect = net.now - t0
    assert a.live_members(net.now) == ["a"] and a.up_members(net.now) == ["a", "b"]   # a suspect still counts
    while a.status_of("b") == SUSPECT:
        net.run(50, paused={b.address})
    t_dead = net.now - t0
    assert a.status_of("b") == DEAD
    assert 2_000 <= t_suspect <= 10_000 and t_dead - t_suspect >= CFG.dead_after_ms
    assert a.live_members(net.now) == a.up_members(net.now) == ["a"]
    events = [(e.node_id, e.old, e.new) for e in a.take_events()]
    assert ("b", ALIVE, SUSPECT) in events and ("b", SUSPECT, DEAD) in events
    net.run(1_000)                                           # b's heartbeat moves again
    assert a.status_of("b") == ALIVE


def test_a_local_stall_does_not_convict_anyone():
    a, b, net = pair()
    net.run(3_000)
    net.now += 20_000                                        # a's loop did not run for 20 s
    net.deliver(a.address, a.tick(net.now))
    assert a.stats["stalls"] == 1
    assert a.status_of("b") == ALIVE
    net.run(1_000)
    assert a.status_of("b") == ALIVE


def test_dead_nodes_are_collected_and_stale_peers_cannot_bring_them_back():
    a, b, net = pair()
    c = net.add(make("c", seeds=[a.address]))
    net.run(2_000)
    stale_row = b._syn()                                     # b's view while c was alive
    del net.nodes[c.address]                                 # c crashes for good
    net.run(CFG.tombstone_gc_ms + 15_000)
    assert a.status_of("c") is None and b.status_of("c") is None   # collected: graveyard
    a.receive(b.address, wire(stale_row), net.now)                # a stale digest shows up
    assert a.status_of("c") is None
    assert "c" not in a.live_members(net.now)


def test_leave_is_seen_at_once_and_then_gossiped():
    nodes = [make("a")] + [make(x, seeds=["addr-a"]) for x in "bcdef"]
    net = Net(*nodes)
    net.run(3_000)
    a = nodes[0]
    sends = a.leave(net.now)
    assert 1 <= len(sends) <= CFG.leave_fanout and a.tick(net.now + 1_000) == []
    told = {s.dest for s in sends}
    net.deliver(a.address, sends)
    for n in nodes[1:]:
        if n.address in told:
            assert n.status_of("a") == LEFT
    del net.nodes[a.address]
    net.run(2_000)
    assert all(n.status_of("a") == LEFT for n in nodes[1:])
    assert all("a" not in n.live_members(net.now) for n in nodes[1:])


def test_members_report():
    a, b, net = pair()
    ms = {m.node_id: m for m in a.members(net.now)}
    assert set(ms) == {"a", "b"}
    assert ms["b"].address == "addr-b" and ms["b"].status == ALIVE and ms["b"].generation == 1
    assert ms["b"].last_heard_ms is not None and ms["b"].phi >= 0.0


# ---------------------------------------------------------------- persistence ---------

def test_snapshot_is_msgpack_data_and_restores_the_view():
    a, b, net = pair()
    a.set_local("k", [1, 2])
    a.put_cluster("topic/t", {"p": 1})
    a.put_cluster("topic/dead", 1)
    a.delete_cluster("topic/dead")
    net.run(1_000)
    snap = msgpack.unpackb(msgpack.packb(b.snapshot(), use_bin_type=True), raw=False, strict_map_key=False)
    b2 = make("b", gen=2, now=net.now, snapshot=snap)
    b2.check_invariants()
    assert b2.node_items("a") == {"k": [1, 2]}
    assert b2.cluster_items() == {"topic/t": {"p": 1}}
    assert b2.cluster_stamp("topic/dead")[2] is True
    assert b2.status_of("a") == SUSPECT                      # unconfirmed until it is heard
    assert b2.node_items("b") == {}                          # own namespace starts empty


# ---------------------------------------------------------------- robustness ----------

@pytest.mark.parametrize("msg", [
    GossipSyn("x", [["a", "not-an-int", 0, 0, 0, "addr", False, 0]], [], 0),
    GossipSyn("x", [["a", 1, 0]], [], 0),
    GossipSyn("x", ["a", 1, 0, 0, 0, "addr", False, 0], [], 0),
    GossipSyn("x", [["a", 1, 0, 0, 0, "addr", False, 0], ["a", 1, 0, 0, 0, "addr", False, 0]], [], 0),
    GossipSyn("x", [], [1, 2, 3], 0),
    GossipAck("x", [], [["a", 1, 0, 5, 0, False, ["k", 3, 1, False, "j", 2, 1, False]]], [], [], 0),
    GossipAck("x", [], [["a", 1, 0, 1, 0, False, ["k", 1, object(), False]]], [], [], 0),
    GossipAck("x", [], [], [], ["k", 1, "w", 1], 0),
    GossipAck2("x", [["a"]], []),
])
def test_malformed_messages_are_dropped_and_counted(msg):
    a, b, net = pair()
    v = a.version
    assert a.receive("addr-x", msg, net.now) == []
    assert a.stats["malformed"] == 1 and a.version == v
    a.check_invariants()


def test_unknown_messages_are_ignored():
    a = make("a")
    assert a.receive("addr-x", "hello", 0) == []
    assert a.stats["unknown_messages"] == 1


def test_known_nodes_are_bounded():
    cfg = GossipConfig(max_nodes=3)
    a = make("a", cfg=cfg)
    rows = []
    for i in range(10):
        rows.append([f"n{i}", 1, 1, 0, 0, f"addr-n{i}", False, 0])
    a.receive("addr-n0", GossipSyn("n0", rows, [], 0), 0)
    assert len(a.members(0)) == 3 and a.stats["nodes_refused"] == 8


def test_runs_are_deterministic():
    def trace():
        nodes = [make("a")] + [make(x, seeds=["addr-a"]) for x in "bcd"]
        nodes[1].set_local("k", 1)
        nodes[2].put_cluster("t", 2)
        net = Net(*nodes)
        net.run(3_000)
        return [(src, s.dest, encode_body(s.msg)) for src, s in net.sent]
    assert trace() == trace()


# ---------------------------------------------------------------- convergence ---------

ops = st.lists(st.tuples(st.sampled_from(["set", "del", "put", "cdel", "xchg", "drop"]),
                         st.integers(0, 2), st.integers(0, 2), st.integers(0, 3)),
               max_size=60)


@settings(max_examples=40, deadline=None)
@given(script=ops)
def test_any_interleaving_converges_once_the_network_is_reliable(script):
    """Random writes, deletes, lost and duplicated messages: after reliable rounds, all agree."""
    nodes = [make("a")] + [make(x, seeds=["addr-a"]) for x in "bc"]
    net = Net(*nodes)
    net.run(1_000)
    inflight: list[tuple[str, Send]] = []
    for op, i, j, k in script:
        n = nodes[i]
        if op == "set":
            n.set_local(f"k{k}", k * 10 + i)
        elif op == "del":
            n.delete_local(f"k{k}")
        elif op == "put":
            n.put_cluster(f"t{k}", i)
        elif op == "cdel":
            n.delete_cluster(f"t{k}")
        elif op == "xchg":                    # start a round; keep its messages in flight
            started = [(n.address, s) for s in n.tick(net.now)]
            inflight += started or [(n.address, Send(nodes[j].address, n._syn()))]
        elif inflight:                        # deliver (maybe twice) or drop one in flight
            src, s = inflight.pop(k % len(inflight))
            if op != "drop":
                for _ in range(1 + (k == 3)):
                    dst = net.nodes[s.dest]
                    inflight += [(s.dest, r) for r in dst.receive(src, wire(s.msg), net.now)]
        for x in nodes:
            x.check_invariants()
    net.run(3_000)
    views = {repr((n.cluster_items(), [n.node_items(o) for o in "abc"], n.cluster_hash())) for n in nodes}
    assert len(views) == 1


def test_a_row_for_us_from_another_life_of_our_generation_is_a_conflict():
    a, b, net = pair()
    mine = a.digest_entry("a")
    other_life = [["a", mine[0], mine[1] + 50, mine[2] + 5, 0, "addr-a", False, 0]]
    a.receive("addr-b", GossipAck("b", other_life, [], [], [], 0), net.now)
    assert a.identity_conflict == mine[0] and a.stats["identity_conflicts"] == 1
    assert a.heard_peer


def test_a_forged_huge_generation_for_us_is_refused_not_adopted():
    """A row claiming a life of ours at generation 2**62 cannot make the node reincarnate
    there (it would persist it and never come back below it): the message is refused whole,
    and a row that got in anyway (below the parsing bound) is never adopted as ours."""
    a, b, net = pair()
    net.run(1_000)
    a.receive("addr-b", GossipAck("b", [["a", 2 ** 62, 1, 0, 0, "addr-a", False, 0]], [], [], [], 0), net.now)
    assert a.identity_conflict == 0 and a.stats["malformed_bounds"] == 1
    a._members._conflict(a._members.rows["a"]._replace(generation=2 ** 48))
    assert a.identity_conflict == 0 and a.stats["identity_conflicts_refused"] == 1


def test_a_generation_far_ahead_of_what_is_known_is_refused():
    """Inside the parsing bound but 2**48-1: a node that took it as its own would move to
    2**48, which every peer refuses (cut off for good), and peers that took it for the node
    would ignore its real rows for good. A generation moves by one per start."""
    a, b, net = pair()
    net.run(1_000)
    gen_a, gen_b = a.digest_entry("a")[0], a.digest_entry("b")[0]
    far = [["a", 2 ** 48 - 1, 1, 0, 0, "addr-a", False, 12345], ["b", 2 ** 48 - 1, 1, 0, 0, "addr-b", False, 1]]
    a.receive("addr-b", GossipAck("b", far, [], [], [], 0), net.now)
    assert a.identity_conflict == 0 and a.stats["identity_conflicts_refused"] == 1
    assert a.digest_entry("b")[0] == gen_b and a.stats["generation_jumps_refused"] == 1
    near = [["a", gen_a + 3, 1, 0, 0, "addr-a", False, 12345]]   # a store rolled back a few lives: a conflict
    a.receive("addr-b", GossipAck("b", near, [], [], [], 0), net.now)
    assert a.identity_conflict == gen_a + 3


def test_reincarnate_moves_to_a_new_generation_and_peers_follow():
    a, b, net = pair()
    a.set_local("k", 1)
    a.set_local("gone", 2)
    a.delete_local("gone")
    net.run(1_000)
    a.receive("addr-b", GossipAck("b", [["a", 7, 1, 0, 0, "addr-a", False, 0]], [], [], [], 0), net.now)
    assert a.identity_conflict == 7
    with pytest.raises(ValueError):
        a.reincarnate(1, net.now)
    a.reincarnate(8, net.now)
    assert a.identity_conflict == 0 and a.generation == 8
    assert a.node_items("a") == {"k": 1}
    net.run(2_000)
    assert b.digest_entry("a")[0] == 8 and b.node_items("a") == {"k": 1}
    a.check_invariants()
    b.check_invariants()


@pytest.mark.parametrize("first_life_ms", [0, 2_000])
def test_a_second_life_of_the_same_generation_sees_the_first_one(first_life_ms):
    """A store rolled back by one life restarts with a generation the cluster already saw:
    held at heartbeat 0 until a peer is heard, it sees the peers' row from the other life,
    however short that one was once a peer had shown it holds it (``seen_by_peer``)."""
    a = make("a", gen=2)
    b = make("b", seeds=[a.address])
    a.hold_heartbeat = True
    net = Net(a, b)
    while not a.seen_by_peer:
        net.run(50)
    net.run(first_life_ms)
    assert b.digest_entry("a")[1] > 0 and a.identity_conflict == 0
    a2 = make("a", gen=2, now=net.now)             # the same generation again (a rolled-back copy)
    a2.hold_heartbeat = True
    net.add(a2)
    net.run(1_000)
    assert a2.identity_conflict == 2 and a2.heard_peer


def test_a_restarted_node_is_confirmed_by_the_answers_to_its_own_first_two_rounds():
    """A new life (heartbeat held at 0) needs a peer's view of itself twice: to beat, then to
    be confirmed (``seen_by_peer``). A peer answers a young life's SYN with its row as it
    now holds it, so the node's own rounds suffice: it does not wait for a peer to pick it
    as a target (here the peer never starts a round)."""
    a = make("a", gen=1)
    b = make("b", seeds=[a.address])
    net = Net(a, b)
    net.run(1_000)
    a2 = make("a", seeds=[b.address], gen=2, now=net.now)      # a restart: the next generation
    a2.hold_heartbeat = True
    net.add(a2)
    rounds, started = 0, []
    while not a2.seen_by_peer and rounds < 5:
        while not (sends := a2.tick(net.now)):
            net.now += 10
        rounds += 1
        started.append(net.now)
        q = deque((a2.address, s) for s in sends)
        while q:                                                # only this exchange: SYN, ACK, ACK2
            src, snd = q.popleft()
            for r in net.nodes[snd.dest].receive(src, wire(snd.msg), net.now):
                q.append((snd.dest, r))
    assert a2.seen_by_peer and a2.identity_conflict == 0 and rounds == 2
    assert started[1] == started[0]   # the second round at once, as the first beat was released


def test_a_syn_whose_senders_row_we_hold_ahead_is_answered_with_it():
    """A peer holding another life of the sender (same generation, a higher heartbeat: a
    rolled-back disk) answers at once with that row, however small the difference, so the
    sender sees the conflict before it could be confirmed."""
    b, net = _first_life(3)
    held = b.digest_entry("a")
    digest = [list(r) for r in b._syn().digest]
    for r in digest:
        if r[0] == "a":
            r[2] = 1                                   # the sender's row: its heartbeat 1
    out = b.receive("addr-a", wire(GossipSyn("a", digest, [], 0)), net.now)
    acks = [s.msg for s in out if type(s.msg) is GossipAck]
    assert acks and any(r[0] == "a" and r[2] == held[1] for r in acks[0].digest)


def test_a_late_ack_with_an_earlier_lifes_row_is_no_view_of_this_life():
    """An ACK to a SYN of the previous life may arrive after a restart, carrying that life's
    row (peers echo a young life's row): it is not a view of this life, so the held
    heartbeat stays 0 until one is."""
    a2 = make("a", gen=2)
    a2.hold_heartbeat = True
    a2.receive("addr-b", wire(GossipAck("b", [["a", 1, 1, 0, 0, "addr-a", False, 0]], [], [], [], 0)), 0)
    assert not a2.heard_peer and a2.digest_entry("a")[1] == 0 and not a2.seen_by_peer


def _first_life(min_hb: int):
    """Node a, generation 2, held at heartbeat 0 until heard (as the broker runs it), lives
    until peer b holds a row for it with a heartbeat >= ``min_hb``; then it dies."""
    a = make("a", gen=2)
    a.set_local("member", 1)
    a.hold_heartbeat = True
    b = make("b", seeds=[a.address])
    net = Net(a, b)
    while b.digest_entry("a") is None or b.digest_entry("a")[1] < min_hb or b.digest_entry("a")[2] < 1:
        net.run(10, step_ms=10)
    del net.nodes[a.address]
    return b, net


@pytest.mark.parametrize("min_hb", [1, 2, 3, 6])
@pytest.mark.parametrize("order", ["syn_first", "ack_first", "stale_ack_first"])
def test_a_restart_reusing_a_seen_generation_is_a_conflict_before_any_confirm(min_hb, order):
    """Issue 17: a copy of the data directory restarts with the generation (and store) of
    the life the peers last saw, however short that life was (peer heartbeat 1, 2, ...),
    whatever reaches it first: the peer's SYN (full digest), the ACK to its own SYN, or a
    stale ACK without a row for it (then its row comes later). It must see the conflict
    before it could ever confirm itself (``seen_by_peer``: it would vote on forgotten state)."""
    b, net = _first_life(min_hb)
    held = b.digest_entry("a")[1]
    assert held >= min_hb
    a2 = make("a", seeds=[b.address], gen=2, now=net.now)      # the rolled-back copy: generation 2 again
    a2.set_local("member", 1)
    a2.hold_heartbeat = True
    net.add(a2)
    wrong = []

    def deliver(src, sends):
        q = deque((src, s) for s in sends)
        while q:
            src, s = q.popleft()
            dst = net.nodes[s.dest]
            for r in dst.receive(src, wire(s.msg), net.now):
                q.append((s.dest, r))
            if a2.seen_by_peer and not a2.identity_conflict:
                wrong.append((type(s.msg).__name__, a2.digest_entry("a")[1], b.digest_entry("a")[1]))

    if order == "syn_first":
        deliver(b.address, [Send(a2.address, b._syn())])
    elif order == "ack_first":
        while not (sends := a2.tick(net.now)):
            net.now += 10
        deliver(a2.address, sends)
    else:   # an ACK b sent to the first life, delivered late: no row for a in it
        row_b = list(b._syn().digest[[r[0] for r in b._syn().digest].index("b")])
        deliver(b.address, [Send(a2.address, GossipAck("b", [row_b], [], [], [], 0))])
    for _ in range(200):                                        # then 2 s of ordinary gossip
        net.now += 10
        for n in list(net.nodes.values()):
            deliver(n.address, n.tick(net.now))
        assert not wrong, f"confirmed without seeing the other life (held hb {held}): {wrong}"
    assert a2.identity_conflict == 2 and a2.stats["identity_conflicts"] >= 1


# -- lives (Row.life): majority confirmation, deltas, liveness -----------------------

def _restart_with_one_peer_cut(wait_ms):
    a, b, c = make("a"), make("b", seeds=["addr-a"]), make("c", seeds=["addr-a"])
    net = Net(a, b, c)
    net.run(1_000)
    del net.nodes["addr-a"]
    a2 = net.add(make("a", seeds=["addr-b"], gen=2, now=net.now))
    a2.hold_heartbeat = True
    net.cut.add("addr-c")                        # c down or cut off: b alone is no majority of {b, c}
    t0 = net.now
    net.run(wait_ms, step_ms=10)
    return a2, net, t0


def test_one_peer_of_two_is_no_majority_until_confirm_wait():
    """A new life is confirmed by a majority of the other members holding it (a peer keeps
    the first life it saw, so that majority meets any majority that held another life);
    with one of two peers cut off, one view suffices only after ``confirm_wait_ms``."""
    a2, net, t0 = _restart_with_one_peer_cut(CFG.confirm_wait_ms - 200)
    assert a2._members.confirmed_by == {"b"} and not a2.seen_by_peer      # majority rule
    net.run(600, step_ms=10)
    assert a2.seen_by_peer and a2.identity_conflict == 0                   # fallback


def test_deltas_do_not_cross_lives():
    """b holds a's first life; c adopted the copy's (same generation): c never sends b the
    copy's keys as if they were the first life's."""
    a = make("a", gen=2); a.set_local("k", "first life")
    b = make("b", seeds=["addr-a"])
    net = Net(a, b); net.run(1_000)
    assert b.entry_version("a", "k") is not None
    del net.nodes["addr-a"]
    c = net.add(make("c"))                       # never saw the first life
    a2 = net.add(make("a", gen=2, now=net.now)); a2.set_local("k", "copy"); a2.set_local("k2", "copy")
    net.deliver("addr-a", [Send("addr-c", a2._syn())])
    net.deliver("addr-c", [Send("addr-a", c._syn())])
    del net.nodes["addr-a"]
    assert c.entry_version("a", "k2") is not None
    net.deliver("addr-b", [Send("addr-c", b._syn())])
    net.deliver("addr-c", [Send("addr-b", c._syn())])
    assert b.entry_version("a", "k2") is None, "the copy's keys went into the first life's namespace at b"


def test_a_message_from_another_life_does_not_revive_a_suspect_row():
    """A row learned second-hand stays SUSPECT until its own life speaks: a message from
    another life of the same generation does not vouch for it."""
    a = make("a", gen=2); b = make("b", seeds=["addr-a"])
    net = Net(a, b); net.run(1_000)
    c = make("c")
    net.add(c)
    net.deliver("addr-b", [Send("addr-c", b._syn())])   # c learns a second-hand: SUSPECT
    assert {m.node_id: m.status for m in c.members(net.now)}["a"] == SUSPECT
    del net.nodes["addr-a"]
    a2 = net.add(make("a", gen=2, now=net.now))
    net.deliver("addr-a", [Send("addr-c", a2._syn())])
    assert {m.node_id: m.status for m in c.members(net.now)}["a"] == SUSPECT
