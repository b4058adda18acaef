"""The producer worker: one spawned process per producer of a cell (so the GIL of one
does not throttle another); ``bench.cell`` starts it and waits for its result.

Theory of operation
-------------------
Producer *i* sends its share of the cell's messages (or sends for ``duration_s``),
``batch`` records per request with ``Producer.send_batch`` (round-robin over partitions;
keyed batches use keys that hash to that partition, so they land where Kafka's
partitioner would put them), or record by record with ``Producer.send`` when
``batch == 0``. With a target ``rate`` (split evenly among the producers) records follow
an open-loop schedule (``bench.pacing``): record k is due at ``t0 + k / rate`` and is
stamped with that due time, and latency is measured from it; without a rate, as fast as
flow control allows. Each value starts with its 8-byte due time in microseconds (the
consumer's end-to-end latency). Every batch's future records its ack time in the client's I/O
thread. At the end a producer reports how many records it got acknowledged per partition.

It puts its index on ``ready`` once connected (``Producer.connect``: metadata fetched and
the leaders' connections open, so the first request does not pay for them), starts on ``go``, keeps
its live count in ``progress[idx]``, writes its events (``bench.events``) at the end and
reports through ``results``; an error is reported, never left to hang the coordinator.
"""
from __future__ import annotations

import os
import time
import traceback
from collections import Counter

from bench.events import PRODUCE, EventBuffer
from bench.pacing import RateSchedule
from bench.scenarios import Workload
from bench.worker_common import MIB, STAMP, partition_count, request_bytes

__all__ = ["producer_main", "MIN_SLEEP_S"]

# A paced send() loop sleeps at least this long between wake-ups: at 100,000 rec/s one
# wake-up per record would cost the producer (and a busy machine) more than the sends.
# A record sent up to this late is measured from its due time, so nothing is hidden.
MIN_SLEEP_S = 0.0005


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
        pad = b"m" * max(0, w.message_bytes - 8)
        p.connect(topic, timeout=30)   # metadata and leader connections before the start signal
        ready.put(idx)
        go.wait()
        t0 = time.time_ns()
        end_ns = t0 + int(w.duration_s * 1e9) if not w.messages else None
        rows: list = []   # [partition, send_ns, intended_ns, count, bytes, ack_ns, error]
        sched = RateSchedule(t0, rate, share, end_ns) if rate else None
        if w.batch:
            _produce_batches(p, w, topic, share, sched, end_ns, pools, idx % n_parts, n_parts, pad,
                             rows, progress, idx)
        else:
            _produce_records(p, w, topic, share, sched, end_ns, pad, rows, progress, idx)
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


def _done(row, progress, idx):
    def cb(f):
        row[5] = time.time_ns()
        exc = f.exception()
        if exc is not None:
            row[6] = str(exc)
        else:
            progress[idx] += row[3]
    return cb


def _produce_batches(p, w: Workload, topic: str, share: int, sched: RateSchedule | None, end_ns,
                     pools, part: int, n_parts: int, pad: bytes, rows: list, progress, idx: int, *,
                     clock=time.time_ns, sleep=time.sleep) -> None:
    """batch >= 1: ``batch`` records per ``send_batch``, round-robin over partitions. With a
    schedule, a batch is due when its first record is and is stamped with that time."""
    size, batch = w.message_bytes, w.batch
    sent = 0
    while (sent < share) if share else (clock() < end_ns):
        n = min(batch, share - sent) if share else batch
        if sched is not None:
            if sched.done(sent):
                break
            intended = sched.due_ns(sent)
            wait = sched.wait_s(sent, clock())
            if wait > 0:
                sleep(wait)  # the rate schedule: this batch is not due yet
            send_ns = clock()
        else:
            intended = send_ns = clock()
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
        fut.add_done_callback(_done(row, progress, idx))
        sent += n
        part = (part + 1) % n_parts


def _produce_records(p, w: Workload, topic: str, share: int, sched: RateSchedule | None, end_ns, pad: bytes,
                     rows: list, progress, idx: int, *, clock=time.time_ns, sleep=time.sleep) -> None:
    """batch == 0: one ``send()`` per record; the client batches by linger and batch_bytes.
    One event row per chunk of records handed over together (the records due at once with
    a target rate, else 100); its ack time and partition are those of the chunk's last
    record and its intended time is the last record's due time, so the row's latency is
    that of the last record, measured from when it was due (earlier ones waited up to the
    chunk's span longer; the consumer's end-to-end latency is per record)."""
    size = w.message_bytes
    chunk_max = 100
    sent = 0
    keyed = w.keys
    while (sent < share) if share else (clock() < end_ns):
        now = clock()
        if sched is not None:
            if sched.done(sent):
                break
            n = sched.due_by(now) - sent
            if n <= 0:  # not due yet; at high rates wake at most every MIN_SLEEP_S (what is
                sleep(max(sched.wait_s(sent, now), MIN_SLEEP_S))  # sent late counts as latency)
                continue
            n = min(n, 10 * chunk_max)
        else:
            n = min(chunk_max, share - sent) if share else chunk_max
        last = None
        nbytes = 0
        intended = now
        for j in range(n):
            intended = sched.due_ns(sent + j) if sched is not None else clock()
            stamp_us = intended // 1000
            value = STAMP.pack(stamp_us) + pad if size >= 8 else b"m" * size
            key = b"key-%d" % ((sent + j) % w.key_space) if keyed else None
            nbytes += size + (len(key) if key else 0)
            last = p.send(topic, value, key=key, timestamp_ms=stamp_us // 1000)
        row = [-1, now, intended, n, nbytes, 0, None]  # the last record's intended time
        rows.append(row)

        def ok(md, row=row):
            row[0] = md.partition
            row[5] = clock()
            progress[idx] += row[3]

        def bad(exc, row=row):
            row[5] = clock()
            row[6] = str(exc)

        last.add_callback(ok)
        last.add_errback(bad)
        sent += n
