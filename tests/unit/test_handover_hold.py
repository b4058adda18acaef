"""Produce requests that reach a leader while it hands its leadership over are held, not
refused, and run again in order when the handover ends (mesh.node.data.datapath). The shell is
driven by hand here, around the real DataPath; tests/sim/test_node_sim.py runs the same
code with the real replication core through seeded handovers."""
from __future__ import annotations

import pytest

from mesh.node.data import datapath as dp_mod
from mesh.node.data.datapath import DataPath
from mesh.wire import messages as m
from mesh.wire.errors import ErrorCode, MeshError
from mesh.wire.records import encode_batch


class Topic:
    name, partitions, pids = "t", 1, [7]
    config = {"max.message.bytes": 1 << 20}


class Catalog:
    topics = {"t": Topic()}

    def partition(self, name, p):
        return Topic(), 7


class Replicas:
    """The leader of partition 7, handing over while ``moving``; ``leader_id`` once it ended."""

    def __init__(self):
        self.moving, self.leader_id, self.appended = False, "n1", []

    def is_leader(self, pid):
        return self.leader_id == "n1"

    def hosts(self, pid):
        return True

    def transferring(self, pid):
        return self.moving

    def leader(self, pid):
        return self.leader_id, 3

    def append_position(self, pid):
        if self.moving or self.leader_id != "n1":
            raise MeshError(ErrorCode.NOT_LEADER, "not the leader", leader=None)
        return len(self.appended), 3

    def leader_append(self, pid, end, epoch, base, stored, patched=False):
        pass

    def commit_offset(self, pid):
        return 0


class Store:
    def __init__(self, replicas):
        self.replicas = replicas

    def room_for(self, nbytes):
        return True

    def stage_batch(self, pid, payload, epoch, count):
        base = len(self.replicas.appended)
        self.replicas.appended.append(payload)
        return base, base + count, payload


class Producers:
    """The idempotent producer's sequence check, as ProducerStates does it for one producer:
    a batch whose first sequence is not the next one expected is refused (an earlier batch
    is still in flight)."""

    def __init__(self):
        self.next = 0

    def check(self, pid, h):
        if h.producer_id >= 0 and h.base_sequence != self.next:
            raise MeshError(ErrorCode.OUT_OF_ORDER_SEQUENCE, f"expected {self.next}, got {h.base_sequence}")
        return None

    def stage(self, pid, h, base):
        if h.producer_id >= 0:
            self.next = h.base_sequence + h.record_count


def make():
    replicas, replies, now = Replicas(), [], [0]
    dp = DataPath(Store(replicas), Catalog(), replicas, Producers(),
                  lambda ident, rid, msg, payload=None: replies.append((rid, msg)),
                  leader_of=lambda t, p: {"n1": "h1:1", "n2": "h2:1"}.get(replicas.leader_id),
                  now_ms=lambda: now[0], address_of={"n1": "h1:1", "n2": "h2:1"}.get)
    return dp, replicas, replies, now


def produce(dp, rid, value=b"v", seq=-1):
    batch = encode_batch([value], producer_id=5 if seq >= 0 else -1, base_sequence=seq)
    dp.on_produce(b"c", rid, m.ProduceRequest("t", 0, 1, 5_000), batch)


def test_held_during_a_handover_then_answered_with_the_new_leader_in_order():
    dp, replicas, replies, now = make()
    replicas.moving = True
    produce(dp, 1)
    produce(dp, 2)
    assert replies == [] and dp.holding == 2 and dp.next_deadline_ms() == dp_mod._HOLD_MS
    dp.release_held()
    assert dp.holding == 2                    # still handing over: they wait
    replicas.moving, replicas.leader_id = False, None
    dp.release_held()
    assert dp.holding == 2                    # stepped down, nobody won yet: they wait on
    replicas.leader_id = "n2"
    dp.release_held()
    assert [(rid, type(msg).__name__, msg.error, msg.leader) for rid, msg in replies] == [
        (1, "ErrorResponse", ErrorCode.NOT_LEADER, "h2:1"), (2, "ErrorResponse", ErrorCode.NOT_LEADER, "h2:1")]
    assert dp.holding == 0 and replicas.appended == [] and dp.held_total == 2


def test_an_abandoned_handover_appends_what_it_held_first_and_in_order():
    dp, replicas, replies, now = make()
    replicas.moving = True
    produce(dp, 1, b"value-one")
    produce(dp, 2, b"value-two")
    replicas.moving = False                   # the target did not take over: we lead on
    produce(dp, 3, b"value-three")            # came before the release: waits behind them
    assert replicas.appended == [] and dp.holding == 3
    dp.release_held()
    values = (b"value-one", b"value-two", b"value-three")
    assert len(replicas.appended) == 3 and all(v in p for p, v in zip(replicas.appended, values))
    assert replies == [] and dp.holding == 0  # acks=1: answered after the turn's sync


def test_pipelined_idempotent_batches_wait_behind_the_held_one_not_refused_out_of_order():
    dp, replicas, replies, now = make()
    replicas.moving = True
    produce(dp, 1, b"value-one", seq=0)       # held: not stored, so sequence 1 is not next yet
    produce(dp, 2, b"value-two", seq=1)       # must wait behind it, not get OUT_OF_ORDER_SEQUENCE
    assert replies == [] and dp.holding == 2
    replicas.moving = False                   # abandoned: both stored, in order
    dp.release_held()
    assert replies == [] and len(replicas.appended) == 2 and b"value-one" in replicas.appended[0]


def test_a_request_waits_no_longer_than_the_hold_and_holds_are_bounded(monkeypatch):
    dp, replicas, replies, now = make()
    replicas.moving = True
    produce(dp, 1)
    now[0] = dp_mod._HOLD_MS
    dp.release_held()                          # the handover outlived the hold: refused now
    assert [(rid, msg.error) for rid, msg in replies] == [(1, ErrorCode.NOT_LEADER)]
    monkeypatch.setattr(dp_mod, "_HOLD_MAX", 2)
    replies.clear()
    for rid in (2, 3, 4):
        try:
            produce(dp, rid)
        except MeshError as exc:               # the dispatcher answers it as an ErrorResponse
            replies.append((rid, exc))
    assert dp.holding == 2 and [(rid, e.code) for rid, e in replies] == [(4, ErrorCode.NOT_LEADER)]
    assert "too many requests wait" in replies[0][1].message


def test_no_handover_no_hold():
    dp, replicas, replies, now = make()
    produce(dp, 1)
    assert dp.holding == 0 and len(replicas.appended) == 1
    replicas.leader_id = "n2"                 # not the leader, no handover: refused at once
    with pytest.raises(MeshError) as e:
        produce(dp, 2)
    assert e.value.code == ErrorCode.NOT_LEADER and e.value.leader == "h2:1" and dp.holding == 0



def test_after_stepping_down_for_a_handover_requests_wait_for_the_winner(monkeypatch):
    dp, replicas, replies, now = make()
    replicas.moving, replicas.leader_id = True, None   # stepped down for the target; who won: not known yet
    produce(dp, 1)
    produce(dp, 2)
    assert replies == [] and dp.holding == 2 and replicas.appended == []
    dp.release_held()
    assert dp.holding == 2                    # still nobody known: they wait on
    replicas.moving, replicas.leader_id = False, "n2"
    dp.release_held()
    assert [(rid, msg.error, msg.leader) for rid, msg in replies] == [
        (1, ErrorCode.NOT_LEADER, "h2:1"), (2, ErrorCode.NOT_LEADER, "h2:1")]
    replicas.leader_id = None                 # leaderless with no handover (an election): refused at once
    with pytest.raises(MeshError) as e:
        produce(dp, 3)
    assert e.value.code == ErrorCode.LEADER_NOT_AVAILABLE and dp.holding == 0
    replicas.moving = True                    # a handover's gap, but no hold slot left: refused as before
    monkeypatch.setattr(dp_mod, "_HOLD_ALL", 0)
    with pytest.raises(MeshError) as e:
        produce(dp, 4)
    assert e.value.code == ErrorCode.LEADER_NOT_AVAILABLE and dp.holding == 0


def test_a_closing_node_answers_what_it_holds_at_once():
    dp, replicas, replies, now = make()
    replicas.moving, replicas.leader_id = True, None
    produce(dp, 1)
    produce(dp, 2)
    dp.refuse_held()
    assert [(rid, msg.error) for rid, msg in replies] == [(1, ErrorCode.LEADER_NOT_AVAILABLE),
                                                          (2, ErrorCode.LEADER_NOT_AVAILABLE)]
    assert dp.holding == 0 and replicas.appended == []
    replies.clear()
    produce(dp, 3)
    replicas.leader_id = "n2"                 # the winner is known by then: named
    dp.refuse_held()
    assert [(rid, msg.error, msg.leader) for rid, msg in replies] == [(3, ErrorCode.NOT_LEADER, "h2:1")]


def test_a_node_that_stepped_down_and_then_wins_appends_what_it_held_in_order():
    dp, replicas, replies, now = make()
    replicas.moving, replicas.leader_id = True, None   # stepped down for a target that never took over
    produce(dp, 1, b"value-one")
    produce(dp, 2, b"value-two")
    replicas.moving, replicas.leader_id = False, "n1"  # it campaigned again and won
    dp.release_held()
    assert replies == [] and len(replicas.appended) == 2 and b"value-one" in replicas.appended[0]


def test_a_retry_of_a_batch_staged_this_turn_is_answered_only_after_the_turn_commits():
    """A retry that arrives in the turn that staged its batch was answered OK at once (acks=1);
    the turn's commit then failed (a full disk) and took the batch back: acknowledged, lost."""
    from storage.base import LogError

    class FailingStore(Store):
        def has_writes(self):
            return True

        def commit(self, now_ms=None):
            raise LogError("no space left on device")

        def rollback(self):
            self.replicas.appended.clear()

    class Retries(Producers):
        def __init__(self):
            super().__init__()
            self.staged = {}

        def check(self, pid, h):
            if h.base_sequence in self.staged:
                return self.staged[h.base_sequence]   # a duplicate: where it went
            return super().check(pid, h)

        def stage(self, pid, h, base):
            self.staged[h.base_sequence] = base
            super().stage(pid, h, base)

        def rollback(self):
            self.staged.clear()

    replicas, replies = Replicas(), []
    replicas.before_commit = lambda writes: set()
    replicas.after_commit = lambda ok: set()
    dp = DataPath(FailingStore(replicas), Catalog(), replicas, Retries(),
                  lambda ident, rid, msg, payload=None: replies.append((rid, msg)),
                  leader_of=lambda t, p: None, now_ms=lambda: 0, address_of=lambda n: None)
    produce(dp, 1, b"v", seq=0)
    produce(dp, 2, b"v", seq=0)              # the producer's retry, in the same turn
    assert replies == []                      # nothing is durable yet
    assert dp.commit_turn() is False
    assert [(rid, msg.error) for rid, msg in replies] == [(1, ErrorCode.STORAGE_ERROR), (2, ErrorCode.STORAGE_ERROR)]


def test_a_batch_stamped_more_than_an_hour_ahead_is_refused():
    """Time retention deletes from the head while its newest timestamp is old enough: one
    batch stamped in the far future kept its partition from ever expiring."""
    replicas, replies = Replicas(), []
    wall = [1_800_000_000_000]
    dp = DataPath(Store(replicas), Catalog(), replicas, Producers(),
                  lambda ident, rid, msg, payload=None: replies.append((rid, msg)),
                  leader_of=lambda t, p: None, now_ms=lambda: 0, address_of=lambda n: None,
                  wall_ms=lambda: wall[0])
    ahead = encode_batch([b"v"], timestamps_ms=wall[0] + dp_mod.MAX_TIMESTAMP_AHEAD_MS + 1)
    with pytest.raises(MeshError, match="more than an hour ahead") as exc:
        dp.on_produce(b"c", 1, m.ProduceRequest("t", 0, 1, 5_000), ahead)
    assert exc.value.code == ErrorCode.INVALID_REQUEST and replicas.appended == []
    fine = encode_batch([b"v"], timestamps_ms=wall[0] + dp_mod.MAX_TIMESTAMP_AHEAD_MS)
    dp.on_produce(b"c", 2, m.ProduceRequest("t", 0, 1, 5_000), fine)
    assert len(replicas.appended) == 1
