"""A rolled-back store restarting with a generation the cluster saw (issue 17), seeded.

Three gossip cores: b, c, and a. a's first life (generation 1) leaves gracefully and its
snapshot is kept (the copy an operator later restores); its second life (generation 2)
lives a random while, however short, and dies; a copy of the first life's store then
restarts, generation 2 again, from that snapshot. Messages are delayed, dropped and
duplicated at random, and messages addressed to the dead life are delivered to the new
one (a ZeroMQ link queues them across the restart). Checked after every delivery: the
restarted copy is never confirmed (``seen_by_peer``) without having seen the other life
(``identity_conflict``); at the end it must have seen it; it then starts a new life at a
higher generation (``reincarnate``, as the broker does), which every peer must adopt and
which must be confirmed.

A failure prints its seed; ``python -m tests.sim.test_gossip_rollback_sim SEED`` replays it.
"""
from __future__ import annotations

import heapq
import random
import sys

import pytest

from mesh.gossip import Gossip, GossipConfig
from mesh.wire.codec import decode_body, encode_body

pytestmark = pytest.mark.sim

CFG = GossipConfig(dead_after_ms=3_000, tombstone_gc_ms=30_000)


def _make(node_id: str, gen: int, rng: random.Random, now: int, seeds=(), snapshot=None) -> Gossip:
    g = Gossip(node_id, f"addr-{node_id}", gen, list(seeds), random.Random(rng.random()), CFG, now,
               snapshot=snapshot)
    if node_id == "a":
        g.set_local("member", 1)
        g.hold_heartbeat = True            # as the broker runs it (mesh.node.loop)
    return g


def run(seed: int) -> str | None:
    """One scenario; None if it held, else what went wrong."""
    rng = random.Random(f"rollback/{seed}")
    drop, dup, delay = rng.choice([0, 0.05, 0.2]), rng.choice([0, 0.05]), rng.choice([2, 20, 150])
    nodes: dict[str, Gossip] = {}
    queue: list = []
    seq = [0]
    now = [0]
    stale: list = []
    copy: list[Gossip] = []

    def push(t, src, s):
        seq[0] += 1
        heapq.heappush(queue, (t, seq[0], src, s))

    def send(src, sends):
        for s in sends:
            if rng.random() < drop:
                continue
            for _ in range(2 if rng.random() < dup else 1):
                push(now[0] + rng.randint(0, delay), src, s)

    def step(until, dead=frozenset()):
        while now[0] < until:
            now[0] += 10
            while queue and queue[0][0] <= now[0]:
                _, _, src, s = heapq.heappop(queue)
                if s.dest in dead:
                    stale.append((src, s))
                    continue
                dst = nodes.get(s.dest)
                if dst is None:
                    continue
                send(s.dest, dst.receive(src, decode_body(type(s.msg).OP, encode_body(s.msg)), now[0]))
                if copy and copy[0].seen_by_peer and not copy[0].identity_conflict:
                    return (f"the restored copy was confirmed without seeing the other life: b holds "
                            f"{b.digest_entry('a')}, c holds {c.digest_entry('a')}")
            for addr, n in list(nodes.items()):
                if addr not in dead:
                    send(addr, n.tick(now[0]))
        return None

    b = _make("b", 1, rng, 0)
    c = _make("c", 1, rng, 0, seeds=[b.address])
    first = _make("a", 1, rng, 0, seeds=[b.address])
    for n in (first, b, c):
        nodes[n.address] = n
    step(rng.randint(500, 1_500))
    send(first.address, first.leave(now[0]))
    snap = first.snapshot()                                  # the copy an operator keeps
    step(now[0] + rng.randint(50, 400), dead={first.address})
    stale.clear()
    second = nodes[first.address] = _make("a", 2, rng, now[0], seeds=[b.address], snapshot=snap)
    start = now[0]
    while not second.seen_by_peer and now[0] < start + 5_000:
        step(now[0] + 10)
    step(now[0] + rng.choice([0, 10, 50, 200, 600, 1_500]))   # however short its life after that
    step(now[0] + rng.randint(10, 400), dead={second.address})
    restored = nodes[second.address] = _make("a", 2, rng, now[0], seeds=[b.address], snapshot=snap)
    copy.append(restored)
    for src, s in stale:                                     # queued for the dead life
        if rng.random() < 0.7:
            push(now[0] + rng.randint(0, 50), src, s)
    why = step(now[0] + 3_000)
    if why is None and restored.identity_conflict != 2:
        why = f"the restored copy never saw the other life (identity_conflict {restored.identity_conflict})"
    if why is None:
        copy.clear()
        restored.reincarnate(3, now[0])
        step(now[0] + 5_000)
        if not restored.seen_by_peer or {b.digest_entry("a")[0], c.digest_entry("a")[0]} != {3}:
            why = (f"the new life (generation 3) was not adopted and confirmed: b holds {b.digest_entry('a')}, "
                   f"c holds {c.digest_entry('a')}, confirmed {restored.seen_by_peer}")
    return why


# seeds that once failed: 12 of the first 400 before lives (a peer still holding the short
# previous life at heartbeat 0 released the copy's first beat); 3325, 3798, 4084 with lives
# but confirmation by one peer (one that never saw the previous life); 1329, 2003 without
# the majority rule once an unconfirmed life sends its rounds to a majority
REGRESSIONS = (5, 24, 1329, 2003, 3325, 3798, 4084)


def test_a_restored_copy_always_sees_the_life_it_forgot():
    failed = [(s, why) for s in (*range(500), *REGRESSIONS) if (why := run(s)) is not None]
    assert not failed, "\n".join(f"seed {s}: {why}; replay: python -m tests.sim.test_gossip_rollback_sim {s}"
                                 for s, why in failed[:5])


if __name__ == "__main__":
    for arg in sys.argv[1:] or ["0"]:
        print(arg, run(int(arg)) or "held")
