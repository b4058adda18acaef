"""The history recorder of the Jepsen-style checker: producer processes that write down
every send.

Theory of operation
-------------------
Each producer is its own OS process (not a thread: the GIL would measure itself), with
one ``Producer`` at its default settings (acks=all, idempotent) unless told otherwise. It
sends unique values ``p<proc>-<n>`` at a steady rate, round-robin over the topic's
partitions (an explicit partition, so a failed send still says where it went), and
appends to its own JSON-lines file:

    {"f": "invoke", "v": "p0-17", "p": 2, "t": <monotonic s>}
    {"f": "ok",   "v": "p0-17", "p": 2, "offset": 311, "ap": 2, "t": ...}
    {"f": "fail", "v": "p0-17", "p": 2, "error": "...", "maybe_written": false, "t": ...}
    {"f": "info", "v": "p0-17", "p": 2, "error": "..." | null, "t": ... | null}

``ok`` is an acknowledgement; ``fail`` a definite failure (the error says the record was
not written); ``info`` an unknown outcome (the error says it may have been written, says
nothing, or no answer came before the producer stopped). The invoke line is written
before ``send()``, so a value found in the log but in no history is a phantom.

Times are ``time.monotonic()``: one clock for every process on the machine (Linux's
CLOCK_MONOTONIC), so the nemesis's fault times compare with the sends' times.

The process stops when its stop event is set: it flushes for ``drain_s``, records what
is still pending as ``info`` and closes the file.
"""
from __future__ import annotations

import collections
import json
import multiprocessing
import os
import time
from dataclasses import dataclass

__all__ = ["Op", "ProducerProcess", "load_history", "producer_main", "value_of"]


def value_of(proc: int, n: int) -> bytes:
    return b"p%d-%d" % (proc, n)


def parse_value(v: bytes | str) -> tuple[int, int] | None:
    """``(proc, n)`` of a value this recorder wrote, else None."""
    s = v.decode("ascii", "replace") if isinstance(v, (bytes, bytearray)) else v
    if not s.startswith("p") or "-" not in s:
        return None
    a, _, b = s[1:].partition("-")
    if not (a.isdigit() and b.isdigit()):
        return None
    return int(a), int(b)


@dataclass
class Op:
    """One send, from invocation to its outcome."""
    proc: int
    n: int
    value: str
    partition: int
    invoke_t: float
    outcome: str = "info"  # "ok" | "fail" | "info"
    offset: int | None = None
    done_t: float | None = None
    error: str | None = None
    maybe_written: bool | None = None
    ack_partition: int | None = None  # the partition the acknowledgement named


def _outcome_of(exc: BaseException) -> tuple[str, bool | None]:
    """``fail`` when the error says the record was not written, else ``info``."""
    mw = getattr(exc, "maybe_written", None)
    if mw is False:
        return "fail", False
    return "info", mw


def producer_main(bootstrap: str, topic: str, proc: int, partitions: int, rate_per_s: float,
                  path: str, stop, drain_s: float = 20.0, producer_options: dict | None = None) -> None:
    """The body of one producer process (see the module docstring)."""
    from mesh.client import Producer
    done: collections.deque = collections.deque()  # filled by the producer's I/O thread
    out = open(path, "w", buffering=1)  # line-buffered: the harness watches it

    def write(rec: dict) -> None:
        out.write(json.dumps(rec, separators=(",", ":")) + "\n")

    def drain() -> None:
        while done:
            write(done.popleft())

    def on_done(v: str, p: int, md, exc) -> None:
        t = time.monotonic()
        pending.pop(v, None)
        if exc is None:
            done.append({"f": "ok", "v": v, "p": p, "offset": md.offset, "ap": md.partition, "t": t})
        else:
            f, mw = _outcome_of(exc)
            done.append({"f": f, "v": v, "p": p, "error": f"{type(exc).__name__}: {exc}",
                         "maybe_written": mw, "t": t})

    pending: dict[str, tuple[int, object]] = {}
    producer = Producer(bootstrap, **(producer_options or {}))
    try:
        interval_s = 1.0 / rate_per_s
        next_t = time.monotonic()
        n = 0
        while not stop.is_set():
            now = time.monotonic()
            if now < next_t:
                stop.wait(min(next_t - now, 0.05))
                drain()
                continue
            next_t = max(next_t + interval_s, now - 1.0)  # a stall does not become a burst
            v, p = value_of(proc, n).decode(), n % partitions
            n += 1
            write({"f": "invoke", "v": v, "p": p, "t": time.monotonic()})
            try:
                fut = producer.send(topic, v.encode(), partition=p)
            except Exception as exc:  # refused before it was queued: never written
                write({"f": "fail", "v": v, "p": p, "error": f"{type(exc).__name__}: {exc}",
                       "maybe_written": False, "t": time.monotonic()})
                continue
            pending[v] = (p, fut)
            fut.add_callback(lambda md, v=v, p=p: on_done(v, p, md, None))
            fut.add_errback(lambda exc, v=v, p=p: on_done(v, p, None, exc))
            drain()
        try:
            producer.flush(drain_s)
        except Exception:
            pass
        drain()
    finally:
        try:
            producer.close(1.0)
        except Exception:
            pass
        drain()
        for v, (p, _) in list(pending.items()):
            write({"f": "info", "v": v, "p": p, "error": None, "t": None})
        out.close()


class ProducerProcess:
    """One recorder process (``multiprocessing`` with spawn: a clean interpreter)."""

    def __init__(self, bootstrap: str, topic: str, proc: int, partitions: int, rate_per_s: float,
                 path: str, drain_s: float = 20.0, producer_options: dict | None = None):
        ctx = multiprocessing.get_context("spawn")
        self.path = path
        self.stop_event = ctx.Event()
        self.process = ctx.Process(target=producer_main, name=f"jepsen-producer-{proc}", daemon=True,
                                   args=(bootstrap, topic, proc, partitions, rate_per_s, path,
                                         self.stop_event, drain_s, producer_options))

    def start(self) -> "ProducerProcess":
        self.process.start()
        return self

    def stop(self, timeout_s: float = 60.0) -> None:
        self.stop_event.set()
        self.process.join(timeout_s)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(5)


def load_history(paths: list[str]) -> list[Op]:
    """Every send of every history file, in invocation order per process. An op whose
    outcome line is missing (the process died) stays ``info``."""
    ops: list[Op] = []
    for path in paths:
        by_value: dict[str, Op] = {}
        if not os.path.exists(path):
            continue
        with open(path) as f:
            for line in f:
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue  # a torn last line of a killed process
                v = rec["v"]
                if rec["f"] == "invoke":
                    pn = parse_value(v)
                    if pn is None:
                        continue
                    op = by_value[v] = Op(pn[0], pn[1], v, rec["p"], rec["t"])
                    ops.append(op)
                    continue
                op = by_value.get(v)
                if op is None:
                    continue
                op.outcome, op.done_t = rec["f"], rec.get("t")
                op.offset, op.error = rec.get("offset"), rec.get("error")
                op.maybe_written = rec.get("maybe_written")
                op.ack_partition = rec.get("ap", op.partition)
    return ops
