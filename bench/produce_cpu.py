"""The broker's CPU per produced record (``python -m bench.produce_cpu``): one broker, one
client sending pre-encoded batches (1,000 records of 100-byte values, acks=1, 16 in
flight) of three shapes; the broker process's user+system CPU time (from /proc) over the
run, divided by the records. CPU time, not wall time, so a shared machine disturbs it less.
"""
from __future__ import annotations

import os
import shutil
import tempfile
import time

from mesh.client import Admin
from mesh.client.transport import Transport
from mesh.testing.launcher import BrokerProcess, wait_until
from mesh.wire import messages as m
from mesh.wire.records import encode_batch

N, BATCHES, IN_FLIGHT = 1000, 1500, 16


def cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def shapes() -> dict:
    vals = [b"x" * 100] * N
    keys = [b"key-%d" % i for i in range(N)]
    now = int(time.time() * 1000)
    return {"unkeyed": encode_batch(vals, None, now),
            "keyed, per-record ts": encode_batch(vals, keys, list(range(now - N, now))),
            "keyed, headers": encode_batch(vals, keys, now, [[["h", b"v"]] for _ in range(N)])}


def main() -> None:
    d = tempfile.mkdtemp(prefix="produce-cpu-")
    b = BrokerProcess("c1", os.path.join(d, "c1")).start()
    t = Transport()
    try:
        with Admin(b.address) as a:
            for i, name in enumerate(shapes()):
                a.create_topic(f"cpu{i}", partitions=1)
        for i, (name, batch) in enumerate(shapes().items()):
            topic = f"cpu{i}"
            req = m.ProduceRequest(topic, 0, 1)
            wait_until(lambda: t.call(b.address, req, batch)[0].error == 0, 20, "a leader")
            c0, w0 = cpu_s(b.proc.pid), time.perf_counter()
            pending: set[int] = set()
            sent = 0
            while sent < BATCHES or pending:
                while sent < BATCHES and len(pending) < IN_FLIGHT:
                    pending.add(t.send(b.address, req, batch))
                    sent += 1
                for _addr, rid, resp, _ in t.poll(1000):
                    assert resp.error == 0, resp
                    pending.discard(rid)
            c1, w1 = cpu_s(b.proc.pid), time.perf_counter()
            recs = BATCHES * N
            print(f"{name:22s} broker CPU {1e6 * (c1 - c0) / recs:5.3f} us/record "
                  f"({1e6 * (c1 - c0) / BATCHES:6.1f} us/request), {recs / (w1 - w0):>10,.0f} records/s wall")
    finally:
        t.close()
        b.stop()
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
