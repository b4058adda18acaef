"""mesh.node.replication.raft_host: the replication shell over ``MemoryStore``, a clock the test owns and
a FIFO of encoded peer messages. It checks the shell contract of ``mesh.raft.manager``:
persist, then send; acks=all answered at commit; a failed commit sends nothing and rebuilds
the core from storage; time comes only from the injected clock.
"""
from __future__ import annotations

import random

import pytest

from mesh.node.data.producer_state import ProducerStates
from mesh.node.replication.raft_host import TICK_DEBT, REPLICATION_MESSAGES, ReplicaHost
from mesh.raft import PEER_MESSAGES, ReplicationConfig, Role
from mesh.raft.log import NO_READY
from mesh.wire.codec import decode_body, encode_body, op_of
from mesh.wire.errors import ErrorCode
from mesh.wire.records import encode_batch
from storage.memory import MemoryStore

CFG = ReplicationConfig(heartbeat_ticks=1, election_ticks=10, auto_rebalance=False)
TICK_MS = 50
PID = 1


class Cluster:
    def __init__(self, n: int = 3) -> None:
        self.now_ms = 0
        self.ids = [f"n{i}" for i in range(n)]
        self.stores = {nid: MemoryStore() for nid in self.ids}
        self.queue: list[tuple[str, str, bytes, bytes, bytes | None]] = []
        self.replies: dict[str, list] = {nid: [] for nid in self.ids}
        self.published: dict[str, list] = {nid: [] for nid in self.ids}
        self.woken: dict[str, set] = {nid: set() for nid in self.ids}   # what after_commit said to wake
        self.hosts = {nid: self._host(nid) for nid in self.ids}

    def _host(self, nid: str, confirmed: bool = True) -> ReplicaHost:
        store = self.stores[nid]
        h = ReplicaHost(nid, store, ProducerStates(store), random.Random(nid),
                        send=lambda dest, msg, payload: self.queue.append(
                            (nid, dest, op_of(msg), encode_body(msg), payload)),
                        publish=lambda pid, leader, epoch: self.published[nid].append((pid, leader, epoch)),
                        config=CFG, tick_ms=TICK_MS, now_ms=lambda: self.now_ms,
                        store_id=f"store-{nid}", confirmed=confirmed)
        h.reply = lambda ident, rid, msg: self.replies[nid].append((ident, rid, msg))
        return h

    def turn(self, nid: str, ok: bool = True) -> None:
        """End one loop turn of ``nid`` the way the data path does: one commit, then after_commit."""
        h, store = self.hosts[nid], self.stores[nid]
        h.before_commit(store.has_writes())
        if ok:
            store.commit()
        else:
            store.rollback()  # what a failed commit leaves behind
        self.woken[nid] |= h.after_commit(ok)

    def deliver(self, drop=lambda src, dest: False) -> None:
        while self.queue:
            src, dest, op, body, payload = self.queue.pop(0)
            if not drop(src, dest):
                self.hosts[dest].step(src, decode_body(op, body), payload)
                self.turn(dest)

    def start(self) -> None:
        for nid in self.ids:
            self.hosts[nid].add(PID, self.ids)  # n0, the preferred replica, campaigns at once
        for nid in self.ids:
            self.turn(nid)
        self.deliver()

    def produce(self, nid: str, value: bytes = b"v", timeout_ms: int = 1000) -> tuple[int, int]:
        h, store = self.hosts[nid], self.stores[nid]
        base, epoch = h.append_position(PID)
        got_base, end = store.stage_append(PID, encode_batch([value]), epoch, 1)
        assert got_base == base
        h.leader_append(PID, end, epoch)
        h.before_commit(store.has_writes())
        store.commit()
        h.park_ack(PID, b"client", 7, base, end, timeout_ms)
        h.after_commit(True)
        return base, end

    def advance(self, ms: int) -> None:
        self.now_ms += ms
        for nid in self.ids:
            self.hosts[nid].tick_due()
            self.turn(nid)


def test_replication_messages_are_the_peer_messages():
    assert REPLICATION_MESSAGES is PEER_MESSAGES


def test_the_preferred_replica_leads_and_acks_all_is_answered_at_commit():
    c = Cluster()
    c.start()
    assert c.hosts["n0"].is_leader(PID) and c.hosts["n0"].core.role(PID) is Role.LEADER
    assert (PID, "n0", 1) in c.published["n0"] and (PID, "n0", 1) in c.published["n2"]
    base, end = c.produce("n0")
    assert c.replies["n0"] == []  # only the leader holds it
    c.deliver()
    (ident, rid, resp), = c.replies["n0"]
    assert (ident, rid, resp.error, resp.base_offset) == (b"client", 7, 0, base)
    assert [c.stores[nid].log_end(PID) for nid in c.ids] == [end] * 3
    assert c.hosts["n1"].commit_offset(PID) == 0
    c.advance(TICK_MS)  # the next heartbeat tells the followers
    c.deliver()
    assert [c.hosts[nid].commit_offset(PID) for nid in c.ids] == [end] * 3
    # the shared Ready of calls that ask nothing is never changed by the shell
    assert not NO_READY and (NO_READY.log_ops, NO_READY.persist, NO_READY.messages) == ([], [], [])
    with pytest.raises(TypeError):
        NO_READY.messages.append(None)


def test_a_leadership_that_moves_away_wakes_the_partitions_parked_fetches():
    c = Cluster()
    c.start()
    c.produce("n0")
    c.deliver()
    c.advance(TICK_MS)
    c.deliver()
    for nid in c.ids:
        c.woken[nid].clear()
    c.hosts["n0"].transfer_leadership(PID, "n1")
    c.turn("n0")
    c.deliver()
    assert c.hosts["n1"].is_leader(PID) and c.hosts["n0"].leader(PID)[0] == "n1"
    # n0's commit offset did not move: PID is woken because its leadership went to n1, so
    # a fetch parked on n0 is answered NOT_LEADER naming n1 now, not at its max wait
    assert PID in c.woken["n0"]


def test_a_vote_leaves_only_after_the_turn_committed_it():
    c = Cluster()
    for nid in c.ids:
        c.hosts[nid].add(PID, c.ids)
    assert c.queue == []  # n0's pre-vote requests are held until its turn commits
    c.turn("n0")
    assert sorted((s, d, op) for s, d, op, *_ in c.queue) == [("n0", "n1", b"REPL_VOTE"), ("n0", "n2", b"REPL_VOTE")]
    votes_for_n1 = 0
    while c.queue:
        src, dest, op, body, payload = c.queue.pop(0)
        c.hosts[dest].step(src, decode_body(op, body), payload)
        if (src, dest, op) == ("n0", "n1", b"REPL_VOTE"):
            votes_for_n1 += 1
            # a pre-vote grant persists nothing; a real grant persists the vote first
            assert c.stores["n1"].has_writes() == (votes_for_n1 == 2)
            assert [m for m in c.queue if m[0] == "n1"] == []  # the grant is held
        c.turn(dest)
    assert votes_for_n1 == 2 and c.hosts["n0"].is_leader(PID)
    assert c.hosts["n1"].core.state(PID).vote == "n0"
    assert c.stores["n1"].get("repl", PID.to_bytes(8, "big")) is not None


def test_a_failed_commit_sends_nothing_and_rebuilds_the_core_from_storage():
    c = Cluster()
    c.start()
    base, end = c.produce("n0")
    c.queue.clear()  # the followers never see it: the batch stays uncommitted
    h, old_core = c.hosts["n0"], c.hosts["n0"].core
    c.now_ms += CFG.heartbeat_ticks * TICK_MS
    h.tick_due()  # heartbeats are now held
    c.turn("n0", ok=False)
    assert c.queue == []
    (_, _, resp), = c.replies["n0"]
    assert resp.error == int(ErrorCode.STORAGE_ERROR)
    assert h.core is not old_core and h.core.role(PID) is Role.FOLLOWER
    assert h.core.end_offset(PID) == end and h.core.state(PID).term == 1  # what the disk holds


def test_ticks_and_deadlines_follow_the_injected_clock():
    c = Cluster()
    c.start()
    h = c.hosts["n0"]
    c.produce("n0", timeout_ms=100)
    c.queue.clear()
    ticks = h.core.now_tick
    c.now_ms += 2 * TICK_MS + 10
    assert h.next_tick_in_ms() == 0
    for _ in range(5):   # one tick per turn: the debt is paid by the next turns
        h.tick_due()
    assert h.core.now_tick == ticks + 2 and h.next_tick_in_ms() == TICK_MS - 10
    c.now_ms += 1000 * TICK_MS  # a long stall: one tick and a debt of TICK_DEBT, not a storm
    for _ in range(10):
        h.tick_due()
    assert h.core.now_tick == ticks + 3 + TICK_DEBT and h.next_tick_in_ms() == TICK_MS
    c.queue.clear()
    h.expire()
    (_, _, resp), = c.replies["n0"]
    assert resp.error == int(ErrorCode.TIMEOUT)


def test_lost_state_and_corruption_pass_through_and_survive_a_rebuild():
    c = Cluster()
    c.start()
    for _ in range(3):
        c.produce("n0")
        c.deliver()
    h = c.hosts["n1"]
    h.declare_lost_state()
    c.turn("n1")
    assert h.recovering(PID) and h.status(PID)["recovering"] and h.status(PID)["confirmed"]
    saved = c.stores["n1"].get("repl", PID.to_bytes(8, "big"))
    assert h._load_state(PID).recovering  # persisted: a restart mid-refill stays recovering
    h._rebuild()  # a failed commit rebuilds the core: still lost, still recovering
    assert h.core.lost and h.recovering(PID) and saved is not None
    c.advance(TICK_MS)
    c.deliver()
    c.advance(TICK_MS)
    c.deliver()
    assert not h.recovering(PID) and h.core.state(PID).vote == "n0"
    # refilled: a later rebuild must not declare lost state again (every replica would refill
    # anew, and with another replica's disk lost meanwhile, a partition had no voters left)
    h._rebuild()
    assert not h.recovering(PID) and not h.core.lost
    # a corrupt batch on the leader: it hands over and cuts its log; a second report is a no-op
    lead = c.hosts["n0"]
    lead.report_corrupt(PID, 1)
    lead.report_corrupt(PID, 1)
    c.turn("n0")
    assert lead.recovering(PID) and c.stores["n0"].log_end(PID) == 1
    assert [op for _, _, op, *_ in c.queue].count(b"REPL_TIMEOUT_NOW") == 1
    for _ in range(4):
        c.deliver()
        c.advance(TICK_MS)
    assert not lead.recovering(PID) and c.stores["n0"].log_end(PID) == 3


def test_an_unconfirmed_host_does_not_campaign_until_confirmed():
    c = Cluster()
    c.hosts = {nid: c._host(nid, confirmed=False) for nid in c.ids}
    c.start()
    assert not any(h.is_leader(PID) for h in c.hosts.values())
    for h in c.hosts.values():
        h.confirm_identity()
    c.advance(TICK_MS)
    c.deliver()
    for _ in range(3 * CFG.election_ticks):
        c.advance(TICK_MS)
        c.deliver()
    assert sum(h.is_leader(PID) for h in c.hosts.values()) == 1


def _stage(c: Cluster, nid: str, value: bytes) -> tuple[int, int, bytes]:
    """A produce staged on leader ``nid`` the way the data path does it (its batch too)."""
    h, store = c.hosts[nid], c.stores[nid]
    base, epoch = h.append_position(PID)
    batch = encode_batch([value])
    got_base, end = store.stage_append(PID, batch, epoch, 1)
    assert got_base == base
    h.leader_append(PID, end, epoch, base, batch)
    return base, end, batch


def test_a_leaders_append_leaves_before_its_sync_and_a_failed_sync_makes_it_a_follower():
    c = Cluster()
    c.start()
    h = c.hosts["n0"]
    base, end, batch = _stage(c, "n0", b"early")
    h.before_commit(c.stores["n0"].has_writes())
    sent = [(d, op, payload) for s, d, op, _, payload in c.queue if s == "n0"]
    assert sorted(d for d, op, _ in sent if op == b"REPL_APPEND") == ["n1", "n2"]   # before the sync
    assert all(batch[12:] in payload for d, op, payload in sent if op == b"REPL_APPEND")
    assert c.stores["n0"].has_writes()   # not synced yet
    c.stores["n0"].rollback()            # the leader's sync fails
    h.after_commit(False)
    assert h.core.role(PID) is Role.FOLLOWER and h.core.end_offset(PID) == base
    c.deliver()                          # the followers store and sync it all the same
    assert [c.stores[nid].log_end(PID) for nid in ("n1", "n2")] == [end, end]


def test_an_ack_a_followers_answer_allows_leaves_before_the_leaders_next_sync():
    """The follower's answer moves the commit offset while the turn drains: the acks=all
    answer leaves at ``before_commit``, not after the turn's sync (which another produce
    of the same turn needs), and a failed sync does not take it back."""
    c = Cluster()
    c.start()
    h, store = c.hosts["n0"], c.stores["n0"]
    base, end = c.produce("n0")
    for src, dest, op, body, payload in [m for m in c.queue if m[0] == "n0"]:   # followers store, sync, answer
        c.hosts[dest].step(src, decode_body(op, body), payload)
        c.turn(dest)
    c.queue = [m for m in c.queue if m[1] == "n0"]
    src, dest, op, body, payload = c.queue.pop(0)
    h.step(src, decode_body(op, body), payload)   # one answer + the leader's synced copy: a quorum
    _stage(c, "n0", b"next")                      # this turn writes, so it will sync
    assert c.replies["n0"] == []
    assert h.before_commit(store.has_writes()) == {PID}
    (ident, rid, resp), = c.replies["n0"]         # answered before the sync
    assert (ident, rid, resp.error, resp.base_offset) == (b"client", 7, 0, base) and store.has_writes()
    assert h.commit_offset(PID) == end
    store.rollback()                              # the sync fails: the commit stands (quorum-durable)
    h.after_commit(False)
    assert len(c.replies["n0"]) == 1 and [c.stores[nid].log_end(PID) for nid in c.ids] == [end] * 3


def test_a_leaders_append_waits_for_the_sync_in_the_turn_it_wrote_its_epoch():
    c = Cluster()
    for nid in c.ids:
        c.hosts[nid].add(PID, c.ids)
    c.turn("n0")
    h = c.hosts["n0"]
    while c.queue and not h.is_leader(PID):
        src, dest, op, body, payload = c.queue.pop(0)
        c.hosts[dest].step(src, decode_body(op, body), payload)
        if dest != "n0" or not h.is_leader(PID):
            c.turn(dest)
    assert h.is_leader(PID)              # elected in this turn: its epoch marker is staged, not synced
    _stage(c, "n0", b"first")
    before = len(c.queue)
    h.before_commit(c.stores["n0"].has_writes())
    assert [m for m in c.queue[before:] if m[0] == "n0"] == []   # held: the epoch is not durable yet
    c.stores["n0"].commit()
    h.after_commit(True)
    assert {(d, op) for s, d, op, *_ in c.queue[before:] if s == "n0"} >= {("n1", b"REPL_APPEND"),
                                                                          ("n2", b"REPL_APPEND")}


def test_membership_through_the_shell_config_changes_are_taken_after_the_sync():
    c = Cluster(n=4)
    for nid in c.ids[:3]:
        c.hosts[nid].add(PID, c.ids[:3])
    for nid in c.ids[:3]:
        c.turn(nid)
    c.deliver()
    lead = c.hosts["n0"]
    assert lead.is_leader(PID)
    lead.take_config_changes()
    lead.propose_config(PID, ["n0", "n1", "n2"], ["n3"])
    c1 = lead.config(PID)
    assert c1.learners == ("n3",) and lead.config_pending(PID)
    assert lead.take_config_changes() == {}             # not durable before the turn's sync
    c.turn("n0")
    assert lead.take_config_changes() == {PID: (c1, False)}
    c.hosts["n3"].add(PID, c1)                          # a learner joins with the config
    c.turn("n3")
    c.deliver()
    c.advance(TICK_MS)
    c.deliver()
    assert lead.committed_config(PID) == c1 and not lead.config_pending(PID)
    assert lead.followers(PID)["n3"] == lead.commit_offset(PID)
    assert lead.take_config_changes() == {PID: (c1, True)}
    # the history is persisted: a restarted follower (and a rebuilt core) keeps it
    c.hosts["n3"] = c._host("n3")
    c.hosts["n3"].add(PID, c.ids[:3])                   # the history on disk wins over the list
    assert c.hosts["n3"].config(PID) == c1
    c.turn("n1", ok=False)                              # a failed commit rebuilds the core from disk
    assert c.hosts["n1"].config(PID) == c1


def test_acks_all_requests_waiting_for_one_partition_are_bounded(monkeypatch):
    """A client resending an uncommitted batch (no quorum) added a waiter on every resend;
    every turn scans them. Past the bound, TIMEOUT at once (the write may still be made)."""
    import mesh.node.replication.raft_host as raft_host
    monkeypatch.setattr(raft_host, "MAX_ACK_WAITERS_PER_PARTITION", 3)
    c = Cluster()
    h = c.hosts["n0"]
    for rid in range(5):
        h.park_ack(PID, b"c", rid, 0, 1, 60_000)
    assert len(h._waiters[PID]) == 3
    assert [(rid, msg.error) for _, rid, msg in c.replies["n0"]] == [(3, ErrorCode.TIMEOUT), (4, ErrorCode.TIMEOUT)]
