"""Disk damage that LMDB does not see, on real brokers (issue 13, "Disk").

A flipped byte in a stored key (the batch moves to another offset or partition id) and an
old copy of LMDB's main root named by both meta pages. Unit tests on real LMDB files
(tests/unit/test_storage.py) cover each check one by one; here the whole broker: the
damage is found at start, never served, repaired from the peers (or the store refused with
a clear message and exit code 1, never a signal), and no acknowledged record is lost.
"""
import os

import lmdb
import pytest

from mesh.client import Admin, Consumer, Producer
from mesh.testing.diskfaults import leader_broker, read_back, wait_in_sync
from mesh.testing.launcher import BrokerProcess, wait_until
from storage import datadir

pytestmark = pytest.mark.integration

N = 600


def produce(bootstrap, n, topic="t"):
    """n records acks=all to topic/0 in many small batches; {value: offset} of those acknowledged."""
    acked = {}
    with Producer(bootstrap, acks="all", linger_ms=0, batch_size=2_000, delivery_timeout_ms=20_000) as p:
        futs = [(b"k-%05d" % i, p.send(topic, b"k-%05d" % i, partition=0)) for i in range(n)]
        p.flush(30)
        for v, f in futs:
            acked[v] = f.get(30).offset
    return acked


def serves(bootstrap, topic="t2"):
    """An acks=all produce and a consume still work."""
    with Producer(bootstrap, acks="all") as p:
        off = p.send(topic, b"after", partition=0).get(timeout=15).offset
    with Consumer(bootstrap=bootstrap, auto_offset_reset="earliest") as c:
        c.assign([(topic, 0)])
        c.seek((topic, 0), off)
        got = []
        wait_until(lambda: got.extend(r for rs in c.poll_batches(100) for r in rs) or got, 15, "the record")
    assert got[0].value == b"after"


def log_keys(data_dir):
    """The stored (key bytes) of the log database, read while the broker is stopped."""
    env = lmdb.open(data_dir, readonly=True, lock=False, max_dbs=16, subdir=True)
    try:
        with env.begin() as txn:
            return [bytes(k) for k, _ in txn.cursor(db=env.open_db(b"log", txn=txn))]
    finally:
        env.close()


def test_a_flipped_key_byte_on_the_leader_is_found_and_repaired_not_served(cluster3):
    c = cluster3
    with Admin(c.bootstrap) as a:
        a.create_topic("t", 1, 3)
        a.create_topic("t2", 1, 3)
    acked = produce(c.bootstrap, N)
    wait_in_sync(c.brokers, "t", N)
    lead = leader_broker(c.brokers, "t")
    lead.kill()
    keys = log_keys(lead.data_dir)
    i = len(keys) // 2
    middle, before = keys[i], int.from_bytes(keys[i - 1][8:], "big")
    base = int.from_bytes(middle[8:], "big")
    # one bit of its offset flipped so that the key lands inside the batch before it: the
    # harder case (the repair must cut at that batch's start, a boundary the leader has)
    moved = next(middle[:8] + (base ^ (1 << b)).to_bytes(8, "big") for b in range(16)
                 if before < base ^ (1 << b) < base)
    assert moved not in keys
    f = os.path.join(lead.data_dir, "data.mdb")
    with open(f, "rb") as fh:
        data = fh.read()
    assert middle in data
    with open(f, "wb") as fh:
        fh.write(data.replace(middle, moved))
    lead.start(wait=False)
    wait_until(lambda: "follows a batch ending at" in lead.log(1 << 20) or "says it starts at" in lead.log(1 << 20),
               20, "the damaged key found at start")
    lead.wait_ready()
    wait_in_sync(c.brokers, "t", N)                      # repaired from its peers
    got = read_back(c.bootstrap, "t", 1, len(acked), timeout_s=60)
    assert all(got.get(v, (None, None))[1] == off for v, off in acked.items()), "a record lost or moved"
    assert all(b.alive() for b in c.brokers)
    serves(c.bootstrap)


def test_an_old_copy_of_the_main_root_is_refused_with_a_clear_message(tmp_path):
    b = BrokerProcess("n1", str(tmp_path / "n1")).start()
    with Admin(b.address) as a:
        a.create_topic("t", 1)
        a.create_topic("t2", 1)
    acked = produce(b.address, 200)
    b.stop()
    f = os.path.join(b.data_dir, "data.mdb")
    clean = open(f, "rb").read()
    psize = 4096
    metas = [datadir._parse_meta(clean[p:p + 200], "m") for p in (0, psize)]
    meta = max(metas, key=lambda m: m["txnid"])
    with open(f, "rb") as fh:
        free = datadir._free_pages(fh, psize, meta["free_root"], meta["last_pg"])
    copies = [p for p in sorted(free) if datadir._root_problem(
        clean[p * psize:(p + 1) * psize], p, *meta["main_db"], main=True) is None]
    assert copies, "no old copy of the main root in the file"
    main_at = 16 + datadir._META.size + datadir._DB.size + 40
    data = bytearray(clean)
    for m in (0, psize):
        data[m + main_at:m + main_at + 8] = copies[-1].to_bytes(8, "little")
    open(f, "wb").write(bytes(data))
    b.start(wait=False)
    assert b.wait_stopped(20) == 1                        # an exit with a reason, not a signal
    said = b.log()
    assert "free list holds" in said and "--rejoin-empty" in said
    open(f, "wb").write(clean)                            # the operator restores the file
    b.start()
    got = read_back(b.address, "t", 1, len(acked), timeout_s=30)
    assert all(got[v][1] == off for v, off in acked.items())
    serves(b.address)
    b.stop()


def test_a_store_without_its_gossip_snapshot_relearns_and_drops_nothing(cluster3, tmp_path):
    """Partitions on disk but no gossip snapshot (deleted, or damage that hid it): an empty
    view dropped every partition at the first reconcile, and the replicas kept raft state
    for logs they had deleted. The broker relearns the cluster first, as --reset-gossip."""
    c = cluster3
    with Admin(c.bootstrap) as a:
        a.create_topic("t", 1, 3)
        a.create_topic("t2", 1, 3)
    acked = produce(c.bootstrap, 200)
    wait_in_sync(c.brokers, "t", 200)
    b = c.brokers[1]
    assert b.stop() == 0
    env = lmdb.open(b.data_dir, max_dbs=16, subdir=True)
    with env.begin(write=True) as txn:
        assert txn.delete(b"snapshot", db=env.open_db(b"gossip", txn=txn))
    env.close()
    b.start()
    wait_in_sync(c.brokers, "t", 200)
    log = b.log(1 << 20)
    assert "relearning the cluster" in log and "dropping local partition" not in log, log[-3000:]
    got = read_back(c.bootstrap, "t", 1, len(acked), timeout_s=60)
    assert all(got.get(v, (None, None))[1] == off for v, off in acked.items()), "a record lost or moved"
    serves(c.bootstrap)
    # alone (no --seed), it cannot relearn: a clear refusal, exit code 1
    solo = BrokerProcess("s1", str(tmp_path / "s1")).start()
    with Admin(solo.address) as a:
        a.create_topic("solo", 1, 1)
    assert solo.stop() == 0
    env = lmdb.open(solo.data_dir, max_dbs=16, subdir=True)
    with env.begin(write=True) as txn:
        txn.delete(b"snapshot", db=env.open_db(b"gossip", txn=txn))
    env.close()
    solo.start(wait=False)
    assert solo.proc.wait(20) == 1
    assert "holds partitions but no gossip snapshot" in solo.log()
    solo.extra = solo.extra + ["--rejoin-empty"]   # the way out it names: the directory is moved aside
    solo.start()
    assert any(name.startswith("s1.refused-") for name in os.listdir(tmp_path))
    solo.stop()
