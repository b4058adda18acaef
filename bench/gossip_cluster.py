"""Gossip on a real cluster of this machine: detection time, join time, idle traffic.

    python -m bench.gossip_cluster [--nodes 5] [--kills 10] [--topics 100] [--load 8] [--quiet-s 30]

Starts N brokers on 127.0.0.1 (node i seeds from node 1, 200 ms gossip interval), then:
  1. idle traffic: creates --topics topics, waits for the cluster to settle, and measures
     peer bytes sent per node per second over 10 s;
  2. join: starts one more node seeded from node 2 and times until every node lists it alive;
  3. detection: --kills times, kill -9 a random non-seed node and time until every other
     node reports it dead (then restart it and wait until it is alive again);
  4. with --load N: N busy-loop processes run from step 1 (the cluster formed) to the end, and for
     --quiet-s seconds before the kills every node's view of every other is polled: a
     broker that is up but shown suspect or dead by a peer (then, and during the kills,
     apart from the victim) is a false suspicion. The busy loops pause while a victim
     restarts (a broker starting under load 8 misses its start timeout).
"""
from __future__ import annotations

import argparse
import multiprocessing
import os
import random
import signal
import statistics
import tempfile
import time
from pathlib import Path

from mesh.client import Admin
from mesh.wire.errors import MeshError
from mesh.testing.launcher import BrokerProcess, Cluster, wait_until


def brokers(addr):
    with Admin(addr, request_timeout_ms=1000) as a:
        return {b["id"]: b for b in a.metadata([]).brokers}


def _spin() -> None:
    while True:
        pass


def _views(nodes, skip=None):
    """(observer, node, status) for every pair where an up broker is not shown alive."""
    out = []
    for b in nodes:
        if b is skip:
            continue
        try:
            seen = brokers(b.address)
        except Exception:
            continue
        for o in nodes:
            if o is not skip and o is not b and seen.get(o.node_id, {}).get("status") != "alive":
                out.append((b.node_id, o.node_id, seen.get(o.node_id, {}).get("status")))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=5)
    ap.add_argument("--kills", type=int, default=10)
    ap.add_argument("--topics", type=int, default=100)
    ap.add_argument("--load", type=int, default=0, help="busy-loop processes meanwhile")
    ap.add_argument("--quiet-s", type=float, default=30.0, help="with --load: seconds of polling for false suspicions")
    args = ap.parse_args()
    spinners = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(args.load)]
    tmp = Path(tempfile.mkdtemp(prefix="mesh-gossip-"))
    c = Cluster(tmp, args.nodes).start()
    nodes = c.brokers
    try:
        for b in nodes:
            wait_until(lambda: sum(x["status"] == "alive" for x in brokers(b.address).values()) == args.nodes,
                       30, "cluster to form")
        with Admin(nodes[0].address) as a:
            for i in range(args.topics):
                a.create_topic(f"idle-{i:03d}", partitions=3, wait_s=0)
            a._wait_everywhere(lambda ts: len(ts) >= args.topics, 30)
        for p in spinners:   # (once the cluster runs: brokers starting under load 8 time out)
            p.start()
        time.sleep(3)  # let the last deltas and stats settle before measuring idle traffic
        before = {b.node_id: brokers(b.address)[b.node_id]["peer_bytes_sent"] for b in nodes}
        t0 = time.monotonic()
        time.sleep(10)
        dt = time.monotonic() - t0
        rates = [(brokers(b.address)[b.node_id]["peer_bytes_sent"] - before[b.node_id]) / dt for b in nodes]
        print(f"idle gossip traffic, {args.nodes} nodes, {args.topics} topics: "
              f"mean {statistics.mean(rates) / 1000:.2f} KB/s per node, max {max(rates) / 1000:.2f} KB/s")

        joiner = BrokerProcess("join", str(tmp / "join"), seeds=[nodes[1].address])
        t0 = time.monotonic()
        joiner.start(wait=False)
        for b in nodes:
            wait_until(lambda: brokers(b.address).get("join", {}).get("status") == "alive", 30, "join listed",
                       interval_s=0.01)
        print(f"join: listed alive by all {args.nodes} nodes after {time.monotonic() - t0:.2f} s "
              f"(including process start)")
        joiner.kill()
        for b in nodes:
            wait_until(lambda: brokers(b.address)["join"]["status"] == "dead", 30, "joiner dead")

        false = []
        if args.load:
            t_end = time.monotonic() + args.quiet_s
            polls = 0
            while time.monotonic() < t_end:
                false += _views(nodes)
                polls += 1
                time.sleep(0.05)
            print(f"quiet {args.quiet_s:.0f} s under load {args.load}: {polls} polls of every view, "
                  f"{len(false)} false suspicions {false[:5]}")
        times = []
        rng = random.Random(1)
        for k in range(args.kills):
            victim = rng.choice(nodes[1:])
            others = [b for b in nodes if b is not victim]
            t0 = time.monotonic()
            victim.kill()
            pending = set(b.node_id for b in others)
            while pending:
                for b in others:
                    try:
                        if b.node_id in pending and brokers(b.address)[victim.node_id]["status"] == "dead":
                            pending.discard(b.node_id)
                    except MeshError:     # (a starved broker may answer late: ask again)
                        pass
                false += _views(nodes, skip=victim)
                time.sleep(0.02)
            times.append(time.monotonic() - t0)
            print(f"kill {k + 1}: {victim.node_id} declared dead by all others after {times[-1]:.2f} s")
            for p in spinners:       # (a broker starting under load 8 takes longer than its start timeout)
                os.kill(p.pid, signal.SIGSTOP)
            victim.start()
            for b in nodes:
                wait_until(lambda: brokers(b.address)[victim.node_id]["status"] == "alive", 30, "victim back")
            for p in spinners:
                os.kill(p.pid, signal.SIGCONT)
            time.sleep(1 if spinners else 0)
        print(f"detection over {len(times)} kills: p50 {statistics.median(times):.2f} s, max {max(times):.2f} s; "
              f"false suspicions seen (quiet period and kills): {len(false)} {false[:6]}")
    finally:
        for p in spinners:
            if p.pid is not None:
                p.kill()
        for b in nodes:
            b.kill()


if __name__ == "__main__":
    main()
