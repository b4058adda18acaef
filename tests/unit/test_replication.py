"""mesh.raft: one test per rule, on a tiny hand-driven network (etcd-raft style).

``Net`` plays the shell for a few brokers: each ``Ready`` is applied to the simulator's disk
(``tests.sim.replication_disk.SimDisk``: the real ``MemoryStore`` with real record batches)
and made durable at once, messages go through the real wire codec into a FIFO that the
test delivers, drops or cuts.
"""
from __future__ import annotations

import dataclasses
import random

import pytest

from mesh.wire.errors import ErrorCode, MeshError
from mesh.raft import (
    PEER_MESSAGES, Append, CleanTo, CutHead, EpochCache, PersistState, ReplAppend, ReplAppendResp, ReplHeartbeat, ReplHeartbeatResp,
    ReplVote, ReplicaManager, ReplicationConfig, ResetLog, Role, Truncate,
)
from mesh.raft.messages import AppendRespRow, AppendRow, HeartbeatRespRow, HeartbeatRow, VoteRow
from mesh.raft.partition import PartitionHost
from mesh.raft.membership import Config
from mesh.raft.progress import NEVER_HEARD, PROBE, REPLICATE, Progress, count_active
from mesh.raft.quorum import VoteResult, committed_offset, majority, vote_result
from mesh.wire.codec import REGISTRY, decode_body, encode_body, op_of
from tests.sim.replication_disk import SimDisk, batches_of

CFG = ReplicationConfig(heartbeat_ticks=1, election_ticks=10, retransmit_ticks=5, auto_rebalance=False,
                        isr_lag_ticks=20, quiesce_after_beats=0)   # message-exact scenarios: always ticking


class Net:
    def __init__(self, n: int = 3, pids=(1,), replicas=None, cfg: ReplicationConfig = CFG) -> None:
        self.ids = [f"n{i}" for i in range(n)]
        self.cfg = cfg
        self.replicas = {pid: list(replicas or self.ids) for pid in pids}
        self.stores: dict[str, SimDisk] = {}
        self.cores: dict[str, ReplicaManager] = {}
        self.queue: list[tuple] = []
        self.cut: set[tuple[str, str]] = set()
        self.readies: dict[str, list] = {nid: [] for nid in self.ids}
        self.sent: list[tuple[str, object]] = []
        for nid in self.ids:
            self.start(nid)

    # -- the shell ----------------------------------------------------------------------
    def start(self, nid: str, confirmed: bool = True) -> None:
        pids = [pid for pid, reps in self.replicas.items() if nid in reps]
        store = self.stores.setdefault(nid, SimDisk(pids, store_id=f"store-{nid}"))
        core = ReplicaManager(nid, random.Random(nid), self.cfg, store, store_id=store.store_id,
                              confirmed=confirmed)
        for pid in pids:
            core.add_partition(pid, self.replicas[pid], store.live_state[pid], store.live[pid].end)
        self.cores[nid] = core

    def crash(self, nid: str) -> None:
        self.stores[nid].crash()
        del self.cores[nid]

    def apply(self, nid: str, rd):
        store = self.stores[nid]
        for op in rd.log_ops:
            if type(op) is Append:
                store.stage_append(op.pid, op.payload, batches_of(op.payload))
            elif type(op) is Truncate:
                store.stage_truncate(op.pid, op.to_offset)
            elif type(op) is CutHead:
                store.stage_cut_head(op.pid, op.offset)
            elif type(op) is CleanTo:
                store.mem.stage_clean_target(op.pid, op.clean_end, op.horizon_ms)
            else:
                store.stage_reset(op.pid, op.start_offset)
        for st in rd.persist:
            store.stage_state(st)
        store.sync()
        self.readies[nid].append(rd)
        for s in rd.messages:
            self.sent.append((nid, s))
            self.queue.append((nid, s.dest, op_of(s.msg), encode_body(s.msg), s.payload))
        return rd

    def deliver(self, limit: int = 100_000, drop=lambda src, dest, msg: False) -> int:
        n = 0
        while self.queue and n < limit:
            src, dest, op, body, payload = self.queue.pop(0)
            msg = decode_body(op, body)
            if (src, dest) in self.cut or dest not in self.cores or drop(src, dest, msg):
                continue
            n += 1
            self.apply(dest, self.cores[dest].step(src, msg, payload))
            self.apply(dest, self.cores[dest].flush())
        return n

    def tick(self, n: int = 1, nids=None) -> None:
        for _ in range(n):
            for nid in sorted(nids or self.cores):
                if nid in self.cores:
                    self.apply(nid, self.cores[nid].tick())
            self.deliver()

    def elect(self, nid: str, pid: int = 1) -> None:
        self.apply(nid, self.cores[nid].campaign(pid))
        self.deliver()
        assert self.cores[nid].role(pid) is Role.LEADER

    def produce(self, nid: str, pid: int = 1, data: bytes = b"x", count: int = 1, sync: bool = True) -> tuple[int, int]:
        core, store = self.cores[nid], self.stores[nid]
        base, epoch = core.append_position(pid)
        store.stage_produce(pid, [data] * count, epoch, 0)
        core.leader_append(pid, base + count, epoch)
        self.apply(nid, core.flush())
        if sync:
            store.sync()
            self.apply(nid, core.synced(pid, base + count))
        return base, base + count

    def age(self, nids, n: int) -> None:
        """Tick ``nids`` with every message they send lost."""
        for _ in range(n):
            for nid in nids:
                self.cores[nid].tick()

    def isolate(self, nid: str) -> None:
        self.cut |= {(nid, o) for o in self.ids if o != nid} | {(o, nid) for o in self.ids if o != nid}

    def heal(self) -> None:
        self.cut = set()

    def log(self, nid: str, pid: int = 1) -> list:
        return [b[:3] for b in self.stores[nid].live[pid].batches]


def msgs_of(rds, kind) -> list:
    return [s for rd in rds for s in rd.messages if type(s.msg) is kind]


# -- the epoch cache ----------------------------------------------------------------------------

def test_epoch_cache_answers_epoch_at_and_end_for_epoch():
    c = EpochCache([(1, 0), (3, 10), (4, 25)])
    assert [c.epoch_at(o) for o in (0, 9, 10, 24, 25, 99)] == [1, 1, 3, 3, 4, 4]
    assert c.end_for_epoch(1, 30) == 10 and c.end_for_epoch(2, 30) == 10  # epoch 2 never appended
    assert c.end_for_epoch(3, 30) == 25 and c.end_for_epoch(4, 30) == 30 and c.end_for_epoch(0, 30) == 0
    assert c.last_epoch() == 4


def test_epoch_cache_assign_truncate_trim():
    c = EpochCache()
    assert c.assign(1, 0) and not c.assign(1, 5)
    c.assign(2, 7)
    c.assign(3, 7)  # epoch 2 never appended: replaced
    assert c.entries() == ((1, 0), (3, 7))
    with pytest.raises(AssertionError):
        c.assign(2, 9)
    c.assign(5, 12)
    assert c.truncate_from(12) and c.entries() == ((1, 0), (3, 7))
    assert not c.truncate_from(50)
    assert not c.trim_before(7)  # epoch 1 still covers offset 6, just below the log start
    assert c.trim_before(8) and c.entries() == ((3, 7),)
    assert c.epoch_at(2) == 3  # below the first entry: only consulted below commit


# -- elections ---------------------------------------------------------------------------------

def test_single_replica_elects_itself_and_commits_only_what_is_synced():
    net = Net(n=1)
    core = net.cores["n0"]
    net.tick(2 * CFG.election_ticks)
    assert core.role(1) is Role.LEADER and core.leader(1) == ("n0", 1)
    net.produce("n0", data=b"a", count=2, sync=False)
    assert core.commit_offset(1) == 0  # staged, not yet synced
    rd = net.apply("n0", core.synced(1, 2))
    assert rd.committed == {1: 2} and core.commit_offset(1) == 2


def test_election_on_timeout_and_leadership_reported():
    net = Net()
    net.tick(2 * CFG.election_ticks + 1)
    leaders = [nid for nid in net.ids if net.cores[nid].role(1) is Role.LEADER]
    assert len(leaders) == 1
    lead, term = net.cores[leaders[0]].leader(1)
    for nid in net.ids:
        assert net.cores[nid].leader(1) == (lead, term)
        assert any(rd.leadership.get(1) == (lead, term) for rd in net.readies[nid])


def test_vote_is_persisted_in_the_ready_that_grants_it():
    net = Net()
    core = net.cores["n1"]
    rd = core.step("n0", ReplVote([VoteRow(1, 1, 0, 0, 0, 0)]))
    assert rd.persist == [PersistState(1, 1, "n0", 0, (), False, ((0, Config(0, 0, ("n0", "n1", "n2"))),))]
    (grant,) = rd.messages
    assert grant.dest == "n0" and grant.msg.rows[0].granted == 1


def test_one_vote_per_term():
    net = Net()
    core = net.cores["n2"]
    assert core.step("n0", ReplVote([VoteRow(1, 1, 0, 0, 0, 0)])).messages[0].msg.rows[0].granted == 1
    assert core.step("n1", ReplVote([VoteRow(1, 1, 0, 0, 0, 0)])).messages[0].msg.rows[0].granted == 0
    assert core.step("n0", ReplVote([VoteRow(1, 1, 0, 0, 0, 0)])).messages[0].msg.rows[0].granted == 1


@pytest.mark.parametrize("cand, granted", [
    ((2, 5), True),    # same log
    ((2, 9), True),    # same last epoch, longer
    ((3, 1), True),    # later last epoch beats a longer log
    ((2, 4), False),   # same last epoch, shorter
    ((1, 50), False),  # older last epoch, however long
])
def test_vote_needs_a_log_at_least_as_up_to_date(cand, granted):
    net = Net()
    core = net.cores["n1"]
    core.remove_partition(1)
    core.add_partition(1, net.ids, PersistState(1, 2, None, 0, ((1, 0), (2, 3))), end_offset=5)
    rd = core.step("n0", ReplVote([VoteRow(1, 3, cand[0], cand[1], 0, 0)]))
    assert rd.messages[0].msg.rows[0].granted == int(granted)


def test_a_returning_partitioned_replica_does_not_depose_the_leader():
    net = Net()
    net.elect("n0")
    net.isolate("n2")
    net.tick(5 * CFG.election_ticks)  # n2 keeps pre-voting, never bumps its term
    assert net.cores["n2"].leader(1)[1] == 1 and net.cores["n2"].role(1) is Role.PRE_CANDIDATE
    net.heal()
    net.tick(3)
    assert net.cores["n0"].leader(1) == ("n0", 1) and net.cores["n2"].leader(1) == ("n0", 1)


def test_votes_are_ignored_within_a_leader_lease_unless_transferring():
    net = Net()
    net.elect("n0")
    core = net.cores["n1"]
    assert core.step("n2", ReplVote([VoteRow(1, 2, 1, 0, 0, 0)])).messages == []
    assert core.leader(1) == ("n0", 1)
    rd = core.step("n2", ReplVote([VoteRow(1, 2, 1, 0, 0, 1)]))
    assert rd.messages[0].msg.rows[0].granted == 1 and core.leader(1) == (None, 2)


# -- fencing and check-quorum -------------------------------------------------------------------------

def test_a_stale_leader_is_fenced_and_steps_down():
    net = Net()
    net.elect("n0")
    net.produce("n0")
    net.isolate("n0")
    net.tick(3 * CFG.election_ticks, nids=["n1", "n2"])
    new = next(n for n in ("n1", "n2") if net.cores[n].role(1) is Role.LEADER)
    assert net.cores[new].leader(1)[1] >= 2 and net.cores["n0"].role(1) is Role.LEADER
    net.heal()
    # the old leader's heartbeat reaches a follower of the new term: FENCED_EPOCH comes back
    rd = net.apply("n1" if new == "n2" else "n2", net.cores["n1" if new == "n2" else "n2"].step(
        "n0", ReplHeartbeat([HeartbeatRow(1, 1, 1)])))
    assert rd.messages[0].msg.rows[0].code == ErrorCode.FENCED_EPOCH
    net.deliver()
    assert net.cores["n0"].role(1) is Role.FOLLOWER and net.cores["n0"].leader(1)[1] >= 2


def test_a_cut_off_leader_refuses_writes_then_steps_down():
    net = Net()
    net.elect("n0")
    net.isolate("n0")
    net.tick(3 * CFG.heartbeat_ticks + 2, nids=["n0"])
    with pytest.raises(MeshError) as e:
        net.cores["n0"].append_position(1)
    assert e.value.code == ErrorCode.NOT_ENOUGH_REPLICAS and e.value.retriable
    assert net.cores["n0"].role(1) is Role.LEADER
    net.tick(CFG.election_ticks, nids=["n0"])
    assert net.cores["n0"].role(1) is Role.FOLLOWER
    with pytest.raises(MeshError) as e:
        net.cores["n0"].append_position(1)
    assert e.value.code == ErrorCode.NOT_LEADER


def test_leader_append_with_a_stale_epoch_is_refused():
    net = Net()
    net.elect("n0")
    with pytest.raises(MeshError) as e:
        net.cores["n0"].leader_append(1, 1, epoch=0)
    assert e.value.code == ErrorCode.FENCED_EPOCH
    with pytest.raises(MeshError) as e:
        net.cores["n1"].append_position(1)
    assert e.value.code == ErrorCode.NOT_LEADER and e.value.leader == "n0"


# -- replication and commit ----------------------------------------------------------------------------

def test_commit_needs_a_quorum_that_synced():
    net = Net()
    net.elect("n0")
    net.cut = {("n0", "n1"), ("n0", "n2")}
    net.produce("n0")
    net.deliver()
    assert net.cores["n0"].commit_offset(1) == 0
    net.heal()
    net.tick(CFG.retransmit_ticks + 1)  # the lost append is resent
    assert net.cores["n0"].commit_offset(1) == 1
    net.tick(1)
    assert all(net.cores[n].commit_offset(1) == 1 for n in net.ids)  # followers learn it


def test_the_leader_counts_itself_only_up_to_its_synced_offset():
    net = Net()
    net.elect("n0")
    net.cut = {("n0", "n2")}
    net.produce("n0", sync=False)  # staged on n0, sent to n1
    net.deliver()
    assert net.cores["n0"].commit_offset(1) == 0  # n1 synced it, n0 has not: no quorum yet
    net.apply("n0", net.cores["n0"].synced(1, 1))
    assert net.cores["n0"].commit_offset(1) == 1


def test_appends_are_pipelined_within_the_inflight_bounds():
    cfg = dataclasses.replace(CFG, max_append_bytes=1, max_inflight_msgs=3)
    net = Net(cfg=cfg)
    net.elect("n0")
    net.tick(1)
    for _ in range(5):
        net.produce("n0")
    appends = [m for src, s in net.sent if src == "n0" and type(s.msg) is ReplAppend
               for m in s.msg.rows if m.pid == 1 and m.end_offset > m.prev_offset]
    assert len(appends) == 2 * 3  # three in flight to each follower, none acked yet
    net.deliver()
    net.tick(2)
    assert all(net.cores[n].commit_offset(1) == 5 and len(net.log(n)) == 5 for n in net.ids)


def test_data_the_reader_cannot_see_yet_goes_out_on_a_later_flush():
    net = Net()
    net.elect("n0")
    net.tick(1)
    core, store = net.cores["n0"], net.stores["n0"]
    store.reads_staged = False  # an LMDB reader outside the turn's write transaction
    base, epoch = core.append_position(1)
    store.stage_produce(1, [b"z"], epoch, 0)
    core.leader_append(1, base + 1, epoch)

    def data_rows(rd):
        return [r for s in rd.messages if type(s.msg) is ReplAppend for r in s.msg.rows if r.end_offset > r.prev_offset]

    assert data_rows(core.flush()) == []
    store.sync()
    net.apply("n0", core.synced(1, base + 1))
    assert len(data_rows(net.apply("n0", core.flush()))) == 2
    net.deliver()
    net.tick(1)
    assert all(net.cores[n].commit_offset(1) == 1 for n in net.ids)


def test_a_divergent_follower_truncates_to_the_point_of_agreement():
    net = Net()
    net.elect("n0")
    net.produce("n0", data=b"a")
    net.tick(1)
    net.isolate("n0")
    net.produce("n0", data=b"lost1")  # epoch 1, never replicated
    net.produce("n0", data=b"lost2")
    net.tick(3 * CFG.election_ticks, nids=["n1", "n2"])
    new = next(n for n in ("n1", "n2") if net.cores[n].role(1) is Role.LEADER)
    net.produce(new, data=b"b")
    net.heal()
    net.tick(3)
    assert net.log("n0") == net.log(new) and [e for _, _, e in net.log("n0")] == [1, net.cores[new].leader(1)[1]]
    truncs = [op for rd in net.readies["n0"] for op in rd.log_ops if type(op) is Truncate]
    assert [t.to_offset for t in truncs] == [1]


def test_commit_after_an_election_waits_for_a_quorum_holding_the_new_epoch():
    """Raft 5.4.2 / figure 8, with the epoch marker standing in for a no-op entry."""
    cfg = dataclasses.replace(CFG, max_append_bytes=1, max_inflight_msgs=1)  # one batch per message
    net = Net(cfg=cfg)
    net.elect("n0")                       # epoch 1
    net.produce("n0", data=b"c")          # [0,1) committed everywhere
    net.tick(1)
    net.cut = {("n0", "n1"), ("n0", "n2")}
    net.produce("n0", data=b"x1")         # [1,2) and [2,3), epoch 1, only on n0
    net.produce("n0", data=b"x2")
    net.crash("n0")
    net.heal()
    net.age(["n1", "n2"], CFG.election_ticks)  # their lease on n0 runs out
    net.apply("n1", net.cores["n1"].campaign(1))
    net.deliver(drop=lambda src, dest, msg: type(msg) is ReplAppend)  # epoch 2; its appends are lost
    assert net.cores["n1"].leader(1) == ("n1", 2)
    net.cut = {("n1", "n0"), ("n1", "n2")}
    net.produce("n1", data=b"y")          # [1,2) epoch 2, only on n1
    net.crash("n1")
    net.start("n0")
    net.cut = set()
    net.age(["n0", "n2"], CFG.election_ticks)
    net.apply("n0", net.cores["n0"].campaign(1))  # its pre-vote learns epoch 2 from n2
    net.deliver()
    net.apply("n0", net.cores["n0"].campaign(1))
    # n0 (epoch 3, log ends at 3) wins with n2's vote; of its two batches only the first arrives
    net.deliver(drop=lambda src, dest, msg: type(msg) is ReplAppend and any(
        r.end_offset > max(2, r.prev_offset) for r in map(AppendRow._make, msg.rows)))
    assert net.cores["n0"].role(1) is Role.LEADER and net.cores["n0"].leader(1)[1] == 3
    assert net.cores["n2"].end_offset(1) == 2
    # n2 acked offset 2 (an epoch-1 batch) without holding epoch 3: no commit
    assert net.cores["n0"].commit_offset(1) == 1
    net.tick(CFG.retransmit_ticks + 2, nids=["n0", "n2"])
    assert net.cores["n2"].epoch_cache(1)[-1] == (3, 3)
    assert net.cores["n0"].commit_offset(1) == 3  # the marker is on a quorum: all of it commits
    # and n1, back with its epoch-2 batch, can no longer win n2's vote
    rd = net.cores["n2"].step("n1", ReplVote([VoteRow(1, 4, 2, 2, 0, 1)]))
    assert not any(r.granted for s in rd.messages for r in s.msg.rows)


def test_a_follower_behind_the_leader_log_start_is_reset():
    net = Net()
    net.elect("n0")
    net.isolate("n2")
    for i in range(4):
        net.produce("n0", data=b"%d" % i)
    net.tick(2, nids=["n0", "n1"])
    for nid in ("n0", "n1"):  # retention on both, below commit
        net.stores[nid].retain_from(1, 3)
        net.stores[nid].sync()
    net.heal()
    net.tick(4)
    resets = [op for rd in net.readies["n2"] for op in rd.log_ops if type(op) is ResetLog]
    assert resets == [ResetLog(1, 3)]
    assert net.log("n2") == net.log("n0") and net.cores["n2"].commit_offset(1) == 4


def test_the_leaders_compaction_cut_reaches_every_follower_and_only_grows():
    net = Net()
    net.elect("n0")
    for i in range(4):
        net.produce("n0", data=b"%d" % i)
    net.tick(2)
    net.stores["n0"].mem.stage_clean_target(1, 3, 500)   # the leader's compactor decided
    net.stores["n0"].sync()
    net.cores["n0"].log_start_moved(1)
    net.tick(2)
    for nid in ("n1", "n2"):
        cuts = [op for rd in net.readies[nid] for op in rd.log_ops if type(op) is CleanTo]
        assert cuts == [CleanTo(1, 3, 500)], (nid, cuts)   # once, though every beat carries it
        assert net.stores[nid].clean_cut(1) == (3, 500)
    # rows with an older cut (a new leader that heard less) move nothing back
    net.stores["n0"].mem.stage_clean_target(1, 2, 100)
    net.stores["n0"].sync()
    net.cores["n0"].log_start_moved(1)
    net.tick(2)
    assert net.stores["n1"].clean_cut(1) == (3, 500)
    # a cut above the leader's commit is never carried beyond it
    net.stores["n0"].mem.stage_clean_target(1, 99, 600)
    net.stores["n0"].sync()
    net.cores["n0"].log_start_moved(1)
    net.tick(2)
    assert net.stores["n1"].clean_cut(1) == (4, 600)


def test_restart_recovers_term_vote_commit_and_epochs():
    net = Net()
    net.elect("n0")
    net.produce("n0")
    net.tick(2)
    before = net.cores["n1"].state(1)
    net.crash("n1")
    net.start("n1")
    assert net.cores["n1"].state(1) == before and net.cores["n1"].end_offset(1) == 1


# -- coalescing, transfer, ISR, status ------------------------------------------------------------------

def test_heartbeats_are_coalesced_per_broker_pair():
    net = Net(pids=range(1, 201))
    for pid in range(1, 201):
        net.elect("n0", pid)
    net.tick(1)
    net.sent.clear()
    net.apply("n0", net.cores["n0"].tick())
    beats = [(src, s) for src, s in net.sent if type(s.msg) is ReplHeartbeat]
    assert sorted(s.dest for _, s in beats) == ["n1", "n2"] and all(len(s.msg.rows) == 200 for _, s in beats)
    net.deliver()
    resps = [(src, s) for src, s in net.sent if type(s.msg) is ReplHeartbeatResp]
    assert sorted(src for src, _ in resps) == ["n1", "n2"] and all(len(s.msg.rows) == 200 for _, s in resps)


def test_leadership_moves_to_the_caught_up_preferred_replica():
    cfg = dataclasses.replace(CFG, auto_rebalance=True, rebalance_delay_ticks=5)
    net = Net(replicas=["n1", "n0", "n2"], cfg=cfg)
    net.elect("n0")
    net.produce("n0")
    net.tick(5)
    assert net.cores["n1"].role(1) is Role.LEADER and net.cores["n1"].leader(1)[1] == 2
    assert net.cores["n0"].role(1) is Role.FOLLOWER and net.cores["n1"].commit_offset(1) == 1


def _one_election_each(net: Net, pids, alive, ticks: int) -> dict[int, tuple[str | None, int]]:
    """Crash n0 (leading ``pids``), tick ``alive`` for ``ticks``; {pid: (leader, terms it took)}."""
    before = {pid: net.cores["n0"].leader(pid) for pid in pids}
    assert all(lead == "n0" for lead, _ in before.values())
    net.crash("n0")
    net.tick(ticks, nids=alive)
    return {pid: (net.cores[alive[-1]].leader(pid)[0], net.cores[alive[-1]].leader(pid)[1] - before[pid][1])
            for pid in pids}


def test_successors_time_out_in_placement_order_so_a_dead_leaders_partitions_need_one_election():
    # 100 partitions led by their preferred replica n0; n0 dies. Its successors' timeouts
    # lie in their own shares of the upper half, in placement order (n1 first), so n1
    # wins each partition in the first election. With one shared window they fired in the
    # same tick for 15 of the 100 and split the vote (a second election).
    pids = tuple(range(1, 101))
    net = Net(pids=pids)
    net.tick(2 * CFG.election_ticks)
    assert _one_election_each(net, pids, ["n1", "n2"], 2 * CFG.election_ticks) == {pid: ("n1", 1) for pid in pids}


def test_quiet_partitions_whose_leader_died_also_need_one_election_each():
    # Idle partitions go quiet (no ticks); when n0's node falls silent its followers wake
    # with their timers standing at most at 1.5E, so the successors' ranks still order
    # their campaigns. Standing at 2E (as before), both campaigned at their first tick.
    cfg = dataclasses.replace(CFG, quiesce_after_beats=3)
    pids = tuple(range(1, 101))
    net = Net(pids=pids, cfg=cfg)
    net.tick(2 * cfg.election_ticks)
    net.tick(3 * cfg.election_ticks)
    assert all(net.cores["n1"]._part(pid).quiesced for pid in pids)
    assert _one_election_each(net, pids, ["n1", "n2"], 3 * cfg.election_ticks) == {pid: ("n1", 1) for pid in pids}


def test_a_pre_candidate_yields_to_a_voter_placed_before_it_so_the_vote_does_not_split():
    # n0 leads and dies; n1 and n2 campaign in the same tick (a slow turn can put both
    # ranks there). n2 grants n1's pre-vote and stops its own campaign, so n1 wins the
    # first real election. Before, each granted the other's pre-vote, both went on to
    # term + 1 voting for themselves, and nobody won.
    net = Net()
    net.elect("n0")
    term = net.cores["n0"].leader(1)[1]
    net.crash("n0")
    net.age(["n1", "n2"], CFG.election_ticks)   # their lease ends (timeouts are later)
    assert all(net.cores[nid].role(1) is Role.FOLLOWER for nid in ("n1", "n2"))
    for nid in ("n1", "n2"):
        net.apply(nid, net.cores[nid].campaign(1))
    net.deliver()
    assert net.cores["n1"].role(1) is Role.LEADER and net.cores["n2"].leader(1) == ("n1", term + 1)


def test_a_successor_whose_log_is_behind_does_not_keep_the_next_one_from_winning():
    # Without pre-vote, rank 1 (n1, behind) campaigns first and loses: a lost election
    # leaves its draw over the whole upper half, not in its rank (which would have it
    # fire first again, forever: 5 voters got no leader in 3,000 ticks).
    cfg = dataclasses.replace(CFG, pre_vote=False)
    net = Net(n=5, cfg=cfg)
    net.elect("n0")
    to_n1 = lambda src, dest, msg: dest == "n1" and type(msg) is ReplAppend
    for _ in range(3):
        net.produce("n0")
        net.deliver(drop=to_n1)
    net.tick(2, nids=["n0", "n2", "n3", "n4"])
    assert net.cores["n0"].commit_offset(1) == 3 and net.cores["n1"].end_offset(1) == 0
    net.crash("n0")
    alive = ["n1", "n2", "n3", "n4"]
    for _ in range(10 * cfg.election_ticks):
        net.tick(1, nids=alive)
        if any(net.cores[nid].role(1) is Role.LEADER for nid in alive):
            break
    leaders = [nid for nid in alive if net.cores[nid].role(1) is Role.LEADER]
    assert leaders and leaders != ["n1"] and net.cores[leaders[0]].commit_offset(1) >= 3


def test_a_successor_takes_its_rank_once_it_knows_a_leader():
    cfg = dataclasses.replace(CFG, election_ticks=14)   # the node's: upper half 21-27 ticks
    net = Net(cfg=cfg)
    net.elect("n0")
    assert net.cores["n1"]._part(1).timeout_ticks in range(21, 24)
    assert net.cores["n2"]._part(1).timeout_ticks in range(24, 27)
    drawn = {"n1": set(), "n2": set()}
    ranked = {"n1": set(), "n2": set()}
    for _ in range(300):
        for nid in drawn:
            part = net.cores[nid]._part(1)
            part._reset_timeout()   # as after a vote for a newer term, or a campaign: no leader known
            drawn[nid].add(part.timeout_ticks)
            part._rank_timeout()    # as on hearing a leader
            ranked[nid].add(part.timeout_ticks)
    assert drawn == {"n1": set(range(21, 28)), "n2": set(range(21, 28))}
    assert ranked == {"n1": {21, 22, 23}, "n2": {24, 25, 26}}
    preferred = net.cores["n0"]._part(1)
    preferred._reset_timeout()
    preferred._rank_timeout()
    assert 14 <= preferred.timeout_ticks < 21


def test_hand_over_picks_the_most_caught_up_answering_voter_and_it_wins():
    net = Net()
    net.elect("n0")
    net.cut = {("n0", "n1")}            # n1 misses the last record
    net.produce("n0")
    net.tick(1, nids=["n0", "n2"])
    net.heal()
    net.apply("n0", net.cores["n0"].hand_over(1))
    assert net.cores["n0"].transferring(1)
    net.tick(3)
    assert net.cores["n2"].role(1) is Role.LEADER and net.cores["n0"].role(1) is Role.FOLLOWER
    assert net.cores["n2"].leader(1)[1] == 2 and net.log("n2") == net.log("n0")


def test_hand_over_skips_excluded_and_silent_voters_and_is_a_no_op_on_a_follower():
    net = Net()
    net.elect("n0")
    net.tick(2)
    net.apply("n1", net.cores["n1"].hand_over(1))          # a follower: nothing
    assert not net.cores["n1"].transferring(1) and net.cores["n1"].role(1) is Role.FOLLOWER
    net.apply("n0", net.cores["n0"].hand_over(1, {"n1", "n2"}))   # both excluded: stays leader
    assert not net.cores["n0"].transferring(1)
    net.apply("n0", net.cores["n0"].hand_over(1, {"n1"}))
    assert net.cores["n0"].transferring(1)
    net.tick(3)
    assert net.cores["n2"].role(1) is Role.LEADER
    net.isolate("n0")                                       # n0 falls silent to the new leader
    net.tick(2 * CFG.heartbeat_ticks + 2, nids=["n1", "n2"])
    net.heal()
    net.apply("n2", net.cores["n2"].hand_over(1, {"n1"}))   # n0 has not answered lately: no one
    assert not net.cores["n2"].transferring(1) and net.cores["n2"].role(1) is Role.LEADER


def test_hand_over_prefers_a_voter_whose_life_it_has_known_for_an_election_timeout():
    net = Net()
    net.elect("n0")
    net.produce("n0")
    net.tick(CFG.election_ticks)
    net.crash("n1")
    net.start("n1", confirmed=False)    # a new life, not yet confirmed: it may not campaign
    net.cores["n1"].life += 1           # (Net draws the same life again: make it the new one it is)
    net.tick(3)
    assert net.cores["n0"].followers(1)["n1"] == net.cores["n0"].followers(1)["n2"]   # both caught up
    net.apply("n0", net.cores["n0"].hand_over(1))
    net.tick(3)
    assert net.cores["n2"].role(1) is Role.LEADER   # not n1, though it comes first in the replica order


def test_a_leader_that_stepped_down_for_its_target_counts_as_transferring_until_a_leader_is_known():
    net = Net()
    net.elect("n0")
    net.produce("n0")
    net.tick(2)
    net.apply("n0", net.cores["n0"].hand_over(1, {"n2"}))
    # n1's vote request reaches n0 (it steps down), n1's first append does not yet
    net.deliver(drop=lambda src, dest, msg: (src, dest) == ("n1", "n0") and type(msg) is not ReplVote)
    n0 = net.cores["n0"]
    assert net.cores["n1"].role(1) is Role.LEADER and n0.role(1) is Role.FOLLOWER
    assert n0.leader(1)[0] is None and n0.transferring(1)    # the shell holds produce requests
    net.tick(1)
    assert n0.leader(1)[0] == "n1" and not n0.transferring(1)
    # a leader cut off from its quorum steps down (the same term) while a transfer it began
    # is pending: that is no handover's gap, nothing is held
    net.isolate("n1")
    for i in range(3 * CFG.election_ticks):
        if i == CFG.election_ticks - 2:
            net.apply("n1", net.cores["n1"].transfer_leadership(1, "n0"))
        net.tick(1, nids=["n1"])
        if net.cores["n1"].role(1) is not Role.LEADER:
            break
    n1 = net.cores["n1"]
    assert n1.role(1) is Role.FOLLOWER and n1.leader(1)[0] is None and not n1.transferring(1)


def test_appends_are_refused_during_a_transfer():
    net = Net()
    net.elect("n0")
    net.cut = {("n1", "n0")}  # n1 never takes over: the transfer stays pending
    net.apply("n0", net.cores["n0"].transfer_leadership(1, "n1"))
    with pytest.raises(MeshError) as e:
        net.cores["n0"].append_position(1)
    # no hint: the target has not won yet, and a client retries at a hint at once
    assert e.value.code == ErrorCode.NOT_LEADER and e.value.leader is None


def test_isr_drops_a_lagging_follower():
    net = Net()
    net.elect("n0")
    net.produce("n0")
    net.tick(2)
    assert net.cores["n0"].isr(1) == ["n0", "n1", "n2"]
    net.cut = {("n0", "n2"), ("n2", "n0")}
    net.produce("n0")
    net.tick(CFG.isr_lag_ticks + 1, nids=["n0", "n1"])
    assert net.cores["n0"].isr(1) == ["n0", "n1"]
    st = net.cores["n0"].status(1)
    assert st["role"] == "leader" and st["followers"]["n2"]["match"] == 1 and st["commit"] == 2


def test_follower_silence_counts_ticks_since_the_leader_heard_each_follower():
    net = Net()
    net.cut = {("n2", "n0")}   # n2 died just before the election (its answers stop)
    net.elect("n0")
    # a new leader's grace period (check-quorum) counts n2 as live; this does not
    assert net.cores["n0"].follower_silence(1) == {"n1": 0, "n2": NEVER_HEARD}
    net.cut = set()
    net.tick(2)
    assert max(net.cores["n0"].follower_silence(1).values()) < CFG.heartbeat_ticks + 1
    assert net.cores["n1"].follower_silence(1) == {}   # a follower knows none
    net.cut = {("n2", "n0")}   # n2 died, nobody convicted it yet
    net.tick(CFG.election_ticks, nids=["n0", "n1"])
    silence = net.cores["n0"].follower_silence(1)
    assert silence["n1"] <= CFG.heartbeat_ticks and silence["n2"] >= CFG.election_ticks


# -- robustness ------------------------------------------------------------------------------------

@pytest.mark.parametrize("msg, payload", [
    (ReplAppend([[1, 1, 0, 0, 1, 1, 0, 0, 5, 0]]), b"abc"),      # payload shorter than the row says
    (ReplAppend([[1, 1, 0, 0, 0, 1, 0, 0, 3, 0]]), b"abc"),      # bytes but no offsets
    (ReplAppend([[1, "x", 0, 0, 0, 0, 0, 0, 0, 0]]), None),      # wrong type
    (ReplAppend([[1, 1, 0]]), None),                             # short row
    (ReplHeartbeat([[1, True, 0]]), None),                       # a bool is not an int
    (ReplHeartbeat("rows"), None),
])
def test_malformed_messages_are_refused_and_change_nothing(msg, payload):
    net = Net()
    before = net.cores["n1"].state(1)
    with pytest.raises(MeshError) as e:
        net.cores["n1"].step("n0", msg, payload)
    assert e.value.code == ErrorCode.INVALID_REQUEST
    assert net.cores["n1"].state(1) == before


def test_rows_for_partitions_not_hosted_are_counted_and_skipped():
    net = Net()
    core = net.cores["n1"]
    rd = core.step("n0", ReplHeartbeat([HeartbeatRow(99, 1, 0), HeartbeatRow(1, 1, 0)]))
    assert core.unknown_rows == 1 and rd.messages[0].msg.rows[0].pid == 1


def test_messages_round_trip_through_the_wire_codec():
    row = AppendRow(7, 3, 10, 2, 12, 3, 10, 9, 4, 0, 1, 2, [[5, 1, 2, ["n0", "n1"], ["n2"]]])
    msg = ReplAppend([row])
    back = decode_body(op_of(msg), encode_body(msg))
    assert type(back) is ReplAppend and AppendRow(*back.rows[0]) == row


def test_config_and_partition_validation():
    with pytest.raises(MeshError):
        ReplicationConfig(heartbeat_ticks=5, election_ticks=6)
    core = ReplicaManager("a", random.Random(0), CFG, SimDisk([1]))
    with pytest.raises(MeshError):
        core.add_partition(1, ["b", "c"])  # must include itself
    core.add_partition(1, ["a", "b"])
    with pytest.raises(MeshError):
        core.add_partition(1, ["a", "b"])
    with pytest.raises(MeshError) as e:
        core.role(2)
    assert e.value.code == ErrorCode.UNKNOWN_PARTITION


def test_peer_messages_name_every_replication_operation():
    assert set(PEER_MESSAGES) == {cls for op, cls in REGISTRY.items() if op.startswith(b"REPL_")}
    assert len(set(PEER_MESSAGES)) == len(PEER_MESSAGES) == 7


def test_the_manager_is_a_partition_host():
    core = ReplicaManager("a", random.Random(0), CFG, SimDisk([1]))
    members = set(PartitionHost.__annotations__) | {n for n in vars(PartitionHost) if not n.startswith("_")}
    assert members >= {"cfg", "rng", "now_tick", "reader", "send", "log_op", "want_flush"}
    assert [n for n in sorted(members) if not hasattr(core, n)] == []


# -- quorum and progress (the pure pieces the partition state machine uses) ---------------------

def test_quorum_is_a_majority_and_commit_counts_only_replicas_with_the_epoch_marker():
    assert [majority(n) for n in (1, 2, 3, 4, 5)] == [1, 2, 2, 3, 3]
    assert committed_offset([10, 7, 3], epoch_start=0, quorum=2) == 7
    assert committed_offset([10, 7, 3], epoch_start=5, quorum=2) == 7
    assert committed_offset([10, 7, 3], epoch_start=8, quorum=2) is None  # 7 lacks the marker
    assert committed_offset([4, 4, 4], epoch_start=4, quorum=3) == 4


def test_vote_tally_wins_with_a_quorum_and_loses_once_a_quorum_is_impossible():
    assert vote_result({"a": True}, voters=3, quorum=2) is VoteResult.PENDING
    assert vote_result({"a": True, "b": True}, voters=3, quorum=2) is VoteResult.WON
    assert vote_result({"a": True, "b": False}, voters=3, quorum=2) is VoteResult.PENDING
    assert vote_result({"a": True, "b": False, "c": False}, voters=3, quorum=2) is VoteResult.LOST
    assert vote_result({"a": True, "b": False, "c": False}, voters=5, quorum=3) is VoteResult.PENDING


def test_progress_pipelines_within_its_window_and_recognises_stale_answers():
    pr = Progress(next_offset=10, now_tick=0)
    assert pr.state == PROBE and pr.next == 10 and pr.oldest_sent_tick() is None
    pr.probe_sent, pr.probe_prev = True, 10
    assert pr.stale_rejection(9) and not pr.stale_rejection(10)  # 9: an older probe
    assert pr.maybe_update(10) and not pr.maybe_update(10)
    pr.become_replicate()
    assert pr.state == REPLICATE and pr.next == 10
    pr.sent(12, 100, now_tick=3)
    pr.sent(15, 50, now_tick=4)
    assert pr.next == 15 and pr.oldest_sent_tick() == 3 and pr.inflight_bytes == 150
    assert pr.can_send(max_msgs=3, max_bytes=1000) and not pr.can_send(max_msgs=2, max_bytes=1000)
    assert not pr.can_send(max_msgs=3, max_bytes=150)
    assert pr.maybe_update(12) and pr.oldest_sent_tick() == 4 and pr.inflight_bytes == 50
    assert pr.stale_rejection(11) and not pr.stale_rejection(12)  # replicating: below match is stale
    pr.become_probe(12)
    assert pr.state == PROBE and pr.inflight_bytes == 0 and pr.oldest_sent_tick() is None
    assert pr.stale_rejection(12)  # no probe outstanding
    pr.last_resp_tick = 8
    assert count_active([pr, Progress(0, now_tick=0)], now_tick=10, window_ticks=5) == 2
    assert pr.in_sync(now_tick=10, lag_ticks=5, log_end=12) and not pr.in_sync(10, 5, log_end=13)


# -- lost state, identity, corruption (issue 17) -----------------------------------------------

def wipe(net: Net, nid: str, store_id: str) -> None:
    """``nid`` restarts on an empty data directory (a new store), not yet confirmed."""
    net.crash(nid)
    net.stores[nid] = SimDisk([pid for pid, reps in net.replicas.items() if nid in reps], store_id=store_id)
    net.start(nid, confirmed=False)


def hand(net: Net, src: str, dest: str) -> None:
    """Deliver only the first queued message from ``src`` to ``dest``."""
    i = next(i for i, q in enumerate(net.queue) if q[:2] == (src, dest))
    _, _, op, body, payload = net.queue.pop(i)
    net.apply(dest, net.cores[dest].step(src, decode_body(op, body), payload))
    net.apply(dest, net.cores[dest].flush())


def first_answer(net: Net, lead: str, nid: str) -> None:
    """One heartbeat from ``lead`` to ``nid`` and its answer, nothing else."""
    net.queue.clear()
    net.apply(lead, net.cores[lead].tick())
    hand(net, lead, nid)
    hand(net, nid, lead)


def follower_view(net: Net, lead: str, nid: str, pid: int = 1) -> dict:
    return net.cores[lead].status(pid)["followers"][nid]


def test_messages_carry_the_senders_store_and_life():
    net = Net()
    net.elect("n0")
    (src, s) = next((src, s) for src, s in net.sent if src == "n1")
    assert s.msg.store == "store-n1" and s.msg.life == net.cores["n1"].life > 0
    assert net.cores["n0"].peer_identity("n1") == ("store-n1", net.cores["n1"].life)
    with pytest.raises(MeshError) as e:
        net.cores["n1"].step("n0", ReplHeartbeat([HeartbeatRow(1, 1, 0)], "x" * 65, 1))
    assert e.value.code == ErrorCode.INVALID_REQUEST


def test_a_rejection_below_what_the_follower_acked_lowers_it_at_once():
    net = Net()
    net.elect("n0")
    for _ in range(3):
        net.produce("n0")
    net.tick(1)
    assert follower_view(net, "n0", "n1")["match"] == 3 and "n1" in net.cores["n0"].isr(1)
    core1 = net.cores["n1"]
    reject = ReplAppendResp([AppendRespRow(1, 1, 0, 0, 3, 0, 0, 0)], "store-n1", core1.life)
    net.apply("n0", net.cores["n0"].step("n1", reject))
    assert follower_view(net, "n0", "n1")["match"] == 0 and "n1" not in net.cores["n0"].isr(1)
    net.deliver()
    net.tick(2)  # n1 still holds everything: it acks again at once
    assert follower_view(net, "n0", "n1")["match"] == 3 and "n1" in net.cores["n0"].isr(1)


def test_a_wiped_follower_is_not_counted_and_a_restart_is_verified():
    net = Net()
    net.elect("n0")
    for _ in range(4):
        net.produce("n0")
    net.tick(2)
    wipe(net, "n1", "new-store")
    first_answer(net, "n0", "n1")
    v = follower_view(net, "n0", "n1")
    assert v["store"] == "new-store" and v["match"] == 0 and "n1" not in net.cores["n0"].isr(1)
    net.tick(3)
    assert net.log("n1") == net.log("n0") and follower_view(net, "n0", "n1")["match"] == 4
    # a plain restart keeps its disk: the leader re-checks at the old offset, one round trip
    net.crash("n2")
    net.start("n2")
    net.tick(1)
    assert follower_view(net, "n0", "n2")["match"] == 4


def test_a_late_message_from_a_life_never_heard_does_not_cut_the_live_one_off():
    # Lives are unordered: n0 heard n1's live identity first, then a late answer from an
    # older life it never heard, and took it for a restart, retiring the live one. The
    # live one is dropped only while the late one might still be current: once that has
    # been silent for an election timeout, the live one is taken back (node sim seed 40).
    net = Net()
    net.elect("n0")
    for _ in range(3):
        net.produce("n0")
    net.tick(1)
    live = net.cores["n1"].life
    assert follower_view(net, "n0", "n1")["match"] == 3
    late = ReplHeartbeatResp([HeartbeatRespRow(1, 1, 0, 0)], "store-n1", live + 1)
    net.apply("n0", net.cores["n0"].step("n1", late))
    assert net.cores["n0"].peer_identity("n1") == ("store-n1", live + 1)
    assert follower_view(net, "n0", "n1")["match"] == 0
    net.tick(CFG.election_ticks - 1)
    assert net.cores["n0"].peer_identity("n1") == ("store-n1", live + 1)  # still dropped
    assert follower_view(net, "n0", "n1")["match"] == 0 and "n1" not in net.cores["n0"].isr(1)
    net.tick(3)
    assert net.cores["n0"].peer_identity("n1") == ("store-n1", live)
    assert follower_view(net, "n0", "n1")["match"] == 3 and "n1" in net.cores["n0"].isr(1)
    net.produce("n0")
    net.tick(2)
    assert net.log("n1") == net.log("n0") and net.cores["n1"].commit_offset(1) == 4

def test_unconfirmed_replicas_neither_vote_nor_campaign_but_follow():
    net = Net()
    net.elect("n0")
    net.produce("n0")
    for nid in ("n1", "n2"):
        net.crash(nid)
        net.start(nid, confirmed=False)
    core = net.cores["n1"]
    rd = core.step("n2", ReplVote([VoteRow(1, 5, 1, 1, 0, 1)], "store-n2", 1))
    assert not any(r.granted for s in rd.messages for r in s.msg.rows)
    net.crash("n0")
    net.tick(5 * CFG.election_ticks)
    assert all(net.cores[n].role(1) is Role.FOLLOWER for n in ("n1", "n2"))
    net.apply("n1", core.confirm_identity())
    net.apply("n2", net.cores["n2"].confirm_identity())
    net.tick(5 * CFG.election_ticks)
    assert any(net.cores[n].role(1) is Role.LEADER for n in ("n1", "n2"))
    one = Net(n=1)  # RF 1: nobody to ask, no restriction
    one.crash("n0")
    one.start("n0", confirmed=False)
    one.tick(2 * CFG.election_ticks)
    assert one.cores["n0"].role(1) is Role.LEADER


def test_the_directed_scenario_wipe_one_wipe_another_kill_the_leader_loses_nothing():
    """Issue 17: wipe F, wait; wipe G, wait; kill the leader: every acknowledged record is there."""
    net = Net()
    net.elect("n0")
    for i in range(20):
        net.produce("n0", data=b"r%d" % i)
    net.tick(2)
    assert net.cores["n0"].commit_offset(1) == 20
    for nid in ("n1", "n2"):
        wipe(net, nid, f"wiped-{nid}")
        first_answer(net, "n0", nid)
        assert nid not in net.cores["n0"].isr(1)  # the leader believes it at once
        net.apply(nid, net.cores[nid].declare_lost_state())
        assert net.cores[nid].recovering(1)
        net.tick(3)
        assert not net.cores[nid].recovering(1) and net.log(nid) == net.log("n0")
        assert net.cores[nid].state(1).vote == "n0"  # it voted in this term, once: for its leader
        assert nid in net.cores["n0"].isr(1)
    net.crash("n0")
    net.tick(5 * CFG.election_ticks)
    lead = next(n for n in ("n1", "n2") if net.cores[n].role(1) is Role.LEADER)
    assert net.cores[lead].commit_offset(1) >= 20 and len(net.log(lead)) == 20


def test_a_replica_that_lost_state_is_never_counted_or_elected_before_it_caught_up():
    net = Net()
    net.elect("n0")
    for _ in range(5):
        net.produce("n0")
    net.tick(2)
    wipe(net, "n1", "wiped")
    net.apply("n1", net.cores["n1"].declare_lost_state())
    net.isolate("n0")  # the leader dies before n1 refilled
    net.tick(6 * CFG.election_ticks, nids=["n1", "n2"])
    assert all(net.cores[n].role(1) is not Role.LEADER for n in ("n1", "n2"))  # n2 has no quorum without n1
    assert net.cores["n1"].recovering(1) and net.cores["n1"].state(1).recovering
    net.crash("n1")  # restarting mid-refill stays recovering (persisted)
    net.start("n1")
    assert net.cores["n1"].recovering(1)
    net.heal()
    net.tick(6 * CFG.election_ticks)
    lead = next(n for n in net.ids if net.cores[n].role(1) is Role.LEADER)
    assert lead != "n1" and len(net.log(lead)) == 5
    assert not net.cores["n1"].recovering(1) and net.log("n1") == net.log(lead)


def test_a_leader_with_a_corrupt_batch_hands_over_and_refills():
    net = Net()
    net.elect("n0")
    for i in range(5):
        net.produce("n0", data=b"c%d" % i)
    net.tick(2)
    rd = net.apply("n0", net.cores["n0"].report_corrupt(1, 2))
    assert [type(s.msg).__name__ for s in rd.messages] == ["ReplTimeoutNow"]
    assert [op for op in rd.log_ops] == [Truncate(1, 2)] and net.cores["n0"].recovering(1)
    assert net.cores["n0"].role(1) is Role.FOLLOWER and net.cores["n0"].commit_offset(1) == 2
    again = net.cores["n0"].report_corrupt(1, 2)  # the same damage, reported again: nothing
    assert not again.log_ops and not again.messages
    net.deliver()
    net.tick(3)
    lead = next(n for n in net.ids if net.cores[n].role(1) is Role.LEADER)
    assert lead != "n0" and net.log("n0") == net.log(lead) and len(net.log(lead)) == 5
    assert not net.cores["n0"].recovering(1) and net.cores["n0"].commit_offset(1) == 5
    # a follower cuts and refills the same way
    net.apply("n1" if lead != "n1" else "n2", net.cores["n1" if lead != "n1" else "n2"].report_corrupt(1, 0))
    net.tick(3)
    assert all(net.log(n) == net.log(lead) for n in net.ids)


def test_a_replica_that_forgot_refills_to_where_the_new_leaders_epoch_starts_not_to_its_commit():
    """Disk-fault simulator seed 40325: a new leader's commit offset can lag entries that a
    quorum (with the replica that forgot) had acknowledged; it learns of their commit only by
    committing in its own term. Refilled only up to that commit, the forgetful replica could
    vote, and a leader without those entries could be elected."""
    cfg = dataclasses.replace(CFG, max_append_bytes=1, max_inflight_msgs=1)  # one batch per message
    net = Net(cfg=cfg)
    net.elect("n0")                                   # epoch 1
    net.produce("n0", data=b"a")
    net.tick(1)                                       # [0,1) committed everywhere
    net.isolate("n2")                                 # n2 stays behind at 1
    for i in range(4):
        net.produce("n0", data=b"b%d" % i)
        net.deliver(drop=lambda src, dest, msg: type(msg) is ReplHeartbeat)
    assert net.cores["n0"].commit_offset(1) == 5      # [1,5) acknowledged: on n0 and n1
    assert net.cores["n1"].commit_offset(1) < 5       # n1 has not heard that it committed
    wipe(net, "n0", "wiped-n0")                       # the old leader forgets it all
    net.heal()
    net.apply("n0", net.cores["n0"].declare_lost_state())
    net.age(["n1", "n2"], CFG.election_ticks)
    no_data = lambda src, dest, msg: type(msg) is ReplAppend  # noqa: E731
    for _ in range(2):                                # pre-vote, vote: n1 wins with n2's vote
        net.apply("n1", net.cores["n1"].campaign(1))
        net.deliver(drop=no_data)
    assert net.cores["n1"].leader(1) == ("n1", 2)
    net.cut = {("n1", "n2"), ("n2", "n1")}            # n2 gets nothing of [1,5) from it
    stale = net.cores["n1"].commit_offset(1)
    assert stale < 5
    for _ in range(200):                              # refill n0, one message at a time
        if not net.cores["n0"].recovering(1):
            break
        if not net.queue:
            net.apply("n1", net.cores["n1"].tick())
        net.deliver(limit=1)
    assert not net.cores["n0"].recovering(1)
    assert net.cores["n0"].end_offset(1) >= 5, "left recovering before holding what it had acknowledged"
    net.isolate("n1")                                 # the only other holder goes away
    net.age(["n0", "n2"], CFG.election_ticks)
    net.tick(6 * CFG.election_ticks, nids=["n0", "n2"])
    lead = next(n for n in ("n0", "n2") if net.cores[n].role(1) is Role.LEADER)
    assert [b[2] for b in net.log(lead)][:5] == [b[2] for b in net.log("n1")][:5]


def corrupt_leader_and_wiped_follower() -> Net:
    """n0 leads [0, 5) on all three; n1 rejoins wiped (recovering); n0 finds a damaged batch
    at 2 (while reading for n1), hands over to n2 and is recovering too."""
    net = Net()
    net.elect("n0")
    for i in range(5):
        net.produce("n0", data=b"c%d" % i)
    net.tick(2)
    wipe(net, "n1", "wiped-n1")
    net.apply("n1", net.cores["n1"].declare_lost_state())
    net.apply("n0", net.cores["n0"].report_corrupt(1, 2))
    return net


def test_a_corrupt_leader_still_votes_for_its_caught_up_successor_while_another_replica_refills():
    """bench diskfaults seed 810: a wiped follower refilling from its leader read an old
    batch that a bit flip had damaged there; the leader handed over and cut its log, so two
    of three replicas were recovering and the successor could never win an election."""
    net = corrupt_leader_and_wiped_follower()
    assert net.cores["n0"].recovering(1) and net.cores["n1"].recovering(1)
    net.tick(6 * CFG.election_ticks)
    assert net.cores["n2"].role(1) is Role.LEADER           # n0's vote: n2 held all it committed
    assert net.cores["n2"].commit_offset(1) == 5
    assert not net.cores["n0"].recovering(1) and not net.cores["n1"].recovering(1)
    assert net.log("n0") == net.log("n1") == net.log("n2")
    assert net.cores["n0"].state(1).vote == "n2"


def test_a_corrupt_leaders_vouch_survives_its_restart():
    """The vote promised above is part of the persisted state: restarted before its
    successor asked, the corrupt leader still gives it (without it, two recovering replicas
    of three could never elect anyone). Recovered, the promise is gone."""
    net = corrupt_leader_and_wiped_follower()
    assert net.cores["n0"].state(1).vouch == ("n2", 2)
    net.crash("n0")
    net.queue = [q for q in net.queue if "n0" not in q[:2]]   # its TimeoutNow to n2 is lost too
    net.start("n0")
    assert net.cores["n0"].recovering(1) and net.cores["n0"].state(1).vouch == ("n2", 2)
    net.tick(8 * CFG.election_ticks)
    assert net.cores["n2"].role(1) is Role.LEADER and net.cores["n2"].commit_offset(1) == 5
    assert not net.cores["n0"].recovering(1) and net.cores["n0"].state(1).vouch is None
    assert net.log("n0") == net.log("n1") == net.log("n2")


def test_a_vouch_is_dropped_when_the_node_finds_it_lost_state():
    """A promise made by a state the node may since have lost part of (a rolled-back disk
    still holding the row) is no exception to "recovering replicas give no votes"."""
    net = Net()
    net.elect("n0")
    net.produce("n0", data=b"a")
    net.tick(2)
    net.apply("n0", net.cores["n0"].report_corrupt(1, 0))
    assert net.cores["n0"].state(1).vouch is not None
    rd = net.cores["n0"].declare_lost_state()
    assert net.cores["n0"].state(1).vouch is None and [st.vouch for st in rd.persist] == [None]


def test_a_corrupt_leader_vouches_only_for_a_successor_holding_its_commit():
    """The vote above is safe only for a successor holding everything committed: one that
    answers but lags (its appends lost) gets the TimeoutNow, not the vote, and cannot win."""
    net = Net()
    net.elect("n0")
    net.produce("n0", data=b"a")
    net.tick(2)
    no_data_to_n2 = lambda src, dest, msg: dest == "n2" and type(msg) is ReplAppend  # noqa: E731

    def tick(n: int, nids=None, drop=no_data_to_n2) -> None:
        for _ in range(n):
            for nid in nids or sorted(net.cores):
                net.apply(nid, net.cores[nid].tick())
            net.deliver(drop=drop)

    net.produce("n0", data=b"b")
    net.produce("n0", data=b"c")
    tick(3)
    assert net.cores["n0"].commit_offset(1) == 3 and net.cores["n2"].end_offset(1) == 1
    wipe(net, "n1", "wiped-n1")
    net.apply("n1", net.cores["n1"].declare_lost_state())
    no_data = lambda src, dest, msg: type(msg) is ReplAppend and dest != "n0"  # noqa: E731
    tick(2, drop=no_data)                                    # n1 does not refill either
    assert net.cores["n1"].recovering(1)
    net.apply("n0", net.cores["n0"].report_corrupt(1, 2))
    assert net.cores["n0"]._parts[1].vouch is None           # n2 answers, but lacks [1,3)
    tick(6 * CFG.election_ticks, drop=no_data)
    assert all(net.cores[n].role(1) is not Role.LEADER for n in net.ids)


def test_a_replica_that_forgot_does_not_trust_a_stale_leader_until_the_other_voters_confirm_its_term():
    """Disk-fault simulator seed 71204: a replica that forgot it voted in term 2 refilled
    from a leader of term 1 that had been paused (it knew nothing of term 2), left
    recovering and then gave that leader its vote for term 2 again: two leaders in term 2."""
    net = Net()
    net.elect("n0")                                   # term 1
    net.produce("n0", data=b"a")
    net.tick(2)
    net.isolate("n0")                                 # n0 is paused: it still leads term 1
    net.age(["n1", "n2"], CFG.election_ticks)
    net.tick(6 * CFG.election_ticks, nids=["n1", "n2"])
    lead = next(n for n in ("n1", "n2") if net.cores[n].role(1) is Role.LEADER)
    other = "n2" if lead == "n1" else "n1"
    net.produce(lead, data=b"b")
    net.tick(2, nids=["n1", "n2"])
    assert net.cores[lead].commit_offset(1) == 2 and net.cores[lead].leader(1)[1] == 2
    wipe(net, other, f"wiped-{other}")                # it forgets term 2, its vote and "b"
    net.apply(other, net.cores[other].declare_lost_state())
    net.cut = ({(lead, o) for o in net.ids if o != lead} | {(o, lead) for o in net.ids if o != lead})
    for _ in range(4 * CFG.election_ticks):           # n0 resumes and refills it, cut off from `lead`
        for nid in ("n0", other):
            net.apply(nid, net.cores[nid].tick())
        net.deliver()
    assert net.cores[other].recovering(1), "trusted a leader of term 1 without asking the other voter"
    rd = net.cores[other].step("n0", ReplVote([VoteRow(1, 2, 1, 1, 0, 0)]))   # n0 asks for term 2
    assert not any(r.granted for s in rd.messages for r in s.msg.rows)
    net.heal()
    net.tick(10 * CFG.election_ticks)
    winner = next(n for n in net.ids if net.cores[n].role(1) is Role.LEADER)
    assert [b[2] for b in net.log(winner)][:2] == [b"a", b"b"] or len(net.log(winner)) >= 2
    assert all(net.log(n) == net.log(winner) for n in net.ids)
    assert not any(net.cores[n].recovering(1) for n in net.ids)
