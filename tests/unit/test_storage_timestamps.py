"""``StoreBase.offset_for_time``: the first record at or after a timestamp (Kafka's
ListOffsets by timestamp), on both stores. Batches are skipped by their max timestamp;
timestamps need not grow along the log (Kafka's semantics: the first record in offset
order whose timestamp reaches the target)."""
import pytest

from mesh.wire.records import encode_batch
from storage.log import Store
from storage.memory import MemoryStore


@pytest.fixture(params=["lmdb", "memory"])
def store(request, tmp_path):
    s = Store(str(tmp_path / "db"), map_size=64 << 20) if request.param == "lmdb" else MemoryStore()
    yield s
    s.close()


def test_the_first_record_reaching_a_timestamp_is_found(store):
    pid = store.partition_id("t", 0)
    batches = [[100, 100, 100],     # offsets 0-2, one timestamp: no delta column
               [200, 150, 250],     # 3-5: out of order inside the batch
               [90, 300],           # 6-7: a late record first
               [400]]               # 8
    for tss in batches:
        store.stage_append(pid, encode_batch([b"v"] * len(tss), timestamps_ms=tss), 0, len(tss))
    store.commit()
    hw = 9
    q = lambda ts, hw=hw: store.offset_for_time(pid, ts, hw)
    assert q(0) == (0, 100) and q(100) == (0, 100)
    assert q(101) == (3, 200)        # first in offset order, not the smallest timestamp >= 101
    assert q(201) == (5, 250)
    assert q(251) == (7, 300)        # batch 6-7 starts with 90 < 251: its deltas are decoded
    assert q(301) == (8, 400)
    assert q(401) is None            # nothing reaches it: Kafka answers -1
    assert q(301, hw=8) is None      # the high watermark bounds the answer
    assert q(251, hw=7) is None      # (inside a batch too)


def test_the_log_start_bounds_it_and_empty_logs_answer_none(store):
    pid = store.partition_id("t", 1)
    assert store.offset_for_time(pid, 0, 0) is None
    store.stage_reset(pid, 50)
    store.stage_append(pid, encode_batch([b"a", b"b"], timestamps_ms=[10, 20]), 0, 2)
    store.commit()
    assert store.offset_for_time(pid, 0, 52) == (50, 10)
    assert store.offset_for_time(pid, 15, 52) == (51, 20)


def test_the_index_follows_appends_truncations_and_retention(store, monkeypatch):
    """Runs of 2 batches (RUN_BATCHES patched) so a few batches make several runs; the
    answers stay those of a scan of the whole log after each change."""
    import storage.timestamps as ts_mod
    monkeypatch.setattr(ts_mod, "RUN_BATCHES", 2)
    pid = store.partition_id("t", 2)

    def put(tss):
        store.stage_append(pid, encode_batch([b"v"] * len(tss), timestamps_ms=tss), 0, len(tss))
        store.commit()

    def scan(ts, hw):   # the truth: every record in offset order
        from mesh.wire.records import iter_batches, records_from
        for c in store.read(pid, store.log_start(pid), 1 << 30, hw) if hw > store.log_start(pid) else []:
            for r in records_from("t", 0, c, store.log_start(pid)):
                if r.offset < hw and r.timestamp >= ts:
                    return r.offset, r.timestamp
        return None

    def check(hw):
        for ts in range(0, 1000, 25):
            assert store.offset_for_time(pid, ts, hw) == scan(ts, hw), (ts, hw)

    for tss in ([100], [50, 300], [200], [400, 120], [10], [500]):   # offsets 0, 1-2, 3, 4-5, 6, 7
        put(tss)
    check(8)
    check(5)                       # a high watermark inside the runs
    store.stage_truncate(pid, 4)   # a diverged suffix: offsets 4.. go
    check(4)                       # (staged: a lookup in the same turn)
    store.commit()
    put([900, 600])                # offsets 4-5 again, other timestamps
    check(6)
    store.stage_retention(pid, now_ms=10**9, retention_ms=1, retention_bytes=None, keep_from=3)
    store.commit()
    assert store.log_start(pid) == 3
    check(6)
    put([950])
    check(7)


def test_a_long_partition_is_indexed_over_several_lookups(store, monkeypatch):
    """A lookup reads at most MAX_WALK_BATCHES headers: an answer beyond them is
    StillIndexing (the node answers TIMEOUT, retriable), and the next lookup goes on."""
    import storage.timestamps as ts_mod
    monkeypatch.setattr(ts_mod, "MAX_WALK_BATCHES", 3)
    monkeypatch.setattr(ts_mod, "RUN_BATCHES", 2)
    pid = store.partition_id("t", 3)
    for i in range(10):
        store.stage_append(pid, encode_batch([b"v"], timestamps_ms=100 * i), 0, 1)
    store.commit()
    assert store.offset_for_time(pid, 0, 10) == (0, 0)     # in the first walk: answered at once
    tries = 0
    while True:
        tries += 1
        try:
            got = store.offset_for_time(pid, 850, 10)
            break
        except ts_mod.StillIndexing:
            assert tries < 10
    assert got == (9, 900) and tries == 3                   # 10 headers, 3 more per lookup
    assert store.offset_for_time(pid, 950, 10) is None      # indexed to the end: a final "none"


def test_the_lookups_of_one_request_share_one_budget(store):
    """Thousands of partitions asked at once cannot hold the loop either: once the shared
    budget is spent, the rest are StillIndexing (retriable) and answered by a later ask."""
    import storage.timestamps as ts_mod
    pids = [store.partition_id("many", p) for p in range(5)]
    for pid in pids:
        store.stage_append(pid, encode_batch([b"v"], timestamps_ms=[50]), 0, 1)
    store.commit()
    budget = [2 * ts_mod.READ_COST]
    answered, later = [], []
    for pid in pids:
        try:
            answered.append(store.offset_for_time(pid, 10, 1, budget))
        except ts_mod.StillIndexing:
            later.append(pid)
    assert answered == [(0, 50), (0, 50)] and len(later) == 3
    assert [store.offset_for_time(pid, 10, 1) for pid in later] == [(0, 50)] * 3
