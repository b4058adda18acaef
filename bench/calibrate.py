"""How quiet is this machine right now: four figures taken before a run, written beside its
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
- raw TCP round trip: the same exchange over a plain socket pair (TCP_NODELAY), each
  side's application thread only: two wake-ups. Not part of any floor; it says what
  ZeroMQ's I/O threads add to every hop (issue 41: measured 17 us against 107-201 us);
- synced commit: a put of 2 kB and a commit in a fresh LMDB environment under the run's
  directory (LMDB's default, fully synced commit: two fdatasyncs), what every broker turn
  with appends waits for; and the same with 3 processes committing at the same moment,
  each in its own environment: an RF-3 write's replicas sync together, and on this
  machine they share one disk (measured: 0.29 ms alone, 0.52 ms 3 at once).

A few seconds in all. A probe that fails says why in the result; it never fails a run.
"""
from __future__ import annotations

import multiprocessing as mp
import shutil
import socket
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


def _round_trips(send, recv, rounds: int) -> tuple[float, float]:
    """p50 and p99 (microseconds) of ``rounds`` one-byte round trips after 50 to connect and
    warm up, 0.5 ms apart: each starts from sleeping processes."""
    for _ in range(50):
        send(b"x")
        recv()
    ts = []
    for _ in range(rounds):
        t = time.perf_counter_ns()
        send(b"x")
        recv()
        ts.append(time.perf_counter_ns() - t)
        time.sleep(0.0005)  # start each round trip from sleeping processes
    s = latency_summary(ts)
    return s["p50_ms"] * 1000, s["p99_ms"] * 1000


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
        try:
            return _round_trips(d.send, d.recv, rounds)
        finally:
            d.send(b"q")
    finally:
        d.close()
        zctx.term()
        proc.join(5)
        if proc.is_alive():
            proc.kill()


def _tcp_echo(port_q) -> None:
    with socket.create_server(("127.0.0.1", 0)) as srv:
        port_q.put(srv.getsockname()[1])
        conn, _ = srv.accept()
        with conn:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            while (b := conn.recv(64)) and b != b"q":
                conn.sendall(b)


def tcp_rtt_us(rounds: int = _ROUNDS) -> tuple[float, float]:
    """p50 and p99 (microseconds) of a plain TCP round trip to another process, measured as
    ``wakeup_rtt_us`` is."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    proc = ctx.Process(target=_tcp_echo, args=(q,), daemon=True)
    proc.start()
    try:
        with socket.create_connection(("127.0.0.1", q.get(timeout=30)), timeout=5) as s:
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            try:   # one byte each way: a recv returns it whole
                return _round_trips(s.sendall, lambda: s.recv(64), rounds)
            finally:
                s.sendall(b"q")
    finally:
        proc.join(5)
        if proc.is_alive():
            proc.kill()


def _commits(directory: str | None, commits: int, barrier=None) -> list[int]:
    """Nanoseconds of each synced commit of one 2 kB put in a fresh environment; with a
    ``barrier``, each commit starts when every party's does."""
    import lmdb
    path = tempfile.mkdtemp(prefix="calibrate-", dir=directory)
    try:
        env = lmdb.open(path, map_size=64 << 20, max_dbs=1)
        try:
            ts = []
            for i in range(commits):
                if barrier is not None:
                    barrier.wait(30)
                t = time.perf_counter_ns()
                with env.begin(write=True) as tx:
                    tx.put(i.to_bytes(8, "big"), b"c" * 2048)
                ts.append(time.perf_counter_ns() - t)
                time.sleep(0.001)  # as a broker's turns come apart
            return ts
        finally:
            env.close()
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _commits_in(q, barrier, directory, commits) -> None:
    try:
        q.put(_commits(directory, commits, barrier))
    except Exception as exc:
        barrier.abort()
        q.put(f"{type(exc).__name__}: {exc}")


def sync_commit_ms(directory: str | None = None, commits: int = _COMMITS, at_once: int = 1) -> tuple[float, float]:
    """p50 and p99 (milliseconds) of a synced LMDB commit of one 2 kB put. ``at_once`` > 1:
    that many processes commit at the same moment, each in its own environment under
    ``directory`` (as the replicas of an RF-3 write sync together when they share this
    machine's one disk); the figures are over all their commits."""
    if at_once <= 1:
        s = latency_summary(_commits(directory, commits))
        return s["p50_ms"], s["p99_ms"]
    ctx = mp.get_context("spawn")
    q, barrier = ctx.Queue(), ctx.Barrier(at_once)
    procs = [ctx.Process(target=_commits_in, args=(q, barrier, directory, commits), daemon=True)
             for _ in range(at_once)]
    for p in procs:
        p.start()
    try:
        got = [q.get(timeout=120) for _ in procs]
    finally:
        for p in procs:
            p.join(5)
            if p.is_alive():
                p.kill()
    errors = [g for g in got if isinstance(g, str)]
    if errors:
        raise RuntimeError(errors[0])
    s = latency_summary([t for g in got for t in g])
    return s["p50_ms"], s["p99_ms"]


def probe(directory: str | None = None) -> dict:
    """The four figures; a part that fails is replaced by its error (a run goes on)."""
    out: dict = {}
    for key, fn, args in (("wakeup_rtt_us", wakeup_rtt_us, ()), ("tcp_rtt_us", tcp_rtt_us, ()),
                          ("sync_commit_ms", sync_commit_ms, (directory,)),
                          ("sync_commit_x3_ms", sync_commit_ms, (directory, _COMMITS, 3))):
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
                                  ("tcp_rtt_us", "plain TCP round trip", "us", "{:.0f}"),
                                  ("sync_commit_ms", "synced LMDB commit", "ms", "{:.2f}"),
                                  ("sync_commit_x3_ms", "the same, 3 at once", "ms", "{:.2f}")):
        v = cal.get(key) or {}
        if "p50" in v:
            parts.append(f"{label} p50 {fmt.format(v['p50'])} {unit} (p99 {fmt.format(v['p99'])})")
        elif v.get("error"):
            parts.append(f"{label}: {v['error']}")
    return "; ".join(parts) or "-"


def floor_ms(cal: dict | None, round_trips: int = 2, syncs: int = 1, shared_disk: bool = False) -> float | None:
    """The physical floor of a blocking write on this host right now, in ms: ``round_trips``
    ZeroMQ round trips and ``syncs`` synced LMDB commits at the probe's p50 (an RF-3
    acks=all write: client -> leader -> follower and back, one sync on the path; issue 41
    measures the fsync mode against twice this). ``shared_disk``: the sync is one of 3 at
    once (the replicas of an RF-3 write on this machine's one disk sync together). None if
    a part failed."""
    rtt, sync = ((cal or {}).get(k) or {} for k in ("wakeup_rtt_us", "sync_commit_x3_ms" if shared_disk
                                                    else "sync_commit_ms"))
    if "p50" not in rtt or "p50" not in sync:
        return None
    return round_trips * rtt["p50"] / 1000 + syncs * sync["p50"]
