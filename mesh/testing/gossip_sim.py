"""The gossip simulator: the real ``mesh.gossip`` core on the shared simulated network.

Scenarios and the command line are in ``mesh.testing.gossip_scenarios``:

    python -m mesh.testing.gossip_scenarios --nodes 1000 --seed 7 [--loss 0.1]

How it works
------------
One thread steps one ``SimNet`` (``mesh.testing.simnet``): its event heap, ordered by
(simulated ms, sequence number), owns time; it carries node ticks, scheduled calls and
messages, and draws loss, delay and duplication from its own ``random.Random`` seeded from
the run's seed. A run is a pure function of its seed and its arguments (no hash ordering,
no wall clock). Each node gets its own ``random.Random`` seeded from (seed, node id,
generation). In *wire mode* every message is encoded with ``mesh.wire.codec`` and decoded on
delivery, exactly as the shell would, and its bytes are counted. A node can crash (the
network drops what is in flight to and from it), restart from its snapshot with a higher
generation, or stall (its ticks wait and the network holds its messages until the stall
ends, like a SIGSTOPped process). Partitions are the network's.

After every step the checkers run on the node that stepped: the core's own
``check_invariants`` (every step for small clusters, sampled for large ones), no
resurrection (a node never goes back to an older stamp or version of a key it has seen),
and no zombies (a crashed node, once convicted, never comes back alive). Membership
events are collected to count convictions, false convictions and detection times.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Callable

from mesh.gossip import ALIVE, DEAD, LEFT, SUSPECT, Gossip, GossipConfig
from mesh.testing.simnet import DELIVER, SimNet
from mesh.wire.codec import decode_body, encode_body

__all__ = ["NetConfig", "SimNode", "Simulation", "SimulationFailure", "address_of",
           "check_no_resurrection", "check_no_zombies"]

_FRAME_OVERHEAD = 30      # protocol, request id, op frames around a msgpack body (bytes)
_TICK, _CALL = "tick", "call"


@dataclass
class NetConfig:
    loss: float = 0.0
    delay_min_ms: int = 1
    delay_max_ms: int = 10
    dup: float = 0.0


class SimNode:
    __slots__ = ("gossip", "address", "up", "token", "checked_version")

    def __init__(self, gossip: Gossip) -> None:
        self.gossip = gossip
        self.address = gossip.address
        self.up = True
        self.token = 0            # bumps on crash/restart so stale tick events are ignored
        self.checked_version = -1


class SimulationFailure(AssertionError):
    pass


class Simulation:
    def __init__(self, seed: int, config: GossipConfig, net: NetConfig | None = None, *,
                 wire: bool = True, full_check_every: int = 1) -> None:
        self.seed = seed
        self.config = config
        nc = net or NetConfig()
        self.net = SimNet(f"gossip-sim/{seed}/net", loss=nc.loss, dup=nc.dup,
                          delay=(nc.delay_min_ms, nc.delay_max_ms))
        self.wire = wire
        self.full_check_every = max(1, full_check_every)
        self.rng = random.Random(seed)                 # the scenario's choices
        self.nodes: dict[str, SimNode] = {}          # by address
        self.by_id: dict[str, SimNode] = {}
        self.steps = 0
        self._changed_steps = 0
        # measurements
        self.bytes_sent: dict[str, int] = {}
        self.events: list[tuple[int, str, str, str, str]] = []    # (ms, observer, node, old, new)
        self.false_convictions: list[tuple[int, str, str]] = []
        self.false_suspicions: list[tuple[int, str, str]] = []
        self.expected_dead: set[str] = set()          # node ids that may legitimately be convicted
        self.crashed: set[str] = set()                # node ids down now
        self.violations: list[str] = []
        self.checkers: list[Callable[["Simulation", SimNode], None]] = [check_no_resurrection, check_no_zombies]
        self._seen_cluster: dict[tuple[str, str], tuple] = {}
        self._seen_entries: dict[tuple[str, str, str], tuple] = {}
        self._convicted: set[tuple[str, str]] = set()
        self.watch_cluster: set[str] = set()
        self.watch_entries: set[tuple[str, str]] = set()   # (origin, key)
        self.on_step: Callable[[SimNode], None] | None = None

    @property
    def now_ms(self) -> int:
        return self.net.now

    @property
    def messages(self) -> dict[str, int]:
        """The network's counters: sent, lost, duplicated, cut, undeliverable, held, delivered."""
        return self.net.stats

    # ------------------------------------------------------------ building -------------

    def node_rng(self, node_id: str, generation: int = 1) -> random.Random:
        return random.Random(f"{self.seed}/{node_id}/{generation}")

    def add(self, g: Gossip, token: int = 0) -> SimNode:
        n = SimNode(g)
        n.token = token
        self.nodes[g.address] = n
        self.by_id[g.node_id] = n
        self.bytes_sent.setdefault(g.address, 0)
        self.net.call_at(max(self.now_ms, g.next_tick_ms), _TICK, n, n.token)
        return n

    def new_node(self, node_id: str, seeds: list[str], generation: int = 1,
                 snapshot: dict | None = None) -> Gossip:
        g = Gossip(node_id, address_of(node_id), generation, seeds, self.node_rng(node_id, generation),
                   self.config, self.now_ms, snapshot=snapshot)
        self.add(g)
        return g

    def crash(self, node_id: str) -> None:
        n = self.by_id[node_id]
        n.up = False
        n.token += 1
        self.net.crash(n.address)
        self.crashed.add(node_id)
        self.expected_dead.add(node_id)

    def restart(self, node_id: str, snapshot: dict | None) -> Gossip:
        """Restart a crashed node with generation + 1, from ``snapshot`` if given."""
        old = self.by_id[node_id]
        gen = old.gossip.generation + 1
        g = Gossip(node_id, old.address, gen, old.gossip.seeds, self.node_rng(node_id, gen),
                   self.config, self.now_ms, snapshot=snapshot)
        self.crashed.discard(node_id)
        self.expected_dead.discard(node_id)
        self._convicted = {(obs, o) for obs, o in self._convicted if o != node_id}
        self.net.restart(old.address)
        self.add(g, token=old.token + 1)
        return g

    def stall(self, node_id: str, duration_ms: int) -> None:
        self.net.stall(self.by_id[node_id].address, self.now_ms + duration_ms)

    def partition(self, *groups: list[str]) -> None:
        """Cut the network between groups of node ids (nodes not listed form one more group)."""
        self.net.partition(*[[self.by_id[o].address for o in grp] for grp in groups])

    def heal(self) -> None:
        self.net.heal()

    def call_at(self, t_ms: int, fn: Callable[[], None]) -> None:
        self.net.call_at(t_ms, _CALL, fn)

    # ------------------------------------------------------------ running --------------

    def run_until(self, t_ms: int, stop: Callable[[], bool] | None = None,
                  stop_every_ms: int | None = None) -> bool:
        """Step until ``t_ms``; True as soon as ``stop()`` holds (checked after each step,
        or at multiples of ``stop_every_ms``)."""
        net = self.net
        next_check = net.now
        while True:
            ev = net.pop(t_ms)
            if ev is None:
                break
            self._step(ev)
            if stop is not None:
                if stop_every_ms is None:
                    if stop():
                        return True
                elif net.now >= next_check:
                    next_check = net.now + stop_every_ms
                    if stop():
                        return True
        net.advance(t_ms)
        return bool(stop and stop())

    def _step(self, ev: tuple) -> None:
        kind, a, b, c = ev
        t = self.net.now
        self.steps += 1
        if kind == _TICK:
            n: SimNode = a
            if not n.up or b != n.token:
                return
            if self.net.stalled(n.address):
                self.net.call_at(self.net.stalled_until(n.address), _TICK, n, b)
                return
            sends = n.gossip.tick(t)
            nxt = n.gossip.next_tick_ms
            self.net.call_at(nxt if nxt > t else t + self.config.interval_ms, _TICK, n, n.token)
            self._dispatch(n, sends)
            self._after(n)
        elif kind == DELIVER:
            n = self.nodes.get(b)
            if n is None or not n.up:      # an address nobody has (yet)
                return
            msg = c
            if self.wire:
                op, body = c
                msg = decode_body(op, body)
            self._dispatch(n, n.gossip.receive(a, msg, t))
            self._after(n)
        else:
            a()

    def _dispatch(self, n: SimNode, sends: list) -> None:
        net = self.net
        for s in sends:
            payload: Any = s.msg
            if self.wire:
                body = encode_body(s.msg)
                payload = (type(s.msg).OP, body)
                self.bytes_sent[n.address] += len(body) + _FRAME_OVERHEAD
            net.send(n.address, s.dest, payload)

    def _after(self, n: SimNode) -> None:
        g = n.gossip
        if g.version != n.checked_version:      # heartbeats alone do not move the version
            n.checked_version = g.version
            self._changed_steps += 1
            for ev in g.take_events():
                self.events.append((ev.at_ms, g.node_id, ev.node_id, ev.old, ev.new))
                if ev.node_id not in self.expected_dead and ev.node_id != g.node_id:
                    if ev.new == DEAD:
                        self.false_convictions.append((ev.at_ms, g.node_id, ev.node_id))
                    elif ev.new == SUSPECT and ev.old == ALIVE:
                        self.false_suspicions.append((ev.at_ms, g.node_id, ev.node_id))
            if self._changed_steps % self.full_check_every == 0:
                try:
                    g.check_invariants()
                except AssertionError as exc:
                    self.violations.append(f"t={self.now_ms} {g.node_id}: invariant: {exc}")
            for check in self.checkers:
                check(self, n)
        if self.on_step is not None:
            self.on_step(n)

    # ------------------------------------------------------------ views ----------------

    def up_nodes(self) -> list[SimNode]:
        return [n for n in self.nodes.values() if n.up]

    def total_bytes(self) -> int:
        return sum(self.bytes_sent.values())


def address_of(node_id: str) -> str:
    return f"sim://{node_id}"


# ------------------------------------------------------------ checkers --------------------

def check_no_resurrection(sim: Simulation, n: SimNode) -> None:
    """A node never goes back to an older stamp (cluster) or version (namespace) of a key."""
    g = n.gossip
    for key in sim.watch_cluster:
        st = g.cluster_stamp(key)
        if st is None:
            continue
        rank = (st[0], st[1], st[2])
        k = (g.node_id, key)
        prev = sim._seen_cluster.get(k)
        if prev is not None and rank < prev and not st[2]:
            sim.violations.append(f"t={sim.now_ms} {g.node_id}: cluster key {key!r} went back "
                                  f"from {prev} to {rank} (resurrection)")
        if prev is None or rank > prev:
            sim._seen_cluster[k] = rank
    for origin, key in sim.watch_entries:
        ev = g.entry_version(origin, key)
        if ev is None:
            continue
        k3 = (g.node_id, origin, key)
        prev = sim._seen_entries.get(k3)
        if prev is not None and ev[:2] < prev[:2] and not ev[2]:
            sim.violations.append(f"t={sim.now_ms} {g.node_id}: {origin}/{key} went back "
                                  f"from {prev} to {ev} (resurrection)")
        if prev is None or ev[:2] > prev[:2]:
            sim._seen_entries[k3] = ev


def check_no_zombies(sim: Simulation, n: SimNode) -> None:
    """A crashed node, once convicted or collected by an observer, never looks alive again."""
    g = n.gossip
    for o in sim.crashed:
        st = g.status_of(o)
        key = (g.node_id, o)
        if st in (DEAD, LEFT) or (st is None and key in sim._convicted):
            sim._convicted.add(key)
        elif st in (ALIVE, SUSPECT) and key in sim._convicted:
            sim.violations.append(f"t={sim.now_ms} {g.node_id}: crashed node {o} came back as {st} (zombie)")


