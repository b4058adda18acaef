"""``bench run --scenario kafka``: one workload through the native client and through
confluent-kafka against the Kafka port of the same cluster, side by side.

Theory of operation
-------------------
One 3-broker cluster (RF 3, every broker with a Kafka listener) is started for the run.
With ``message_bytes`` records into one partition each client runs on topics of its own:
blocking send latency (``latency_samples`` sends, each waiting for its acknowledgement
before the next: ``Producer.send().get()``; confluent-kafka ``produce`` + ``flush``), after
100 warm-up sends, native first; then async send throughput (``messages`` records one by
one, then wait for every acknowledgement) in ``rounds`` rounds per client, interleaved and
the order swapped every round (native, kafka; kafka, native; ...); each client's figure is
the median of its rounds and the ratio the median of the rounds' ratios (the two phases
of a round run back to back): on a shared machine a burst of load in one client's only
phase decided the ratio (one run gave 0.37x, the next 0.73x); then consume throughput (each
client reads back its first round from the start: ``poll_batches``; confluent-kafka
``consume(1000)`` with ``assign``). Records/s are acknowledged or received records over
the wall time of the phase.

Both producers send acks=all, idempotent, linger 5 ms, uncompressed, and hear of failed
records only. The native producer (its defaults) closes 256 KiB batches and keeps up to
5 requests per partition in flight. librdkafka's idempotent producer keeps one: it limits
a partition's in-flight *requests* to 5 minus its in-flight *messages*
(``rdkafka_broker.c``, ``RD_KAFKA_IDEMP_MAX_INFLIGHT - rktp_msgs_inflight``; librdkafka
PR #4989, open), so with batches of 5 records or more one Produce request is out per
partition, against any broker. Measured here: waitresp_cnt 1 with idempotence, 5 without.
So its batch gets the native producer's bytes in flight in one request, as far as
librdkafka lets one request grow: ``batch.size`` = ``message.max.bytes`` = 1,000,000
(``batch.num.messages`` 10,000, the default, does not bind at 100 B). ``KAFKA_PRODUCER``
is the whole config, written into the report. Failed records reach one producer-wide
``on_delivery`` (``delivery.report.only.error``): no Python call per acknowledged record,
as the native producer completes one future per batch.

Writes ``kafka.json`` and ``report.md`` in the run directory (no Spark: the samples are
few and summarised here).
"""
from __future__ import annotations

import json
import os
import statistics
import time

from bench.calibrate import describe, probe
from bench.peer import run_mesh  # noqa: F401 (the native workload is the peer scenarios' own)
from bench.peer_nats import latency_summary
from bench.scenarios import BenchError, format_size

__all__ = ["run_kafka_bench", "run_both", "kafka_producer_config", "KAFKA_PRODUCER"]

ROUNDS = 5
KAFKA_PRODUCER = {"acks": "all", "enable.idempotence": True, "linger.ms": 5, "compression.type": "none",
                  "batch.size": 1_000_000, "batch.num.messages": 10_000, "message.max.bytes": 1_000_000,
                  "queue.buffering.max.messages": 1_000_000, "queue.buffering.max.kbytes": 1 << 20,
                  "delivery.report.only.error": True}

MEASURES = (
    ("blocking send p50 (ms)", ("latency", "p50_ms"), "lower"),
    ("blocking send p99 (ms)", ("latency", "p99_ms"), "lower"),
    ("blocking send mean (ms)", ("latency", "mean_ms"), "lower"),
    ("async send (records/s)", ("produce_rps",), "higher"),
    ("consume (records/s)", ("consume_rps",), "higher"),
)


def _spec(message_bytes: int, messages: int, rounds: int = ROUNDS) -> dict:
    return {"message_bytes": message_bytes, "messages": messages, "rounds": rounds,
            "latency_samples": max(20, min(1000, messages // 100))}


def _native_latency(p, spec: dict) -> dict:
    from bench.cluster import create_topic
    payload = b"m" * spec["message_bytes"]
    create_topic(spec["bootstrap"], "native-lat", 1, 3)
    for _ in range(min(100, spec["latency_samples"])):
        p.send("native-lat", payload).get(30)
    lat = []
    for _ in range(spec["latency_samples"]):
        t = time.perf_counter_ns()
        p.send("native-lat", payload).get(30)
        lat.append(time.perf_counter_ns() - t)
    return latency_summary(lat)


def _native_produce(p, spec: dict, topic: str) -> float:
    from bench.cluster import create_topic
    payload, n = b"m" * spec["message_bytes"], spec["messages"]
    create_topic(spec["bootstrap"], topic, 1, 3)
    t = time.perf_counter_ns()
    for _ in range(n):
        p.send(topic, payload, partition=0)
    p.flush(300)
    return n / ((time.perf_counter_ns() - t) / 1e9)


def _native_consume(bootstrap: str, topic: str, n: int) -> float:
    from mesh.client import Consumer
    with Consumer(bootstrap=bootstrap, auto_offset_reset="earliest") as c:
        c.assign([(topic, 0)])
        c.seek_to_beginning()
        got, t = 0, time.perf_counter_ns()
        deadline = time.monotonic() + 300
        while got < n and time.monotonic() < deadline:
            got += sum(len(b) for b in c.poll_batches(200))
        rps = got / ((time.perf_counter_ns() - t) / 1e9)
    if got < n:
        raise BenchError(f"native consumer read {got} of {n} records")
    return rps


def kafka_producer_config(kafka_bootstrap: str, on_delivery=None) -> dict:
    """confluent-kafka's producer as like the native one as librdkafka allows (module doc);
    ``on_delivery`` hears of every record that failed (none of those that did not)."""
    conf = {"bootstrap.servers": kafka_bootstrap, **KAFKA_PRODUCER}
    if on_delivery is not None:
        conf["on_delivery"] = on_delivery
    return conf


def _kafka_latency(p, spec: dict) -> dict:
    from bench.cluster import create_topic
    payload = b"m" * spec["message_bytes"]
    create_topic(spec["bootstrap"], "kafka-lat", 1, 3)
    for _ in range(min(100, spec["latency_samples"])):
        p.produce("kafka-lat", payload, partition=0)
        p.flush(30)
    lat = []
    for _ in range(spec["latency_samples"]):
        t = time.perf_counter_ns()
        p.produce("kafka-lat", payload, partition=0)
        p.flush(30)
        lat.append(time.perf_counter_ns() - t)
    return latency_summary(lat)


def _kafka_produce(p, spec: dict, topic: str) -> float:
    from bench.cluster import create_topic
    payload, n = b"m" * spec["message_bytes"], spec["messages"]
    create_topic(spec["bootstrap"], topic, 1, 3)
    errors = spec["kafka_errors"]
    failed = len(errors)
    t = time.perf_counter_ns()
    for i in range(n):
        while True:
            try:
                p.produce(topic, payload, partition=0)
                break
            except BufferError:
                p.poll(0.01)
        if i % 1000 == 0:
            p.poll(0)
    left = p.flush(300)
    rps = n / ((time.perf_counter_ns() - t) / 1e9)
    if left or len(errors) > failed:
        raise BenchError(f"confluent-kafka: {left} records unacknowledged, {len(errors) - failed} failed "
                         f"({errors[failed:failed + 1]})")
    return rps


def _kafka_consume(kafka_bootstrap: str, topic: str, n: int) -> float:
    import confluent_kafka as ck
    c = ck.Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": "bench-unused", "enable.auto.commit": False,
                     "fetch.max.bytes": 16 << 20, "max.partition.fetch.bytes": 4 << 20})
    try:
        c.assign([ck.TopicPartition(topic, 0, 0)])
        got, t = 0, time.perf_counter_ns()
        deadline = time.monotonic() + 300
        while got < n and time.monotonic() < deadline:
            got += sum(1 for m in c.consume(1000, 0.2) if m.error() is None)
        rps = got / ((time.perf_counter_ns() - t) / 1e9)
    finally:
        c.close()
    if got < n:
        raise BenchError(f"confluent-kafka consumer read {got} of {n} records")
    return rps


def run_both(bootstrap: str, kafka_bootstrap: str, spec: dict, echo=print) -> tuple[dict, dict]:
    """(native, kafka) results: latency, then ``rounds`` async-send rounds of each client,
    interleaved (the order swapped every round), then consume of each client's first round.
    ``produce_rps`` is each client's median round; ``kafka["produce_ratio"]`` the median of
    the rounds' Kafka/native ratios (each round's two phases ran back to back, under much
    the same load), the async send ratio of the report."""
    import confluent_kafka as ck
    from mesh.client import Producer
    errors: list = []

    def failed(err, _msg):   # (delivery.report.only.error: called for failed records only)
        if err:
            errors.append(err)

    spec = dict(spec, bootstrap=bootstrap, kafka_errors=errors)
    native: dict = {"produce_rounds": []}
    kafka: dict = {"produce_rounds": []}
    kp = ck.Producer(kafka_producer_config(kafka_bootstrap, failed))
    with Producer(bootstrap) as np_:   # acks=all, idempotent, linger 5 ms, 256 KiB batches, 5 in flight
        echo("bench: kafka: blocking sends (native, then confluent-kafka)...")
        native["latency"] = _native_latency(np_, spec)
        kafka["latency"] = _kafka_latency(kp, spec)
        for r in range(spec["rounds"]):
            order = [("native", native), ("kafka", kafka)]
            if r % 2:
                order.reverse()
            for name, out in order:
                if name == "native":
                    out["produce_rounds"].append(_native_produce(np_, spec, f"native-thr-{r}"))
                else:
                    out["produce_rounds"].append(_kafka_produce(kp, spec, f"kafka-thr-{r}"))
            echo(f"bench: kafka: async send round {r + 1}/{spec['rounds']}: native "
                 f"{native['produce_rounds'][-1]:,.0f}, confluent-kafka {kafka['produce_rounds'][-1]:,.0f} records/s")
    kp.flush(30)
    if errors:
        raise BenchError(f"confluent-kafka: {len(errors)} records failed ({errors[:1]})")
    for out in (native, kafka):
        out["produce_rps"] = statistics.median(out["produce_rounds"])
    kafka["produce_ratio"] = statistics.median(k / n for n, k in zip(native["produce_rounds"], kafka["produce_rounds"]))
    echo("bench: kafka: consume (native, then confluent-kafka)...")
    native["consume_rps"] = _native_consume(bootstrap, "native-thr-0", spec["messages"])
    kafka["consume_rps"] = _kafka_consume(kafka_bootstrap, "kafka-thr-0", spec["messages"])
    return native, kafka


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
        if path == ("produce_rps",) and kafka.get("produce_ratio") is not None:
            ratio = f"{kafka['produce_ratio']:.2f}x"   # the median of the rounds' ratios (run_both)
        lines.append(f"| {label} | {fmt(a)} | {fmt(b)} | {ratio} | {better} |")
    return "\n".join(lines)


def rounds_line(native: dict, kafka: dict) -> str:
    a, b = native.get("produce_rounds") or [], kafka.get("produce_rounds") or []
    return ("async send rounds (records/s): native " + ", ".join(f"{v:,.0f}" for v in a)
            + "; confluent-kafka " + ", ".join(f"{v:,.0f}" for v in b)
            + "; Kafka/native per round " + ", ".join(f"{y / x:.2f}x" for x, y in zip(a, b) if x))


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
        native, kafka = run_both(cluster.bootstrap, cluster.kafka_bootstrap, spec, echo)
    finally:
        cluster.stop()
    table = side_by_side(native, kafka)
    echo(table)
    echo(rounds_line(native, kafka))
    with open(os.path.join(out_dir, "kafka.json"), "w") as f:
        json.dump({"spec": spec, "kafka_producer": KAFKA_PRODUCER, "info": info, "native": native, "kafka": kafka}, f, indent=1)
    path = os.path.join(out_dir, "report.md")
    with open(path, "w") as f:
        f.write("\n".join([
            "# Benchmark report: kafka", "",
            f"The same workload through the native client and through confluent-kafka (librdkafka) against the "
            f"Kafka port of one 3-broker cluster (RF 3, acks=all, idempotent, linger 5 ms): "
            f"{format_size(message_bytes)} records into one partition; blocking send latency over "
            f"{spec['latency_samples']:,} sends (each acknowledged before the next); async send and consume "
            f"throughput over {messages:,} records (async send: each client's median of {spec['rounds']} "
            f"interleaved rounds, the ratio the median of the rounds' ratios).", "", table, "", rounds_line(native, kafka), "",
            f"confluent-kafka producer: `{json.dumps(KAFKA_PRODUCER, sort_keys=True)}`", "",
            "## Setup", "", f"- command: `{command or '-'}`", f"- started {info['started']}",
            f"- machine at start: {describe(info['calibration'])}", ""]))
    return path
