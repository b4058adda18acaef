"""The workload driver: producer and consumer *processes* (spawned, so the GIL of one does
not throttle another), coordinated per cell by the bench process.

Theory of operation
-------------------
For each cell the coordinator creates a fresh topic, spawns the workers and waits until
each has connected and fetched metadata ("ready"); then it sets one "go" event and
records that instant as the phase start. In ``split`` mode producers run to completion,
then consumers are spawned and started; in ``streaming`` mode consumers are started
first, then both get the same "go".

Producers: producer *i* sends its share of the cell's messages (or sends for
``duration_s``), ``batch`` records per request with ``Producer.send_batch`` (round-robin
over partitions; keyed batches use keys that hash to that partition, so they land where
Kafka's partitioner would put them), or record by record with ``Producer.send`` when
``batch == 0``. With a target ``rate`` the k-th batch is due at ``t0 + k * batch /
rate_per_producer`` and stamped with that due time; without one, as fast as flow control
allows. Each value starts with its 8-byte due time in microseconds (the consumer's
end-to-end latency). Every batch's future records its ack time in the client's I/O
thread. At the end a producer reports how many records it got acknowledged per partition.

Consumers: consumer *j* of *C* is assigned partitions ``j, j+C, ...`` (no group) and
reads from the beginning until it has the records the producers reported for its
partitions (the coordinator publishes that count once the producers are done). Records
missing after ``idle_timeout_s`` without progress are an error, not a silent pass.

Workers write their events (``bench.events``) at the end of their phase and report
through a queue; live progress goes through one shared counter per worker.
"""
from __future__ import annotations

import dataclasses
import multiprocessing as mp
import os
import queue as queue_mod
import struct
import time
import traceback
from collections import Counter
from dataclasses import dataclass

from bench.events import CONSUME, PRODUCE, EventBuffer, append_cell
from bench.scenarios import BenchError, Cell, Workload

__all__ = ["CellResult", "run_cell", "check_group_support", "topic_config"]

_STAMP = struct.Struct(">q")
_MIB = 1 << 20


def check_group_support() -> None:
    try:
        import mesh.client.group  # noqa: F401
    except ImportError:
        raise BenchError("consumer groups are not supported by this broker build yet "
                         "(mesh.client.group is missing); run without --group") from None


def _partitions(client, topic: str, timeout_s: float = 60.0) -> int:
    """The topic's partition count, retrying while a busy broker is slow to answer."""
    from mesh.wire.errors import MeshError
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return client.cluster.partitions(topic)
        except MeshError as exc:
            if not exc.retriable or time.monotonic() > deadline:
                raise
            time.sleep(0.2)  # back off before asking again


def request_bytes(w: Workload) -> int:
    """Upper bound of one produce request's record batch."""
    per = w.message_bytes + (12 if w.keys else 0) + 16
    n = w.batch if w.batch else max(1, w.batch_bytes // max(1, w.message_bytes))
    return n * per + 4096


def topic_config(w: Workload) -> dict:
    """Raise max.message.bytes when a batch of large messages needs it (128 KB x 50)."""
    need = request_bytes(w)
    return {"max.message.bytes": need} if need > _MIB else {}


@dataclass
class CellResult:
    cell: str
    produced: int
    consumed: int
    produce_s: float
    consume_s: float
    errors: int


# -- workers (run in spawned processes) ----------------------------------------------------
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


def _producer_main(spec: dict, idx: int, ready, go, progress, results, events_dir: str) -> None:
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
    max_req = max(_MIB, request_bytes(w))
    p = Producer(spec["bootstrap"], acks=w.acks, linger_ms=w.linger_ms,
                 batch_size=w.batch_bytes, max_in_flight=w.in_flight, max_record_bytes=max_req,
                 buffer_memory=max(64 * _MIB, 8 * max_req), client_id=f"bench-p{idx}")
    ev = EventBuffer(PRODUCE)
    acked = Counter()
    errors = 0
    try:
        n_parts = _partitions(p, topic)
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
                value = _STAMP.pack(stamp_us) + pad if size >= 8 else b"m" * size
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
            value = _STAMP.pack(stamp_us) + pad if size >= 8 else b"m" * size
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


def _consumer_main(spec: dict, idx: int, ready, go, progress, expected, results, events_dir: str) -> None:
    try:
        results.put(("consumer", idx, _consume(spec, idx, ready, go, progress, expected, events_dir)))
    except BaseException as exc:
        results.put(("consumer", idx, {"error": f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"}))


def _consume(spec: dict, idx: int, ready, go, progress, expected, events_dir: str) -> dict:
    from mesh.client import Consumer
    w = Workload(**spec["workload"])
    topic, cell_id = spec["topic"], spec["cell"]
    idle_timeout_s = spec["idle_timeout_s"]
    max_req = max(_MIB, request_bytes(w))
    kwargs = {"group_id": f"{w.group}-{cell_id}"} if w.group else {}  # one group per cell
    c = Consumer(bootstrap=spec["bootstrap"], auto_offset_reset="earliest",
                 max_partition_fetch_bytes=max(4 * _MIB, max_req), fetch_max_bytes=max(32 * _MIB, 2 * max_req),
                 **kwargs)
    ev = EventBuffer(CONSUME)
    got = Counter()
    try:
        n_parts = _partitions(c, topic)
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
        unpack = _STAMP.unpack_from
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
                    else:
                        stamps = Counter(unpack(r.value)[0] for r in recs)
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


# -- coordinator (the bench process) --------------------------------------------------------
class _Phase:
    """Spawned workers of one side, their ready/go handshake and live counters."""

    def __init__(self, ctx, kind: str, n: int, target, spec: dict, results, events_dir: str,
                 expected=None):
        self.kind, self.n = kind, n
        self.ready = ctx.Queue()
        self.go = ctx.Event()
        self.progress = ctx.Array("q", n, lock=False)
        self.procs = []
        for i in range(n):
            args = (spec, i, self.ready, self.go, self.progress)
            args += ((expected,) if expected is not None else ()) + (results, events_dir)
            pr = ctx.Process(target=target, args=args, name=f"bench-{kind}-{i}", daemon=True)
            pr.start()
            self.procs.append(pr)

    def wait_ready(self, timeout_s: float, results) -> None:
        deadline = time.monotonic() + timeout_s
        seen = 0
        while seen < self.n:
            try:
                self.ready.get(timeout=0.2)
                seen += 1
            except queue_mod.Empty:
                _raise_worker_error(results)
                for pr in self.procs:
                    if pr.exitcode not in (None, 0):
                        raise BenchError(f"{pr.name} exited with code {pr.exitcode} before it was ready")
                if time.monotonic() > deadline:
                    raise BenchError(f"{self.kind}s not ready after {timeout_s:.0f} s")

    def total(self) -> int:
        return sum(self.progress[:])

    def kill(self) -> None:
        for pr in self.procs:
            if pr.is_alive():
                pr.terminate()
        for pr in self.procs:
            pr.join(5)


_pending_results: list = []


def _raise_worker_error(results) -> None:
    """Drain ``results``; raise the first worker error."""
    while True:
        try:
            item = results.get_nowait()
        except queue_mod.Empty:
            return
        _pending_results.append(item)
        kind, idx, res = item
        if "error" in res:
            raise BenchError(f"{kind} {idx} failed: {res['error']}")


def _collect(results, kind: str, n: int, phase: _Phase, bar, deadline: float, totals=None) -> dict:
    """Wait for ``n`` results of ``kind``; keep the progress bars moving meanwhile."""
    out = {}
    last = 0
    while len(out) < n:
        _raise_worker_error(results)
        for item in [x for x in _pending_results if x[0] == kind]:
            _pending_results.remove(item)
            out[item[1]] = item[2]
        if len(out) >= n:
            break
        for b, ph in totals or [(bar, phase)]:
            if b is not None:
                cur = ph.total()
                b.update(cur - b.n)
        for i, pr in enumerate(phase.procs):
            if i not in out and pr.exitcode not in (None, 0):
                time.sleep(0.5)  # its error report may still be in the queue
                _raise_worker_error(results)
                raise BenchError(f"{pr.name} died with exit code {pr.exitcode}")
        if time.monotonic() > deadline:
            raise BenchError(f"{kind}s did not finish within the phase timeout")
        time.sleep(0.1 if last == phase.total() else 0.05)  # progress display cadence
        last = phase.total()
    return out


def _log_ends(bootstrap: str, topic: str, settle: bool) -> list[int]:
    """Each partition's log end, asked of its leader (another broker's gossiped view of a
    partition it does not lead may lag)."""
    from mesh.client import Consumer
    with Consumer(bootstrap=bootstrap) as c:
        tps = [(topic, q) for q in range(_partitions(c, topic))]

        def ends():
            got = c.end_offsets(tps)
            return [got[tp] for tp in sorted(got, key=lambda tp: tp.partition)]
        now = ends()
        while settle:  # acks=0: wait until the brokers have taken in what was sent
            time.sleep(0.3)
            again = ends()
            settle, now = again != now, again
    return now


def _bar(tqdm, desc: str, total: int | None, position: int, quiet: bool):
    if tqdm is None or quiet:
        return None
    return tqdm(total=total, desc=desc, unit="rec", unit_scale=True, position=position, leave=False,
                dynamic_ncols=True, mininterval=0.25, smoothing=0.3)


def run_cell(cell: Cell, bootstrap: str, run_dir: str, run_id: str, *, quiet: bool = False,
             timeout_s: float = 600.0, idle_timeout_s: float = 30.0, keep_topic: bool = False,
             echo=print) -> CellResult:
    """Measure one cell; append its row to cells.jsonl; return the counts."""
    from bench.cluster import create_topic, delete_topic
    try:
        from tqdm import tqdm
    except ImportError:
        tqdm = None
    w = cell.workload
    if w.group:
        check_group_support()
    topic = f"bench-{run_id}-{cell.id}"
    create_topic(bootstrap, topic, w.partitions, w.replication_factor, topic_config(w))
    events_dir = os.path.join(run_dir, "events")
    spec = {"workload": dataclasses.asdict(w), "topic": topic, "cell": cell.id, "bootstrap": bootstrap,
            "idle_timeout_s": idle_timeout_s}
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    expected = ctx.Array("q", [-1] * max(1, w.consumers), lock=False)
    _pending_results.clear()
    prod = cons = None
    pbar = cbar = None
    row = {"cell": cell.id, "label": cell.label, "index": cell.index, "topic": topic, **dataclasses.asdict(w)}
    started = time.monotonic()
    try:
        if w.mode == "streaming":
            cons = _Phase(ctx, "consumer", w.consumers, _consumer_main, spec, results, events_dir, expected)
            cons.wait_ready(60, results)
        prod = _Phase(ctx, "producer", w.producers, _producer_main, spec, results, events_dir)
        prod.wait_ready(60, results)
        total = w.messages or None
        pbar = _bar(tqdm, f"{cell.id} produce", total, 1, quiet)
        if cons is not None:
            cbar = _bar(tqdm, f"{cell.id} consume", total, 2, quiet)
        go_ns = time.time_ns()
        row["produce_go_ns"] = go_ns
        if cons is not None:
            row["consume_go_ns"] = go_ns
            cons.go.set()
        prod.go.set()
        deadline = time.monotonic() + timeout_s
        bars = [(pbar, prod)] + ([(cbar, cons)] if cons is not None else [])
        pres = _collect(results, "producer", w.producers, prod, pbar, deadline, bars)
        row["produce_end_ns"] = time.time_ns()
        acked = Counter()
        for r in pres.values():
            acked.update({int(k): v for k, v in r["acked"].items()})
        errors = sum(r["errors"] for r in pres.values())
        produced = sum(acked.values())
        if errors:
            first = next(r["first_error"] for r in pres.values() if r["first_error"])
            echo(f"warning: {cell.id}: {errors} produce requests failed, e.g. {first}")
        if pbar is not None:
            pbar.close()
        # what each consumer must read: the log end of its partitions (a fresh topic starts
        # at 0; with acks=0 only the log knows what arrived)
        ends = _log_ends(bootstrap, topic, settle=w.acks == "0")
        row["log_end"] = sum(ends)
        if w.batch and w.acks != "0":  # send_batch rows know their partition exactly
            ends = [max(e, acked.get(q, 0)) for q, e in enumerate(ends)]
        for j in range(w.consumers):
            if w.group:  # the broker assigns: all stop when the group has read everything
                expected[j] = sum(ends)
            else:
                expected[j] = sum(e for q, e in enumerate(ends) if q % w.consumers == j)
        consumed = 0
        if w.consumers:
            if cons is None:  # split: consumption starts now, on a topic that is complete
                cons = _Phase(ctx, "consumer", w.consumers, _consumer_main, spec, results, events_dir, expected)
                cons.wait_ready(60, results)
                cbar = _bar(tqdm, f"{cell.id} consume", produced, 1, quiet)
                row["consume_go_ns"] = time.time_ns()
                cons.go.set()
            elif cbar is not None:
                cbar.total = produced
                cbar.refresh()
            cres = _collect(results, "consumer", w.consumers, cons, cbar, time.monotonic() + timeout_s)
            row["consume_end_ns"] = time.time_ns()
            consumed = sum(r["total"] for r in cres.values())
            if cbar is not None:
                cbar.close()
        row.update(produced=produced, consumed=consumed, produce_errors=errors,
                   wall_s=round(time.monotonic() - started, 3))
        append_cell(run_dir, row)
        p_s = (row["produce_end_ns"] - row["produce_go_ns"]) / 1e9
        c_s = (row["consume_end_ns"] - row["consume_go_ns"]) / 1e9 if w.consumers else 0.0
        return CellResult(cell.id, produced, consumed, p_s, c_s, errors)
    finally:
        for b in (pbar, cbar):
            if b is not None:
                b.close()
        for ph in (prod, cons):
            if ph is not None:
                ph.kill()
        if not keep_topic:
            delete_topic(bootstrap, topic)
