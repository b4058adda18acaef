"""One wrong clock (issue 38, DESIGN.md section 11): the offset estimate
(``mesh.gossip.clock_offset``, ``mesh.node.peers.peer_clock``), and gossip judged by the peers'
time: a broker whose clock is a day behind refuses nothing its peers consider live, keeps
its snapshot's registers, and drops no local partition for want of them."""
from __future__ import annotations

import dataclasses
import logging
import random
from collections import deque

import msgpack

from mesh.cluster import keys
from mesh.cluster.catalog import Catalog, topic_registers
from mesh.gossip import Gossip, GossipAck, GossipConfig, GossipSyn
from mesh.gossip.clock_offset import AGREES, ALONE, OFF, UNKNOWN, ClockOffsets
from mesh.node.peers.peer_clock import PeerClock
from storage.memory import MemoryStore
from tests.unit.test_catalog import UUID_A, Registers, topic
from tests.unit.test_gossip import wire

T0 = 1_790_000_000_000
DAY_MS = 86_400_000
HOUR_MS = 3_600_000


# -- the estimate (pure) ----------------------------------------------------------------
def test_the_offset_is_the_median_of_fresh_samples_and_says_whose_clock_is_off():
    c = ClockOffsets(bound_ms=30_000, max_age_ms=60_000)
    assert c.state(0, alone=True) == ALONE and c.trusted(0, alone=True)
    assert c.state(0, alone=False) == UNKNOWN and not c.trusted(0, alone=False)   # peers, none heard yet
    me = T0 + 2 * HOUR_MS                       # this clock is two hours ahead of four peers
    for i, (peer, lag) in enumerate((("a", 3), ("b", -2), ("d", 1), ("c", 400_000_000))):
        ours_at_receive = me + i
        theirs = T0 + i + lag if peer != "c" else T0 + lag   # c: a wrong clock of its own
        assert c.observe(peer, theirs, ours_at_receive, mono_ms=1_000, rtt_ms=4)
    est = c.estimate_ms(1_000)
    assert abs(est + 2 * HOUR_MS) <= 10         # the median ignores c (and our own clock)
    assert c.state(1_000, alone=False) == OFF and not c.trusted(1_000, alone=False)
    assert abs(c.correction_ms(1_000) - est) == 0
    assert c.peers(1_000) == 4 and c.sample_ms("c", 1_000) > 0
    # samples age out: with none fresh, the state is unknown again (not trusted)
    assert c.estimate_ms(1_000 + 60_001) is None and c.state(61_001, alone=False) == UNKNOWN


def test_one_wrong_clock_of_three_is_found_by_itself_and_by_nobody_else():
    good, bad = ClockOffsets(), ClockOffsets()
    good.observe("right", T0 + 1, T0, 0)
    good.observe("bad", T0 + 2 * HOUR_MS, T0, 0)
    assert good.estimate_ms(0) == 1 and good.trusted(0, alone=False)
    bad.observe("right", T0, T0 + 2 * HOUR_MS, 0)
    bad.observe("right2", T0 + 1, T0 + 2 * HOUR_MS, 0)
    assert bad.estimate_ms(0) == -2 * HOUR_MS + 1 and not bad.trusted(0, alone=False)
    two = ClockOffsets()                          # two brokers that disagree: neither is trusted
    two.observe("other", T0 + 2 * HOUR_MS, T0, 0)
    assert two.estimate_ms(0) == HOUR_MS and not two.trusted(0, alone=False)


def test_within_the_bound_the_clock_agrees_and_nothing_is_corrected():
    c = ClockOffsets(bound_ms=30_000)
    c.observe("a", T0 + 29_000, T0, 5)
    c.observe("b", T0 + 20_000, T0, 5)
    c.observe("e", T0 + 25_000, T0, 5)
    assert c.state(5, alone=False) == AGREES and c.trusted(5, alone=False) and c.correction_ms(5) == 0


def test_junk_stamps_are_ignored_and_the_table_is_bounded():
    c = ClockOffsets(max_peers=4)
    for bad in (0, -1, 1 << 53, "1", 1.5, True, None):
        assert not c.observe("x", bad, T0, 0)
    assert c.estimate_ms(0) is None
    c.observe("p", T0, T0, 0, rtt_ms=10**9)      # an absurd round trip counts as none
    assert c.sample_ms("p", 0) == 0
    for i in range(10):
        c.observe(f"n{i}", T0, T0, i)
    assert len(c._samples) == 4 and c.sample_ms("n9", 9) == 0


def test_state_changes_are_reported_once():
    c = ClockOffsets()
    assert c.update(0, alone=False) == (None, UNKNOWN)
    assert c.update(1, alone=False) is None
    c.observe("a", T0 + DAY_MS, T0, 2)
    assert c.update(2, alone=False) == (UNKNOWN, OFF)
    assert c.update(3, alone=False) is None
    c.observe("a", T0, T0, 4)
    assert c.update(4, alone=False) == (OFF, AGREES)


# -- the shell: stamps out, samples in, one log line per change ----------------------------
class FakeClock:
    def __init__(self, wall_ms: int, mono_ms: int = 10_000):
        self.wall, self.mono = wall_ms, mono_ms

    def wall_ms(self) -> int:
        return self.wall

    def now_ms(self) -> int:
        return self.mono


def test_peer_clock_stamps_gossip_takes_samples_and_logs_once_per_state_change(caplog):
    fast = FakeClock(T0 + 2 * HOUR_MS)          # this broker: two hours ahead
    right = FakeClock(T0)
    pc = PeerClock(fast, bound_ms=30_000, alone=lambda: False)
    peer = PeerClock(right, alone=lambda: False)
    syn = pc.stamp("b:1", GossipSyn("a", [], [], 0))
    assert syn.wall_ms == fast.wall and pc.stamp("b:1", "not gossip") == "not gossip"
    fast.mono += 4                               # the ACK comes back 4 ms later
    right.wall += 2
    ack = peer.stamp("a:1", GossipAck("b", [], [], [], [], 0))
    fast.wall += 4
    peer.observe("a:1", syn)                     # and the peer learns of us the other way round
    pc.observe("b:1", ack)
    with caplog.at_level(logging.INFO, logger="mesh.node.clock"):
        assert pc.check() == OFF                 # one peer heard: half the gap (our own clock is 0)
    assert "-3600.000 s from 1 peer(s)" in caplog.records[-1].getMessage()
    pc.observe("c:1", dataclasses.replace(ack, node_id="c"))   # a third broker, its clock right too
    with caplog.at_level(logging.INFO, logger="mesh.node.clock"):
        assert pc.check() is None                # no change of state, but the estimate moved: said again
    assert "now -7200.000 s from 2 peer(s)" in caplog.records[-1].getMessage()
    caplog.clear()
    assert pc.offset_ms() == -2 * HOUR_MS and peer.sample_ms("a:1") == 2 * HOUR_MS - 2
    assert pc.state() == OFF and not pc.trusted() and pc.correction_ms() == -2 * HOUR_MS
    assert pc.agreed_wall_ms() == fast.wall - 2 * HOUR_MS and pc.wall_ms() == fast.wall
    with caplog.at_level(logging.INFO, logger="mesh.node.clock"):
        assert pc.check() is None and pc.check() is None
        assert [r for r in caplog.records if r.levelno == logging.ERROR] == []     # said once
        pc2 = PeerClock(fast, bound_ms=30_000, alone=lambda: False)
        pc2.observe("b:1", ack)
        pc2.observe("c:1", dataclasses.replace(ack, node_id="c"))
        assert pc2.check() == OFF
        errors = [r for r in caplog.records if r.levelno == logging.ERROR]
        assert len(errors) == 1 and "-7200.00" in errors[0].getMessage() and "no retention by time" in \
            errors[0].getMessage()
        fast.wall -= 2 * HOUR_MS                 # the operator fixed the clock
        pc.observe("b:1", dataclasses.replace(ack, wall_ms=fast.wall))
        assert pc.check() == AGREES and pc.trusted() and pc.correction_ms() == 0
        assert any("agrees again" in r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)


# -- gossip judged by the peers' time ------------------------------------------------------
CFG = GossipConfig(dead_after_ms=3_000, tombstone_gc_ms=3_600_000, max_clock_skew_ms=60_000)


class SkewNet:
    """Two gossip cores, each on its own wall clock (``skew``), driven as the node shell
    drives them: SYN and ACK stamped with the sender's wall clock, every stamp a sample of
    the receiver's ``PeerClock``, the receiver's checks judged by its correction."""

    def __init__(self, skew: dict[str, int]):
        self.t = T0
        self.skew = skew
        self.clocks = {n: FakeClock(T0 + s) for n, s in skew.items()}
        self.peer_clocks = {n: PeerClock(self.clocks[n], alone=lambda: False) for n in skew}
        self.nodes: dict[str, Gossip] = {}

    def add(self, g: Gossip, name: str) -> Gossip:
        self.nodes[g.address] = g
        g._name = name
        return g

    def now(self, name: str) -> int:
        return self.t + self.skew[name]

    def run(self, ms: int, shell: bool = True) -> None:
        end = self.t + ms
        while self.t < end:
            self.t += 50
            for n in self.clocks:
                self.clocks[n].wall, self.clocks[n].mono = self.now(n), self.t
            for addr, g in list(self.nodes.items()):
                self._deliver(addr, g.tick(self.now(g._name)), shell)

    def _deliver(self, src: str, sends, shell: bool) -> None:
        q = deque((src, s) for s in sends)
        while q:
            src, s = q.popleft()
            dst = self.nodes.get(s.dest)
            if dst is None:
                continue
            msg = self.peer_clocks[self.nodes[src]._name].stamp(s.dest, s.msg) if shell else s.msg
            msg = wire(msg)
            if shell:
                pc = self.peer_clocks[dst._name]
                pc.observe(src, msg)
                dst.set_clock_offset(pc.correction_ms())
            for r in dst.receive(src, msg, self.now(dst._name)):
                q.append((s.dest, r))


def _pair(skew_b: int) -> tuple[Gossip, Gossip, SkewNet]:
    """a and c with clocks right, b ``skew_b`` off."""
    net = SkewNet({"a": 0, "b": skew_b, "c": 0})
    a = net.add(Gossip("a", "addr-a", 1, [], random.Random("a"), CFG, net.now("a")), "a")
    b = net.add(Gossip("b", "addr-b", 1, ["addr-a"], random.Random("b"), CFG, net.now("b")), "b")
    net.add(Gossip("c", "addr-c", 1, ["addr-a"], random.Random("c"), CFG, net.now("c")), "c")
    return a, b, net


TOPIC = {"uuid": "0123456789abcdef"}


def test_a_broker_a_day_behind_takes_its_peers_registers():
    for shell, taken in ((False, False), (True, True)):     # (False: judged by its own clock, as before)
        a, b, net = _pair(-DAY_MS)
        a.put_cluster("topic/orders", TOPIC)
        net.run(2_000, shell=shell)
        assert ("topic/orders" in b.cluster_items()) is taken, shell
        if not shell:
            assert b.stats["malformed_stamp"] > 0
    assert net.peer_clocks["b"].offset_ms() == DAY_MS and net.peer_clocks["a"].offset_ms() == 0
    assert net.peer_clocks["a"].sample_ms("addr-b") == -DAY_MS


def test_a_broker_ahead_still_refuses_a_forged_stamp_by_its_peers_time():
    a, b, net = _pair(2 * HOUR_MS)
    net.run(1_000)
    assert net.peer_clocks["b"].correction_ms() == -2 * HOUR_MS
    forged = ["topic/x", net.now("b"), "a", TOPIC, False]   # stamped with b's own (wrong) clock
    from mesh.gossip import GossipAck2
    b.receive("addr-a", wire(GossipAck2("a", [], forged)), net.now("b"))
    assert "topic/x" not in b.cluster_items() and b.stats["malformed_stamp"] == 1


def _snapshot_of(g: Gossip) -> dict:
    return msgpack.unpackb(msgpack.packb(g.snapshot(), use_bin_type=True), raw=False, strict_map_key=False)


def test_a_restart_a_day_behind_keeps_the_registers_of_its_snapshot(caplog):
    a, b, net = _pair(0)
    a.put_cluster("topic/orders", TOPIC)
    net.run(2_000)
    snap = _snapshot_of(b)
    with caplog.at_level(logging.WARNING):
        b2 = Gossip("b", "addr-b", 2, ["addr-a"], random.Random("b2"), CFG, net.now("b") - DAY_MS, snapshot=snap)
    assert b2.cluster_items() == {"topic/orders": TOPIC}, b2.load_warnings
    assert any("is the clock behind" in r.getMessage() for r in caplog.records)


# -- the catalog drops a local partition only on the metadata's word -------------------------
class StampedRegisters(Registers):
    """Registers with tombstones, as the gossip core holds them (``cluster_stamp``)."""

    def __init__(self):
        super().__init__()
        self.tombs: set[str] = set()

    def delete_cluster(self, key: str) -> None:
        super().delete_cluster(key)
        self.tombs.add(key)

    def cluster_stamp(self, key: str):
        if key in self.tombs:
            return (2, "n2", True)
        return (1, "n2", False) if key in self.values else None


def test_a_view_without_the_topic_keeps_the_local_partitions_and_a_tombstone_drops_them(caplog):
    regs = StampedRegisters()
    store = MemoryStore()
    t = topic("orders", UUID_A, [["n1", "n2"], ["n2", "n1"]])
    for k, v in topic_registers(t).items():
        regs.put_cluster(k, v)
    cat = Catalog("n1", regs, store)
    cat.reconcile()
    assert len(store.partitions()) == 2
    # the registers are gone from this node's view (a snapshot dropped them): keep the data
    regs.values.clear()
    regs.version += 1
    with caplog.at_level(logging.INFO):
        cat.reconcile()
        cat.reconcile()
    assert len(store.partitions()) == 2
    kept = [r for r in caplog.records if "keeping local partition" in r.getMessage()]
    assert len(kept) == 2 and not any("dropping" in r.getMessage() for r in caplog.records)
    # a deletion the metadata shows (the header's tombstone): dropped
    for k, v in topic_registers(t).items():
        regs.put_cluster(k, v)
    cat.reconcile()
    for k in list(topic_registers(t)):
        regs.delete_cluster(k)
    caplog.clear()
    with caplog.at_level(logging.INFO):
        cat.reconcile()
    assert store.partitions() == []
    assert any("(topic deleted)" in r.getMessage() for r in caplog.records)
    assert keys.topic_key("orders") in regs.tombs
