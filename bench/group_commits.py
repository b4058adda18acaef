"""Group commit latency: how long a native GROUP_COMMIT takes to be acknowledged.

    python -m bench.group_commits [--brokers 3] [--commits 500] [--partitions 6]

Starts ``--brokers`` local brokers (``bench.cluster.LocalCluster``, synced group commit),
a topic, and a group coordinated by one of them; then commits offsets of every partition
of the topic ``--commits`` times, one at a time, straight to the coordinator (a simple
consumer's commit: the path a member's and the text gateway's commits take too), and
prints p50, p99 and max of the time from send to acknowledgement. A commit is answered once
a majority of the group's replicas synced it (``mesh.groups.replication``).
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time

from bench.cluster import LocalCluster, create_topic
from mesh.client.transport import Transport
from mesh.groups import GroupCommit, coordinator_for


def _commit(t: Transport, address: str, group: str, offsets: list) -> float:
    """Seconds until acknowledged (retried while a new coordinator loads the group)."""
    started = time.perf_counter()
    for _ in range(100):
        resp, _ = t.call(address, GroupCommit(group, "", -1, offsets), timeout_ms=10_000)
        if resp.error == 0:
            return time.perf_counter() - started
        time.sleep(0.05)   # retry backoff
    raise RuntimeError(f"commit not acknowledged: {resp}")


def run(brokers: int, commits: int, partitions: int) -> dict:
    with tempfile.TemporaryDirectory() as logs:
        cluster = LocalCluster(brokers, logs).start()
        t = Transport()
        try:
            create_topic(cluster.bootstrap, "commits", partitions, min(3, brokers))
            ids = [b.node_id for b in cluster.brokers]
            group = next(f"bench-{i}" for i in range(1000) if coordinator_for(f"bench-{i}", ids) == ids[0])
            coord = cluster.brokers[0].address
            for n in range(20):   # warm up (the coordinator claims and loads the group)
                _commit(t, coord, group, [["commits", p, n, ""] for p in range(partitions)])
            took = [_commit(t, coord, group, [["commits", p, 100 + n, ""] for p in range(partitions)])
                    for n in range(commits)]
        finally:
            t.close()
            cluster.stop()
    ms = sorted(x * 1000 for x in took)
    return {"brokers": brokers, "commits": commits, "partitions": partitions,
            "p50_ms": round(statistics.median(ms), 2), "p99_ms": round(ms[int(0.99 * (len(ms) - 1))], 2),
            "max_ms": round(ms[-1], 2), "mean_ms": round(statistics.fmean(ms), 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--brokers", type=int, default=3)
    ap.add_argument("--commits", type=int, default=500)
    ap.add_argument("--partitions", type=int, default=6)
    args = ap.parse_args()
    print(json.dumps(run(args.brokers, args.commits, args.partitions)))


if __name__ == "__main__":
    main()
