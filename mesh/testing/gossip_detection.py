"""Failure detection at scale in the gossip simulator (SWIM probes, Lifeguard suspicion).

    python -m mesh.testing.gossip_detection --nodes 1000 --seed 7 [--loss 0.01] [--kills 3]

A converged cluster of ``nodes`` runs with the broker's preset (``GossipConfig.lan``:
probes on) under loss, delay up to ``delay_max_ms`` and a few nodes that stall
``stall_ms`` in every ``stall_every_ms`` (their ticks wait, their messages are held:
like a SIGSTOPped process). After a warm-up, ``kills`` nodes crash one after the other;
for each: the time until every other up node holds it DEAD. Reported: detection p50 and
max, false suspicions and false convictions (of nodes that never crashed), idle bytes per
node per second (codec bytes, the probes included), the same checkers as every scenario
(invariants, no resurrection, no zombies).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

from mesh.gossip import DEAD, Gossip, GossipConfig
from mesh.testing.gossip_scenarios import Report, _argv, _finish, _node_ids
from mesh.testing.gossip_sim import NetConfig, Simulation, address_of

__all__ = ["scenario_detect", "main"]


def scenario_detect(nodes: int = 200, seed: int = 7, loss: float = 0.01, *, kills: int = 3,
                    stallers: int = 3, stall_ms: int = 1000, stall_every_ms: int = 10_000,
                    delay_max_ms: int = 20, warm_rounds: int = 50, wire: bool | None = None,
                    bound_ms: int = 20_000) -> Report:
    cfg = GossipConfig.lan()
    wire = nodes <= 2000 if wire is None else wire
    report = Report("detect", _argv("detect", nodes, seed, loss, kills=kills)[2:], module="mesh.testing.gossip_detection")
    sim = Simulation(seed, cfg, NetConfig(loss=loss, delay_max_ms=delay_max_ms), wire=wire,
                     full_check_every=1 if nodes <= 64 else 997)
    ids = _node_ids(nodes)
    members = [(o, address_of(o), 1) for o in ids]
    for g in Gossip.converged_cluster(members, [address_of(ids[0])], [sim.node_rng(o) for o in ids], cfg, 0):
        sim.add(g)
    interval = cfg.interval_ms
    rng = sim.rng
    pool = list(ids[1:])
    rng.shuffle(pool)
    stalling = pool[:stallers]
    victims = pool[stallers:stallers + kills]
    horizon = (warm_rounds + kills * (bound_ms // interval + 10) + 20) * interval
    for k, o in enumerate(stalling):      # staggered: at any time at most one of them stalls
        for t in range(stall_every_ms * (k + 1) // (stallers + 1), horizon, stall_every_ms):
            sim.call_at(t, lambda o=o: sim.stall(o, stall_ms))
    sim.run_until(10 * interval)
    b0, t0 = sim.total_bytes(), sim.now_ms
    sim.run_until(warm_rounds * interval)
    idle = (sim.total_bytes() - b0) / nodes / ((sim.now_ms - t0) / 1000)
    times = []
    for v in victims:
        sim.crash(v)
        t_kill = sim.now_ms
        others = [o for o in ids if sim.by_id[o].up and o != v]

        def all_dead() -> bool:
            return all(sim.by_id[o].gossip.status_of(v) in (DEAD, None) for o in others)
        ok = sim.run_until(t_kill + bound_ms, stop=all_dead, stop_every_ms=10)
        times.append(sim.now_ms - t_kill if ok else float("inf"))
        sim.run_until(sim.now_ms + 10 * interval)
    real_false = [c for c in sim.false_convictions]
    report.metrics["nodes"] = nodes
    report.metrics["loss"] = loss
    report.metrics["stalling nodes"] = f"{stallers} x {stall_ms} ms every {stall_every_ms} ms"
    report.metrics["kills"] = kills
    report.metrics["detection: dead at all, p50 (ms)"] = statistics.median(times) if times else None
    report.metrics["detection: dead at all, max (ms)"] = max(times) if times else None
    report.metrics["detection times (ms)"] = times
    report.metrics["false suspicions"] = len(sim.false_suspicions)
    report.metrics["false convictions"] = len(real_false)
    if wire:
        report.metrics["bytes per node per second (idle, probes included)"] = round(idle)
    report.metrics["refutations"] = sum(sim.by_id[o].gossip.stats["refutations"] for o in ids)
    report.expect(all(t <= bound_ms for t in times), f"a killed node not dead everywhere within {bound_ms} ms")
    report.expect(not real_false, f"false convictions: {real_false[:3]}")
    return _finish(report, sim)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m mesh.testing.gossip_detection", description=__doc__.split("\n")[0])
    p.add_argument("--nodes", type=int, default=200)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--loss", type=float, default=0.01)
    p.add_argument("--kills", type=int, default=3)
    p.add_argument("--stallers", type=int, default=3)
    p.add_argument("--no-wire", action="store_true")
    args = p.parse_args(argv)
    t = time.perf_counter()
    r = scenario_detect(args.nodes, args.seed, args.loss, kills=args.kills, stallers=args.stallers,
                        wire=False if args.no_wire else None)
    print(r.render())
    print(f"  wall time (s): {time.perf_counter() - t:.1f}")
    return 0 if r.ok else 1


if __name__ == "__main__":
    sys.exit(main())
