"""Compacted topics on real brokers (issue 40): the latest value per key on every replica."""
from __future__ import annotations

import random

import pytest

from mesh.client import Admin, Consumer, Producer
from mesh.testing.launcher import Cluster, wait_until
from mesh.wire.errors import MeshError
from mesh.wire.records import iter_batches, records_from
from storage.log import Store

pytestmark = pytest.mark.integration

COMPACT = {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.2", "delete.retention.ms": "2000"}


def writes(rng: random.Random, n: int, keys: int, start: int = 0):
    """``n`` (key, value) writes over ``keys`` keys, about one in eight a tombstone."""
    for i in range(start, start + n):
        k = b"k%d" % rng.randrange(keys)
        yield k, (None if rng.random() < 0.125 else b"v%d-" % i + b"x" * 40)


def produce(bootstrap: str, topics: list[str], ws, latest: dict) -> None:
    with Producer(bootstrap, linger_ms=20) as p:
        for k, v in ws:
            for t in topics:
                p.send(t, v, key=k)
            latest[k] = v
        p.flush()


def parts(b, topic: str) -> dict:
    with Admin(b.address, request_timeout_ms=2000) as a:
        return a.describe_topic(topic)["partitions"][0]


def read_all(bootstrap: str, topic: str, hw: int) -> list:
    got = []
    with Consumer(topic, bootstrap=bootstrap, auto_offset_reset="earliest") as c:
        def done():
            for rs in c.poll_batches(200):
                got.extend(rs)
            return c.position((topic, 0)) >= hw
        wait_until(done, 20, f"{topic} read to {hw}")
    return got


def stored_records(data_dir: str, topic_prefix: str) -> dict[str, list]:
    """Every record of the broker's store (stopped), by topic key, straight from LMDB."""
    s = Store(data_dir)
    try:
        out = {}
        for tkey, p, pid in s.partitions():
            if not tkey.startswith(topic_prefix):
                continue
            recs = []
            for chunk in s.read(pid, s.log_start(pid), 1 << 40, s.log_end(pid)):
                for h, batch in iter_batches(chunk):
                    recs.extend((r.offset, r.key, r.value) for r in records_from("t", p, bytes(batch), 0, h))
            out[tkey] = (recs, s.size_bytes(pid))
        return out
    finally:
        s.close()


def test_compaction_with_a_leader_killed_midway_leaves_every_replica_the_same_latest_values(tmp_path):
    c = Cluster(tmp_path, 3, extra=["--compaction-check-ms", "200", "--compaction-bytes-per-s", "200000"]).start()
    try:
        with Admin(c.bootstrap) as a:
            a.create_topic("kv", partitions=1, replication_factor=3, config=COMPACT)
            a.create_topic("plain", partitions=1, replication_factor=3)
            with pytest.raises(MeshError) as exc:   # a compacted topic takes keyed records only
                with Producer(c.bootstrap, retries=0) as p:
                    p.send("kv", b"no key").get(10)
            assert exc.value.code.name == "INVALID_RECORD"
        rng, latest = random.Random(40), {}
        produce(c.bootstrap, ["kv", "plain"], writes(rng, 10_000, 500), latest)
        leader = next(b for b in c.brokers if b.node_id == parts(c.brokers[0], "kv")["leader"])
        # the leader decided its first cut and compacts in the background (200 kB/s): kill it
        wait_until(lambda: parts(leader, "kv").get("local_clean_target", 0) > 0, 20, "a first compaction cut")
        leader.kill()
        others = [b for b in c.brokers if b is not leader]
        produce(",".join(b.address for b in others), ["kv", "plain"], writes(rng, 10_000, 500, 10_000), latest)
        leader.start()
        hw = 20_000

        def settled():   # every replica applied a cut at the end, and the tombstones are gone
            ps = [parts(b, "kv") for b in c.brokers]
            return all(p["high_watermark"] == hw and p.get("local_clean_end") == hw
                       and p.get("local_clean_target") == hw and not p.get("local_clean_pending", True)
                       for p in ps) and not any(
                r.value is None for r in read_all(c.bootstrap, "kv", hw))
        wait_until(settled, 45, "every replica compacted to the end, tombstones expired")
        cuts = {b.node_id: {k: v for k, v in parts(b, "kv").items() if "clean" in k or k == "leader"}
                for b in c.brokers}   # (for the message below, should the replicas differ)
        got = read_all(c.bootstrap, "kv", hw)
        want = {k: v for k, v in latest.items() if v is not None}
        assert {r.key: r.value for r in got} == want
        assert len(got) == len(want)   # one record per live key, no deleted key left
        offsets = [r.offset for r in got]
        assert offsets == sorted(offsets) and len(set(offsets)) == len(offsets)
    finally:
        c.kill()
    stores = {b.node_id: stored_records(b.data_dir, "") for b in c.brokers}
    views = []
    for node, by_topic in stores.items():
        kv = [v for k, v in by_topic.items() if k.startswith("kv")]
        plain = [v for k, v in by_topic.items() if k.startswith("plain")]
        assert len(kv) == 1 and len(plain) == 1, (node, list(by_topic))
        (recs, size), (_, plain_size) = kv[0], plain[0]
        assert size < plain_size / 4, (node, size, plain_size)   # the store shrank
        views.append(recs)
    differ = {node: (len(v), sorted(set(v) ^ set(views[0]))[:5]) for node, v in zip(stores, views)}
    assert views[0] == views[1] == views[2], (cuts, differ)   # every replica holds the same records
    assert {k: v for _, k, v in views[0]} == want


def test_cli_text_gateway_and_kafka_clients_read_a_compacted_topic(tmp_path):
    """Offsets with gaps: ``mesh consume --from-beginning``, the text gateway's CONS and a
    Kafka client (kafka-python, through the listener) each give the latest value of each
    key, the tombstones still held, and nothing else; a Kafka create with the policy works."""
    import json
    import socket
    import subprocess
    import sys
    import time

    import kafka

    from mesh.testing.launcher import ROOT, BrokerProcess, free_port
    text_port = free_port()
    b = BrokerProcess("n1", str(tmp_path / "n1"), kafka_port=free_port(),
                      extra=["--text-port", str(text_port), "--compaction-check-ms", "100"]).start()
    try:
        adm = kafka.KafkaAdminClient(bootstrap_servers=[b.kafka_address])
        adm.create_topics([kafka.admin.NewTopic("kv", 1, 1, topic_configs={
            "cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.01"})])
        adm.close()
        ws = [(b"k%d" % (i % 9), b"v%d" % i) for i in range(300)] + [(b"k4", None)]
        with Producer(b.address) as p:
            for k, v in ws:
                p.send("kv", v, key=k)
            p.flush()
        latest = {}
        for i, (k, v) in enumerate(ws):
            latest[k] = (i, v)
        want = sorted((i, k, v) for k, (i, v) in latest.items())
        wait_until(lambda: parts(b, "kv").get("local_clean_end") == len(ws), 20, "kv compacted")
        with Admin(b.address) as a:
            assert a.describe_topic("kv")["config"]["cleanup.policy"] == 1
        # the CLI
        out = subprocess.run([sys.executable, "-m", "tools.cli", "consume", "kv", "--from-beginning",
                              "--timeout-ms", "1500", "-f", "{offset} {key} {value}", "-b", b.address],
                             cwd=ROOT, capture_output=True, text=True, timeout=60)
        lines = out.stdout.split("\n")[:-1]
        assert lines == [f"{i} {k.decode()} {'NULL' if v is None else v.decode()}" for i, k, v in want], out.stderr
        described = subprocess.run([sys.executable, "-m", "tools.cli", "topic", "describe", "kv", "-b", b.address],
                                   cwd=ROOT, capture_output=True, text=True, timeout=60).stdout
        assert "cleanup.policy=compact" in described and "dirty" in described, described
        # the text gateway
        s = socket.create_connection(("127.0.0.1", text_port), timeout=10)
        buf = b""

        def line():
            nonlocal buf
            while b"\n" not in buf:
                buf += s.recv(65536)
            ln, _, buf = buf.partition(b"\n")
            return ln.decode()
        s.sendall(b"SUBS kv g1\n")
        sub = line().split()
        assert sub[0] == "OK"
        got = []
        deadline = time.monotonic() + 20
        while len(got) < len(want) and time.monotonic() < deadline:
            s.sendall(f"CONS kv {sub[1]}\n".encode())
            while (ln := line()) != "END":
                assert not ln.startswith("ERR"), ln
                _p, off, obj = ln.split(" ", 2)
                got.append((int(off), json.loads(obj)))
        s.close()
        assert [o for o, _ in got] == [i for i, _k, _v in want]
        assert [obj.get("Key") for _o, obj in got] == [k.decode() for _i, k, _v in want]
        # a Kafka client
        cons = kafka.KafkaConsumer(bootstrap_servers=[b.kafka_address], enable_auto_commit=False)
        tp = kafka.TopicPartition("kv", 0)
        cons.assign([tp])
        cons.seek_to_beginning()
        rows = []
        deadline = time.monotonic() + 30
        while cons.position(tp) < len(ws) and time.monotonic() < deadline:
            for recs in cons.poll(timeout_ms=500).values():
                rows.extend(recs)
        cons.close()
        assert [(r.offset, r.key, r.value) for r in rows] == want
        with pytest.raises(MeshError):   # a keyless record through the Kafka listener: refused too
            with Producer(b.address, retries=0) as p:
                p.send("kv", b"x").get(10)
        prod = kafka.KafkaProducer(bootstrap_servers=[b.kafka_address], retries=0)
        with pytest.raises(kafka.errors.InvalidRecordError):
            prod.send("kv", b"no key").get(10)
        prod.close(5)
    finally:
        b.kill()
