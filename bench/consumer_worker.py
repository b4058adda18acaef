"""The consumer worker: one spawned process per consumer of a cell; ``bench.cell`` starts
it and waits for its result.

Theory of operation
-------------------
Consumer *j* of *C* is assigned partitions ``j, j+C, ...`` (no group) and reads from the
beginning until it has the records the producers reported for its partitions (the
coordinator publishes that count in ``expected[j]`` once the producers are done). Records
missing after ``idle_timeout_s`` without progress are an error, not a silent pass. With
``--group`` the broker assigns the partitions and every member stops when the group as a
whole has read everything.

Each received batch is recorded with its stamps run-length encoded; distinct stamps (a
paced ``send()`` gives each record its own) are rounded down to ``STAMP_QUANTUM_US``,
so an end-to-end latency may read up to that much high, never low.

It puts its index on ``ready`` once connected, starts on ``go``, keeps its live count in
``progress[idx]``, writes its events (``bench.events``) at the end and reports through
``results``.
"""
from __future__ import annotations

import os
import time
import traceback
from collections import Counter

from bench.events import CONSUME, EventBuffer
from bench.scenarios import BenchError, Workload
from bench.worker_common import MIB, STAMP, STAMP_QUANTUM_US, partition_count, request_bytes

__all__ = ["consumer_main"]


def consumer_main(spec: dict, idx: int, ready, go, progress, expected, results, events_dir: str) -> None:
    try:
        results.put(("consumer", idx, _consume(spec, idx, ready, go, progress, expected, events_dir)))
    except BaseException as exc:
        results.put(("consumer", idx, {"error": f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"}))


def _consume(spec: dict, idx: int, ready, go, progress, expected, events_dir: str) -> dict:
    from mesh.client import Consumer
    w = Workload(**spec["workload"])
    topic, cell_id = spec["topic"], spec["cell"]
    idle_timeout_s = spec["idle_timeout_s"]
    max_req = max(MIB, request_bytes(w))
    kwargs = {"group_id": f"{w.group}-{cell_id}"} if w.group else {}  # one group per cell
    c = Consumer(bootstrap=spec["bootstrap"], auto_offset_reset="earliest",
                 max_partition_fetch_bytes=max(4 * MIB, max_req), fetch_max_bytes=max(32 * MIB, 2 * max_req),
                 **kwargs)
    ev = EventBuffer(CONSUME)
    got = Counter()
    try:
        n_parts = partition_count(c, topic)
        mine = list(range(idx, n_parts, w.consumers))
        if w.group:
            c.subscribe([topic])
            if w.mode == "streaming":  # join before "go" (the topic is still empty)
                deadline = time.monotonic() + 20
                while not c.assignment() and time.monotonic() < deadline:
                    assert not c.poll_batches(100), "records in a streaming topic before go"
        else:
            c.assign([(topic, q) for q in mine])
            c.seek_to_beginning()
        stamped = w.message_bytes >= 8
        unpack = STAMP.unpack_from
        total = 0
        seen = 0   # what this consumer (no group) or the whole group has read
        last_progress = time.monotonic()
        ready.put(idx)
        go.wait()
        while True:
            batches = c.poll_batches(100)
            recv_ns = time.time_ns()
            for recs in batches:
                n = len(recs)
                first, last = recs[0], recs[-1]
                if stamped:
                    a, b = unpack(first.value)[0], unpack(last.value)[0]
                    if a == b:
                        stamps = {a: n}
                    else:  # per-record stamps (paced send()) to STAMP_QUANTUM_US: fewer rows
                        q = STAMP_QUANTUM_US
                        stamps = Counter(unpack(r.value)[0] // q * q for r in recs)
                else:
                    stamps = Counter(r.timestamp * 1000 for r in recs)
                nbytes = sum(len(r.value) for r in recs)
                if first.key is not None:
                    nbytes += sum(len(r.key) for r in recs if r.key)
                ev.add(cell=cell_id, consumer=idx, partition=first.partition, recv_ns=recv_ns, count=n,
                       bytes=nbytes, first_offset=first.offset, ts_us=list(stamps), ts_n=list(stamps.values()))
                got[first.partition] += n
                total += n
            if batches:
                progress[idx] = total
            # with a group the broker assigns partitions: every member stops when the group
            # as a whole has read everything
            now_seen = sum(progress[:]) if w.group else total
            if now_seen != seen:
                seen, last_progress = now_seen, time.monotonic()
            want = expected[idx]
            if want >= 0 and seen >= want:
                break
            if want >= 0 and time.monotonic() - last_progress > idle_timeout_s:
                who = f"group {w.group}" if w.group else f"consumer {idx} (partitions {mine})"
                raise BenchError(f"{who} read {seen} of {want} records and nothing new for {idle_timeout_s:.0f} s")
    finally:
        c.close()
    ev.write(os.path.join(events_dir, CONSUME, f"{cell_id}-c{idx}.parquet"))
    return {"got": dict(got), "total": sum(got.values())}
