"""How quiet is this machine right now: two figures taken before a run, written beside its
results, so that runs made at different times can be compared fairly.

Theory of operation
-------------------
Latency on a small shared machine (a 2-core VM here) depends less on our code than on how
fast the host wakes a sleeping process and how fast the disk syncs, and both drift by
half or more from one hour to the next while a pure-CPU loop runs at the same speed. So
``probe`` measures exactly those two:

- wake-up round trip: a ZeroMQ DEALER in this process and a ROUTER echo in another
  (spawned) process on 127.0.0.1, one 1-byte message at a time with a 0.5 ms pause
  between round trips (so each one starts from sleeping processes, as a broker's request
  does at moderate load). A round trip is six thread wake-ups (each side's application
  thread and ZeroMQ I/O thread), the floor under every request of the mesh;
- synced commit: a put of 2 kB and a commit in a fresh LMDB environment under the run's
  directory (LMDB's default, fully synced commit: two fdatasyncs), what every broker turn
  with appends waits for.

A few seconds in all. A probe that fails says why in the result; it never fails a run.
"""
from __future__ import annotations

import multiprocessing as mp
import shutil
import tempfile
import time

from bench.peer_nats import latency_summary

__all__ = ["probe", "describe", "floor_ms"]

_ROUNDS = 1000
_COMMITS = 300


def _echo(port_q) -> None:
    import zmq
    ctx = zmq.Context()
    s = ctx.socket(zmq.ROUTER)
    s.setsockopt(zmq.LINGER, 0)
    port_q.put(s.bind_to_random_port("tcp://127.0.0.1"))
    try:
        while True:
            m = s.recv_multipart()
            if m[1] == b"q":
                return
            s.send_multipart(m)
    finally:
        s.close()
        ctx.term()


def wakeup_rtt_us(rounds: int = _ROUNDS) -> tuple[float, float]:
    """p50 and p99 (microseconds) of a ZeroMQ round trip to another process."""
    import zmq
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    proc = ctx.Process(target=_echo, args=(q,), daemon=True)
    proc.start()
    zctx = zmq.Context()
    d = zctx.socket(zmq.DEALER)
    d.setsockopt(zmq.LINGER, 0)
    d.setsockopt(zmq.RCVTIMEO, 5_000)
    try:
        d.connect(f"tcp://127.0.0.1:{q.get(timeout=30)}")
        for _ in range(50):  # connect and warm up
            d.send(b"x")
            d.recv()
        ts = []
        for _ in range(rounds):
            t = time.perf_counter_ns()
            d.send(b"x")
            d.recv()
            ts.append(time.perf_counter_ns() - t)
            time.sleep(0.0005)  # start each round trip from sleeping processes
        d.send(b"q")
        s = latency_summary(ts)
        return s["p50_ms"] * 1000, s["p99_ms"] * 1000
    finally:
        d.close()
        zctx.term()
        proc.join(5)
        if proc.is_alive():
            proc.kill()


def sync_commit_ms(directory: str | None = None, commits: int = _COMMITS) -> tuple[float, float]:
    """p50 and p99 (milliseconds) of a synced LMDB commit of one 2 kB put."""
    import lmdb
    path = tempfile.mkdtemp(prefix="calibrate-", dir=directory)
    try:
        env = lmdb.open(path, map_size=64 << 20, max_dbs=1)
        try:
            ts = []
            for i in range(commits):
                t = time.perf_counter_ns()
                with env.begin(write=True) as tx:
                    tx.put(i.to_bytes(8, "big"), b"c" * 2048)
                ts.append(time.perf_counter_ns() - t)
                time.sleep(0.001)  # as a broker's turns come apart
        finally:
            env.close()
        s = latency_summary(ts)
        return s["p50_ms"], s["p99_ms"]
    finally:
        shutil.rmtree(path, ignore_errors=True)


def probe(directory: str | None = None) -> dict:
    """Both figures; a part that fails is replaced by its error (a run goes on)."""
    out: dict = {}
    for key, fn, args in (("wakeup_rtt_us", wakeup_rtt_us, ()), ("sync_commit_ms", sync_commit_ms, (directory,))):
        try:
            p50, p99 = fn(*args)
            out[key] = {"p50": round(p50, 3), "p99": round(p99, 3)}
        except Exception as exc:  # a probe must not cost the run
            out[key] = {"error": f"{type(exc).__name__}: {exc}"}
    return out


def describe(cal: dict | None) -> str:
    """One line for a report's setup table."""
    if not cal:
        return "-"
    parts = []
    for key, label, unit, fmt in (("wakeup_rtt_us", "ZeroMQ round trip between two processes", "us", "{:.0f}"),
                                  ("sync_commit_ms", "synced LMDB commit", "ms", "{:.2f}")):
        v = cal.get(key) or {}
        if "p50" in v:
            parts.append(f"{label} p50 {fmt.format(v['p50'])} {unit} (p99 {fmt.format(v['p99'])})")
        elif v.get("error"):
            parts.append(f"{label}: {v['error']}")
    return "; ".join(parts) or "-"


def floor_ms(cal: dict | None, round_trips: int = 2, syncs: int = 1) -> float | None:
    """The physical floor of a blocking write on this host right now, in ms: ``round_trips``
    ZeroMQ round trips and ``syncs`` synced LMDB commits at the probe's p50 (an RF-3
    acks=all write: client -> leader -> follower and back, one sync on the path; issue 41
    measures the fsync mode against twice this). None if either part failed."""
    rtt, sync = ((cal or {}).get(k) or {} for k in ("wakeup_rtt_us", "sync_commit_ms"))
    if "p50" not in rtt or "p50" not in sync:
        return None
    return round_trips * rtt["p50"] / 1000 + syncs * sync["p50"]
