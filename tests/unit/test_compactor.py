"""The compactor (mesh.node.data.compactor) over the in-memory store: the leader's cut, the
appliers on two replicas, slices, a rollback in the middle, readers of compacted batches."""
from __future__ import annotations

import random
from types import SimpleNamespace

from mesh.kafka.convert import to_kafka
from mesh.node.data.compactor import Compactor, refuse_keyless
from mesh.wire.errors import MeshError
from mesh.wire.records import encode_batch, iter_batches, records_from
from mesh.wire.topic_config import normalize_config
from storage.memory import MemoryStore
from storage.timestamps import records_at_time

PID = 7
NOW = 10_000_000


class Replicas:
    def __init__(self, store, leader=True):
        self.store, self.leader, self.matches, self.woken = store, leader, {}, 0

    def hosts(self, pid):
        return pid == PID

    def is_leader(self, pid):
        return self.leader

    def persisted_commit(self, pid):
        return self.store.log_end(pid)

    def followers(self, pid):
        return dict(self.matches)

    def log_start_moved(self, pid):
        self.woken += 1


def catalog(**cfg):
    c = normalize_config({"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.1", **cfg})
    return SimpleNamespace(topics={"kv": SimpleNamespace(name="kv", config=c, pids=(PID,))})


def fill(store, seed=1, n=3000, keys=50, ts0=NOW - 100_000):
    rng = random.Random(seed)
    i = 0
    while i < n:
        m = rng.randint(1, 40)
        ks = [b"k%d" % rng.randrange(keys) for _ in range(m)]
        vs = [None if rng.random() < 0.1 else b"v%d" % (i + j) for j in range(m)]
        store.stage_append(PID, encode_batch(vs, ks, [ts0 + i + j for j in range(m)]), 1, m)
        i += m
    store.commit()


def all_records(store):
    out = []
    for chunk in store.read(PID, store.log_start(PID), 1 << 40, store.log_end(PID)):
        for h, b in iter_batches(chunk):
            out.extend((r.offset, r.key, r.value, r.timestamp) for r in records_from("kv", 0, bytes(b), 0, h))
    return out


def run(comp, store, start_ms=0, step_ms=100, turns=10_000):
    for i in range(turns):
        comp.step(start_ms + i * step_ms)
        store.commit()
        if not comp._jobs and store.clean_applied(PID) == store.clean_target(PID):
            return i
    raise AssertionError("the compactor did not finish")


def test_leader_cuts_every_replica_applies_and_both_hold_the_same_records():
    lead, foll = MemoryStore(), MemoryStore()
    fill(lead)
    fill(foll)
    before, size0 = all_records(lead), lead.size_bytes(PID)
    rl, rf = Replicas(lead), Replicas(foll, leader=False)
    cat = catalog(**{"delete.retention.ms": "1000"})
    cl, cf = Compactor(lead, cat, rl, bytes_per_s=20_000), Compactor(foll, cat, rf, bytes_per_s=7_000)
    rl.matches = {"f": 1500}   # the follower holds less: the cut goes no further than it
    cl.plan(NOW, True)
    lead.commit()
    end, horizon = lead.clean_target(PID)
    assert rl.woken == 1 and end <= 1500 and horizon == NOW - 1000
    rl.matches = {"f": lead.log_end(PID)}
    turns = run(cl, lead)
    assert turns > 3   # sliced: the budget spreads the work over turns
    cl.plan(NOW, True)   # dirty again above the first cut: a second cut to the end
    lead.commit()
    assert lead.clean_target(PID)[0] == lead.log_end(PID)
    run(cl, lead)
    foll.stage_clean_target(PID, *lead.clean_target(PID))   # what the rows carried (CleanTo)
    foll.commit()
    run(cf, foll)
    after = all_records(lead)
    assert after == all_records(foll)
    latest = {}
    for _o, k, v, _t in before:
        latest[k] = v
    assert {k: v for _o, k, v, _t in after} == {k: v for k, v in latest.items() if v is not None}
    assert lead.size_bytes(PID) < size0 / 4 and foll.size_bytes(PID) == lead.size_bytes(PID)
    assert cl.cleaned_bytes > 0 and cl.dirty_ratio(PID) == 0.0


def test_a_rollback_in_the_middle_starts_again_and_ends_the_same():
    a, b = MemoryStore(), MemoryStore()
    fill(a, seed=3)
    fill(b, seed=3)
    cat = catalog()
    ca, cb = Compactor(a, cat, Replicas(a), bytes_per_s=5_000), Compactor(b, cat, Replicas(b), bytes_per_s=50_000)
    ca.plan(NOW, True)
    a.commit()
    b.stage_clean_target(PID, *a.clean_target(PID))
    b.commit()
    for i in range(1, 40):    # part of the way, then one turn's slice rolled back
        ca.step(i * 100)
        a.commit()
    ca.step(4000)
    a.rollback()
    assert not ca._jobs
    run(ca, a, start_ms=5000)
    run(cb, b)
    assert all_records(a) == all_records(b)


def test_an_untrusted_clock_drops_superseded_records_but_no_tombstone():
    s = MemoryStore()
    fill(s, seed=5)
    comp = Compactor(s, catalog(**{"delete.retention.ms": "0"}), Replicas(s), bytes_per_s=1 << 20)
    comp.plan(NOW, False)
    s.commit()
    assert s.clean_target(PID)[1] == 0
    run(comp, s)
    recs = all_records(s)
    assert any(v is None for _o, _k, v, _t in recs)
    assert len({k for _o, k, _v, _t in recs}) == len(recs)


def test_keyless_records_are_refused():
    refuse_keyless(encode_batch([b"1", None], [b"a", b"b"]))
    for batch in (encode_batch([b"1"]), encode_batch([b"1", b"2"], [b"a", None])):
        try:
            refuse_keyless(batch)
        except MeshError as exc:
            assert exc.code.name == "INVALID_RECORD"
        else:
            raise AssertionError("a keyless record was taken")


def test_readers_step_over_the_gaps():
    s = MemoryStore()
    fill(s, seed=9, n=400, keys=5)
    comp = Compactor(s, catalog(), Replicas(s), bytes_per_s=1 << 20)
    comp.plan(NOW, True)
    s.commit()
    run(comp, s)
    want = [(o, k, v) for o, k, v, _t in all_records(s)]
    payload = b"".join(s.read(PID, 0, 1 << 30, s.log_end(PID)))
    kafka, n = to_kafka(payload)
    from aiokafka.record.memory_records import MemoryRecords
    mr, got, nxt = MemoryRecords(kafka), [], 0
    while (bt := mr.next_batch()) is not None:
        assert bt.validate_crc() and bt.base_offset == nxt
        nxt = bt.next_offset
        got.extend((r.offset, r.key, r.value) for r in bt)
    assert got == want and n == len(want) and nxt == s.log_end(PID)
    # by timestamp: the first kept record at or after it, never an offset compaction removed
    o, k, v, t = all_records(s)[len(want) // 2]
    for chunk in s.read(PID, 0, 1 << 30, s.log_end(PID)):
        for h, b in iter_batches(chunk):
            found = records_at_time(bytes(b), t, 0, s.log_end(PID))
            if found is not None:
                assert found[0] in {x[0] for x in want}


def test_the_dirty_ratio_survives_a_restart_of_the_compactor():
    s = MemoryStore()
    fill(s, seed=11)
    cat = catalog()
    comp = Compactor(s, cat, Replicas(s), bytes_per_s=1 << 20)
    comp.plan(NOW, True)
    s.commit()
    run(comp, s)
    ratio = comp.dirty_ratio(PID)
    assert ratio == 0.0
    s._clean_cache.clear()   # as after a restart: read back from meta
    assert Compactor(s, cat, Replicas(s)).dirty_ratio(PID) == ratio


def test_hostile_compaction_fields_in_rows_are_refused():
    import pytest as _pytest
    from mesh.raft.messages import HeartbeatRow, ReplHeartbeat, parse_rows
    ok = ReplHeartbeat([[1, 1, 5, 0, 0, 0, 0, 3, 100]])
    assert parse_rows(ok)[0].clean_end == 3
    assert parse_rows(ReplHeartbeat([[1, 1, 5, 0, 0, 0, 0]]))[0].clean_end == 0   # an older broker's row
    for bad in ([1, 1, 5, 0, 0, 0, 0, -5, 0], [1, 1, 5, 0, 0, 0, 0, 1 << 62, 0], [1, 1, 5, 0, 0, 0, 0, 0, "x"]):
        with _pytest.raises(MeshError):
            parse_rows(ReplHeartbeat([bad]))
    assert HeartbeatRow._fields[-2:] == ("clean_end", "clean_horizon")
