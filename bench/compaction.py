"""Compaction throughput and its effect on produce latency on the same partition (issue 40).

    python -m bench.compaction [--writes 100000] [--keys 1000] [--value-bytes 100]
                               [--budget-bytes-per-s 8388608] [--probes 400]

Three local brokers, one partition, replication factor 3. The partition is loaded with
``--writes`` keyed writes over ``--keys`` keys (one in ten a tombstone) while its topic's
``cleanup.policy`` is still ``delete``; then a probe producer (acks=all, one record at a
time, keyed) measures produce latency with no compaction running (baseline). Then the topic
is altered to ``cleanup.policy=compact`` and the probe keeps producing to the same partition
while the leader compacts it; the run ends once the leader applied its cut. Printed (and
written as JSON with ``--out``): compaction MB/s (bytes the leader's compactor read,
scanning and rewriting, over the time it ran), the bytes it removed, the partition's size
before and after, and produce p50/p99 baseline vs during compaction.
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
import urllib.request

from mesh.client import Admin, Producer
from mesh.testing.launcher import Cluster, wait_until


def _metric(url: str, name: str) -> float:
    with urllib.request.urlopen(url, timeout=5) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
    return 0.0


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] * 1000 if xs else float("nan")


def _part(b, topic: str) -> dict:
    with Admin(b.address, request_timeout_ms=5000) as a:
        return a.describe_topic(topic)["partitions"][0]


def run(writes: int, keys: int, value_bytes: int, budget: int, probes: int) -> dict:
    root = tempfile.mkdtemp(prefix="bench-compaction-")
    c = Cluster(root, 3, metrics=True, extra=["--compaction-check-ms", "200",
                                              "--compaction-bytes-per-s", str(budget)]).start()
    try:
        with Admin(c.bootstrap) as a:
            a.create_topic("kv", partitions=1, replication_factor=3)
        rng = random.Random(40)
        pad = b"x" * value_bytes
        with Producer(c.bootstrap, linger_ms=20) as p:
            for i in range(writes):
                p.send("kv", None if rng.random() < 0.1 else pad, key=b"key-%d" % rng.randrange(keys))
            p.flush()
        leader = next(b for b in c.brokers if b.node_id == _part(c.brokers[0], "kv")["leader"])
        before = _part(leader, "kv")
        size_before = before["local_size_bytes"]
        with Producer(leader.address, linger_ms=0) as probe:
            def one(i: int) -> float:
                t0 = time.perf_counter()
                probe.send("kv", b"probe-%d" % i, key=b"probe-%d" % (i % 50)).get(30)
                return time.perf_counter() - t0
            base = [one(i) for i in range(probes)]
            with Admin(c.bootstrap) as a:
                a.alter_topic("kv", config={"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.1"})
            during, i = [], probes
            t_alter = time.monotonic()
            while time.monotonic() - t_alter < 300:
                during.append(one(i))
                i += 1
                if i % 10 == 0:
                    p = _part(leader, "kv")
                    if p.get("local_clean_target", 0) >= writes and p.get("local_clean_end") == p["local_clean_target"]:
                        break
        time.sleep(1.1)   # the metrics snapshot is refreshed once a second (not a wait for the compactor)
        cleaned = _metric(leader.metrics_url, "mesh_compaction_cleaned_bytes_total")
        after = _part(leader, "kv")
        wait_until(lambda: all(_part(b, "kv").get("local_clean_end", 0) >= writes for b in c.brokers), 60,
                   "every replica compacted")
        jobs, job_bytes, job_ms = after["local_compaction"]   # the leader's compactor: jobs, bytes, ms
        secs = max(1e-3, job_ms / 1000)
        return {
            "writes": writes, "keys": keys, "value_bytes": value_bytes, "budget_bytes_per_s": budget,
            "partition_bytes_before": size_before, "partition_bytes_after": after["local_size_bytes"],
            "compactor_read_bytes": job_bytes, "compaction_jobs": jobs, "cleaned_bytes": cleaned,
            "compaction_s": round(secs, 2), "compaction_mb_per_s": round(job_bytes / secs / 1e6, 2),
            "produce_p50_ms_baseline": round(_pct(base, 0.5), 2), "produce_p99_ms_baseline": round(_pct(base, 0.99), 2),
            "produce_p50_ms_compacting": round(_pct(during, 0.5), 2),
            "produce_p99_ms_compacting": round(_pct(during, 0.99), 2),
            "probes_baseline": len(base), "probes_compacting": len(during),
            "produce_mean_ms_baseline": round(statistics.mean(base) * 1000, 2),
        }
    finally:
        c.kill()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--writes", type=int, default=100_000)
    ap.add_argument("--keys", type=int, default=1_000)
    ap.add_argument("--value-bytes", type=int, default=100)
    ap.add_argument("--budget-bytes-per-s", type=int, default=8 << 20)
    ap.add_argument("--probes", type=int, default=400)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    res = run(a.writes, a.keys, a.value_bytes, a.budget_bytes_per_s, a.probes)
    print(json.dumps(res, indent=1))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
