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
