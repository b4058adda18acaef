"""Where the CPU of a produced record goes (``python -m bench.kafka_cpu [records]``): one
3-broker cluster with Kafka listeners (RF 3, acks=all, idempotent, linger 5 ms, 256 KiB
batches, 100 B records into one partition, as ``bench run --scenario kafka``), the native
producer then confluent-kafka through the Kafka port, twice each, interleaved; for each
phase the records/s and the CPU microseconds per record of every process (this client,
each node, each listener: utime + stime from /proc, so Linux only). The nodes' and
listeners' idle work (gossip, heartbeats) is in their figures too: a slower phase pays more
of it per record."""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time

from bench.cluster import LocalCluster, create_topic

PAYLOAD = b"m" * 100


def _descendants(pid: int) -> list[int]:
    out = []
    kids = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
    for k in map(int, kids):
        out += [k] + _descendants(k)
    return out


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _roles(cluster_root: int) -> dict[int, str]:
    roles = {os.getpid(): "client"}
    for pid in _descendants(cluster_root):
        try:
            with open(f"/proc/{pid}/cmdline") as f:
                cmd = f.read().replace("\0", " ")
        except OSError:
            continue
        if "mesh.kafka.process" in cmd:
            roles[pid] = f"listener {pid}"
        elif "node" in cmd:
            roles[pid] = f"node {pid}"
    return roles


def native(bootstrap: str, n: int) -> None:
    from mesh.client import Producer
    with Producer(bootstrap) as p:
        for _ in range(n):
            p.send("cpu-native", PAYLOAD, partition=0)
        p.flush(300)


def confluent(kafka_bootstrap: str, n: int) -> None:
    import confluent_kafka as ck
    p = ck.Producer({"bootstrap.servers": kafka_bootstrap, "acks": "all", "enable.idempotence": True,
                     "linger.ms": 5, "batch.size": 256 << 10, "queue.buffering.max.messages": 1_000_000})
    for i in range(n):
        while True:
            try:
                p.produce("cpu-kafka", PAYLOAD, partition=0)
                break
            except BufferError:
                p.poll(0.01)
        if i % 1000 == 0:
            p.poll(0)
    if p.flush(300):
        raise SystemExit("confluent-kafka: records left unacknowledged")


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 200_000
    cluster = LocalCluster(3, tempfile.mkdtemp(prefix="kafka-cpu-logs-"), kafka=True).start()
    try:
        create_topic(cluster.bootstrap, "cpu-native", 1, 3)
        create_topic(cluster.bootstrap, "cpu-kafka", 1, 3)
        native(cluster.bootstrap, 1000)
        confluent(cluster.kafka_bootstrap, 1000)   # (warm: connections, producer ids)
        roles = _roles(os.getpid())
        for _ in range(2):
            for name, run in (("native", lambda: native(cluster.bootstrap, n)),
                              ("kafka", lambda: confluent(cluster.kafka_bootstrap, n))):
                before = {pid: _cpu_s(pid) for pid in roles}
                t = time.perf_counter()
                run()
                wall = time.perf_counter() - t
                per = {roles[pid]: (_cpu_s(pid) - c) / n * 1e6 for pid, c in before.items()}
                busy = {k: v for k, v in sorted(per.items()) if v >= 0.05}
                print(f"{name:7} {n / wall:9,.0f} records/s; CPU us/record: "
                      + ", ".join(f"{k} {v:.2f}" for k, v in busy.items()) + f"; total {sum(per.values()):.2f}")
    finally:
        cluster.stop()


if __name__ == "__main__":
    main()
