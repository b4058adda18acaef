"""Consumer-group numbers: rebalance times, and the consume throughput of a group.

    python -m bench.groups [--runs 10] [--session-ms 3000] [--records 3000000] [--size 100]

Starts 3 brokers (``bench.cluster.LocalCluster``, synced group commit) whose maximum
session timeout, hence takeover grace, is ``--session-ms``, and a 12-partition topic. Every
member is its own process (``multiprocessing``, spawn) running ``Consumer(group_id=...)``
and reporting over its own pipe (a SIGKILLed writer cannot then block the others), with
wall-clock stamps, when it subscribed and every change of the partitions it is actually
consuming.

1. Rebalance on join: two members hold 6 + 6; a third subscribes. Time from its
   ``subscribe()`` until the three consume 4 + 4 + 4 (every partition owned by exactly one).
2. Rebalance on a kill: the third member is SIGKILLed. Time from the kill until the two
   survivors consume 6 + 6. This is bounded below by the session timeout: the coordinator
   cannot tell a dead member from a slow one before that.
   Both are repeated ``--runs`` times; p50 and max are printed.
3. Throughput: ``--records`` records of ``--size`` bytes are produced to the topic; three
   members join (at the log end) and settle on 4 + 4 + 4; then each seeks to the beginning
   of its partitions and reads to the end. Total records / (last record read - start).
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import multiprocessing.connection
import os
import statistics
import tempfile
import time

TOPIC = "groupbench"
PARTITIONS = 12


# -- member processes -------------------------------------------------------------------
def _member(name, bootstrap, group, session_ms, events, stop, go, reset):
    from mesh.client import Consumer
    c = Consumer(bootstrap=bootstrap, group_id=group, auto_offset_reset=reset, session_timeout_ms=session_ms,
                 max_partition_fetch_bytes=4 << 20, fetch_max_bytes=32 << 20)
    events.send((name, "subscribed", time.time(), None))
    c.subscribe([TOPIC])
    last = None
    count = nbytes = 0
    t_go = t_first = t_last = None
    ends = None
    while not stop.is_set():
        batches = c.poll_batches(timeout_ms=50)
        held = tuple(sorted(p for _, p in c._group.assignment()))
        if held != last:
            last = held
            events.send((name, "assignment", time.time(), held))
        if go is not None and go.is_set() and t_go is None:
            t_go = time.time()
            tps = c.assignment()
            ends = c.end_offsets(tps)
            c.seek_to_beginning(*tps)
            count = nbytes = 0
            continue
        if t_go is not None and batches:
            for recs in batches:
                count += len(recs)
                nbytes += sum(len(r.value) for r in recs)
            t_last = time.time()
            t_first = t_first or t_last
            if count >= sum(ends.values()):
                events.send((name, "done", time.time(), (t_go, t_first, t_last, count, nbytes)))
                go = None
    c.close()


class Members:
    def __init__(self, bootstrap, group, session_ms, reset="latest"):
        self.ctx = mp.get_context("spawn")
        self.pipes: dict = {}   # reader -> member name
        self.writers: list = []
        self.bootstrap, self.group, self.session_ms, self.reset = bootstrap, group, session_ms, reset
        self.procs: dict[str, mp.Process] = {}
        self.stops: dict[str, object] = {}
        self.held: dict[str, tuple] = {}
        self.subscribed: dict[str, float] = {}
        self.done: dict[str, tuple] = {}
        self.go = self.ctx.Event()

    def start(self, name, with_go=False):
        stop = self.ctx.Event()
        reader, writer = self.ctx.Pipe(duplex=False)
        p = self.ctx.Process(target=_member, args=(name, self.bootstrap, self.group, self.session_ms, writer,
                                                   stop, self.go if with_go else None, self.reset), daemon=True)
        p.start()
        self.pipes[reader] = name
        self.writers.append(writer)   # kept open: spawn hands the descriptor over after start()
        self.procs[name], self.stops[name] = p, stop
        self.held[name] = ()

    def kill(self, name) -> float:
        self.procs[name].kill()
        t = time.time()
        self.procs[name].join(10)
        del self.procs[name], self.held[name]
        return t

    def pump(self, timeout_s=0.05):
        """Fold reported events; returns the time of the last assignment change seen."""
        latest = None
        for reader in mp.connection.wait(list(self.pipes), timeout_s):
            try:
                while reader.poll():
                    name, kind, t, data = reader.recv()
                    if kind == "subscribed":
                        self.subscribed[name] = t
                    elif kind == "assignment" and name in self.held:
                        self.held[name] = data
                        latest = max(latest or t, t)
                    elif kind == "done":
                        self.done[name] = data
            except (EOFError, OSError):   # the member is gone
                del self.pipes[reader]
                reader.close()
        return latest

    def wait_for(self, sizes, timeout_s=60.0) -> float:
        """Wait until the live members consume partitions of these sizes covering all
        partitions exactly once; the wall time of the change that got there."""
        deadline = time.monotonic() + timeout_s
        last_change = time.time()
        while True:
            t = self.pump()
            if t is not None:
                last_change = t
            held = list(self.held.values())
            owned = [p for h in held for p in h]
            if sorted(map(len, held)) == sorted(sizes) and sorted(owned) == list(range(PARTITIONS)):
                return last_change
            if time.monotonic() > deadline:
                raise RuntimeError(f"members never settled on {sizes}: {self.held}")

    def stop_all(self):
        for name in list(self.procs):
            self.stops[name].set()
        for name, p in list(self.procs.items()):
            p.join(15)
            if p.is_alive():
                p.kill()
        self.procs.clear()


def _fill(bootstrap, records, size):
    from mesh.client import Producer
    values = [b"x" * size] * 1000
    with Producer(bootstrap, max_in_flight=8) as p:
        futs = []
        for i in range(0, records, 1000):
            n = min(1000, records - i)
            futs.append(p.send_batch(TOPIC, values[:n], partition=(i // 1000) % PARTITIONS))
            if len(futs) > 256:
                futs.pop(0).result()
        for f in futs:
            f.result()


def _pct(xs):
    return {"p50": round(statistics.median(xs), 3), "max": round(max(xs), 3), "runs": len(xs)}


def run(args) -> dict:
    from bench.cluster import LocalCluster, create_topic
    os.environ["MESH_GROUP_MAX_SESSION_MS"] = str(args.session_ms)
    log_dir = tempfile.mkdtemp(prefix="mesh-groupbench-logs-")
    results: dict = {"session_timeout_ms": args.session_ms}
    with LocalCluster(3, log_dir) as cluster:
        boot = cluster.bootstrap
        create_topic(boot, TOPIC, PARTITIONS, 1)
        time.sleep(args.session_ms / 1000)   # let the brokers' start-up takeover grace pass

        joins, kills = [], []
        members = Members(boot, "rebalance", args.session_ms)
        try:
            members.start("a")
            members.start("b")
            members.wait_for([6, 6])
            for run_no in range(args.runs):
                name = f"c{run_no}"
                members.start(name)
                settled = members.wait_for([4, 4, 4])
                joins.append(settled - members.subscribed[name])
                killed = members.kill(name)
                settled = members.wait_for([6, 6])
                kills.append(settled - killed)
                print(f"run {run_no + 1}: join {joins[-1]:.3f} s, kill {kills[-1]:.3f} s", flush=True)
        finally:
            members.stop_all()
        results["rebalance_join_s"] = _pct(joins)
        results["rebalance_kill_s"] = _pct(kills)

        _fill(boot, args.records, args.size)
        members = Members(boot, "throughput", args.session_ms)
        try:
            for name in ("t1", "t2", "t3"):
                members.start(name, with_go=True)
            members.wait_for([4, 4, 4])
            members.go.set()
            deadline = time.monotonic() + 300
            while len(members.done) < 3 and time.monotonic() < deadline:
                members.pump(0.2)
        finally:
            members.stop_all()
        if len(members.done) < 3:
            raise RuntimeError("throughput members did not finish")
        start = min(d[0] for d in members.done.values())
        end = max(d[2] for d in members.done.values())
        total = sum(d[3] for d in members.done.values())
        nbytes = sum(d[4] for d in members.done.values())
        results["consume"] = {"records": total, "seconds": round(end - start, 3),
                              "records_per_s": round(total / (end - start)),
                              "MB_per_s": round(nbytes / (end - start) / 1e6, 1),
                              "per_member": {n: d[3] for n, d in sorted(members.done.items())}}
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--session-ms", type=int, default=3000, help="member session timeout = brokers' maximum")
    ap.add_argument("--records", type=int, default=3_000_000)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    res = run(args)
    j, k, c = res["rebalance_join_s"], res["rebalance_kill_s"], res["consume"]
    print(f"rebalance on join : p50 {j['p50']:.3f} s, max {j['max']:.3f} s ({j['runs']} runs)")
    print(f"rebalance on kill : p50 {k['p50']:.3f} s, max {k['max']:.3f} s "
          f"(session timeout {res['session_timeout_ms'] / 1000:.1f} s)")
    print(f"consume, 3 members x 12 partitions, 3 brokers: {c['records']:,} records in {c['seconds']:.2f} s = "
          f"{c['records_per_s']:,} records/s, {c['MB_per_s']} MB/s  {c['per_member']}")
    if args.json:
        print(json.dumps(res))


if __name__ == "__main__":
    main()
