"""Disk-fault campaigns on real brokers (``bench diskfaults``), issue 17's closing numbers.

    bench diskfaults --runs 10 --seed 1            # seeded campaigns: lost acknowledged records
    bench diskfaults --runs 0 --refill-mb 100      # time until a wiped replica is in sync again

A campaign run: N brokers, one topic (P partitions, RF 3), producer processes recording
every send (``mesh.testing.history``, the Jepsen checker's recorder) at a steady rate; a
seeded sequence of disk faults (``mesh.testing.diskfaults``: wipe, rollback, truncate,
flip), one broker at a time, waiting between faults until every partition is fully
replicated again; then a kill -9 of one partition's leader; then the producers stop and
everything is read back and checked against the histories (``mesh.testing.checker``):
acknowledged records lost (target 0), duplicates, order.

The refill measurement: 3 brokers, one partition RF 3, about ``--refill-mb`` MB written
(1 KiB records, acks=all), then one follower wiped: seconds until the leader reports it
in the in-sync set again, and the rate that makes.
"""
from __future__ import annotations

import json
import os
import random
import time

from mesh.testing import diskfaults as df
from mesh.testing.checker import check, read_back
from mesh.testing.history import ProducerProcess, load_history
from mesh.testing.launcher import Cluster, wait_until

__all__ = ["campaign", "refill", "FAULTS"]

FAULTS = ("wipe", "rollback", "truncate", "flip")


def _has_ack(path: str) -> bool:
    try:
        with open(path) as f:
            return any('"f":"ok"' in line.replace(" ", "") for line in f)
    except OSError:
        return False


def campaign(workdir: str, seed: int, brokers: int = 5, partitions: int = 6, producers: int = 4,
             rate_per_s: float = 100.0, faults: int = 4, kinds=FAULTS, sync_timeout_s: float = 90.0,
             log=print) -> dict:
    """One seeded run; returns its result (also written to ``workdir/result.json``)."""
    rng = random.Random(seed)
    os.makedirs(workdir, exist_ok=True)
    t0 = time.monotonic()
    cluster = Cluster(os.path.join(workdir, "brokers"), brokers)
    procs: list[ProducerProcess] = []
    applied: list[dict] = []
    try:
        cluster.start(timeout_s=30)
        from mesh.client import Admin
        with Admin(cluster.bootstrap) as a:
            a.create_topic("disk", partitions, 3)
        paths = [os.path.join(workdir, f"history-{i}.jsonl") for i in range(producers)]
        procs = [ProducerProcess(cluster.bootstrap, "disk", i, partitions, rate_per_s, paths[i]).start()
                 for i in range(producers)]
        wait_until(lambda: all(_has_ack(p) for p in paths), 30, "a first acknowledgement", interval_s=0.1)
        # an early copy of one broker's directory, for the rollback faults
        snap_b = cluster.brokers[rng.randrange(brokers)]
        copy = os.path.join(workdir, f"{snap_b.node_id}-copy")
        time.sleep(1.0)  # let the producers write something the copy will not have (a pacing delay, not a wait)
        df.snapshot(snap_b, copy)
        df.wait_in_sync(cluster.brokers, "disk", timeout_s=sync_timeout_s)
        for i in range(faults):
            kind = rng.choice(list(kinds))
            b = snap_b if kind == "rollback" else cluster.brokers[rng.randrange(brokers)]
            t = time.monotonic()
            note = ""
            if kind == "wipe":
                df.wipe(b)
            elif kind == "rollback":
                df.restore(b, copy)
            elif kind == "truncate":
                note = df.truncate(b)
            else:
                marker = f"p{rng.randrange(producers)}-{rng.randrange(1, 50)}".encode()
                if not df.flip(b, marker):
                    note = f"{marker.decode()} not found in {b.node_id}'s store: restarted only"
                    b.start(wait=False)
            took = df.wait_in_sync(cluster.brokers, "disk", timeout_s=sync_timeout_s)
            applied.append({"fault": kind, "broker": b.node_id, "in_sync_after_s": round(took, 2),
                            "at_s": round(t - t0, 2), "note": note})
            log(f"  fault {i + 1}/{faults}: {kind} {b.node_id}: in sync again after {took:.1f} s {note}")
        lead = df.leader_broker(cluster.brokers, "disk", 0)
        lead.kill()
        applied.append({"fault": "kill-leader", "broker": lead.node_id, "at_s": round(time.monotonic() - t0, 2)})
        others = [b for b in cluster.brokers if b is not lead]
        wait_until(lambda: df.leader_broker(others, "disk", 0), 30, "a new leader of disk/0")
        log(f"  killed the leader of disk/0 ({lead.node_id})")
        time.sleep(2.0)  # producers keep writing on the surviving brokers (pacing, not a wait)
        for p in procs:
            p.stop_event.set()
        for p in procs:
            p.stop(60)
        lead.start()
        df.wait_in_sync(cluster.brokers, "disk", timeout_s=sync_timeout_s)
        res = check(load_history(paths), read_back(cluster.bootstrap, "disk", partitions))
        out = {"seed": seed, "faults": applied, "acked": res.acked, "lost": res.lost,
               "duplicated": res.duplicated, "ok": res.ok, "summary": res.summary(),
               "seconds": round(time.monotonic() - t0, 1)}
    except Exception as exc:
        out = {"seed": seed, "faults": applied, "error": f"{type(exc).__name__}: {exc}",
               "seconds": round(time.monotonic() - t0, 1)}
    finally:
        for p in procs:
            if p.process.is_alive():
                p.stop(5)
        cluster.stop()
    with open(os.path.join(workdir, "result.json"), "w") as f:
        json.dump(out, f, indent=1)
    return out


def refill(workdir: str, mb: int = 100, log=print) -> dict:
    """Seconds until a wiped follower of a ~``mb`` MB partition is in sync again."""
    from mesh.client import Admin, Producer
    os.makedirs(workdir, exist_ok=True)
    cluster = Cluster(os.path.join(workdir, "brokers"), 3)
    try:
        cluster.start(timeout_s=30)
        with Admin(cluster.bootstrap) as a:
            a.create_topic("refill", 1, 3)
        value = b"x" * 1024
        batches = max(1, mb * 1024 // 1000)      # 1,000 records of 1 KiB per batch
        t = time.monotonic()
        with Producer(cluster.bootstrap, acks="all", max_in_flight=8) as p:
            futs = []
            for _ in range(batches):
                futs.append(p.send_batch("refill", [value] * 1000, partition=0))
                if len(futs) > 32:
                    futs.pop(0).result(120)
            for f in futs:
                f.result(120)
        write_s = time.monotonic() - t
        records = batches * 1000
        df.wait_in_sync(cluster.brokers, "refill", records, timeout_s=300)
        lead = df.leader_broker(cluster.brokers, "refill")
        victim = next(b for b in cluster.brokers if b is not lead)
        df.wipe(victim)
        took = df.wait_in_sync(cluster.brokers, "refill", records, timeout_s=900)
        size_mb = records * 1024 / 1e6
        out = {"mb": round(size_mb, 1), "records": records, "write_s": round(write_s, 1),
               "wiped": victim.node_id, "in_sync_after_s": round(took, 2),
               "refill_mb_per_s": round(size_mb / max(took, 1e-9), 1)}
        log(f"refill: {size_mb:.0f} MB ({records:,} records of 1 KiB) written in {write_s:.1f} s; wiped "
            f"follower {victim.node_id} back in the in-sync set after {took:.1f} s ({out['refill_mb_per_s']} MB/s)")
        return out
    finally:
        cluster.stop()
