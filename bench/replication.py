"""Replication on a real 3-broker cluster of this machine.

    python -m bench.replication [--records 1000000] [--kills 10] [--fault kill,pause]
                                [--skip throughput,failover,latency,idle]

1. throughput: one producer process, bulk ``send_batch`` (1000 x 100-byte records per batch),
   acks=all, RF 3, 6 partitions;
2. failover: a producer with the default settings (acks=all, idempotent) writes one record
   at a time to a 1-partition RF-3 topic; kill -9 (or SIGSTOP, ``--fault pause``) the
   leader and time the first acknowledgement of a send made right after the fault (it
   must come from a new leader), then restart (SIGCONT) the old one and wait until it
   leads again; --kills times per fault; p50 and max;
3. latency: 10,000 records/s (acks=all, RF 3, the producer's default settings, as
   ``bench run --scenario peer-nats`` uses) for 10 s; end-to-end = consumer receive time
   minus the time of the ``send`` call, per record (carried in the value's first 8 bytes:
   the record timestamp has whole milliseconds, which would add 0.5 ms on average);
   produce ack latency per send;
4. idle: 1,000 partitions x RF 3, no traffic: replication messages sent per broker per second;
5. roundtrip: one record at a time (send, wait for the ack) for RF 1 / acks=1, RF 3 / acks=1
   and RF 3 / acks=all: the latency floor without batching or queueing; then a blocking
   ``send().get()`` with the producer's default settings (RF 3, acks=all).

``--secured`` runs the same on a secured cluster (``mesh security init``, CurveZMQ on every
socket, clients with the admin's creds), to compare with the open run; ``--metrics``
turns the brokers' ``/metrics`` on.
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import struct
import tempfile
import time
from pathlib import Path

from mesh.client import Admin, Consumer, Producer
from mesh.testing.launcher import Cluster, wait_until


_SENT = struct.Struct(">d")   # latency records: the send time (time.time()), then padding


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def _bulk(addr, topic, records, out):
    values = [b"x" * 100] * 1000
    with Producer(addr, acks="all", max_in_flight=8) as p:
        t0 = time.perf_counter()
        futs = []
        for i in range(records // 1000):
            futs.append(p.send_batch(topic, values, partition=i % 6))
            if len(futs) > 64:
                futs.pop(0).result(60)
        for f in futs:
            f.result(60)
        out.put(time.perf_counter() - t0)


def throughput(c, records):
    with Admin(c.bootstrap) as a:
        a.create_topic("tput", partitions=6, replication_factor=3)
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_bulk, args=(c.bootstrap, "tput", records, q))
    p.start()
    dt = q.get(timeout=600)
    p.join()
    print(f"throughput: {records} records acks=all RF3 in {dt:.2f} s = {records / dt:,.0f} records/s, "
          f"{records * 100 / dt / 1e6:.1f} MB/s", flush=True)


def failover(c, kills, faults=("kill", "pause")):
    with Admin(c.bootstrap) as a:
        a.create_topic("fo", partitions=1, replication_factor=3)
    with Producer(c.bootstrap, linger_ms=0) as p:
        for fault in faults:
            times = []
            for k in range(kills):
                with Admin(c.bootstrap) as a:
                    t = a.describe_topic("fo")["partitions"][0]
                victim = next(b for b in c.brokers if b.node_id == t["leader"])
                p.send("fo", b"warm").get(10)
                t0 = time.monotonic()
                if fault == "pause":
                    victim.pause()
                else:
                    victim.kill()
                md = p.send("fo", b"probe").get(30)
                times.append(time.monotonic() - t0)
                with Admin(",".join(b.address for b in c.brokers if b is not victim)) as a:
                    now_leader = a.describe_topic("fo")["partitions"][0]["leader"]
                assert now_leader not in (None, victim.node_id), (fault, now_leader)
                print(f"{fault} {k + 1}: leader {victim.node_id}; first send after it acknowledged by "
                      f"{now_leader} after {times[-1]:.2f} s (offset {md.offset})", flush=True)
                if fault == "pause":
                    victim.resume()
                else:
                    victim.start()
                c.wait_converged()
                with Admin(c.bootstrap) as a:  # leadership settles on the preferred replica: the
                    # victim again, unless the balancer moved the preference while it was down
                    def settled() -> bool:
                        now = a.describe_topic("fo")["partitions"][0]
                        return now["leader"] == now["replicas"][0]
                    wait_until(settled, 60, "leadership on the preferred replica")
            print(f"client recovery after a leader {fault}, {len(times)} times: p50 {statistics.median(times):.2f} s, "
                  f"max {max(times):.2f} s", flush=True)


def _consume_latency(addr, topic, n, out):
    lat = []
    with Consumer(topic, bootstrap=addr, auto_offset_reset="latest", fetch_max_wait_ms=100) as c:
        for tp in c.assignment():
            c.position(tp)
        out.put("ready")
        while len(lat) < n:
            for recs in c.poll_batches(1000):
                now = time.time()
                lat.extend((now - _SENT.unpack_from(r.value)[0]) * 1000 for r in recs)
    out.put(lat)


def latency(c, rate=10_000, seconds=10, settle_s=0, linger_ms=5):
    with Admin(c.bootstrap) as a:
        a.create_topic("lat", partitions=3, replication_factor=3)
        print("leaders:", [(p["leader"], p["epoch"]) for p in a.describe_topic("lat")["partitions"]])
        time.sleep(settle_s)
        print("leaders:", [(p["leader"], p["epoch"]) for p in a.describe_topic("lat")["partitions"]])
    n = rate * seconds
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    cons = ctx.Process(target=_consume_latency, args=(c.bootstrap, "lat", n, q))
    cons.start()
    assert q.get(timeout=60) == "ready"
    acks = []
    pad = b"l" * (100 - _SENT.size)
    with Producer(c.bootstrap, acks="all", linger_ms=linger_ms) as p:
        # paced with sleeps, one small burst per millisecond: a busy-wait would hold the GIL
        # and starve the producer's own I/O thread (and take a core from the brokers)
        t0 = time.perf_counter()
        i = 0
        while i < n:
            due = min(n, int((time.perf_counter() - t0) * rate) + 1)
            while i < due:
                sent = time.perf_counter()
                p.send("lat", _SENT.pack(time.time()) + pad).add_callback(
                    lambda md, s=sent: acks.append((time.perf_counter() - s) * 1000))
                i += 1
            time.sleep(0.001)
        p.flush()
    lat = q.get(timeout=120)
    cons.join()
    print(f"latency at {rate} records/s acks=all RF3: end-to-end p50 {pct(lat, .5):.2f} ms, "
          f"p99 {pct(lat, .99):.2f} ms, p99.9 {pct(lat, .999):.2f} ms; produce ack p50 {pct(acks, .5):.2f} ms, "
          f"p99 {pct(acks, .99):.2f} ms", flush=True)


def roundtrip(c, n=300):
    with Admin(c.bootstrap) as a:
        a.create_topic("rt1", partitions=1, replication_factor=1)
        a.create_topic("rt3", partitions=1, replication_factor=3)
    for topic, acks in (("rt1", 1), ("rt3", 1), ("rt3", "all")):
        with Producer(c.bootstrap, acks=acks, linger_ms=0) as p:
            p.send(topic, b"warm").get(10)
            ts = []
            for _ in range(n):
                t = time.perf_counter()
                p.send(topic, b"x" * 100).get(10)
                ts.append((time.perf_counter() - t) * 1000)
        print(f"round trip, {topic[-1] == '3' and 'RF 3' or 'RF 1'}, acks={acks}: p50 {pct(ts, .5):.2f} ms, "
              f"p99 {pct(ts, .99):.2f} ms", flush=True)
    with Producer(c.bootstrap) as p:   # the defaults: acks=all, idempotent, linger_ms=5 as an upper bound
        for _ in range(20):
            p.send("rt3", b"warm").get(10)
        ts = []
        for _ in range(n):
            t = time.perf_counter()
            p.send("rt3", b"x" * 100).get(10)
            ts.append((time.perf_counter() - t) * 1000)
    print(f"blocking send().get(), default producer, RF 3, acks=all: p50 {pct(ts, .5):.2f} ms, "
          f"p99 {pct(ts, .99):.2f} ms", flush=True)


def idle(c):
    with Admin(c.bootstrap) as a:
        for i in range(10):
            a.create_topic(f"idle{i}", partitions=100, replication_factor=3, wait_s=60)
    time.sleep(8)  # let elections, preferred-leader moves and catch-up settle before measuring idle

    def sent():
        out = {}
        for b in c.brokers:
            with Admin(b.address) as a:
                me = next(x for x in a.metadata([]).brokers if x["id"] == b.node_id)
                out[b.node_id] = me["peer_messages_sent"]
        return out
    s0, t0 = sent(), time.monotonic()
    time.sleep(10)
    s1, dt = sent(), time.monotonic() - t0
    rates = {k: (s1[k] - s0[k]) / dt for k in s0}
    print("idle, 1,000 partitions x RF 3 on 3 brokers: peer messages sent per broker per second "
          "(replication + gossip): " + ", ".join(f"{k} {v:.0f}/s" for k, v in sorted(rates.items())), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--kills", type=int, default=10)
    ap.add_argument("--fault", default="kill,pause", help="failover faults: kill, pause or both")
    ap.add_argument("--skip", default="")
    ap.add_argument("--settle", type=float, default=0, help="seconds to wait after creating a topic")
    ap.add_argument("--linger-ms", type=int, default=5,
                    help="the latency producer's linger_ms (5, the producer's default: an upper bound, "
                         "a batch leaves at once when its partition has nothing in flight)")
    ap.add_argument("--metrics", action="store_true", help="brokers with --metrics-port (cost of metrics)")
    ap.add_argument("--secured", action="store_true", help="a secured cluster (CurveZMQ, admin creds)")
    ap.add_argument("--roundtrips", type=int, default=300, help="records sent one at a time per roundtrip line")
    args = ap.parse_args()
    skip = set(args.skip.split(","))
    root = Path(tempfile.mkdtemp(prefix="mesh-repl-"))
    security = {}
    if args.secured:
        from mesh.security import init_secrets
        _, admin = init_secrets(root / "secrets")
        os.environ["MESH_CREDS"] = admin   # every client of this run, worker processes included
        security = {"secrets": str(root / "secrets"), "creds": admin}
    c = Cluster(root / "cluster", 3, metrics=args.metrics, **security).start()
    try:
        if "throughput" not in skip:
            throughput(c, args.records)
        if "latency" not in skip:
            latency(c, settle_s=args.settle, linger_ms=args.linger_ms)
        if "failover" not in skip:
            failover(c, args.kills, tuple(args.fault.split(",")))
        if "roundtrip" not in skip:
            roundtrip(c, args.roundtrips)
        if "idle" not in skip:
            idle(c)
    finally:
        c.kill()


if __name__ == "__main__":
    main()
