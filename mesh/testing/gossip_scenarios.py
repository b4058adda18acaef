"""Gossip simulation scenarios and their command line (the simulator: ``gossip_sim``).

    python -m mesh.testing.gossip_scenarios --nodes 1000 --seed 7 [--loss 0.1]
        [--scenario spread|join-storm|stall-hour|partition|tombstones|idle]

Each scenario builds a ``Simulation``, drives it (faults first, then a liveness phase),
and returns a ``Report`` of metrics and failures. Rounds are elapsed simulated time divided
by ``interval_ms``. A failing scenario prints
``reproduce with: python -m mesh.testing.gossip_scenarios ... --seed N``. The tests in
tests/sim run them at small sizes; bench/gossip_scale.py at 1,000 and 10,000 nodes.
"""
from __future__ import annotations

import argparse
import random
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from mesh.gossip import DEAD, Gossip, GossipConfig, SUSPECT
from mesh.testing.gossip_sim import NetConfig, SimNode, Simulation, SimulationFailure, address_of

__all__ = ["Report", "SCENARIOS", "run_scenario", "main"]


@dataclass
class Report:
    scenario: str
    argv: list[str]
    metrics: dict[str, Any] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    module: str = "mesh.testing.gossip_scenarios"

    @property
    def ok(self) -> bool:
        return not self.failures

    def reproduce(self) -> str:
        return f"reproduce with: python -m {self.module} " + " ".join(self.argv)

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


def _spread_config(heartbeats: bool, lan: bool = False) -> GossipConfig:
    if lan:       # the broker's preset: SWIM probes, heartbeats only while a life is young
        return GossipConfig.lan()
    if heartbeats:
        return GossipConfig()
    # heartbeats (and so the detector) effectively off: a 10,000-node digest of moving
    # heartbeats costs O(N^2) Python work per round; dissemination does not depend on them
    return GossipConfig(heartbeat_interval_ms=10**12)


def scenario_spread(nodes: int = 1000, seed: int = 7, loss: float = 0.0, *, dup: float = 0.0,
                    heartbeats: bool | None = None, wire: bool | None = None,
                    max_rounds: float | None = None, churn: float = 0.0, lan: bool = False) -> Report:
    """One update at one node of a converged cluster: rounds until every node has it.
    ``churn``: metadata writes per second across the cluster meanwhile (offset commits and
    leader changes in random nodes' namespaces, one in five a topic register)."""
    heartbeats = nodes <= 2000 if heartbeats is None else heartbeats
    wire = nodes <= 2000 if wire is None else wire
    cfg = _spread_config(heartbeats, lan)
    report = Report("spread", _argv("spread", nodes, seed, loss, dup=dup,
                                    no_heartbeats=not heartbeats and nodes <= 2000,
                                    no_wire=not wire and nodes <= 2000, wire=wire and nodes > 2000,
                                    churn=churn or None, lan=lan))
    sim = Simulation(seed, cfg, NetConfig(loss=loss, dup=dup), wire=wire,
                     full_check_every=1 if nodes <= 64 else 997)
    ids = _node_ids(nodes)
    members = [(o, address_of(o), 1) for o in ids]
    for g in Gossip.converged_cluster(members, [address_of(ids[0])],
                                      [sim.node_rng(o) for o in ids], cfg, 0):
        sim.add(g)
    interval = cfg.interval_ms
    if churn:
        churn_rng = random.Random(f"{seed}/churn")

        def write() -> None:
            g = sim.by_id[ids[churn_rng.randrange(nodes)]].gossip
            r = churn_rng.random()
            if r < 0.2:
                g.put_cluster(f"topic/c{churn_rng.randrange(100)}", {"partitions": churn_rng.randrange(1, 9)})
            elif r < 0.6:
                g.set_local(f"lead/t{churn_rng.randrange(50)}/0", {"epoch": churn_rng.randrange(1000)})
            else:
                g.set_local(f"offset/g{churn_rng.randrange(20)}", churn_rng.randrange(10**6))
        step_ms = max(1, int(1000 / churn))
        for t in range(step_ms, int(((max_rounds or 60) + 40) * interval), step_ms):
            sim.call_at(t, write)
    warm = 20 if lan else 2      # (the broker preset's young lives beat 3 times: news, first)
    sim.run_until(warm * interval)
    b_idle, t_idle = sim.total_bytes(), sim.now_ms
    sim.run_until((warm + 10) * interval)
    steady = (sim.total_bytes() - b_idle) / nodes / ((sim.now_ms - t_idle) / 1000)
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
        report.metrics["bytes per node per second (10 rounds before the update)"] = round(steady)
    report.metrics["churn (writes per second)"] = churn
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
    p = argparse.ArgumentParser(prog="python -m mesh.testing.gossip_scenarios", description=__doc__.split("\n")[0])
    p.add_argument("--scenario", default="spread", choices=sorted(SCENARIOS))
    p.add_argument("--nodes", type=int, default=None, help="cluster size (default depends on the scenario)")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--loss", type=float, default=None, help="message loss probability")
    p.add_argument("--dup", type=float, default=0.0, help="message duplication probability")
    p.add_argument("--hours", type=float, default=1.0, help="stall-hour: simulated hours")
    p.add_argument("--no-heartbeats", action="store_true", help="spread: heartbeats off")
    p.add_argument("--no-wire", action="store_true", help="spread: skip msgpack encoding")
    p.add_argument("--wire", action="store_true", help="spread: msgpack encoding above 2,000 nodes too")
    p.add_argument("--churn", type=float, default=0.0, help="spread: metadata writes per second meanwhile")
    p.add_argument("--lan", action="store_true", help="spread: the broker's preset (SWIM probes)")
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
        if args.wire:
            kwargs["wire"] = True
        if args.churn:
            kwargs["churn"] = args.churn
        if args.lan:
            kwargs["lan"] = True
    t = time.perf_counter()
    report = run_scenario(args.scenario, **kwargs)
    print(report.render())
    print(f"  wall time (s): {time.perf_counter() - t:.1f}")
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
