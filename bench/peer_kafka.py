"""``bench run --scenario kafka``: one workload through the native client and through
confluent-kafka against the Kafka port of the same cluster, side by side.

Theory of operation
-------------------
One 3-broker cluster (RF 3, every broker with a Kafka listener) is started for the run.
With ``message_bytes`` records into one partition each client runs, native first, then
confluent-kafka, each on topics of its own: blocking send latency (``latency_samples``
sends, each waiting for its acknowledgement before the next: ``Producer.send().get()``;
confluent-kafka ``produce`` + ``flush``), after 100 warm-up sends; async send throughput
(``messages`` records one by one, then wait for every acknowledgement); consume
throughput (read them back from the start: ``poll_batches``; confluent-kafka
``consume(1000)`` with ``assign``). Both producers send with acks=all, idempotent, linger
5 ms, batches of at most 256 KiB (the native producer's default ``batch_size``). Records/s are acknowledged or received records over the wall time of the phase.

Writes ``kafka.json`` and ``report.md`` in the run directory (no Spark: the samples are
few and summarised here).
"""
from __future__ import annotations

import json
import os
import time

from bench.calibrate import describe, probe
from bench.peer import run_mesh  # noqa: F401 (the native workload is the peer scenarios' own)
from bench.peer_nats import latency_summary
from bench.scenarios import BenchError, format_size

__all__ = ["run_kafka_bench", "run_confluent", "run_native"]

MEASURES = (
    ("blocking send p50 (ms)", ("latency", "p50_ms"), "lower"),
    ("blocking send p99 (ms)", ("latency", "p99_ms"), "lower"),
    ("blocking send mean (ms)", ("latency", "mean_ms"), "lower"),
    ("async send (records/s)", ("produce_rps",), "higher"),
    ("consume (records/s)", ("consume_rps",), "higher"),
)


def _spec(message_bytes: int, messages: int) -> dict:
    return {"message_bytes": message_bytes, "messages": messages,
            "latency_samples": max(20, min(1000, messages // 100))}


def run_native(bootstrap: str, spec: dict) -> dict:
    from bench.cluster import create_topic
    from mesh.client import Consumer, Producer
    size, n, n_lat = spec["message_bytes"], spec["messages"], spec["latency_samples"]
    payload = b"m" * size
    create_topic(bootstrap, "native-lat", 1, 3)
    create_topic(bootstrap, "native-thr", 1, 3)
    out: dict = {}
    with Producer(bootstrap) as p:   # acks=all, idempotent, linger 5 ms
        for _ in range(min(100, n_lat)):
            p.send("native-lat", payload).get(30)
        lat = []
        for _ in range(n_lat):
            t = time.perf_counter_ns()
            p.send("native-lat", payload).get(30)
            lat.append(time.perf_counter_ns() - t)
        out["latency"] = latency_summary(lat)
        t = time.perf_counter_ns()
        for _ in range(n):
            p.send("native-thr", payload, partition=0)
        p.flush(300)
        out["produce_rps"] = n / ((time.perf_counter_ns() - t) / 1e9)
    with Consumer(bootstrap=bootstrap, auto_offset_reset="earliest") as c:
        c.assign([("native-thr", 0)])
        c.seek_to_beginning()
        got, t = 0, time.perf_counter_ns()
        deadline = time.monotonic() + 300
        while got < n and time.monotonic() < deadline:
            got += sum(len(b) for b in c.poll_batches(200))
        out["consume_rps"] = got / ((time.perf_counter_ns() - t) / 1e9)
    if got < n:
        raise BenchError(f"native consumer read {got} of {n} records")
    return out


def run_confluent(bootstrap: str, kafka_bootstrap: str, spec: dict) -> dict:
    import confluent_kafka as ck
    from bench.cluster import create_topic
    size, n, n_lat = spec["message_bytes"], spec["messages"], spec["latency_samples"]
    payload = b"m" * size
    create_topic(bootstrap, "kafka-lat", 1, 3)
    create_topic(bootstrap, "kafka-thr", 1, 3)
    out: dict = {}
    errors: list = []
    p = ck.Producer({"bootstrap.servers": kafka_bootstrap, "acks": "all", "enable.idempotence": True,
                     "linger.ms": 5, "batch.size": 256 << 10, "queue.buffering.max.messages": 1_000_000})
    for _ in range(min(100, n_lat)):
        p.produce("kafka-lat", payload, partition=0)
        p.flush(30)
    lat = []
    for _ in range(n_lat):
        t = time.perf_counter_ns()
        p.produce("kafka-lat", payload, partition=0)
        p.flush(30)
        lat.append(time.perf_counter_ns() - t)
    out["latency"] = latency_summary(lat)

    def done(err, _msg):
        if err:
            errors.append(err)

    t = time.perf_counter_ns()
    for i in range(n):
        while True:
            try:
                p.produce("kafka-thr", payload, partition=0, on_delivery=done)
                break
            except BufferError:
                p.poll(0.01)
        if i % 1000 == 0:
            p.poll(0)
    left = p.flush(300)
    out["produce_rps"] = n / ((time.perf_counter_ns() - t) / 1e9)
    if left or errors:
        raise BenchError(f"confluent-kafka: {left} records unacknowledged, {len(errors)} failed ({errors[:1]})")
    c = ck.Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": "bench-unused", "enable.auto.commit": False,
                     "fetch.max.bytes": 16 << 20, "max.partition.fetch.bytes": 4 << 20})
    try:
        c.assign([ck.TopicPartition("kafka-thr", 0, 0)])
        got, t = 0, time.perf_counter_ns()
        deadline = time.monotonic() + 300
        while got < n and time.monotonic() < deadline:
            got += sum(1 for m in c.consume(1000, 0.2) if m.error() is None)
        out["consume_rps"] = got / ((time.perf_counter_ns() - t) / 1e9)
    finally:
        c.close()
    if got < n:
        raise BenchError(f"confluent-kafka consumer read {got} of {n} records")
    return out


def _get(result, path):
    for k in path:
        result = result.get(k) if isinstance(result, dict) else None
    return result


def side_by_side(native: dict, kafka: dict) -> str:
    lines = ["| measure | native client | confluent-kafka via the Kafka port | Kafka/native | better |",
             "|:---|---:|---:|---:|:---|"]
    for label, path, better in MEASURES:
        a, b = _get(native, path), _get(kafka, path)
        fmt = (lambda v: "-" if v is None else f"{v:.2f}") if path[0] == "latency" else \
            (lambda v: "-" if v is None else f"{v:,.0f}")
        ratio = f"{b / a:.2f}x" if a and b is not None else "-"
        lines.append(f"| {label} | {fmt(a)} | {fmt(b)} | {ratio} | {better} |")
    return "\n".join(lines)


def run_kafka_bench(out_dir: str, message_bytes: int, messages: int, command: str = "", echo=print) -> str:
    """Start the cluster, measure both clients, write kafka.json and report.md; return the report."""
    try:
        import confluent_kafka  # noqa: F401
    except ImportError:
        raise BenchError("the kafka scenario needs confluent-kafka (pip install confluent-kafka)") from None
    from bench.cluster import LocalCluster
    from bench.events import now_iso
    spec = _spec(message_bytes, messages)
    info = {"command": command, "started": now_iso(), "calibration": probe(out_dir)}
    echo(f"bench: machine now: {describe(info['calibration'])}")
    cluster = LocalCluster(3, os.path.join(out_dir, "logs"), kafka=True).start()
    try:
        echo("bench: kafka: the native client...")
        native = run_native(cluster.bootstrap, spec)
        echo("bench: kafka: confluent-kafka through the Kafka port...")
        kafka = run_confluent(cluster.bootstrap, cluster.kafka_bootstrap, spec)
    finally:
        cluster.stop()
    table = side_by_side(native, kafka)
    echo(table)
    with open(os.path.join(out_dir, "kafka.json"), "w") as f:
        json.dump({"spec": spec, "info": info, "native": native, "kafka": kafka}, f, indent=1)
    path = os.path.join(out_dir, "report.md")
    with open(path, "w") as f:
        f.write("\n".join([
            "# Benchmark report: kafka", "",
            f"The same workload through the native client and through confluent-kafka (librdkafka) against the "
            f"Kafka port of one 3-broker cluster (RF 3, acks=all, idempotent, linger 5 ms): "
            f"{format_size(message_bytes)} records into one partition; blocking send latency over "
            f"{spec['latency_samples']:,} sends (each acknowledged before the next); async send and consume "
            f"throughput over {messages:,} records.", "", table, "",
            "## Setup", "", f"- command: `{command or '-'}`", f"- started {info['started']}",
            f"- machine at start: {describe(info['calibration'])}", ""]))
    return path
