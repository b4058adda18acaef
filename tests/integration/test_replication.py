"""Replicated partitions on real brokers: the Kafka Lite test matrix and Jepsen-style faults.

Every test ends by reading everything back and checking: each acknowledged record is
present exactly once and in its producer's order within its partition; then, with the
brokers stopped, the replicas' LMDB logs are compared directly: no two replicas hold
different batches at one offset below the commit offset.
"""
import collections
import signal
import threading
import time

import pytest

from mesh.client import Admin, Consumer, ErrorCode, MeshError, Producer, TopicPartition
from mesh.wire.records import iter_batches
from storage.log import Store
from mesh.testing.launcher import wait_until

pytestmark = pytest.mark.integration


class Writer(threading.Thread):
    """A producer thread: sends numbered records until stopped, remembers what was acked."""

    def __init__(self, bootstrap, topic, tag, acks="all", limit=None, **opts):
        super().__init__(daemon=True)
        self.bootstrap, self.topic, self.tag, self.acks, self.limit = bootstrap, topic, tag, acks, limit
        self.opts = {"delivery_timeout_ms": 20_000, "request_timeout_ms": 2_000, **opts}
        self.acked: dict[bytes, tuple[int, int]] = {}
        self.failed = 0
        self.sent = 0
        self.stop_flag = threading.Event()

    def run(self):
        with Producer(self.bootstrap, acks=self.acks, linger_ms=2, **self.opts) as p:
            window = collections.deque()
            i = 0
            while not self.stop_flag.is_set() and (self.limit is None or i < self.limit):
                v = b"%s-%07d" % (self.tag, i)
                window.append((v, p.send(self.topic, v, key=b"%s-%d" % (self.tag, i % 7))))
                i += 1
                self.sent = i
                while window and (window[0][1].done() or len(window) > 2000):
                    self._settle(*window.popleft())
            try:
                p.flush(30)
            except MeshError:
                pass
            for v, f in window:
                self._settle(v, f)

    def _settle(self, v, f):
        try:
            md = f.get(30)
            self.acked[v] = (md.partition, md.offset)
        except Exception:
            self.failed += 1

    def stop(self):
        self.stop_flag.set()
        self.join(60)
        assert not self.is_alive(), "producer thread hung"


def read_all(bootstrap, topic, partitions, timeout_s=60):
    """Everything below the high watermark of every partition, by partition."""
    with Consumer(bootstrap=bootstrap, auto_offset_reset="earliest") as c:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        c.assign(tps)
        ends = c.end_offsets(tps)
        out = collections.defaultdict(list)
        deadline = time.monotonic() + timeout_s
        while any(len(out[tp.partition]) < ends[tp] - c.beginning_offsets([tp])[tp] for tp in tps):
            assert time.monotonic() < deadline, "could not read everything back"
            for recs in c.poll_batches(500):
                for r in recs:
                    out[r.partition].append(r)
        return out


def check_acked(writers, got):
    """Each acknowledged record exactly once, at its acknowledged offset, in producer order."""
    stored = {}
    for part, recs in got.items():
        assert [r.offset for r in recs] == sorted(r.offset for r in recs)
        for r in recs:
            assert r.value not in stored, f"duplicate record {r.value!r}"
            stored[r.value] = (part, r.offset)
    total = 0
    for w in writers:
        for v, where in w.acked.items():
            assert stored.get(v) == where, f"acknowledged {v!r} at {where} but found {stored.get(v)}"
        total += len(w.acked)
        # per-producer order within each partition: offsets grow with the sequence number
        by_part = collections.defaultdict(list)
        for v, (part, off) in stored.items():
            if v.startswith(w.tag + b"-"):
                by_part[part].append((int(v.rsplit(b"-", 1)[1]), off))
        for part, pairs in by_part.items():
            pairs.sort()
            assert [o for _, o in pairs] == sorted(o for _, o in pairs), f"{w.tag} out of order in {part}"
    assert total > 0, "nothing was acknowledged: the test proved nothing"
    return total


def check_replicas_agree(cluster):
    """Open every broker's LMDB (brokers stopped) and compare committed batches."""
    logs = {}
    for b in cluster.brokers:
        assert not b.alive()
        s = Store(b.data_dir)
        per_pid = collections.defaultdict(dict)
        for tkey, p, pid in s.partitions():
            for chunk in s.read(pid, s.log_start(pid), 1 << 40, s.log_end(pid)):
                for h, batch in iter_batches(chunk):
                    per_pid[pid][h.base_offset] = bytes(batch)
        import msgpack
        commits = {}
        for k, v in s.items("repl"):
            commits[int.from_bytes(k, "big")] = msgpack.unpackb(v, raw=False)[2]
        logs[b.node_id] = (per_pid, commits)
        s.close()
    pids = set().union(*(set(pp) for pp, _ in logs.values()))
    for pid in pids:
        commit = max(c.get(pid, 0) for _, c in logs.values())
        by_offset = collections.defaultdict(set)
        for node, (pp, _) in logs.items():
            for base, batch in pp.get(pid, {}).items():
                if base < commit:
                    by_offset[base].add(batch)
        for base, versions in by_offset.items():
            assert len(versions) == 1, f"replicas disagree at partition {pid} offset {base}"


def leader_of(admin, topic, partition):
    return admin.describe_topic(topic)["partitions"][partition]["leader"]


def create(cluster, topic, partitions=3, rf=3):
    with Admin(cluster.bootstrap) as a:
        a.create_topic(topic, partitions=partitions, replication_factor=rf)


def finish(cluster, writers, topic, partitions):
    got = read_all(cluster.bootstrap, topic, partitions)
    total = check_acked(writers, got)
    for b in cluster.brokers:
        b.stop()
    check_replicas_agree(cluster)
    return total


def test_placement_spreads_replicas_and_describe_shows_them(cluster3):
    create(cluster3, "placed", partitions=12, rf=3)

    def spread():   # a replica elected first hands leadership back to the preferred one within seconds
        with Admin(cluster3.bootstrap) as a:
            t = a.describe_topic("placed")
        leaders = collections.Counter(p["leader"] for p in t["partitions"])
        return t if sorted(leaders.values()) == [4, 4, 4] else None
    t = wait_until(spread, 20, "leaderships spread 4, 4, 4 over the brokers")
    for p in t["partitions"]:
        assert sorted(p["replicas"]) == ["n1", "n2", "n3"] and p["epoch"] >= 1
    with pytest.raises(MeshError) as e:
        with Admin(cluster3.bootstrap) as a:
            a.create_topic("toowide", replication_factor=4)
    assert e.value.code == ErrorCode.INVALID_CONFIG


def test_1_producer_1_consumer_3_brokers(cluster3):
    create(cluster3, "m113")
    w = Writer(cluster3.bootstrap, "m113", b"p1", limit=3000)
    w.start()
    w.join(60)
    assert len(w.acked) == 3000
    finish(cluster3, [w], "m113", 3)


def test_2_producers_2_consumers_3_brokers_with_a_follower_killed(cluster3):
    create(cluster3, "m223f")
    ws = [Writer(cluster3.bootstrap, "m223f", b"p%d" % i) for i in (1, 2)]
    for w in ws:
        w.start()
    wait_until(lambda: all(len(w.acked) > 500 for w in ws), 30, "writes before the fault")
    with Admin(cluster3.bootstrap) as a:
        leader = leader_of(a, "m223f", 0)
    follower = next(b for b in cluster3.brokers if b.node_id != leader)
    follower.kill()
    n = sum(len(w.acked) for w in ws)
    wait_until(lambda: sum(len(w.acked) for w in ws) > n + 1000, 30, "writes to go on without a follower")
    follower.start()
    for w in ws:
        w.stop()
    # two consumers each read everything
    a = read_all(cluster3.bootstrap, "m223f", 3)
    b = read_all(cluster3.brokers[2].address, "m223f", 3)
    assert {r.value for rs in a.values() for r in rs} == {r.value for rs in b.values() for r in rs}
    finish(cluster3, ws, "m223f", 3)


def test_2_producers_2_consumers_3_brokers_with_the_leader_killed(cluster3):
    create(cluster3, "m223l")
    ws = [Writer(cluster3.bootstrap, "m223l", b"p%d" % i) for i in (1, 2)]
    for w in ws:
        w.start()
    wait_until(lambda: all(len(w.acked) > 500 for w in ws), 30, "writes before the fault")
    with Admin(cluster3.bootstrap) as a:
        leader = leader_of(a, "m223l", 0)
    victim = next(b for b in cluster3.brokers if b.node_id == leader)
    victim.kill()
    others = [b.address for b in cluster3.brokers if b is not victim]
    with Admin(",".join(others)) as a:
        wait_until(lambda: leader_of(a, "m223l", 0) not in (None, leader), 15, "a new leader")
    n = sum(len(w.acked) for w in ws)
    wait_until(lambda: sum(len(w.acked) for w in ws) > n + 1000, 30, "writes to go on under the new leader")
    victim.start()  # the old leader rejoins as a follower, truncates, catches up
    with Admin(cluster3.bootstrap) as a:
        wait_until(lambda: leader_of(a, "m223l", 0) == leader, 30, "leadership back on the preferred replica")
    for w in ws:
        w.stop()
    finish(cluster3, ws, "m223l", 3)


def test_all_brokers_killed_clients_get_errors_and_nothing_acked_is_lost(cluster3):
    create(cluster3, "m223all")
    w = Writer(cluster3.bootstrap, "m223all", b"p1", delivery_timeout_ms=4_000)
    w.start()
    wait_until(lambda: len(w.acked) > 1000, 30, "writes before the fault")
    for b in cluster3.brokers:
        b.kill()
    wait_until(lambda: w.failed > 0, 30, "the producer to report failures instead of hanging")
    w.stop()
    for b in cluster3.brokers:
        b.start(wait=False)
    for b in cluster3.brokers:
        b.wait_ready()
    finish(cluster3, [w], "m223all", 3)


def test_a_paused_leader_steps_down_and_no_split_brain(cluster3):
    create(cluster3, "paused", partitions=1)
    w = Writer(cluster3.bootstrap, "paused", b"p1")
    w.start()
    wait_until(lambda: len(w.acked) > 500, 30, "writes before the pause")
    with Admin(cluster3.bootstrap) as a:
        leader = leader_of(a, "paused", 0)
        epoch = a.describe_topic("paused")["partitions"][0]["epoch"]
    victim = next(b for b in cluster3.brokers if b.node_id == leader)
    victim.signal(signal.SIGSTOP)
    others = ",".join(b.address for b in cluster3.brokers if b is not victim)
    with Admin(others) as a:
        wait_until(lambda: leader_of(a, "paused", 0) not in (None, leader), 15, "a new leader while paused")
    n = len(w.acked)
    wait_until(lambda: len(w.acked) > n + 500, 30, "writes under the new leader")
    victim.signal(signal.SIGCONT)
    with Admin(victim.address) as a:  # the old leader learns of the newer epoch: it stepped down
        wait_until(lambda: a.describe_topic("paused")["partitions"][0]["epoch"] > epoch, 10,
                   "the resumed node to see a newer epoch")
    w.stop()
    finish(cluster3, [w], "paused", 1)


def test_a_broker_that_was_down_catches_up(cluster3):
    create(cluster3, "catchup", partitions=2)
    late = cluster3.brokers[2]
    late.stop()
    w = Writer(",".join(b.address for b in cluster3.brokers[:2]), "catchup", b"p1", limit=3000)
    w.start()
    w.join(60)
    assert len(w.acked) == 3000
    late.start()
    with Admin(late.address) as a:
        wait_until(lambda: all(p["isr"] == sorted(p["replicas"]) or len(p["isr"]) == 3
                               for p in a.describe_topic("catchup")["partitions"]), 30, "n3 back in sync")
    finish(cluster3, [w], "catchup", 2)


def test_no_quorum_means_a_clear_retriable_error(cluster3):
    create(cluster3, "quorum", partitions=1)
    with Producer(cluster3.bootstrap, acks="all") as p:
        p.send("quorum", b"before").get(10)
    with Admin(cluster3.bootstrap) as a:
        leader = leader_of(a, "quorum", 0)
    for b in cluster3.brokers:
        if b.node_id != leader:
            b.kill()
    survivor = next(b for b in cluster3.brokers if b.node_id == leader)
    with Producer(survivor.address, acks="all", delivery_timeout_ms=3000, request_timeout_ms=1000) as p:
        with pytest.raises(MeshError) as e:
            p.send("quorum", b"never acknowledged").get(20)
    assert e.value.retriable and e.value.code in (ErrorCode.NOT_ENOUGH_REPLICAS, ErrorCode.TIMEOUT,
                                                  ErrorCode.NOT_LEADER, ErrorCode.LEADER_NOT_AVAILABLE)
