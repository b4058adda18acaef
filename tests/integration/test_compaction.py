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
            assert "INVALID_RECORD" in str(exc.value) or "key" in str(exc.value)
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
                       and p.get("local_clean_target") == hw for p in ps) and not any(
                r.value is None for r in read_all(c.bootstrap, "kv", hw))
        wait_until(settled, 45, "every replica compacted to the end, tombstones expired")
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
    assert views[0] == views[1] == views[2]   # every replica holds the same records
    assert {k: v for _, k, v in views[0]} == want
