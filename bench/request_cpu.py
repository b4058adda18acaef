"""CPU per small produce request (``python -m bench.request_cpu``): issue 41's question of
what a DSBS production cell's request costs, in the client and in each broker.

Three brokers, one partition of RF 3 (acks=all; fsync, then write caching), one client in
this process sending ``Producer.send_batch`` of ``--batch`` records of ``--size`` bytes
with up to ``--in-flight`` requests in flight (the DSBS producer's path), ``--requests``
requests after a warm-up. The user+system CPU time of this process and of every broker
process (from /proc) over the run, divided by the requests: CPU time, not wall time, so a
shared machine disturbs it less. The leader is the broker the partition's metadata names.
"""
from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time

from bench.cluster import create_topic
from bench.produce_cpu import cpu_s
from mesh.client import Admin, Producer
from mesh.testing.launcher import Cluster

__all__ = ["measure", "main"]


def _send(p: Producer, topic: str, values: list[bytes], requests: int, in_flight: int) -> None:
    window = []
    for _ in range(requests):
        window.append(p.send_batch(topic, values, partition=0))
        if len(window) >= in_flight:
            window.pop(0).result(30)
    for f in window:
        f.result(30)


def measure(cluster: Cluster, topic: str, size: int, batch: int, requests: int, in_flight: int) -> dict:
    """CPU us per request of the client (this process) and of the leader and followers."""
    values = [b"v" * size] * batch
    with Producer(cluster.bootstrap, max_in_flight=in_flight) as p:
        _send(p, topic, values, min(2_000, requests), in_flight)   # warm-up: connections, caches
        with Admin(cluster.bootstrap) as a:
            leader = a.describe_topic(topic)["partitions"][0]["leader"]
        pids = {b.node_id: b.proc.pid for b in cluster.brokers}
        before = {n: cpu_s(pid) for n, pid in pids.items()}
        c0, t0 = time.process_time(), time.monotonic()
        _send(p, topic, values, requests, in_flight)
        client, wall = time.process_time() - c0, time.monotonic() - t0
        after = {n: cpu_s(pid) for n, pid in pids.items()}
    per = {n: (after[n] - before[n]) / requests * 1e6 for n in pids}
    followers = [v for n, v in per.items() if n != leader]
    return {"client_us": client / requests * 1e6, "leader_us": per[leader],
            "follower_us": sum(followers) / max(1, len(followers)), "requests_per_s": requests / wall}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=int, default=32)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 20])
    ap.add_argument("--requests", type=int, default=20_000)
    ap.add_argument("--in-flight", type=int, default=15)
    args = ap.parse_args(argv)
    d = tempfile.mkdtemp(prefix="request-cpu-")
    try:
        for mode, config in (("fsync", None), ("write caching", {"write.caching": "true"})):
            with Cluster(os.path.join(d, mode.replace(" ", "-")), 3, new_session=True) as c:
                for batch in args.batch:
                    topic = f"cpu-{batch}"
                    create_topic(c.bootstrap, topic, 1, 3, config)
                    r = measure(c, topic, args.size, batch, args.requests, args.in_flight)
                    print(f"{mode:>13}, batch {batch:>3} x {args.size} B: CPU per request: client "
                          f"{r['client_us']:6.1f} us, leader {r['leader_us']:6.1f} us, each follower "
                          f"{r['follower_us']:6.1f} us ({r['requests_per_s']:,.0f} requests/s)", flush=True)
    finally:
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
