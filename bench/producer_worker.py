"""The producer worker: one spawned process per producer of a cell (so the GIL of one
does not throttle another); ``bench.cell`` starts it and waits for its result.

Theory of operation
-------------------
Producer *i* sends its share of the cell's messages (or sends for ``duration_s``),
``batch`` records per request with ``Producer.send_batch`` (round-robin over partitions;
keyed batches use keys that hash to that partition, so they land where Kafka's
partitioner would put them), or record by record with ``Producer.send`` when
``batch == 0``. With a target ``rate`` the k-th batch is due at ``t0 + k * batch /
rate_per_producer`` and stamped with that due time; without one, as fast as flow control
allows. Each value starts with its 8-byte due time in microseconds (the consumer's
end-to-end latency). Every batch's future records its ack time in the client's I/O
thread. At the end a producer reports how many records it got acknowledged per partition.

It puts its index on ``ready`` once connected (metadata fetched), starts on ``go``, keeps
its live count in ``progress[idx]``, writes its events (``bench.events``) at the end and
reports through ``results``; an error is reported, never left to hang the coordinator.
"""
from __future__ import annotations

import os
import time
import traceback
from collections import Counter

from bench.events import PRODUCE, EventBuffer
from bench.scenarios import Workload
from bench.worker_common import MIB, STAMP, partition_count, request_bytes

__all__ = ["producer_main"]


def _key_pools(partitions: int, key_space: int) -> list[list[bytes]]:
    from mesh.wire.partitioner import partition_for_key
    pools: list[list[bytes]] = [[] for _ in range(partitions)]
    i = 0
    while any(not p for p in pools) or i < key_space:
        k = b"key-%d" % i
        pools[partition_for_key(k, partitions)].append(k)
        i += 1
        if i > key_space * 100 + 10_000:
            break
    return pools


def producer_main(spec: dict, idx: int, ready, go, progress, results, events_dir: str) -> None:
    try:
        results.put(("producer", idx, _produce(spec, idx, ready, go, progress, events_dir)))
    except BaseException as exc:  # report, do not hang the coordinator
        results.put(("producer", idx, {"error": f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"}))


def _produce(spec: dict, idx: int, ready, go, progress, events_dir: str) -> dict:
    from mesh.client import Producer
    w = Workload(**spec["workload"])
    topic, cell_id = spec["topic"], spec["cell"]
    share = w.messages // w.producers + (1 if idx < w.messages % w.producers else 0) if w.messages else 0
    rate = w.rate / w.producers if w.rate else 0.0
    if not share and rate:  # a duration at a fixed rate is a count
        share = int(rate * w.duration_s)
    max_req = max(MIB, request_bytes(w))
    p = Producer(spec["bootstrap"], acks=w.acks, linger_ms=w.linger_ms,
                 batch_size=w.batch_bytes, max_in_flight=w.in_flight, max_record_bytes=max_req,
                 buffer_memory=max(64 * MIB, 8 * max_req))
    ev = EventBuffer(PRODUCE)
    acked = Counter()
    errors = 0
    try:
        n_parts = partition_count(p, topic)
        pools = _key_pools(n_parts, w.key_space) if w.keys else None
        size, pad_len = w.message_bytes, max(0, w.message_bytes - 8)
        pad = b"m" * pad_len
        ready.put(idx)
        go.wait()
        t0 = time.time_ns()
        end_ns = t0 + int(w.duration_s * 1e9) if not w.messages else None
        rows: list = []   # [partition, send_ns, intended_ns, count, bytes, ack_ns, error]

        def done(row):
            def cb(f):
                row[5] = time.time_ns()
                exc = f.exception()
                if exc is not None:
                    row[6] = str(exc)
                else:
                    progress[idx] += row[3]
            return cb

        sent = 0
        k = 0
        part = idx % n_parts
        batch = w.batch
        if batch:
            while (sent < share) if share else (time.time_ns() < end_ns):
                n = min(batch, share - sent) if share else batch
                if rate:
                    intended = t0 + int(k * batch / rate * 1e9)
                    if end_ns and intended >= end_ns:
                        break
                    wait = (intended - time.time_ns()) / 1e9
                    if wait > 0:
                        time.sleep(wait)  # the rate schedule: this batch is not due yet
                    send_ns = time.time_ns()
                else:
                    intended = send_ns = time.time_ns()
                stamp_us = intended // 1000
                value = STAMP.pack(stamp_us) + pad if size >= 8 else b"m" * size
                keys = None
                if pools:
                    pool = pools[part]
                    keys = [pool[(sent + j) % len(pool)] for j in range(n)]
                nbytes = n * size + (sum(map(len, keys)) if keys else 0)
                row = [part, send_ns, intended, n, nbytes, 0, None]
                fut = p.send_batch(topic, [value] * n, partition=part, keys=keys, timestamp_ms=stamp_us // 1000)
                rows.append(row)
                fut.add_done_callback(done(row))
                sent += n
                k += 1
                part = (part + 1) % n_parts
        else:
            _produce_records(p, w, topic, share, rate, t0, end_ns, pad, rows, progress, idx)
        p.flush()
    finally:
        p.close()
    for part, send_ns, intended, n, nbytes, ack_ns, err in rows:
        ev.add(cell=cell_id, producer=idx, partition=part, send_ns=send_ns, intended_ns=intended,
               ack_ns=ack_ns or send_ns, count=n, bytes=nbytes, error=err)
        if err is None:
            acked[part] += n
        else:
            errors += 1
    ev.write(os.path.join(events_dir, PRODUCE, f"{cell_id}-p{idx}.parquet"))
    first_error = next((r[6] for r in rows if r[6]), None)
    return {"acked": dict(acked), "batches": len(rows), "errors": errors, "first_error": first_error}


def _produce_records(p, w: Workload, topic: str, share: int, rate: float, t0: int, end_ns, pad: bytes,
                     rows: list, progress, idx: int) -> None:
    """batch == 0: one ``send()`` per record; the client batches by linger and batch_bytes.
    One event row per chunk of records handed over together (the records due at once with
    a target rate, else 100); its ack time and partition are those of the chunk's last
    record, so its latency is that of the last record (earlier ones waited up to the
    chunk's span longer; the consumer's end-to-end latency is per record)."""
    size = w.message_bytes
    chunk_max = 100
    sent = 0
    keyed = w.keys
    while (sent < share) if share else (time.time_ns() < end_ns):
        now = time.time_ns()
        if rate:
            due = int((now - t0) / 1e9 * rate) + 1
            if share:
                due = min(due, share)
            n = due - sent
            if n <= 0:
                time.sleep(max(0.0, (t0 + (sent + 1) / rate * 1e9 - now) / 1e9))  # not due yet
                continue
            n = min(n, 10 * chunk_max)
        else:
            n = min(chunk_max, share - sent) if share else chunk_max
        last = None
        nbytes = 0
        intended = now
        for j in range(n):
            intended = t0 + int((sent + j) / rate * 1e9) if rate else time.time_ns()
            stamp_us = intended // 1000
            value = STAMP.pack(stamp_us) + pad if size >= 8 else b"m" * size
            key = b"key-%d" % ((sent + j) % w.key_space) if keyed else None
            nbytes += size + (len(key) if key else 0)
            last = p.send(topic, value, key=key, timestamp_ms=stamp_us // 1000)
        row = [-1, now, intended, n, nbytes, 0, None]  # the last record's intended time
        rows.append(row)

        def ok(md, row=row):
            row[0] = md.partition
            row[5] = time.time_ns()
            progress[idx] += row[3]

        def bad(exc, row=row):
            row[5] = time.time_ns()
            row[6] = str(exc)

        last.add_callback(ok)
        last.add_errback(bad)
        sent += n
