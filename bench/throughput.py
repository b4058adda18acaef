"""Single-broker throughput: one broker, one producer process, one consumer process.

    python -m bench.throughput [--records 2000000] [--size 100] [--batch 1000] [--acks 1]

Starts a broker on a free 127.0.0.1 port in a temporary directory (synced group commit,
as in production), then measures, each in its own process:
  1. bulk produce (``Producer.send_batch``: records pre-built into batches),
  2. plain per-record ``Producer.send()``,
  3. consume everything from the beginning (``Consumer.poll_batches``, records decoded).
Prints records/s and MB/s for each.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shutil
import tempfile
import time

from mesh.testing.launcher import BrokerProcess, free_port


def _bulk_producer(addr, topic, partitions, records, size, batch, acks, out):
    from mesh.client import Producer
    value = b"x" * size
    values = [value] * batch
    with Producer(addr, acks=acks, max_in_flight=8) as p:
        t0 = time.perf_counter()
        futs = []
        sent = 0
        i = 0
        while sent < records:
            n = min(batch, records - sent)
            futs.append(p.send_batch(topic, values[:n] if n < batch else values, partition=i % partitions))
            sent += n
            i += 1
            if len(futs) > 256:
                futs.pop(0).result()
        p.flush()
        for f in futs:
            f.result()
        dt = time.perf_counter() - t0
    out.put(("bulk produce", records, records * size, dt))


def _send_producer(addr, topic, partitions, records, size, acks, out):
    from mesh.client import Producer
    value = b"y" * size
    with Producer(addr, acks=acks, linger_ms=5, batch_size=128 << 10) as p:
        t0 = time.perf_counter()
        send = p.send
        for _ in range(records):
            send(topic, value)
        p.flush()
        dt = time.perf_counter() - t0
    out.put(("send() produce", records, records * size, dt))


def _consumer(addr, topic, records, size, out):
    from mesh.client import Consumer
    c = Consumer(topic, bootstrap=addr, auto_offset_reset="earliest",
                 max_partition_fetch_bytes=4 << 20, fetch_max_bytes=32 << 20)
    got = 0
    nbytes = 0
    t0 = time.perf_counter()
    while got < records:
        for recs in c.poll_batches(2000):
            got += len(recs)
            nbytes += sum(len(r.value) for r in recs)
    dt = time.perf_counter() - t0
    c.close()
    out.put(("consume", got, nbytes, dt))


def run(args) -> list[dict]:
    tmp = tempfile.mkdtemp(prefix="mesh-bench-")
    broker = BrokerProcess("b1", os.path.join(tmp, "b1"), metrics_port=free_port() if args.metrics else None)
    addr = broker.address
    results = []
    try:
        broker.start()
        from mesh.client import Admin
        with Admin(addr) as a:
            a.create_topic("bench", args.partitions)
            a.create_topic("bench-send", args.partitions)
        ctx = mp.get_context("spawn")
        out = ctx.Queue()
        acks = "all" if args.acks == "all" else int(args.acks)
        phases = [
            (_bulk_producer, (addr, "bench", args.partitions, args.records, args.size, args.batch, acks, out)),
            (_send_producer, (addr, "bench-send", args.partitions, args.send_records, args.size, acks, out)),
            (_consumer, (addr, "bench", args.records, args.size, out)),
        ]
        for fn, fargs in phases:
            proc = ctx.Process(target=fn, args=fargs)
            proc.start()
            name, n, nbytes, dt = out.get(timeout=600)
            proc.join()
            row = {"phase": name, "records": n, "seconds": round(dt, 3),
                   "records_per_s": round(n / dt), "MB_per_s": round(nbytes / dt / 1e6, 1)}
            results.append(row)
            print(f"{name:>15}: {n:>9} records in {dt:6.2f} s = {n / dt:>10,.0f} records/s, "
                  f"{nbytes / dt / 1e6:6.1f} MB/s", flush=True)
    finally:
        broker.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=2_000_000)
    ap.add_argument("--send-records", type=int, default=500_000)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--batch", type=int, default=1000, help="records per send_batch call")
    ap.add_argument("--partitions", type=int, default=6)
    ap.add_argument("--acks", default="1", choices=["0", "1", "all"])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--metrics", action="store_true", help="broker with --metrics-port (cost of metrics)")
    args = ap.parse_args()
    res = run(args)
    if args.json:
        print(json.dumps(res))


if __name__ == "__main__":
    main()
