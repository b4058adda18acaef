"""Metadata at scale: a 10,000-partition topic on real brokers, and 100,000 partitions of
cluster metadata in the gossip simulator.

    python -m bench.metadata_scale [--real-only | --sim-only] [--partitions 10000]
                                   [--brokers 20,50] [--topics 1000] [--seed 7]

(a) Real brokers (3, on this machine): idle gossip bytes per broker per second (each
    broker's ``peer_bytes_sent`` over a few seconds), then the time of one create call
    for a topic of ``--partitions`` partitions at replication factor 3 (target < 5 s),
    the time until every broker lists it with a leader for every partition, the time
    until every partition is led by its preferred replica and how many were elected more
    than once on the way (a successor that won hands leadership back), the idle
    bytes again with the topic in place, then failover: kill -9 one broker and time until
    another lists every partition it led with a new leader (and how many of them needed
    more than one election).
(b) The gossip simulator (``mesh.testing.gossip_sim``: the real gossip core, msgpack on
    the wire, simulated time), for each ``--brokers`` count: ``--topics`` topics of 100
    partitions at RF 3 written as the brokers write them (``topic/`` headers and
    ``tparts/`` chunks from ``mesh.cluster.catalog``, each leader's ``lead/`` and
    ``stats/`` chunks), every value checked by ``mesh.cluster.schema``. Reported: rounds
    (200 ms each) until every broker holds all of it, bytes per broker per round while
    spreading, idle bytes per broker per second, and the rounds for one new broker to
    join and learn everything, and the seconds until one broker restarted from its
    snapshot (a new generation, its leaderships published again) is back in sync.

Short by design (2-core machines): the real part takes ~30 s, each simulated size ~1 min
at 20 brokers. Exit status 1 if the create call misses 5 s or a simulation does not
converge.
"""
from __future__ import annotations

import argparse
import hashlib
import sys
import tempfile
import time

from mesh.cluster import keys
from mesh.cluster.catalog import Topic, topic_registers
from mesh.cluster.placement import place_replicas
from mesh.cluster.schema import REGISTER_PREFIXES, validate_entry
from mesh.gossip import Gossip, GossipConfig
from mesh.testing.gossip_sim import NetConfig, Simulation, address_of
from mesh.wire.topic_config import normalize_config

__all__ = ["real_brokers", "simulate", "main"]

CREATE_TARGET_S = 5.0


# ------------------------------------------------------------------ real brokers ----------

def _peer_bytes(b) -> int:
    me = [x for x in b.metadata(5000).brokers if x["id"] == b.node_id]
    return me[0].get("peer_bytes_sent", 0) if me else 0


def _idle_rate(brokers, window_s: float) -> float:
    """Mean gossip bytes per broker per second over ``window_s``."""
    before = [_peer_bytes(b) for b in brokers]
    t = time.monotonic()
    time.sleep(window_s)   # a measurement window, not a wait for a condition
    dt = time.monotonic() - t
    after = [_peer_bytes(b) for b in brokers]
    return sum(a - b for a, b in zip(after, before)) / len(brokers) / dt


def real_brokers(partitions: int, rf: int = 3, window_s: float = 4.0, list_timeout_s: float = 60.0) -> dict:
    from mesh.client import Admin
    from mesh.testing.launcher import Cluster, wait_until
    from mesh.wire.messages import CreateTopicRequest, MetadataRequest

    out: dict = {"partitions": partitions, "brokers": 3, "replication_factor": rf}
    root = tempfile.mkdtemp(prefix="metadata-scale-")
    c = Cluster(root, 3).start()
    try:
        out["idle bytes/broker/s before"] = round(_idle_rate(c.brokers, window_s))
        with Admin(c.bootstrap, request_timeout_ms=60_000) as a:
            t0 = time.monotonic()
            a.timeout_ms = 120_000
            resp = a._call(CreateTopicRequest("wide", partitions, rf, {}))   # on to the topic's owner
            a.timeout_ms = 60_000
            out["create call s"] = round(time.monotonic() - t0, 2)
            if resp.error:
                raise RuntimeError(f"create failed: {resp}")

            def led(b) -> int:
                """Partitions of the topic that ``b`` lists with a leader."""
                b.check_running()
                r, _ = a.transport.call(b.address, MetadataRequest(["wide"]), timeout_ms=30_000)
                t = r.topics[0]
                return 0 if t.get("error") else sum(1 for p in t["partitions"] if p["leader"])
            try:
                for b in c.brokers:
                    wait_until(lambda b=b: led(b) == partitions, max(1.0, t0 + list_timeout_s - time.monotonic()),
                               f"{b.node_id} to list the topic with leaders", interval_s=0.2)
                out["listed everywhere with leaders s"] = round(time.monotonic() - t0, 2)
            except AssertionError:
                out["listed everywhere with leaders s"] = f"> {list_timeout_s:.0f}"
                out["with a leader at the end"] = [led(b) for b in c.brokers]
            out.update(_settled(a, c.brokers[0].address, partitions, t0, list_timeout_s))
        for b in c.brokers:
            b.check_running()
        out["idle bytes/broker/s after"] = round(_idle_rate(c.brokers, window_s))
        out.update(_failover(c, partitions, list_timeout_s))
    finally:
        c.kill()
    return out


def _wide(a, address: str) -> list[dict]:
    """The ``wide`` topic's partitions as the broker at ``address`` lists them ([] if none)."""
    from mesh.wire.messages import MetadataRequest
    r, _ = a.transport.call(address, MetadataRequest(["wide"]), timeout_ms=30_000)
    t = r.topics[0]
    return [] if t.get("error") else t["partitions"]


def _settled(a, address: str, partitions: int, t0: float, timeout_s: float) -> dict:
    """After a create: the seconds until every partition is led by its preferred replica,
    and how many elections that took (epoch 1: the first election was the last one)."""
    from mesh.testing.launcher import wait_until
    try:
        ps = wait_until(lambda: (ps := _wide(a, address)) and len(ps) == partitions
                        and all(p["leader"] == p["replicas"][0] for p in ps) and ps,
                        max(1.0, t0 + timeout_s - time.monotonic()), "every partition on its preferred leader",
                        interval_s=0.2)
    except AssertionError:
        return {"create: all on their preferred leader s": f"> {timeout_s:.0f}"}
    epochs = [p["epoch"] for p in ps]
    return {"create: all on their preferred leader s": round(time.monotonic() - t0, 2),
            "create: elections per partition (max)": max(epochs),
            "create: partitions elected more than once": sum(1 for e in epochs if e > 1)}


def _failover(c, partitions: int, timeout_s: float) -> dict:
    """Kill -9 the last broker (after ``_settled``: creation's handovers done); the seconds
    until the first one lists every partition with a leader other than it (leaders as
    gossiped), and how many elections that took."""
    from mesh.client import Admin
    from mesh.testing.launcher import wait_until

    victim, survivor = c.brokers[-1], c.brokers[0]
    with Admin(c.bootstrap, request_timeout_ms=60_000) as a:
        def parts() -> list[dict]:
            return _wide(a, survivor.address)

        gone = (victim.node_id, victim.address)
        before = {p["partition"]: p for p in parts()}
        moved = sum(1 for p in before.values() if p["leader"] in gone)
        victim.kill()
        t0 = time.monotonic()
        try:
            after = wait_until(lambda: (ps := parts()) and len(ps) == partitions
                               and all(p["leader"] and p["leader"] not in gone for p in ps) and ps,
                               timeout_s, "every partition to have a live leader", interval_s=0.1)
            took: object = round(time.monotonic() - t0, 2)
        except AssertionError:
            return {"failover: partitions the killed broker led": moved,
                    "failover: all led elsewhere s": f"> {timeout_s:.0f}"}
    extra = [after_p["epoch"] - before[after_p["partition"]]["epoch"] for after_p in after
             if before.get(after_p["partition"], {}).get("leader") in gone]
    return {"failover: partitions the killed broker led": moved, "failover: all led elsewhere s": took,
            "failover: elections per partition (max)": max(extra, default=0),
            "failover: partitions needing more than one election": sum(1 for e in extra if e > 1)}


# ------------------------------------------------------------------ simulator -------------

def _node(sim: Simulation, node_id: str, seeds: list[str], cfg: GossipConfig) -> Gossip:
    g = Gossip(node_id, address_of(node_id), 1, seeds, sim.node_rng(node_id), cfg, sim.now_ms,
               validate_entry=validate_entry, register_prefixes=REGISTER_PREFIXES)
    sim.add(g)
    return g


def _converged(gs: list[Gossip]) -> bool:
    """Every node holds one cluster store and every node's latest version of every node."""
    first = gs[0]
    h = first.cluster_hash()
    want = {g.node_id: g.digest_entry(g.node_id) for g in gs}
    for g in gs:
        if g.cluster_hash() != h:
            return False
        for o, row in want.items():
            mine = g.digest_entry(o)
            if mine is None or mine[0] != row[0] or mine[2] != row[2]:   # (generation, max version)
                return False
    return True


def _metadata(ids: list[str], topics: int, partitions: int, rf: int, seed: int):
    """(registers by writer, namespace entries by node): the cluster's metadata as brokers
    write it."""
    regs: dict[str, dict] = {o: {} for o in ids}
    ns: dict[str, dict] = {o: {} for o in ids}
    load: dict[str, int] = {}
    for i in range(topics):
        name = f"topic-{i:04d}"
        uuid = hashlib.blake2b(f"{seed}/{name}".encode(), digest_size=8).hexdigest()
        replicas = place_replicas(partitions, rf, ids, load)
        for reps in replicas:
            load[reps[0]] = load.get(reps[0], 0) + 1
        t = Topic(name, uuid, partitions, rf, normalize_config({}), tuple(tuple(r) for r in replicas))
        regs[ids[i % len(ids)]].update(topic_registers(t))
        for p, reps in enumerate(replicas):
            k = keys.chunk_of(p)
            ns[reps[0]].setdefault(keys.lead_key(name, k), {})[str(p)] = 1
            ns[reps[0]].setdefault(keys.stats_key(name, k), {})[str(p)] = [0, 1000 + p, 1000 + p]
    return regs, ns


def simulate(brokers: int, topics: int = 1000, partitions: int = 100, rf: int = 3, seed: int = 7,
             idle_rounds: int = 10) -> dict:
    cfg = GossipConfig.lan()
    interval = cfg.interval_ms
    sim = Simulation(seed, cfg, NetConfig(), full_check_every=10_000)
    sim.checkers = []                          # the scenarios check safety; this measures cost
    ids = [f"n{i:03d}" for i in range(brokers)]
    first = _node(sim, ids[0], [], cfg)
    gs = [first] + [_node(sim, o, [first.address], cfg) for o in ids[1:]]
    if not sim.run_until(sim.now_ms + 100 * interval, stop=lambda: _converged(gs), stop_every_ms=interval):
        raise RuntimeError("the cluster did not form")
    regs, ns = _metadata(ids, topics, partitions, rf, seed)
    t_build = time.perf_counter()
    for g in gs:
        for k, v in regs[g.node_id].items():
            g.put_cluster(k, v)
        for k, v in ns[g.node_id].items():
            g.set_local(k, v)
    entries = sum(map(len, regs.values())) + sum(map(len, ns.values()))
    b0, t0 = sim.total_bytes(), sim.now_ms
    ok = sim.run_until(t0 + 600 * interval, stop=lambda: _converged(gs), stop_every_ms=interval)
    rounds = (sim.now_ms - t0) / interval
    out = {"brokers": brokers, "partitions": topics * partitions, "gossip entries": entries,
           "converged": ok, "rounds to converge": round(rounds, 1),
           "bytes/broker/round while spreading": round((sim.total_bytes() - b0) / brokers / max(rounds, 1))}
    b1, t1 = sim.total_bytes(), sim.now_ms
    sim.run_until(t1 + idle_rounds * interval)
    out["idle bytes/broker/s"] = round((sim.total_bytes() - b1) / brokers / ((sim.now_ms - t1) / 1000))
    joiner = _node(sim, "joiner", [first.address], cfg)
    gs.append(joiner)
    t2 = sim.now_ms
    joined = sim.run_until(t2 + 600 * interval, stop=lambda: _converged(gs), stop_every_ms=interval)
    out["rounds for a new broker to learn it all"] = round((sim.now_ms - t2) / interval, 1) if joined else None
    # one broker restarts (kill -9, back 5 s later from its snapshot, a new generation): its
    # shell publishes its leaderships again; time until every broker holds all of it again
    victim = gs[1]
    snap = victim.snapshot()
    sim.crash(victim.node_id)
    sim.run_until(sim.now_ms + 5_000)
    back = sim.restart(victim.node_id, snap)
    for k, v in ns[victim.node_id].items():
        back.set_local(k, v)
    gs[1] = back
    t3 = sim.now_ms
    resynced = sim.run_until(t3 + 600 * interval, stop=lambda: _converged(gs), stop_every_ms=interval)
    out["one broker restarted: back in sync after (s)"] = round((sim.now_ms - t3) / 1000, 1) if resynced else None
    out["converged"] = ok and joined and resynced
    out["wall s"] = round(time.perf_counter() - t_build, 1)
    return out


# ------------------------------------------------------------------ main ------------------

def _print(title: str, row: dict) -> None:
    print(title + ": " + ", ".join(f"{k} {v}" for k, v in row.items()), flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.metadata_scale", description=__doc__.split("\n")[0])
    p.add_argument("--real-only", action="store_true")
    p.add_argument("--sim-only", action="store_true")
    p.add_argument("--partitions", type=int, default=10_000, help="(a) partitions of the one wide topic")
    p.add_argument("--rf", type=int, default=3, help="(a) its replication factor")
    p.add_argument("--brokers", default="20", help="(b) simulated broker counts, comma-separated")
    p.add_argument("--topics", type=int, default=1000, help="(b) topics of 100 partitions")
    p.add_argument("--seed", type=int, default=7)
    args = p.parse_args(argv)
    failed = False
    if not args.sim_only:
        row = real_brokers(args.partitions, args.rf)
        _print("real brokers", row)
        failed |= row["create call s"] >= CREATE_TARGET_S
    if not args.real_only:
        for n in (int(x) for x in args.brokers.split(",") if x):
            row = simulate(n, topics=args.topics, seed=args.seed)
            _print("simulator", row)
            failed |= not row["converged"]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
