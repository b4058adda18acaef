"""Raft membership change per partition (mesh.raft.membership, mesh.raft.configuring): the
allowed steps, learners, promotion and removal, configs in the log across leader changes
and restarts, on the hand-driven network of test_replication."""
from __future__ import annotations

import random

import msgpack
import pytest

from mesh.node.replication.raft_host import pack_state, unpack_state
from mesh.raft import PersistState, ReplAppend, ReplicaManager, ReplicationConfig, Role
from mesh.raft.membership import Config, History, check_step
from mesh.raft.messages import AppendRow, parse_rows
from mesh.wire.errors import ErrorCode, MeshError
from tests.sim.replication_disk import SimDisk
from tests.unit.test_replication import CFG, Net

C0 = Config(0, 0, ("n0", "n1", "n2"))


class MNet(Net):
    """Four brokers; ``hosted`` says which host partition 1 (n3 only once it joins)."""

    def __init__(self, cfg: ReplicationConfig = CFG, hosted=("n0", "n1", "n2")) -> None:
        self.hosted = set(hosted)
        super().__init__(n=4, replicas=list(hosted), cfg=cfg)

    def start(self, nid: str, confirmed: bool = True) -> None:
        store = self.stores.setdefault(nid, SimDisk([1], store_id=f"store-{nid}"))
        core = ReplicaManager(nid, random.Random(nid), self.cfg, store, store_id=store.store_id,
                              confirmed=confirmed)
        if nid in self.hosted:
            core.add_partition(1, self.replicas[1], store.live_state[1], store.live[1].end)
        self.cores[nid] = core

    def join(self, nid: str, config: Config) -> None:
        self.hosted.add(nid)
        self.cores[nid].add_partition(1, config, None, 0)

    def propose(self, nid: str, voters, learners=()):
        rd = self.apply(nid, self.cores[nid].propose_config(1, voters, learners))
        self.apply(nid, self.cores[nid].flush())
        return rd

    def settle(self, ticks: int = 3) -> None:
        self.deliver()
        self.tick(ticks, nids=sorted(self.hosted))


def configs_of(net: MNet, nodes) -> set:
    return {net.cores[n].config(1) for n in nodes}


# -- the steps ---------------------------------------------------------------------------------

@pytest.mark.parametrize("voters, learners, ok", [
    (("n0", "n1", "n2"), ("n3",), True),                   # add a learner
    (("n0", "n1", "n2"), ("n3", "n4"), False),             # two at once
    (("n0", "n1", "n2", "n3"), (), False),                 # a voter must join as a learner
    (("n0", "n1"), (), True),                              # remove a voter
    (("n1", "n2"), (), False),                             # ... but not the leader n0
    (("n1", "n0", "n2"), (), True),                        # reorder
    (("n0", "n1", "n2"), (), False),                       # no change
    (("n0", "n2"), ("n1",), False),                        # demote: remove, then add as learner
])
def test_single_server_steps(voters, learners, ok):
    assert (check_step(C0, voters, learners, "n0") is None) is ok


def test_promote_and_remove_learner_steps():
    c = Config(1, 1, ("n0", "n1", "n2"), ("n3",))
    assert check_step(c, ("n0", "n3", "n1", "n2"), (), "n0") is None  # promote at any position
    assert check_step(c, ("n0", "n1", "n2"), (), "n0") is None         # remove the learner
    assert check_step(c, ("n0", "n2", "n1", "n3"), (), "n0") is not None  # promote and reorder


# -- a move: learner, caught up, promoted, old voter removed -----------------------------------

def test_a_learner_joins_catches_up_is_promoted_and_an_old_voter_removed():
    net = MNet()
    net.elect("n0")
    for _ in range(3):
        net.produce("n0", data=b"abc", count=2)
    net.deliver()
    lead = net.cores["n0"]
    rd = net.propose("n0", ("n0", "n1", "n2"), ("n3",))
    c1 = Config(1, lead.leader(1)[1], ("n0", "n1", "n2"), ("n3",))
    assert lead.config(1) == c1 and lead.config_pending(1) and rd.configs[1] == (c1, False)
    net.join("n3", c1)
    net.settle()
    assert lead.followers(1)["n3"] == lead.end_offset(1) == 6
    assert net.log("n3") == net.log("n0")
    assert not lead.config_pending(1) and configs_of(net, ["n0", "n1", "n2", "n3"]) == {c1}
    assert any(r.configs.get(1) == (c1, True) for r in net.readies["n0"])
    assert "n3" not in lead.isr(1)                      # a learner is never in the ISR
    net.propose("n0", ("n3", "n0", "n1", "n2"), ())    # promote n3, as the preferred leader
    net.settle()
    assert net.cores["n3"].config(1).voters == ("n3", "n0", "n1", "n2")
    net.propose("n0", ("n3", "n0", "n1"), ())           # remove n2
    net.settle()
    c3 = lead.config(1)
    assert c3.version == 3 and c3.voters == ("n3", "n0", "n1") and not lead.config_pending(1)
    assert sorted(lead.followers(1)) == ["n1", "n3"]    # no progress for the removed one
    assert not net.cores["n2"].role(1) is Role.LEADER
    net.produce("n0", data=b"z")
    net.deliver()
    assert lead.commit_offset(1) == 7 and net.log("n3") == net.log("n0")
    # the preferred leader is voters[0]: a transfer hands it over
    net.apply("n0", lead.transfer_leadership(1, "n3"))
    net.settle(2)
    assert net.cores["n3"].role(1) is Role.LEADER


def test_commit_counts_only_voters():
    net = MNet()
    net.elect("n0")
    net.propose("n0", ("n0", "n1", "n2"), ("n3",))
    net.join("n3", net.cores["n0"].config(1))
    net.settle()
    net.isolate("n1")
    net.cut |= {("n0", "n2"), ("n2", "n0")}
    base, end = net.produce("n0", data=b"q")
    net.deliver()
    lead = net.cores["n0"]
    assert lead.followers(1)["n3"] == end             # the learner holds it
    assert lead.commit_offset(1) < end                # but it does not count
    with pytest.raises(MeshError) as e:               # nor for write admission, once the voters went silent
        net.age(["n0"], 3 * CFG.heartbeat_ticks + 2)
        lead.append_position(1)
    assert e.value.code in (ErrorCode.NOT_ENOUGH_REPLICAS, ErrorCode.NOT_LEADER)


def test_a_learner_never_campaigns_and_is_never_a_transfer_target():
    net = MNet()
    net.elect("n0")
    net.propose("n0", ("n0", "n1", "n2"), ("n3",))
    net.join("n3", net.cores["n0"].config(1))
    net.settle()
    net.apply("n0", net.cores["n0"].transfer_leadership(1, "n3"))
    assert net.cores["n0"].status(1).get("transfer_to") is None
    net.isolate("n0")
    net.isolate("n1")
    net.isolate("n2")
    for _ in range(5 * CFG.election_ticks):
        net.apply("n3", net.cores["n3"].tick())
        net.apply("n3", net.cores["n3"].campaign(1))
    assert net.cores["n3"].role(1) is Role.FOLLOWER
    assert not any(type(s.msg).__name__ == "ReplVote" for _, s in net.sent if _ == "n3")


def test_removing_the_last_other_voter_commits_at_once_without_another_write():
    # n0 leads (n0, n1) and has synced a record n1 has not acked. Removing n1 leaves n0
    # the whole quorum: the record and the new config commit in the same call. Before,
    # nothing counted again (no ack or sync was left to come), and on an idle partition
    # the config stayed uncommitted until the next write, blocking the next move.
    net = MNet(hosted=("n0", "n1"))
    net.elect("n0")
    net.settle()
    lead = net.cores["n0"]
    net.produce("n0")
    net.queue.clear()   # n1 never sees it
    assert lead.commit_offset(1) == 0 and lead.end_offset(1) == 1
    net.propose("n0", ("n0",))
    assert lead.commit_offset(1) == 1
    assert lead.committed_config(1).voters == ("n0",) and not lead.config_pending(1)


def test_an_uncommitted_config_of_a_deposed_leader_disappears():
    net = MNet()
    net.elect("n0")
    net.produce("n0", data=b"a")
    net.deliver()
    net.isolate("n0")
    net.propose("n0", ("n0", "n1", "n2"), ("n3",))     # never leaves n0: uncommitted
    net.queue.clear()
    assert net.cores["n0"].config(1).version == 1
    net.age(["n1", "n2"], CFG.election_ticks)         # the lease of n0 runs out
    net.queue.clear()
    net.elect("n2")
    net.produce("n2", data=b"b")
    net.deliver()
    net.heal()
    net.settle(3 * CFG.election_ticks)
    for n in ("n0", "n1", "n2"):
        assert net.cores[n].config(1) == C0, n
        assert [c for _, c in net.cores[n].state(1).configs] == [C0]
    assert net.log("n0") == net.log("n2")
    # the new leader's own version 1 is another config: one history, no conflict
    lead = next(n for n in ("n0", "n1", "n2") if net.cores[n].role(1) is Role.LEADER)
    net.propose(lead, ("n0", "n1", "n2"), ("n3",))
    net.join("n3", net.cores[lead].config(1))
    net.settle()
    c1 = net.cores[lead].config(1)
    assert c1.version == 1 and c1.term == net.cores[lead].leader(1)[1] > 1
    assert configs_of(net, ["n0", "n1", "n2", "n3"]) == {c1}


def test_a_follower_missing_the_latest_config_loses_the_vote():
    net = MNet()
    net.elect("n0")
    net.produce("n0", data=b"a")
    net.deliver()
    net.cut |= {("n0", "n2")}
    net.propose("n0", ("n0", "n1", "n2"), ("n3",))
    net.deliver()
    assert net.cores["n1"].config(1).version == 1 and net.cores["n2"].config(1).version == 0
    net.isolate("n0")
    net.apply("n2", net.cores["n2"].campaign(1))
    net.deliver()
    net.tick(2, nids=["n2"])
    assert net.cores["n2"].role(1) is not Role.LEADER  # n1 holds a config n2 lacks


def test_config_survives_a_restart():
    net = MNet()
    net.elect("n0")
    net.propose("n0", ("n0", "n1", "n2"), ("n3",))
    net.join("n3", net.cores["n0"].config(1))
    net.settle()
    c1 = net.cores["n1"].config(1)
    net.crash("n1")
    net.start("n1")
    assert net.cores["n1"].config(1) == c1
    net.crash("n3")
    net.start("n3")                                    # its state holds its history
    assert net.cores["n3"].config(1) == c1
    st = net.cores["n1"].state(1)
    assert unpack_state(1, pack_state(st)) == st
    old = msgpack.packb([3, "n0", 5, [[1, 0]], 0])     # a row written before membership changes
    assert unpack_state(1, old) == PersistState(1, 3, "n0", 5, ((1, 0),), False, ())
    vouched = st._replace(recovering=True, vouch=("n2", st.term + 1))   # a corrupt leader's promise
    assert unpack_state(1, pack_state(vouched)) == vouched
    with pytest.raises(ValueError, match="vouch"):
        unpack_state(1, msgpack.packb([3, "n0", 5, [[1, 0]], 1, [], ["n2"]]))


def test_refused_steps():
    net = MNet()
    with pytest.raises(MeshError) as e:
        net.cores["n1"].propose_config(1, ("n0", "n1", "n2"), ("n3",))
    assert e.value.code == ErrorCode.NOT_LEADER
    net.elect("n0")
    lead = net.cores["n0"]
    for voters, learners, why in [
        (("n1", "n2"), (), "transfer leadership first"),
        (("n0", "n1", "n2"), ("n3", "n4"), "one learner at a time"),
    ]:
        with pytest.raises(MeshError) as e:
            lead.propose_config(1, voters, learners)
        assert e.value.code == ErrorCode.INVALID_REQUEST and why in str(e.value)
    net.propose("n0", ("n0", "n1", "n2"), ("n3",))
    with pytest.raises(MeshError) as e:               # n3 has not acked: still pending
        lead.propose_config(1, ("n0", "n1", "n2"), ())
    assert "not committed yet" in str(e.value)


def test_a_new_leader_waits_for_its_epoch_marker():
    net = MNet()
    net.apply("n0", net.cores["n0"].campaign(1))
    net.deliver(drop=lambda src, dest, msg: type(msg).__name__ == "ReplAppendResp")
    lead = net.cores["n0"]
    assert lead.role(1) is Role.LEADER
    with pytest.raises(MeshError) as e:
        lead.propose_config(1, ("n0", "n1", "n2"), ("n3",))
    assert "epoch marker" in str(e.value)


def _learner_joins(batches: int, batch_bytes: int, max_append_bytes: int):
    """A leader n0 with ``batches`` batches, a learner n3 just added (150 bytes per tick)."""
    cfg = ReplicationConfig(heartbeat_ticks=1, election_ticks=10, retransmit_ticks=5, auto_rebalance=False,
                            max_append_bytes=max_append_bytes, learner_bytes_per_tick=150)
    net = MNet(cfg=cfg)
    net.elect("n0")
    for _ in range(batches):
        net.produce("n0", data=b"x" * batch_bytes)
    net.deliver()
    net.propose("n0", ("n0", "n1", "n2"), ("n3",))
    net.join("n3", net.cores["n0"].config(1))
    net.deliver()
    return net, net.cores["n0"]


def test_learner_catch_up_is_bounded_per_tick():
    net, lead = _learner_joins(20, 40, max_append_bytes=100)
    seen = [lead.followers(1)["n3"]]
    for _ in range(40):
        net.tick(1, nids=sorted(net.hosted))
        seen.append(lead.followers(1)["n3"])
    assert seen[-1] == lead.end_offset(1) == 20
    assert len(set(seen)) > 5    # many ticks, not one burst
    sent = [sum(len(s.payload or b"") for s in rd.messages if s.dest == "n3") for rd in net.readies["n0"]]
    assert max(sent) <= 150 + 100


def test_learner_catch_up_keeps_its_average_rate_with_batches_over_the_budget():
    """A batch bigger than a tick's budget is debt repaid by the next ticks: the learner gets
    the budget on average, not one batch per tick (which overshot the throttle)."""
    net, lead = _learner_joins(12, 400, max_append_bytes=100_000)
    ticks = 0
    while lead.followers(1)["n3"] < lead.end_offset(1) and ticks < 200:
        net.tick(1, nids=sorted(net.hosted))
        ticks += 1
    sent = sum(len(s.payload or b"") for rd in net.readies["n0"] for s in rd.messages if s.dest == "n3")
    assert lead.followers(1)["n3"] == lead.end_offset(1) == 12
    assert sent <= 150 * ticks + 500, (sent, ticks)     # the average holds, give or take one batch
    assert ticks >= sent // 150 - 5                      # (the bucket starts full; the last batch is debt)


def test_history_window_replace_truncate_trim():
    a, b, c = (Config(v, 1, ("n0", "n1")) for v in (1, 2, 3))
    h = History([(0, C0), (10, a), (20, b)])
    assert [m[0] for m in h.window(15, 30)] == [10, 20] and [m[0] for m in h.window(5, 12)] == [0, 10]
    assert h.truncate_after(15) and h.latest() == a and not h.truncate_after(15)
    # a deposed leader's marker at 10 (term 1) is replaced by the new leader's window
    assert h.replace_window(((0, C0),), 12, term=2) and h.markers() == ((0, C0),)
    h = History([(0, C0), (10, a)])
    # a reordered older window of the current leader (term 1) keeps its newer marker
    assert not h.replace_window(((0, C0),), 12, term=1) and h.latest() == a
    h.append(20, b)
    h.append(20, c)
    assert h.trim(2) and h.markers() == ((20, b), (20, c)) and h.committed(2) == b


def test_parse_rows_bounds_carried_configs():
    def row(configs, term=3):
        return AppendRow(1, term, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, configs)

    ok = parse_rows(ReplAppend([row([[0, 1, 2, ["n0", "n1"], ["n2"]]])]))
    assert ok[0].configs == ((0, Config(1, 2, ("n0", "n1"), ("n2",))),)
    for bad in ([[0, 1, 4, ["n0"], []]],                         # a term after the row's
                [[0, 1 << 40, 2, ["n0"], []]],                   # version out of range
                [[0, 1, 2, [], []]],                             # no voter
                [[0, 1, 2, ["n0", "n0"], []]],                   # not distinct
                [[0, 1, 2, ["x" * 300], []]],                    # node id too long
                [[0, 1, 2, [f"n{i}" for i in range(10)], []]],  # more than max_replicas
                [[5, 2, 2, ["n0"], []], [0, 3, 2, ["n0"], []]],  # out of order
                [[0, 1, 2, ["n0"], []]] * 17,                    # too many markers
                [[0, 1, 2, "n0", []]]):
        with pytest.raises(MeshError):
            parse_rows(ReplAppend([row(bad)]))
