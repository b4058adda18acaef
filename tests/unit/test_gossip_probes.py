"""SWIM probes and Lifeguard suspicion in the gossip core (mesh.gossip.probes, suspicion)."""
from __future__ import annotations

import random

from mesh.gossip import ALIVE, DEAD, SUSPECT, Gossip, GossipConfig, GossipPing, GossipPingAck
from mesh.gossip.suspicion import SUSPICION_K, Suspicion, parse_suspects
from mesh.wire.codec import decode_body, encode_body

import pytest

CFG = GossipConfig.lan()


class Net:
    """A few nodes, messages through the codec, delivered at once unless cut."""

    def __init__(self, ids, config=CFG):
        addrs = [(o, f"addr-{o}", 1) for o in ids]
        self.nodes = {g.address: g for g in Gossip.converged_cluster(
            addrs, [], [random.Random(f"{o}") for o in ids], config, 0)}
        self.by_id = {g.node_id: g for g in self.nodes.values()}
        self.down: set[str] = set()      # addresses that neither send nor receive
        self.now = 0
        self.sent: list = []

    def deliver(self, src, sends):
        q = [(src, s) for s in sends]
        while q:
            src, s = q.pop(0)
            self.sent.append((src, s.dest, type(s.msg).__name__))
            if s.dest in self.down or src in self.down or s.dest not in self.nodes:
                continue
            msg = decode_body(type(s.msg).OP, encode_body(s.msg))
            q += [(s.dest, r) for r in self.nodes[s.dest].receive(src, msg, self.now)]

    def run(self, until_ms, step_ms=10):
        while self.now < until_ms:
            self.now += step_ms
            for a, g in self.nodes.items():
                if a not in self.down:
                    self.deliver(a, g.tick(self.now))


def test_the_timeout_falls_from_max_to_min_with_independent_confirmations():
    net = Net(["a", "b", "c", "d", "e"])
    sus = net.by_id["a"]._probes._sus
    lo, hi = CFG.effective_suspicion_ms
    times = [sus.timeout_ms(Suspicion(1, 0, ["x"] * (c + 1), 0, 0)) for c in range(SUSPICION_K + 2)]
    assert times[0] == hi and times[SUSPICION_K] == lo and times[-1] == lo
    assert times == sorted(times, reverse=True) and len(set(times[:SUSPICION_K + 1])) == SUSPICION_K + 1


def test_a_killed_node_is_suspected_through_indirect_probes_then_convicted_by_all():
    net = Net(["a", "b", "c", "d", "e"])
    net.run(2_000)
    assert all(g.status_of(o) == ALIVE for g in net.nodes.values() for o in net.by_id)
    net.down.add("addr-e")
    net.run(2_000 + 10_000)
    others = [g for g in net.nodes.values() if g.node_id != "e"]
    assert all(g.status_of("e") == DEAD for g in others)
    assert sum(g.stats["indirect_probes_sent"] for g in others) > 0
    assert sum(g.stats["relayed_pings"] for g in others) > 0
    assert all(g.status_of(o) == ALIVE for g in others for o in "abcd")   # nobody else blamed


def test_a_live_suspect_refutes_with_a_newer_heartbeat_and_nobody_convicts_it():
    net = Net(["a", "b", "c", "d", "e"])
    net.run(2_000)
    a, e = net.by_id["a"], net.by_id["e"]
    hb = e.digest_entry("e")[1]
    assert a._probes._sus.suspect("e", net.now)        # as if a's probe of e had failed
    assert a.status_of("e") == SUSPECT
    net.run(net.now + 5_000)
    assert e.stats["refutations"] >= 1 and e.digest_entry("e")[1] > hb
    assert all(g.status_of("e") == ALIVE for g in net.nodes.values())
    assert all("e" not in g._probes._sus.records for g in net.nodes.values())


def test_a_node_whose_loop_stalled_convicts_nobody_on_what_it_could_not_hear():
    net = Net(["a", "b", "c"])
    net.run(1_000)
    a = net.by_id["a"]
    assert a._probes._sus.suspect("b", net.now)
    net.down.add("addr-b")
    stalled_at = net.now
    net.now += 20_000                      # a's loop did not run for 20 s
    net.deliver("addr-a", a.tick(net.now))
    assert a.stats["stalls"] == 1 and a.status_of("b") == SUSPECT
    net.run(net.now + CFG.effective_suspicion_ms[0] - 50)
    assert a.status_of("b") == SUSPECT     # still held: min has not passed since the stall
    net.run(stalled_at + 40_000)
    assert a.status_of("b") == DEAD


def test_pings_from_strangers_are_ignored_and_malformed_news_refused():
    net = Net(["a", "b"])
    a = net.by_id["a"]
    assert a.receive("addr-x", GossipPing("x", 1), 0) == []
    assert a.receive("addr-z", GossipPing("b", 1), 0) == []            # b, but not at b's address
    assert a.stats["pings_ignored"] == 2
    for bad in (GossipPing("b", -1), GossipPing("b", 1, 5), GossipPing("b", 1, "", [["b"]]),
                GossipPing("b", 1, "", [], [["b", 1, 0, []]]), GossipPing("b", 1, "", [], "x"),
                GossipPingAck(7, 1)):
        assert a.receive("addr-b", bad, 0) == []
    assert a.stats["malformed"] == 6
    # a ping request for a node we do not know sends nothing anywhere
    assert a.receive("addr-b", GossipPing("b", 1, "ghost"), 0) == []


def test_a_ping_is_answered_and_a_ping_request_relays_to_a_member_only():
    net = Net(["a", "b", "c"])
    a = net.by_id["a"]
    (ack,) = a.receive("addr-b", GossipPing("b", 9), 0)
    assert ack.dest == "addr-b" and type(ack.msg) is GossipPingAck and ack.msg.seq == 9
    (relay,) = a.receive("addr-b", GossipPing("b", 10, "c"), 0)
    assert relay.dest == "addr-c" and type(relay.msg) is GossipPing and relay.msg.target == ""
    (back,) = a.receive("addr-c", GossipPingAck("c", relay.msg.seq), 0)
    assert back.dest == "addr-b" and back.msg.node_id == "c" and back.msg.seq == 10


@pytest.mark.parametrize("bad", [
    [["a", 1, 0]], [["a", -1, 0, ["b"]]], [["a", 1, 0, []]], [["a", 1, 0, ["b"] * 9]],
    [[1, 1, 0, ["b"]]], [["a", 1, 0, [""]]], [["a", 1, True, ["b"]]], "x", [["a", 1, 0, ["b"]]] * 99,
])
def test_parse_suspects_refuses_malformed(bad):
    with pytest.raises(ValueError):
        parse_suspects(bad)


def test_phi_mode_sends_no_pings():
    net = Net(["a", "b", "c"], GossipConfig())
    net.run(3_000)
    assert not any(kind.startswith("GossipPing") for _, _, kind in net.sent)


def test_a_partial_digest_pushes_a_changed_row_and_the_answer_expands_no_bucket():
    ids = [f"n{i:03d}" for i in range(200)]
    nodes = Gossip.converged_cluster([(o, f"addr-{o}", 1) for o in ids], [], [random.Random(o) for o in ids],
                                     GossipConfig(), 0)
    a, b = nodes[0], nodes[1]
    a.set_local("k", 1)
    syn = a._rounds.syn(b.node_id)
    assert syn.rows_hash and len(syn.digest) < 40
    (ack,) = b.receive(a.address, decode_body(type(syn).OP, encode_body(syn)), 1)
    assert ack.msg.rows_hash == [] and [r[0] for r in ack.msg.digest] == [a.node_id]   # only the row asked for
    (ack2,) = a.receive(b.address, ack.msg, 2)
    assert b.receive(a.address, ack2.msg, 3) == []
    assert b.node_items(a.node_id) == {"k": 1}
    # and b pushes that row on in its next partial digests
    assert a.node_id in [r[0] for r in b._rounds.syn(nodes[2].node_id).digest]


def test_a_probe_of_a_node_that_restarted_meanwhile_does_not_suspect_its_new_life():
    net = Net(["a", "b", "c"])
    net.run(1_000)
    a = net.by_id["a"]
    probes = a._probes
    probes.in_flight.clear()
    net.down.add("addr-b")                # the ping is lost; b restarts with generation 2
    net.deliver("addr-a", [probes._ping("b", net.now)])
    (seq,) = probes.in_flight
    row = a._members.rows["b"]
    a._members.set_row(row._replace(generation=2, heartbeat=1))
    net.deliver("addr-a", probes.tick(net.now + 10 * CFG.effective_probe_timeout_ms))
    assert seq not in probes.in_flight and "b" not in probes._sus.records


def test_a_large_table_puts_its_row_bucket_hashes_in_every_partial_syn():
    # the pull rate bounds the spread's rounds at 10^4-10^5 nodes (docs/decisions/42-swim-probes.md);
    # a smaller table keeps them in every other SYN (bytes)
    from mesh.gossip.rounds import HASHES_EVERY_SYN_ROWS
    for n, want in ((200, [False, True, False, True]), (HASHES_EVERY_SYN_ROWS, [True] * 4)):
        ids = [f"n{i:05d}" for i in range(n)]
        rng = random.Random(1)
        (a, b, *_) = Gossip.converged_cluster([(o, f"addr-{o}", 1) for o in ids], [], [rng] * n, CFG, 0)
        got = [a._rounds.syn(b.node_id).rows_hash != [0] for _ in range(4)]
        assert got == want, n
