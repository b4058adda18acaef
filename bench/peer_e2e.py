"""End-to-end latency at a fixed rate, for ``bench run --scenario peer-nats``: the same
open-loop measurement against this mesh and against NATS JetStream.

Theory of operation
-------------------
A consumer runs in its own process (so the producer's work does not delay it in one
interpreter, and the other way round); it subscribes, says it is ready, and for every
record takes ``time.time_ns()`` at receipt minus the record's due time, which the
producer wrote into the value's first 8 bytes (``bench.worker_common.STAMP``, in
microseconds). The producer, in this process, follows a ``RateSchedule`` (open loop, as
the OpenMessaging Benchmark does): record k is due at ``t0 + k / rate`` whatever happened
to the records before it, so time spent queued behind a slow request is counted. The
consumer returns its samples (ns) through a queue; ``latency_summary`` turns them into
percentiles. Both clocks are this machine's wall clock.

mesh: ``Producer.send`` with default settings (acks=all, linger 5 ms as an upper bound)
into partition 0 of a 1-partition topic, or into a wider one as a user's unkeyed sends go
(the producer's sticky partitioner: a batch's worth to one partition, then the next; issue
41's 3-partition row, a leader on every broker); the consumer long-polls every partition.
NATS: ``publish_async`` into a 1-replica-set stream; the consumer is an ordered push consumer (the server pushes
each stored message, flow-controlled). Records shorter than 8 bytes are padded to 8 here.
"""
from __future__ import annotations

import asyncio
import multiprocessing as mp
import queue
import time

from bench.pacing import RateSchedule
from bench.scenarios import BenchError
from bench.worker_common import STAMP

__all__ = ["mesh_e2e", "nats_e2e", "value_for"]

_READY_S = 60      # a consumer process must subscribe within this
_TAIL_S = 60       # and receive every record within this after the last one is due
_START_NS = 50_000_000  # the schedule starts this long after the consumer is ready


def value_for(due_ns: int, size: int) -> bytes:
    """A ``size``-byte value (at least 8) stamped with its due time in microseconds."""
    return STAMP.pack(due_ns // 1000) + b"e" * max(0, size - STAMP.size)


def _latency_ns(value: bytes, now_ns: int) -> int:
    return now_ns - STAMP.unpack_from(value)[0] * 1000


def _collect(target, args: tuple, n: int, produce) -> list[int]:
    """Start the consumer process ``target(*args, n, q)``, wait until it is ready, run
    ``produce()`` here, return the consumer's samples (ns)."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    proc = ctx.Process(target=target, args=(*args, n, q), daemon=True)
    proc.start()
    try:
        msg = _next(q, proc, _READY_S, "was not ready")
        if msg != "ready":
            raise BenchError(f"the end-to-end consumer failed: {msg}")
        produce()
        out = _next(q, proc, _TAIL_S, f"did not get all {n:,} records")
        if isinstance(out, str):
            raise BenchError(f"the end-to-end consumer failed: {out}")
        return out
    finally:
        proc.join(10)
        if proc.is_alive():
            proc.kill()


def _count(rate: int, seconds: float) -> int:
    if rate <= 0 or seconds <= 0:
        raise BenchError("the end-to-end phase needs a rate and a duration above 0")
    return max(1, int(rate * seconds))


def _next(q, proc, within_s: float, what: str):
    """The consumer's next message; BenchError if it exits or is silent ``within_s``."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            return q.get(timeout=0.5)
        except queue.Empty:
            if not proc.is_alive():
                raise BenchError(f"the end-to-end consumer exited (code {proc.exitcode}) and {what}") from None
            if time.monotonic() > deadline:
                raise BenchError(f"the end-to-end consumer {what} within {within_s:.0f} s") from None


def _schedule(rate: int, n: int) -> RateSchedule:
    """Started when the producer is connected and the consumer ready, so neither's start
    is counted as latency."""
    return RateSchedule(time.time_ns() + _START_NS, rate, total=n)


# -- mesh -----------------------------------------------------------------------------

def _mesh_consumer(bootstrap: str, topic: str, partitions: int, n: int, q) -> None:
    try:
        from mesh.client import Consumer
        lat: list[int] = []
        with Consumer(bootstrap=bootstrap, auto_offset_reset="earliest") as c:
            c.assign([(topic, p) for p in range(partitions)])
            c.seek_to_beginning()
            q.put("ready")
            deadline = time.monotonic() + _READY_S + _TAIL_S
            while len(lat) < n and time.monotonic() < deadline:
                for recs in c.poll_batches(200):
                    now = time.time_ns()
                    lat.extend(_latency_ns(r.value, now) for r in recs)
        q.put(lat if len(lat) >= n else f"got {len(lat):,} of {n:,} records")
    except Exception as exc:  # reported to the driver, which raises BenchError
        q.put(f"{type(exc).__name__}: {exc}")


def mesh_e2e(bootstrap: str, topic: str, size: int, rate: int, seconds: float, partitions: int = 1) -> dict:
    """Records of ``size`` bytes at ``rate``/s for ``seconds`` into ``topic`` (which exists):
    partition 0 if ``partitions`` is 1, else the producer's own choice among its
    ``partitions``; the consumer's latency summary plus the achieved rate."""
    part = 0 if partitions == 1 else None
    from bench.peer_nats import latency_summary
    from mesh.client import Producer
    n = _count(rate, seconds)
    took: list[float] = []

    def produce() -> None:
        with Producer(bootstrap) as p:  # default settings (acks=all)
            p.connect([topic])
            sched = _schedule(rate, n)
            k = 0
            while k < n:
                due = sched.due_by(time.time_ns())
                while k < due:
                    p.send(topic, value_for(sched.due_ns(k), size), partition=part)
                    k += 1
                if k < n:
                    time.sleep(sched.wait_s(k, time.time_ns()))  # the rate schedule
            took.append((time.time_ns() - sched.t0_ns) / 1e9)
            p.flush(60)

    samples = _collect(_mesh_consumer, (bootstrap, topic, partitions), n, produce)
    return {**latency_summary(samples), "rate": rate, "achieved_rps": n / max(took[0], 1e-9)}


# -- NATS -----------------------------------------------------------------------------

def _nats_consumer(url: str, subject: str, n: int, q) -> None:
    try:
        q.put(asyncio.run(_nats_consume(url, subject, n, q)))
    except Exception as exc:  # reported to the driver, which raises BenchError
        q.put(f"{type(exc).__name__}: {exc}")


async def _nats_consume(url: str, subject: str, n: int, q) -> list[int] | str:
    import nats
    from bench.peer_nats import _quiet
    nc = await nats.connect(servers=url.split(","), max_reconnect_attempts=2, error_cb=_quiet)
    lat: list[int] = []
    done = asyncio.Event()

    async def got(msg) -> None:
        lat.append(_latency_ns(msg.data, time.time_ns()))
        if len(lat) >= n:
            done.set()

    try:
        sub = await nc.jetstream(timeout=10).subscribe(subject, cb=got, ordered_consumer=True)
        q.put("ready")
        try:
            await asyncio.wait_for(done.wait(), _READY_S + _TAIL_S)
        except asyncio.TimeoutError:
            return f"got {len(lat):,} of {n:,} messages"
        await sub.unsubscribe()
    finally:
        await nc.close()
    return lat


async def _nats_produce(url: str, subject: str, size: int, rate: int, n: int, took: list) -> None:
    import nats
    from bench.peer_nats import _quiet
    nc = await nats.connect(servers=url.split(","), max_reconnect_attempts=2, error_cb=_quiet)
    try:
        js = nc.jetstream(timeout=10)
        sched = _schedule(rate, n)
        k = 0
        while k < n:
            due = sched.due_by(time.time_ns())
            while k < due:
                await js.publish_async(subject, value_for(sched.due_ns(k), size))
                k += 1
            if k < n:
                await asyncio.sleep(sched.wait_s(k, time.time_ns()))  # the rate schedule
        took.append((time.time_ns() - sched.t0_ns) / 1e9)
        await asyncio.wait_for(js.publish_async_completed(), 60)
    finally:
        await nc.close()


def nats_e2e(url: str, subject: str, size: int, rate: int, seconds: float) -> dict:
    """As ``mesh_e2e``, against a NATS stream that captures ``subject``."""
    from bench.peer_nats import latency_summary
    n = _count(rate, seconds)
    took: list[float] = []
    samples = _collect(_nats_consumer, (url, subject), n,
                       lambda: asyncio.run(_nats_produce(url, subject, size, rate, n, took)))
    return {**latency_summary(samples), "rate": rate, "achieved_rps": n / max(took[0], 1e-9)}
