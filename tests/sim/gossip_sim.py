"""Deterministic simulator for mesh.gossip.core: the simulator owns time and the network.

    python -m tests.sim.gossip_sim --nodes 1000 --seed 7 [--loss 0.1]
        [--scenario spread|join-storm|stall-hour|partition|tombstones|idle]

How it works
------------
One thread, one event heap ordered by (simulated ms, sequence number): ties are broken
by the order in which events were scheduled, so a run is a pure function of its seed and
its arguments (no hash ordering, no wall clock). The network draws loss, delay,
duplication and partitions from one seeded ``random.Random``; each node gets its own
``random.Random`` seeded from (seed, node id). In *wire mode* every message is encoded
with ``mesh.wire.codec`` and decoded on delivery, exactly as the shell would, and its bytes are
counted. A node can crash, restart from its snapshot with a higher generation, or stall
(its ticks and deliveries wait until the stall ends, like a SIGSTOPped process).

After every step the checkers run on the node that stepped: the core's own
``check_invariants`` (every step for small clusters, sampled for large ones), no
resurrection (a node never goes back to an older stamp or version of a key it has seen),
and no zombies (a crashed node, once convicted, never comes back alive). Membership
events are collected to count convictions, false convictions and detection times.

Rounds are elapsed simulated time divided by ``interval_ms``. A failing scenario prints
``reproduce with: python -m tests.sim.gossip_sim ... --seed N``.
"""
from __future__ import annotations

import argparse
import heapq
import os
import random
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from mesh.gossip.core import ALIVE, DEAD, LEFT, SUSPECT, Gossip, GossipConfig
from mesh.wire.codec import decode_body, encode_body

__all__ = ["NetConfig", "Simulation", "Report", "SCENARIOS", "run_scenario", "main", "ROOT"]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_FRAME_OVERHEAD = 30      # protocol, request id, op frames around a msgpack body (bytes)
_TICK, _DELIVER, _CALL = 0, 1, 2


@dataclass
class NetConfig:
    loss: float = 0.0
    delay_min_ms: int = 1
    delay_max_ms: int = 10
    dup: float = 0.0


class SimNode:
    __slots__ = ("gossip", "address", "up", "stalled_until_ms", "token", "checked_version")

    def __init__(self, gossip: Gossip) -> None:
        self.gossip = gossip
        self.address = gossip.address
        self.up = True
        self.stalled_until_ms = 0
        self.token = 0            # bumps on crash/restart so stale tick events are ignored
        self.checked_version = -1


class SimulationFailure(AssertionError):
    pass


class Simulation:
    def __init__(self, seed: int, config: GossipConfig, net: NetConfig | None = None, *,
                 wire: bool = True, full_check_every: int = 1) -> None:
        self.seed = seed
        self.config = config
        self.net = net or NetConfig()
        self.wire = wire
        self.full_check_every = max(1, full_check_every)
        self.rng = random.Random(seed)
        self.now_ms = 0
        self.nodes: dict[str, SimNode] = {}          # by address
        self.by_id: dict[str, SimNode] = {}
        self._events: list[tuple] = []
        self._seq = 0
        self.steps = 0
        self._changed_steps = 0
        self.group_of: dict[str, int] | None = None  # address -> side of a partition
        # measurements
        self.bytes_sent: dict[str, int] = {}
        self.messages = {"sent": 0, "lost": 0, "partitioned": 0, "undeliverable": 0, "duplicated": 0}
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

    # ------------------------------------------------------------ building -------------

    def node_rng(self, node_id: str, generation: int = 1) -> random.Random:
        return random.Random(f"{self.seed}/{node_id}/{generation}")

    def add(self, g: Gossip, token: int = 0) -> SimNode:
        n = SimNode(g)
        n.token = token
        self.nodes[g.address] = n
        self.by_id[g.node_id] = n
        self.bytes_sent.setdefault(g.address, 0)
        self._schedule_tick(n, max(self.now_ms, g.next_tick_ms))
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
        self.add(g, token=old.token + 1)
        return g

    def stall(self, node_id: str, duration_ms: int) -> None:
        n = self.by_id[node_id]
        n.stalled_until_ms = max(n.stalled_until_ms, self.now_ms + duration_ms)

    def partition(self, *groups: list[str]) -> None:
        """Cut the network between groups of node ids (nodes not listed form one more group)."""
        self.group_of = {}
        for i, grp in enumerate(groups):
            for node_id in grp:
                self.group_of[self.by_id[node_id].address] = i

    def heal(self) -> None:
        self.group_of = None

    def call_at(self, t_ms: int, fn: Callable[[], None]) -> None:
        self._push(t_ms, _CALL, fn, None, None)

    # ------------------------------------------------------------ running --------------

    def run_until(self, t_ms: int, stop: Callable[[], bool] | None = None,
                  stop_every_ms: int | None = None) -> bool:
        """Step until ``t_ms``; True as soon as ``stop()`` holds (checked after each step,
        or at multiples of ``stop_every_ms``)."""
        next_check = self.now_ms
        events = self._events
        while events and events[0][0] <= t_ms:
            self._step()
            if stop is not None:
                if stop_every_ms is None:
                    if stop():
                        return True
                elif self.now_ms >= next_check:
                    next_check = self.now_ms + stop_every_ms
                    if stop():
                        return True
        if self.now_ms < t_ms:
            self.now_ms = t_ms
        return bool(stop and stop())

    def _push(self, t: int, kind: int, a: Any, b: Any, c: Any) -> None:
        self._seq += 1
        heapq.heappush(self._events, (t, self._seq, kind, a, b, c))

    def _schedule_tick(self, n: SimNode, t: int) -> None:
        self._push(t, _TICK, n, n.token, None)

    def _step(self) -> None:
        t, _, kind, a, b, c = heapq.heappop(self._events)
        self.now_ms = t
        self.steps += 1
        if kind == _TICK:
            n: SimNode = a
            if not n.up or b != n.token:
                return
            if n.stalled_until_ms > t:
                self._schedule_tick(n, n.stalled_until_ms)
                return
            sends = n.gossip.tick(t)
            nxt = n.gossip.next_tick_ms
            self._schedule_tick(n, nxt if nxt > t else t + self.config.interval_ms)
            self._dispatch(n, sends)
            self._after(n)
        elif kind == _DELIVER:
            n = self.nodes.get(b)
            if n is None or not n.up:
                self.messages["undeliverable"] += 1
                return
            if self.group_of is not None and self.group_of.get(a, -1) != self.group_of.get(b, -1):
                self.messages["partitioned"] += 1
                return
            if n.stalled_until_ms > t:
                self._push(n.stalled_until_ms, _DELIVER, a, b, c)
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
        rng = self.rng
        for s in sends:
            payload: Any = s.msg
            if self.wire:
                body = encode_body(s.msg)
                payload = (type(s.msg).OP, body)
                self.bytes_sent[n.address] += len(body) + _FRAME_OVERHEAD
            self.messages["sent"] += 1
            if net.loss and rng.random() < net.loss:
                self.messages["lost"] += 1
                continue
            copies = 2 if net.dup and rng.random() < net.dup else 1
            if copies == 2:
                self.messages["duplicated"] += 1
            for _ in range(copies):
                delay = net.delay_min_ms + int(rng.random() * (net.delay_max_ms - net.delay_min_ms + 1))
                self._push(self.now_ms + delay, _DELIVER, n.address, s.dest, payload)

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


# ------------------------------------------------------------ scenarios -------------------

@dataclass
class Report:
    scenario: str
    argv: list[str]
    metrics: dict[str, Any] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures

    def reproduce(self) -> str:
        return "reproduce with: python -m tests.sim.gossip_sim " + " ".join(self.argv)

    def render(self) -> str:
        lines = [f"scenario: {self.scenario}"]
        for k, v in self.metrics.items():
            lines.append(f"  {k}: {round(v, 2) if isinstance(v, float) else v}")
        for f in self.failures:
            lines.append(f"  FAILED: {f}")
        if self.failures:
            lines.append(self.reproduce())
        return "\n".join(lines)

    def expect(self, ok: bool, what: str) -> None:
        if not ok:
            self.failures.append(what)


def _argv(scenario: str, nodes: int, seed: int, loss: float, **extra: Any) -> list[str]:
    out = ["--scenario", scenario, "--nodes", str(nodes), "--seed", str(seed)]
    if loss:
        out += ["--loss", str(loss)]
    if extra.get("dup"):
        out += ["--dup", str(extra.pop("dup"))]
    for k, v in extra.items():
        if v is True:
            out.append("--" + k.replace("_", "-"))
        elif v not in (None, False):
            out += ["--" + k.replace("_", "-"), str(v)]
    return out


def _finish(report: Report, sim: Simulation) -> Report:
    report.metrics["steps"] = sim.steps
    report.metrics["messages sent"] = sim.messages["sent"]
    report.metrics["invariant violations"] = len(sim.violations)
    for v in sim.violations[:5]:
        report.failures.append(v)
    return report


def _node_ids(n: int) -> list[str]:
    width = len(str(n))
    return [f"n{i:0{width}d}" for i in range(n)]


def _spread_config(heartbeats: bool) -> GossipConfig:
    if heartbeats:
        return GossipConfig()
    # heartbeats (and so the detector) effectively off: a 10,000-node digest of moving
    # heartbeats costs O(N^2) Python work per round; dissemination does not depend on them
    return GossipConfig(heartbeat_interval_ms=10**12)


def scenario_spread(nodes: int = 1000, seed: int = 7, loss: float = 0.0, *, dup: float = 0.0,
                    heartbeats: bool | None = None, wire: bool | None = None,
                    max_rounds: float | None = None) -> Report:
    """One update at one node of a converged cluster: rounds until every node has it."""
    heartbeats = nodes <= 2000 if heartbeats is None else heartbeats
    wire = nodes <= 2000 if wire is None else wire
    cfg = _spread_config(heartbeats)
    report = Report("spread", _argv("spread", nodes, seed, loss, dup=dup,
                                    no_heartbeats=not heartbeats and nodes <= 2000,
                                    no_wire=not wire and nodes <= 2000))
    sim = Simulation(seed, cfg, NetConfig(loss=loss, dup=dup), wire=wire,
                     full_check_every=1 if nodes <= 64 else 997)
    ids = _node_ids(nodes)
    members = [(o, address_of(o), 1) for o in ids]
    for g in Gossip.converged_cluster(members, [address_of(ids[0])],
                                      [sim.node_rng(o) for o in ids], cfg, 0):
        sim.add(g)
    interval = cfg.interval_ms
    sim.run_until(2 * interval)
    origin = ids[sim.rng.randrange(nodes)]
    sim.watch_entries.add((origin, "probe"))
    t0 = sim.now_ms
    bytes0 = sim.total_bytes()
    sim.by_id[origin].gossip.set_local("probe", {"hello": "world"})
    have = {origin}

    def on_step(n: SimNode) -> None:
        if n.gossip.node_id not in have and n.gossip.entry_version(origin, "probe") is not None:
            have.add(n.gossip.node_id)
    sim.on_step = on_step
    limit = max_rounds or 60
    done = sim.run_until(t0 + int(limit * interval), stop=lambda: len(have) == nodes)
    rounds = (sim.now_ms - t0) / interval
    report.metrics["nodes"] = nodes
    report.metrics["loss"] = loss
    report.metrics["heartbeats"] = heartbeats
    report.metrics["rounds to full convergence"] = round(rounds, 2)
    report.metrics["nodes reached"] = len(have)
    if wire:
        sent = sim.total_bytes() - bytes0
        report.metrics["bytes per node per round"] = round(sent / nodes / max(rounds, 1e-9))
    report.metrics["false convictions"] = len(sim.false_convictions)
    report.expect(done, f"only {len(have)} of {nodes} nodes got the update within {limit} rounds")
    if max_rounds is not None:
        report.expect(rounds <= max_rounds, f"took {rounds:.2f} rounds, more than {max_rounds}")
    report.expect(not sim.false_convictions, f"false convictions: {sim.false_convictions[:3]}")
    return _finish(report, sim)


def _converged(sim: Simulation, ids: list[str], now_ms: int) -> bool:
    """Every up node knows every up node alive, with all of its keys, and one cluster store."""
    ups = [sim.by_id[o] for o in ids if sim.by_id[o].up]
    want = {n.gossip.node_id: n.gossip.digest_entry(n.gossip.node_id) for n in ups}
    live = sorted(want)
    hashes = {n.gossip.cluster_hash() for n in ups}
    if len(hashes) != 1:
        return False
    for n in ups:
        g = n.gossip
        if g.live_members(now_ms) != live:
            return False
        for o, row in want.items():
            mine = g.digest_entry(o)
            if mine is None or mine[0] != row[0] or mine[2] != row[2]:
                return False
    return True


def scenario_join_storm(nodes: int = 100, seed: int = 7, loss: float = 0.0, *, dup: float = 0.0,
                        max_rounds: float | None = None) -> Report:
    """A seed plus ``nodes`` joiners that all start within one round, knowing only the seed."""
    cfg = GossipConfig()
    report = Report("join-storm", _argv("join-storm", nodes, seed, loss, dup=dup))
    sim = Simulation(seed, cfg, NetConfig(loss=loss, dup=dup), full_check_every=1 if nodes <= 64 else 97)
    interval = cfg.interval_ms
    seed_id = "seed"
    s = sim.new_node(seed_id, [])
    for i in range(20):
        s.put_cluster(f"topic/t{i:02d}", {"partitions": 3, "replication": 3})
    s.set_local("member", {"rack": "r0"})
    ids = _node_ids(nodes)
    for o in ids:
        def start(o=o):
            g = sim.new_node(o, [s.address])
            g.set_local("member", {"rack": f"r{sim.rng.randrange(3)}"})
        sim.call_at(sim.rng.randrange(interval), start)
    everyone = [seed_id] + ids
    sim.run_until(interval)        # every joiner has started by now
    done = sim.run_until(int((max_rounds or 100) * interval),
                         stop=lambda: _converged(sim, everyone, sim.now_ms), stop_every_ms=interval // 4)
    rounds = sim.now_ms / interval
    report.metrics["joiners"] = nodes
    report.metrics["loss"] = loss
    report.metrics["rounds to full convergence"] = round(rounds, 2)
    report.metrics["bytes per node per round"] = round(sim.total_bytes() / (nodes + 1) / rounds)
    report.metrics["false convictions"] = len(sim.false_convictions)
    report.expect(done, "the join storm did not converge")
    if max_rounds is not None:
        report.expect(rounds <= max_rounds, f"took {rounds:.2f} rounds, more than {max_rounds}")
    report.expect(not sim.false_convictions, f"false convictions: {sim.false_convictions[:3]}")
    return _finish(report, sim)


def _start_cluster(sim: Simulation, ids: list[str]) -> list[Gossip]:
    """Start ``ids`` through the first one as seed and run until they agree."""
    first = sim.new_node(ids[0], [])
    out = [first] + [sim.new_node(o, [first.address]) for o in ids[1:]]
    interval = sim.config.interval_ms
    ok = sim.run_until(sim.now_ms + 200 * interval, stop=lambda: _converged(sim, ids, sim.now_ms),
                       stop_every_ms=interval)
    if not ok:
        raise SimulationFailure("the cluster did not form")
    return out


def scenario_stall_hour(nodes: int = 10, seed: int = 7, loss: float = 0.01, *, dup: float = 0.0,
                        hours: float = 1.0, stall_ms: int = 1000, stall_every_ms: int = 10_000,
                        wire: bool = True, lan: bool = False) -> Report:
    """An hour of a small cluster with loss and metadata churn; one node stalls ``stall_ms``
    in every ``stall_every_ms``. Then one node crashes: detection time, then collection.
    ``lan``: the broker's preset (``GossipConfig.lan``) instead of the defaults."""
    cfg = GossipConfig.lan(tombstone_gc_ms=120_000) if lan else GossipConfig(tombstone_gc_ms=120_000)
    report = Report("stall-hour", _argv("stall-hour", nodes, seed, loss, dup=dup,
                                        hours=hours if hours != 1.0 else None))
    sim = Simulation(seed, cfg, NetConfig(loss=loss, dup=dup), wire=wire, full_check_every=3)
    ids = _node_ids(nodes)
    _start_cluster(sim, ids)
    staller = ids[min(3, nodes - 1)]
    victim = ids[-1] if ids[-1] != staller else ids[0]
    t_start = sim.now_ms
    t_end = t_start + int(hours * 3_600_000)
    # churn: cluster registers and namespace keys created, updated and deleted
    churn_rng = random.Random(f"{seed}/churn")

    def churn() -> None:
        o = churn_rng.choice(ids)
        g = sim.by_id[o].gossip
        key = f"topic/c{churn_rng.randrange(30)}"
        sim.watch_cluster.add(key)
        if churn_rng.random() < 0.4:
            g.delete_cluster(key)
        else:
            g.put_cluster(key, {"partitions": churn_rng.randrange(1, 9)})
        lk = f"lead/{churn_rng.randrange(20)}"
        sim.watch_entries.add((o, lk))
        if churn_rng.random() < 0.4:
            g.delete_local(lk)
        else:
            g.set_local(lk, churn_rng.randrange(1000))
    for t in range(t_start + 5_000, t_end, 15_000):
        sim.call_at(t, churn)
    for t in range(t_start + stall_every_ms, t_end, stall_every_ms):
        sim.call_at(t, lambda: sim.stall(staller, stall_ms))
    sim.run_until(t_end)
    false_convictions = len(sim.false_convictions)
    false_suspicions = len(sim.false_suspicions)
    # crash one node: how long until every other node suspects it, then convicts it
    sim.crash(victim)
    t_crash = sim.now_ms
    others = [o for o in ids if o != victim]

    def all_marked(status: str) -> bool:
        return all(sim.by_id[o].gossip.status_of(victim) in (status, DEAD, None) for o in others)
    sim.run_until(t_crash + 60_000, stop=lambda: all_marked(SUSPECT), stop_every_ms=10)
    t_suspect = sim.now_ms - t_crash
    sim.run_until(t_crash + 120_000, stop=lambda: all_marked(DEAD), stop_every_ms=10)
    t_dead = sim.now_ms - t_crash
    # and after the horizon it is collected everywhere, never to come back
    collected = sim.run_until(sim.now_ms + cfg.tombstone_gc_ms + 10_000,
                              stop=lambda: all(sim.by_id[o].gossip.status_of(victim) is None for o in others),
                              stop_every_ms=1000)
    sim.run_until(sim.now_ms + 30_000)
    stalls = sim.by_id[staller].gossip.stats["stalls"]
    report.metrics["nodes"] = nodes
    report.metrics["loss"] = loss
    report.metrics["simulated hours"] = hours
    report.metrics["local stalls detected by the staller"] = stalls
    report.metrics["false convictions"] = false_convictions
    report.metrics["false suspicions"] = false_suspicions
    report.metrics["detection: all suspect after (ms)"] = t_suspect
    report.metrics["detection: all convicted after (ms)"] = t_dead
    report.metrics["dead node collected everywhere"] = collected
    report.metrics["watched keys"] = len(sim.watch_cluster) + len(sim.watch_entries)
    report.metrics["bytes per node per round"] = round(
        sim.total_bytes() / nodes / ((sim.now_ms) / cfg.interval_ms))
    report.expect(false_convictions == 0, f"false convictions: {sim.false_convictions[:3]}")
    report.expect(t_dead < 60_000, "the crashed node was not convicted everywhere within 60 s")
    report.expect(collected, "the dead node was not collected after the horizon")
    return _finish(report, sim)


def scenario_partition(nodes: int = 40, seed: int = 7, loss: float = 0.0, *, dup: float = 0.0,
                       partition_ms: int = 30_000, max_rounds: float | None = None) -> Report:
    """Two halves cut apart long enough to convict each other, written on both sides, healed."""
    cfg = GossipConfig()
    report = Report("partition", _argv("partition", nodes, seed, loss, dup=dup))
    sim = Simulation(seed, cfg, NetConfig(loss=loss, dup=dup), full_check_every=1 if nodes <= 64 else 97)
    ids = _node_ids(nodes)
    gs = _start_cluster(sim, ids)
    interval = cfg.interval_ms
    half_a, half_b = ids[: nodes // 2], ids[nodes // 2:]
    for g in gs:
        g.put_cluster("topic/shared", {"v": 0})
        g.put_cluster("topic/doomed", {"v": 0})
    sim.watch_cluster |= {"topic/shared", "topic/doomed", "topic/a", "topic/b"}
    sim.run_until(sim.now_ms + 20 * interval)
    sim.partition(half_a, half_b)
    sim.expected_dead |= set(ids)          # convictions across the cut are correct
    t_cut = sim.now_ms
    sim.run_until(t_cut + partition_ms // 2)
    a, b = sim.by_id[half_a[0]].gossip, sim.by_id[half_b[0]].gossip
    a.put_cluster("topic/a", {"side": "a"})
    a.put_cluster("topic/shared", {"v": "a"})
    sim.run_until(sim.now_ms + 5 * interval)
    b.put_cluster("topic/b", {"side": "b"})
    b.put_cluster("topic/shared", {"v": "b"})       # one second later: b's stamp is greater
    b.delete_cluster("topic/doomed")
    a.set_local("written-during-cut", 1)
    sim.watch_entries.add((a.node_id, "written-during-cut"))
    sim.run_until(t_cut + partition_ms)
    cut_a = sum(1 for o in half_a if sim.by_id[o].gossip.status_of(half_b[0]) in (DEAD, None))
    sim.heal()
    sim.expected_dead = set()
    convictions_before = len(sim.false_convictions)
    t_heal = sim.now_ms
    done = sim.run_until(t_heal + int((max_rounds or 100) * interval),
                         stop=lambda: _converged(sim, ids, sim.now_ms), stop_every_ms=interval // 4)
    rounds = (sim.now_ms - t_heal) / interval
    views = {repr(sim.by_id[o].gossip.cluster_items()) for o in ids}
    final = sim.by_id[ids[0]].gossip.cluster_items()
    report.metrics["nodes"] = nodes
    report.metrics["loss"] = loss
    report.metrics["partition (ms)"] = partition_ms
    report.metrics["half A nodes that convicted half B"] = f"{cut_a}/{len(half_a)}"
    report.metrics["rounds to merge after heal"] = round(rounds, 2)
    report.metrics["cluster views after merge"] = len(views)
    report.metrics["false convictions after heal"] = len(sim.false_convictions) - convictions_before
    report.expect(done, "the halves did not merge after the partition healed")
    if max_rounds is not None:
        report.expect(rounds <= max_rounds, f"merging took {rounds:.2f} rounds, more than {max_rounds}")
    report.expect(len(views) == 1, "nodes disagree on the cluster store after the merge")
    report.expect("topic/doomed" not in final, "a key deleted during the partition came back")
    report.expect(final.get("topic/shared") == {"v": "b"},
                  f"last writer did not win: {final.get('topic/shared')}")
    report.expect("topic/a" in final and "topic/b" in final, "writes from one side were lost")
    return _finish(report, sim)


def scenario_tombstones(nodes: int = 6, seed: int = 7, loss: float = 0.0, *, dup: float = 0.0) -> Report:
    """A node down longer than the GC horizon restarts from its old snapshot: it must get a
    full reset, and nothing deleted while it was away may come back, anywhere."""
    cfg = GossipConfig(tombstone_gc_ms=20_000)
    report = Report("tombstones", _argv("tombstones", nodes, seed, loss, dup=dup))
    sim = Simulation(seed, cfg, NetConfig(loss=loss, dup=dup), full_check_every=1)
    ids = _node_ids(nodes)
    gs = _start_cluster(sim, ids)
    interval = cfg.interval_ms
    writer, sleeper = gs[1], gs[-1]
    for i in range(10):
        writer.set_local(f"offset/g{i}", i)
        writer.put_cluster(f"topic/t{i}", {"n": i})
        sim.watch_entries.add((writer.node_id, f"offset/g{i}"))
        sim.watch_cluster.add(f"topic/t{i}")
    sim.run_until(sim.now_ms + 30 * interval, stop=lambda: _converged(sim, ids, sim.now_ms),
                  stop_every_ms=interval)
    snap = sleeper.snapshot()
    sim.crash(sleeper.node_id)
    for i in range(0, 10, 2):
        writer.delete_local(f"offset/g{i}")
        writer.delete_cluster(f"topic/t{i}")
    writer.set_local("offset/g1", 100)
    # well past the horizon: tombstones collected, the sleeper collected too
    sim.run_until(sim.now_ms + 3 * cfg.tombstone_gc_ms)
    gc_versions = {sim.by_id[o].gossip.digest_entry(writer.node_id)[3] for o in ids[:-1]}
    report.metrics["gc version of the writer's namespace (per node)"] = sorted(gc_versions)
    back = sim.restart(sleeper.node_id, snap)
    stale = back.node_items(writer.node_id)
    ok = sim.run_until(sim.now_ms + 100 * interval, stop=lambda: _converged(sim, ids, sim.now_ms),
                       stop_every_ms=interval)
    sim.run_until(sim.now_ms + 10 * interval)
    resets = sum(sim.by_id[o].gossip.stats["resets_sent"] for o in ids)
    killed = sum(sim.by_id[o].gossip.stats["stale_cluster_killed"] for o in ids)
    leftovers = []
    for o in ids:
        g = sim.by_id[o].gossip
        for i in range(0, 10, 2):
            if f"offset/g{i}" in g.node_items(writer.node_id):
                leftovers.append(f"{o}: offset/g{i}")
            if f"topic/t{i}" in g.cluster_items():
                leftovers.append(f"{o}: topic/t{i}")
        if g.node_items(writer.node_id).get("offset/g1") != 100:
            leftovers.append(f"{o}: offset/g1 not updated")
    report.metrics["stale keys the sleeper restored"] = len(stale)
    report.metrics["resets sent"] = resets
    report.metrics["stale cluster entries killed"] = killed
    report.metrics["deleted keys still visible after convergence"] = len(leftovers)
    report.expect(ok, "the cluster did not converge after the sleeper came back")
    report.expect(resets > 0, "the sleeper was never reset")
    report.expect(not leftovers, f"resurrected: {leftovers[:5]}")
    return _finish(report, sim)


def scenario_idle(nodes: int = 5, seed: int = 7, loss: float = 0.0, *, dup: float = 0.0,
                  topics: int = 100, measure_rounds: int = 200) -> Report:
    """Idle traffic of a small cluster holding ``topics`` topics (target: <= 10 KB/s per node)."""
    cfg = GossipConfig()
    report = Report("idle", _argv("idle", nodes, seed, loss, dup=dup))
    sim = Simulation(seed, cfg, NetConfig(loss=loss, dup=dup), full_check_every=13)
    ids = _node_ids(nodes)
    gs = _start_cluster(sim, ids)
    interval = cfg.interval_ms
    for t in range(topics):
        replicas = [ids[(t + r) % nodes] for r in range(min(3, nodes))]
        gs[t % nodes].put_cluster(f"topic/t{t:03d}", {
            "partitions": 3, "replication": 3, "created_ms": 1_700_000_000_000 + t,
            "assignment": [[replicas[(p + r) % len(replicas)] for r in range(len(replicas))] for p in range(3)],
            "config": {"retention.ms": 604_800_000, "segment.bytes": 1 << 30}})
        for p in range(3):
            leader = ids[(t + p) % nodes]
            sim.by_id[leader].gossip.set_local(f"lead/t{t:03d}/{p}", {"epoch": 1, "hw": 0})
    for o in ids:
        sim.by_id[o].gossip.set_local("member", {"rack": "r1", "endpoints": {"client": address_of(o)}})
    sim.run_until(sim.now_ms + 100 * interval, stop=lambda: _converged(sim, ids, sim.now_ms),
                  stop_every_ms=interval)
    sim.run_until(sim.now_ms + 5 * interval)
    b0, t0 = sim.total_bytes(), sim.now_ms
    sim.run_until(t0 + measure_rounds * interval)
    per_round = (sim.total_bytes() - b0) / nodes / measure_rounds
    per_s = per_round * 1000 / interval
    report.metrics["nodes"] = nodes
    report.metrics["topics"] = topics
    report.metrics["bytes per node per round (idle)"] = round(per_round)
    report.metrics["bytes per node per second (idle)"] = round(per_s)
    report.expect(per_s <= 10_000, f"idle traffic {per_s:.0f} B/s per node is above 10 KB/s")
    return _finish(report, sim)


SCENARIOS: dict[str, Callable[..., Report]] = {
    "spread": scenario_spread,
    "join-storm": scenario_join_storm,
    "stall-hour": scenario_stall_hour,
    "partition": scenario_partition,
    "tombstones": scenario_tombstones,
    "idle": scenario_idle,
}


def run_scenario(name: str, **kwargs: Any) -> Report:
    try:
        return SCENARIOS[name](**kwargs)
    except SimulationFailure as exc:
        args = {k: v for k, v in kwargs.items() if k in ("nodes", "seed", "loss")}
        r = Report(name, _argv(name, args.get("nodes", 0), args.get("seed", 0), args.get("loss", 0.0)))
        r.failures.append(str(exc))
        return r


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.sim.gossip_sim", description=__doc__.split("\n")[0])
    p.add_argument("--scenario", default="spread", choices=sorted(SCENARIOS))
    p.add_argument("--nodes", type=int, default=None, help="cluster size (default depends on the scenario)")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--loss", type=float, default=None, help="message loss probability")
    p.add_argument("--dup", type=float, default=0.0, help="message duplication probability")
    p.add_argument("--hours", type=float, default=1.0, help="stall-hour: simulated hours")
    p.add_argument("--no-heartbeats", action="store_true", help="spread: heartbeats off")
    p.add_argument("--no-wire", action="store_true", help="spread: skip msgpack encoding")
    args = p.parse_args(argv)
    kwargs: dict[str, Any] = {"seed": args.seed}
    if args.nodes is not None:
        kwargs["nodes"] = args.nodes
    if args.loss is not None:
        kwargs["loss"] = args.loss
    if args.dup:
        kwargs["dup"] = args.dup
    if args.scenario == "stall-hour" and args.hours != 1.0:
        kwargs["hours"] = args.hours
    if args.scenario == "spread":
        if args.no_heartbeats:
            kwargs["heartbeats"] = False
        if args.no_wire:
            kwargs["wire"] = False
    t = time.perf_counter()
    report = run_scenario(args.scenario, **kwargs)
    print(report.render())
    print(f"  wall time (s): {time.perf_counter() - t:.1f}")
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
