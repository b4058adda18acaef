"""Write caching (issue 41): which commits sync, per mode, and what the replication shell
sends before a sync. The store's rule (``storage.base``): a turn syncs unless every row it
staged belongs to a write-cached partition (or is a soft row, a commit offset); a turn that
did not sync is synced within flush.ms; term and vote always sync before they are sent."""
from __future__ import annotations

import pytest

from mesh.raft.messages import ReplAppendResp, ReplVote, ReplVoteResp
from mesh.wire.codec import decode_body
from mesh.wire.errors import MeshError
from mesh.wire.records import encode_batch
from mesh.wire.topic_config import normalize_config, write_caching_of
from storage.log import Store
from storage.memory import MemoryStore
from tests.unit.test_raft_host import PID, Cluster

CACHED, PLAIN = 7, 8


def _stores(tmp_path):
    return [MemoryStore(), Store(str(tmp_path / "lmdb"))]


def _append(store, pid: int, value: bytes = b"v") -> None:
    store.stage_append(pid, encode_batch([value]), 1, 1)


@pytest.mark.parametrize("kind", [0, 1], ids=["memory", "lmdb"])
def test_a_turn_of_cached_rows_only_commits_without_a_sync_then_syncs_within_flush_ms(tmp_path, kind):
    store = _stores(tmp_path)[kind]
    store.set_cached(CACHED, 100)
    _append(store, CACHED)
    store.commit(1_000)
    assert (store.syncs, store.unsynced_commits, store.unsynced_due_ms) == (0, 1, 1_100)
    _append(store, CACHED)
    store.commit(1_050)   # the due time stays the first unsynced commit's
    assert (store.syncs, store.unsynced_due_ms) == (0, 1_100)
    store.commit(1_099)   # nothing staged, not due: nothing to do
    assert store.syncs == 0
    store.commit(1_100)   # due: synced, with no write of its own
    assert (store.syncs, store.unsynced_due_ms) == (1, None)
    assert store.log_end(CACHED) == 2
    store.close()


@pytest.mark.parametrize("kind", [0, 1], ids=["memory", "lmdb"])
def test_any_row_that_is_not_a_cached_partitions_makes_the_turn_sync(tmp_path, kind):
    store = _stores(tmp_path)[kind]
    store.set_cached(CACHED, 100)
    cases = [
        lambda: _append(store, PLAIN),                                  # a default partition's batch
        lambda: (_append(store, CACHED), _append(store, PLAIN)),       # mixed
        lambda: (_append(store, CACHED), store.put("repl", b"\0" * 8, b"term+vote")),   # hard state
        lambda: store.put("offsets", b"g", b"1"),                       # a group's offset
        lambda: (_append(store, CACHED), store.stage_truncate(CACHED, 0)),   # a delete
    ]
    for i, stage in enumerate(cases):
        stage()
        store.commit(10)
        assert store.syncs == i + 1 and store.unsynced_due_ms is None, i
    _append(store, CACHED)
    store.put("producers", CACHED.to_bytes(8, "big") + b"\0" * 8, b"p")   # its producer row: cached
    store.put_soft("repl", b"\0" * 8, b"commit offset")
    store.commit(10)
    assert store.syncs == len(cases) and store.unsynced_due_ms == 110
    store.commit()   # no clock (metadata, a clean close): always synced
    assert store.syncs == len(cases) + 1 and store.unsynced_due_ms is None
    store.close()


def test_a_store_with_no_cached_partition_syncs_every_commit_as_before():
    store = MemoryStore()
    store.put_soft("repl", b"\0" * 8, b"commit offset")
    store.commit(0)
    assert store.syncs == 1 and store.unsynced_commits == 0


def test_a_partition_no_longer_cached_has_what_it_left_unsynced_synced_at_once():
    store = MemoryStore()
    store.set_cached(CACHED, 60_000)
    _append(store, CACHED)
    store.commit(0)
    store.set_cached(CACHED, None)
    store.commit(1)
    assert store.syncs == 1 and store.unsynced_due_ms is None


def test_lmdb_the_flush_ms_sync_runs_off_the_loop_thread(tmp_path):
    from mesh.testing.launcher import wait_until
    store = Store(str(tmp_path / "s"))
    store.set_cached(CACHED, 10)
    _append(store, CACHED)
    store.commit(0)
    assert store._flusher.done < store._commits == 1
    store.commit(10)   # due: handed to the flusher, the loop goes on
    assert store.unsynced_due_ms is None and store.syncs == 1
    wait_until(lambda: store._flusher.done == 1, 10, "the flusher's sync")
    _append(store, PLAIN)   # a synced commit covers every commit before it
    _append(store, CACHED)
    store.commit(20)
    assert store._flusher.done == store._commits == 1 and store.unsynced_due_ms is None
    store.close()


def test_lmdb_write_caching_is_available_and_a_clean_close_syncs(tmp_path):
    store = Store(str(tmp_path / "s"))
    assert store._nosync is not None   # the flag word was found and proven (storage.nosync)
    store.set_cached(CACHED, 100_000)
    _append(store, CACHED, b"kept")
    store.commit(0)
    assert store.unsynced_due_ms is not None
    store.close()   # syncs first
    again = Store(str(tmp_path / "s"))
    assert again.log_end(CACHED) == 1 and again.unsynced_due_ms is None
    again.close()


def test_topic_configs_write_caching_and_flush_ms_follow_the_broker_default_when_unset():
    assert write_caching_of(normalize_config({}), False, 100) is None
    assert write_caching_of(normalize_config({}), True, 100) == 100
    assert write_caching_of(normalize_config({"write.caching": "true", "flush.ms": 5}), False, 100) == 5
    assert write_caching_of(normalize_config({"write.caching": False}), True, 100) is None
    for bad in ({"write.caching": 2}, {"write.caching": "maybe"}, {"flush.ms": -1}):
        with pytest.raises(MeshError):
            normalize_config(bad)


# -- the replication shell: what a replica sends before and after a sync ------------------

class Recorded(Cluster):
    """The raft host test's cluster, committing with the clock (as the data path does) and
    noting, for every message sent, whether its sender had anything committed unsynced."""

    def __init__(self, cached: bool) -> None:
        self.sent: list[tuple[str, type, bool]] = []
        super().__init__()
        for nid in self.ids:
            store = self.stores[nid]
            store.set_cached(99, 100)   # caching is on in every store, for another partition
            if cached:
                store.set_cached(PID, 100)
            h, send = self.hosts[nid], self.hosts[nid]._send

            def note(dest, msg, payload, nid=nid, store=store, send=send):
                self.sent.append((nid, type(msg), store.unsynced_due_ms is not None))
                send(dest, msg, payload)
            h._send = note

    def turn(self, nid: str, ok: bool = True) -> None:
        h, store = self.hosts[nid], self.stores[nid]
        h.before_commit(store.has_writes())
        store.commit(self.now_ms)
        self.woken[nid] |= h.after_commit(True)

    def produce(self, nid: str, value: bytes = b"v", timeout_ms: int = 1000) -> tuple[int, int]:
        h, store = self.hosts[nid], self.stores[nid]
        base, epoch = h.append_position(PID)
        _, end = store.stage_append(PID, encode_batch([value]), epoch, 1)
        h.leader_append(PID, end, epoch)
        h.before_commit(store.has_writes())
        store.commit(self.now_ms)
        h.park_ack(PID, b"client", 7, base, end, timeout_ms)
        h.after_commit(True)
        return base, end


def _acked(c: Recorded) -> None:
    base, end = c.produce("n0")
    c.deliver()
    (_, _, resp), = c.replies["n0"]
    assert resp.error == 0 and resp.base_offset == base


def test_default_partition_a_follower_answers_an_append_only_once_it_synced_it():
    c = Recorded(cached=False)
    c.start()
    syncs, at = {nid: c.stores[nid].syncs for nid in c.ids}, len(c.sent)
    _acked(c)
    answers = [unsynced for nid, t, unsynced in c.sent[at:] if t is ReplAppendResp]
    assert answers and not any(answers)   # every answer left with nothing unsynced behind it
    assert all(c.stores[nid].syncs > syncs[nid] for nid in c.ids)


def test_write_cached_partition_acks_all_is_answered_on_written_copies_and_votes_still_sync():
    c = Recorded(cached=True)
    c.start()
    votes = [unsynced for _, t, unsynced in c.sent if t in (ReplVote, ReplVoteResp)]
    assert votes and not any(votes)   # term and vote: synced before they leave, whatever the mode
    syncs, at = {nid: c.stores[nid].syncs for nid in c.ids}, len(c.sent)
    _acked(c)
    answers = [unsynced for _, t, unsynced in c.sent[at:] if t is ReplAppendResp]
    assert answers and all(answers)   # answered on a written, not yet synced, copy
    assert {nid: c.stores[nid].syncs for nid in c.ids} == syncs   # acknowledged with no sync at all
    c.advance(100)   # flush.ms later every replica synced it
    assert all(c.stores[nid].unsynced_due_ms is None for nid in c.ids)
    assert all(c.stores[nid].syncs > syncs[nid] for nid in c.ids)
