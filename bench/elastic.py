"""The elastic mesh on real brokers of this machine (issue 14's numbers).

    python -m bench.elastic [--partitions 100] [--mb-per-partition 10] [--rf 3]
                            [--move-rate-bytes 33554432] [--replace-dead-after 10s]

1. fill: 3 brokers, a topic of ``--partitions`` x RF ``--rf``, ``--mb-per-partition`` of
   100-byte records in each partition (bulk ``send_batch``, acks=all);
2. baseline: a producer process writes acks=all batches for 10 s: records/s before;
3. add n4: the same producer runs while n4 joins; time until every broker holds its share
   (replica and preferred-leader counts within 1, no learners left), records/s during the
   move as a fraction of the baseline, and data moved: bytes on n4 at the end and replica
   copies made (``add learner`` steps in the brokers' logs) against the minimum (the
   replicas n4 must hold);
4. death: kill -9 a broker (not n1); time until every partition is back to RF on the live
   brokers, counted from the kill and from ``--replace-dead-after``.
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import re
import tempfile
import time
from collections import Counter

from mesh.client import Admin, Producer
from mesh.testing.launcher import BrokerProcess, Cluster, wait_until
from mesh.testing.workload import balanced, topic_view

_RECORD = b"x" * 100


def _fill(addr, topic, partitions, per_partition_bytes):
    batch = [_RECORD] * 1000
    batches = max(1, per_partition_bytes // (1000 * len(_RECORD)))
    with Producer(addr, acks="all", max_in_flight=8) as p:
        futs = []
        for i in range(batches):
            for part in range(partitions):
                futs.append(p.send_batch(topic, batch, partition=part))
                if len(futs) > 64:
                    futs.pop(0).result(120)
        for f in futs:
            f.result(120)


def _produce_loop(addr, topic, partitions, stop, out):
    """acks=all batches of 100 records round-robin until ``stop``; (time, records acked) per ack."""
    batch = [_RECORD] * 100
    acked = 0
    marks = []
    with Producer(addr, acks="all", max_in_flight=8, delivery_timeout_ms=120_000) as p:
        futs, i = [], 0
        while not stop.is_set():
            futs.append(p.send_batch(topic, batch, partition=i % partitions))
            i += 1
            if len(futs) > 32:
                try:
                    futs.pop(0).result(120)
                    acked += len(batch)
                except Exception:
                    pass
                marks.append((time.time(), acked))
        for f in futs:
            try:
                f.result(120)
                acked += len(batch)
            except Exception:
                pass
        marks.append((time.time(), acked))
    out.put(marks)


def _rate(marks, t0, t1):
    inside = [(t, n) for t, n in marks if t0 <= t <= t1]
    if len(inside) < 2:
        return 0.0
    return (inside[-1][1] - inside[0][1]) / max(1e-9, inside[-1][0] - inside[0][0])


def _learner_steps(log_paths) -> int:
    n = 0
    for path in log_paths:
        try:
            with open(path, errors="replace") as f:
                n += sum(1 for line in f if re.search(r"AddLearner", line))
        except OSError:
            pass
    return n


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--partitions", type=int, default=100)
    ap.add_argument("--mb-per-partition", type=float, default=10.0)
    ap.add_argument("--rf", type=int, default=3)
    ap.add_argument("--move-rate-bytes", type=int, default=32 << 20)
    ap.add_argument("--replace-dead-after", default="10s")
    ap.add_argument("--baseline-s", type=float, default=10.0)
    args = ap.parse_args(argv)
    root = tempfile.mkdtemp(prefix="bench-elastic-")
    extra = ["--move-rate-bytes", str(args.move_rate_bytes), "--replace-dead-after", args.replace_dead_after]
    c = Cluster(root, 3, extra=extra).start()
    n4 = BrokerProcess("n4", os.path.join(root, "n4"), seeds=[c.brokers[0].address], extra=extra)
    ctx = mp.get_context("spawn")
    try:
        topic, P = "el", args.partitions
        with Admin(c.bootstrap) as a:
            a.create_topic(topic, P, args.rf)
        t = time.time()
        _fill(c.bootstrap, topic, P, int(args.mb_per_partition * 1e6))
        print(f"fill: {P} partitions x {args.mb_per_partition:g} MB x RF {args.rf} in {time.time() - t:.1f} s")
        stop, out = ctx.Event(), ctx.Queue()
        proc = ctx.Process(target=_produce_loop, args=(c.bootstrap, topic, P, stop, out))
        proc.start()
        time.sleep(args.baseline_s)          # the baseline window (a benchmark, not a test)
        t_add = time.time()
        n4.start()
        everyone = c.brokers + [n4]
        wait_until(lambda: balanced(everyone, topic, ["n1", "n2", "n3", "n4"], args.rf), 1800,
                   "n4 to take its share", interval_s=0.5)
        t_done = time.time()
        stop.set()
        marks = out.get(timeout=300)
        proc.join(60)
        base = _rate(marks, t_add - args.baseline_s, t_add)
        during = _rate(marks, t_add, t_done)
        parts, brokers = topic_view(everyone, topic)
        on_n4 = Counter(x for p in parts for x in p["replicas"])["n4"]
        copies = _learner_steps([b.log_path for b in everyone])
        n4_bytes = (brokers.get("n4") or {}).get("bytes")
        print(f"add n4: balanced in {t_done - t_add:.1f} s; replicas on n4 {on_n4}; replica copies made {copies} "
              f"(minimum {on_n4}); bytes on n4 {n4_bytes}")
        print(f"produce during the move: {during:,.0f} rec/s vs {base:,.0f} before ({during / max(base, 1):.0%})")
        victim = c.brokers[2]
        t_kill = time.time()
        victim.kill()
        live = [b for b in everyone if b is not victim]
        wait_until(lambda: balanced(live, topic, [b.node_id for b in live], args.rf), 1800,
                   "every partition back to RF", interval_s=0.5)
        t_rf = time.time()
        from tools.node_options import parse_duration_ms
        dead_after = parse_duration_ms(args.replace_dead_after) / 1000
        print(f"death of {victim.node_id}: RF {args.rf} restored {t_rf - t_kill:.1f} s after the kill "
              f"({t_rf - t_kill - dead_after:.1f} s after --replace-dead-after {args.replace_dead_after})")
    finally:
        n4.kill()
        c.kill()


if __name__ == "__main__":
    main()
