"""mesh.raft input checks (defense in depth): one test per check, on the hand-driven network
of ``test_replication`` (real codec, real batches in the simulator's disk).

Row bounds are ``mesh.raft.messages.parse_rows`` (the message raises MeshError and nothing
is applied); checks against a replica's state are rule 8 of ``mesh.raft.partition`` (the
row is dropped and counted, ``refused_rows``); an append's batches are checked by the shell
(``mesh.node.replication.raft_host.check_append_payload``) before the core sees them.
"""
from __future__ import annotations

import dataclasses

import pytest

from mesh.raft import ReplAppend, ReplHeartbeat, ReplTimeoutNow, ReplVote, ReplVoteResp, ReplicationConfig, Role
from mesh.raft.messages import AppendRow, HeartbeatRow, TimeoutNowRow, VoteRespRow, VoteRow
from mesh.node.replication.raft_host import check_append_payload
from mesh.wire.codec import decode_body, encode_body, op_of
from mesh.wire.errors import ErrorCode, MeshError
from mesh.wire.records import encode_batch, patch_batch
from tests.unit.test_replication import CFG, Net


def wire(msg):
    return decode_body(op_of(msg), encode_body(msg))


def as_peer(net: Net, dest: str, src: str, cls, rows) -> object:
    """A message to ``dest`` posing as ``src`` (its store and life, as ``dest`` knows them)."""
    store, life = net.cores[dest].peer_identity(src) or ("", 0)
    return wire(cls(rows, store, life))


def snapshot(net: Net, nid: str, pid: int = 1) -> tuple:
    c = net.cores[nid]
    return c.leader(pid), c.commit_offset(pid), c.end_offset(pid), c.epoch_cache(pid), c.role(pid)


def steady() -> Net:
    net = Net()
    net.elect("n0")
    net.produce("n0", count=3)
    net.tick(2)
    assert net.cores["n1"].commit_offset(1) == 3
    return net


def batch(base: int, epoch: int, n: int = 1) -> bytes:
    return patch_batch(encode_batch([b"forged"] * n), base, epoch)


# -- bounds (parse_rows: the whole message is refused) -------------------------------------------

@pytest.mark.parametrize("msg", [
    ReplVote([VoteRow(1, 2 ** 63 - 1, 1, 0, 0, 1)]),                 # the vote
    ReplVote([VoteRow(1, 2 ** 40, 1, 0, 0, 0)]),
    ReplVote([VoteRow(1, 2, 3, 0, 0, 0)]),                           # last epoch beyond the term
    ReplVote([VoteRow(1, 2, 1, 0, 0, 2)]),                           # a flag that is not 0/1
    ReplHeartbeat([HeartbeatRow(1, 1, 2 ** 62)]),
    ReplHeartbeat([HeartbeatRow(1, 0, 0)]),
    ReplAppend([AppendRow(1, 1, 5, 0, 3, 0, 0, 0, 0, 0)]),           # ends before it starts
    ReplAppend([AppendRow(1, 1, 0, 2, 0, 0, 0, 0, 0, 0)]),           # prev epoch beyond the term
    ReplAppend([AppendRow(1, 2, 0, 0, 1, 1, 0, 0, 10, 0)]),          # batches past epoch start, not its term
    ReplAppend([AppendRow(1, 2, 0, 0, 5, 2, 2, 0, 10, 0)]),          # batches across the epoch start
    ReplAppend([AppendRow(1, 2, 4, 1, 4, 0, 0, 9, 0, 0)]),           # past the epoch start, another epoch
    ReplAppend([AppendRow(1, 2, 9, 2, 9, 0, 0, 3, 0, 1)]),           # a reset above the commit
    ReplTimeoutNow([TimeoutNowRow(-1, 1)]),
])
def test_rows_out_of_bounds_refuse_the_whole_message(msg):
    net = steady()
    before = snapshot(net, "n1")
    with pytest.raises(MeshError) as e:
        net.cores["n1"].step("n0", wire(msg), b"x" * 10)
    assert e.value.code == ErrorCode.INVALID_REQUEST
    assert snapshot(net, "n1") == before and net.cores["n1"].state(1).term == 1


# -- against the replica's state (rule 8: the row is dropped and counted) --------------------------

def test_a_forged_append_far_ahead_of_our_term_is_refused():
    """The issue's attack: posing as the leader, an append at epoch+1000 (it was committed)."""
    net = steady()
    core = net.cores["n1"]
    before = snapshot(net, "n1")
    forged = batch(3, 1001)
    msg = as_peer(net, "n1", "n0", ReplAppend, [AppendRow(1, 1001, 3, 1, 4, 1001, 3, 4, len(forged), 0)])
    rd = net.apply("n1", core.step("n0", msg, forged))
    assert rd.log_ops == [] and rd.messages == [] and snapshot(net, "n1") == before
    assert core.refused_rows == 1 and "more than 100 ahead" in core.take_refusals()["n0"]
    net.produce("n0")                                # the real leader keeps working
    net.tick(2)
    assert core.commit_offset(1) == 4 and core.leader(1) == ("n0", 1)


def test_a_vote_far_ahead_with_transfer_is_refused_and_the_leader_stays():
    net = steady()
    core = net.cores["n1"]
    rd = core.step("n2", as_peer(net, "n1", "n2", ReplVote, [VoteRow(1, 2 ** 39, 1, 10 ** 9, 0, 1)]))
    assert rd.messages == [] and core.leader(1) == ("n0", 1) and core.state(1).term == 1
    net.produce("n0")
    net.tick(2)
    assert core.commit_offset(1) == 4


def test_a_transfer_vote_skips_the_lease_only_for_the_term_after_ours():
    net = steady()
    core = net.cores["n1"]
    rd = core.step("n2", as_peer(net, "n1", "n2", ReplVote, [VoteRow(1, 5, 1, 10 ** 9, 0, 1)]))
    assert rd.messages == [] and core.leader(1) == ("n0", 1)          # in the lease: ignored
    assert "transfer" in core.take_refusals()["n2"]
    rd = core.step("n2", as_peer(net, "n1", "n2", ReplVote, [VoteRow(1, 2, 1, 10 ** 9, 0, 1)]))
    assert rd.messages[0].msg.rows[0].granted == 1                     # a real transfer still works


def test_a_real_leadership_transfer_still_completes():
    net = steady()
    net.apply("n0", net.cores["n0"].transfer_leadership(1, "n1"))
    net.tick(3)
    assert net.cores["n1"].role(1) is Role.LEADER and net.cores["n2"].leader(1) == ("n1", 2)


def test_appends_and_heartbeats_of_our_term_only_from_our_leader():
    net = steady()
    core = net.cores["n1"]
    before = snapshot(net, "n1")
    forged = batch(3, 1)
    rd = core.step("n2", as_peer(net, "n1", "n2", ReplAppend, [AppendRow(1, 1, 3, 1, 4, 1, 0, 4, len(forged), 0)]),
                   forged)
    assert rd.log_ops == [] and snapshot(net, "n1") == before
    core.step("n2", as_peer(net, "n1", "n2", ReplHeartbeat, [HeartbeatRow(1, 1, 3)]))
    assert core.leader(1) == ("n0", 1) and core.refused_rows == 2


def test_timeout_now_only_from_our_leader_in_our_term():
    net = steady()
    core = net.cores["n1"]
    core.step("n2", as_peer(net, "n1", "n2", ReplTimeoutNow, [TimeoutNowRow(1, 1)]))
    core.step("n0", as_peer(net, "n1", "n0", ReplTimeoutNow, [TimeoutNowRow(1, 5)]))
    assert core.role(1) is Role.FOLLOWER and core.state(1).term == 1 and core.refused_rows == 2
    core.step("n0", as_peer(net, "n1", "n0", ReplTimeoutNow, [TimeoutNowRow(1, 1)]))
    assert core.role(1) is Role.CANDIDATE


def test_rows_from_a_non_replica_or_for_a_partition_not_hosted_are_counted():
    net = Net(n=4, replicas=["n0", "n1", "n2"])
    net.elect("n0")
    core = net.cores["n1"]
    core.step("n3", wire(ReplHeartbeat([HeartbeatRow(1, 1, 0), HeartbeatRow(77, 1, 0)])))
    assert core.refused_rows == 2 and core.unknown_rows == 1 and core.leader(1) == ("n0", 1)


def test_an_append_whose_epoch_starts_below_our_commit_is_refused():
    net = steady()
    core = net.cores["n1"]
    before = snapshot(net, "n1")
    msg = as_peer(net, "n1", "n0", ReplAppend, [AppendRow(1, 2, 1, 1, 1, 0, 1, 1, 0, 0)])
    assert core.step("n0", msg).log_ops == [] and snapshot(net, "n1") == before
    assert "below our commit" in core.take_refusals()["n0"]


def test_batches_older_than_our_log_before_them_are_refused_not_asserted():
    net = steady()                                    # n1: epoch 1 from 0, commit 3
    net.apply("n0", net.cores["n0"].transfer_leadership(1, "n1"))
    net.tick(3)
    net.produce("n1")                                 # epoch 2 at offset 3
    net.tick(2)
    core = net.cores["n2"]
    assert core.epoch_cache(1)[-1] == (2, 3) and core.commit_offset(1) == 4
    before = snapshot(net, "n2")
    forged = batch(4, 1)                              # epoch 1 after epoch 2: never honest
    msg = as_peer(net, "n2", "n1", ReplAppend, [AppendRow(1, 2, 4, 1, 5, 1, 5, 4, len(forged), 0)])
    rd = core.step("n1", msg, forged)
    assert rd.log_ops == [] and snapshot(net, "n2") == before


def test_a_replica_many_terms_behind_catches_up_through_a_vote_answer():
    """Liveness of the term-jump bound: appends from far ahead are refused, but a replica
    that campaigns takes the term from the answers to its own vote request."""
    cfg = dataclasses.replace(CFG, max_term_jump=3)
    net = Net(cfg=cfg)
    net.elect("n0")
    net.isolate("n2")
    for leader in ("n1", "n0", "n1", "n0", "n1"):
        net.apply(net.cores[leader].leader(1)[0], net.cores[net.cores[leader].leader(1)[0]].transfer_leadership(1, leader))
        net.tick(4, nids=["n0", "n1"])
    assert net.cores["n0"].leader(1)[1] >= 5 and net.cores["n2"].state(1).term == 1
    net.produce(net.cores["n0"].leader(1)[0])
    net.heal()
    net.tick(8 * cfg.election_ticks)
    leader, term = net.cores["n0"].leader(1)
    assert net.cores["n2"].leader(1) == (leader, term) and net.cores["n2"].commit_offset(1) == net.cores[leader].commit_offset(1)


def test_a_vote_answer_far_ahead_is_taken_only_while_campaigning():
    cfg = dataclasses.replace(CFG, max_term_jump=3)
    net = Net(cfg=cfg)
    net.elect("n0")
    core = net.cores["n1"]
    core.step("n2", as_peer(net, "n1", "n2", ReplVoteResp, [VoteRespRow(1, 50, 0, 0, 0)]))
    assert core.state(1).term == 1 and core.refused_rows == 1


def test_a_vote_answer_at_a_term_near_the_bound_is_never_caught_up_to():
    """One forged answer at MAX_TERM - 1 made a campaigning replica ask for MAX_TERM, which
    every peer refuses, and its own answers took the others there: no leader, for good."""
    from mesh.raft.messages import MAX_TERM
    net = Net()
    net.elect("n0")
    net.isolate("n1")
    net.tick(4 * CFG.election_ticks, nids=["n1"])   # n1, cut off, campaigns
    core = net.cores["n1"]
    assert core.role(1) in (Role.PRE_CANDIDATE, Role.CANDIDATE)
    refused = core.refused_rows
    core.step("n2", as_peer(net, "n1", "n2", ReplVoteResp, [VoteRespRow(1, MAX_TERM - 1, 0, 0, 0)]))
    assert core.state(1).term < 100 and core.refused_rows == refused + 1
    net.heal()
    net.tick(8 * CFG.election_ticks)
    leader, _ = net.cores["n0"].leader(1)
    assert leader is not None and net.cores["n1"].leader(1)[0] == leader


# -- the shell's check of an append's batches ----------------------------------------------------

def _append(rows, payload):
    return wire(ReplAppend(rows)), payload


@pytest.mark.parametrize("rows,payload,why", [
    ([AppendRow(1, 2, 3, 2, 4, 2, 0, 3, 0, 0)], b"", "end at 3"),
    ([AppendRow(1, 2, 3, 2, 5, 2, 0, 3, 0, 0)], batch(3, 2), "end at 4"),
    ([AppendRow(1, 2, 3, 2, 4, 2, 0, 3, 0, 0)], batch(3, 1), "epoch 1"),
    ([AppendRow(1, 2, 3, 2, 4, 2, 0, 3, 0, 0)], batch(5, 2), "batch at 5"),
    ([AppendRow(1, 2, 3, 2, 4, 2, 0, 3, 0, 0)], batch(3, 2)[:-1] + b"!", "CRC"),
    ([AppendRow(1, 2, 3, 2, 4, 2, 0, 3, 0, 0)], b"garbage", "trailing bytes"),
])
def test_append_payloads_must_be_whole_batches_matching_the_row(rows, payload, why):
    msg, payload = _append([r._replace(payload_bytes=len(payload)) for r in rows], payload)
    with pytest.raises(MeshError, match=why):
        check_append_payload(msg, payload)


def test_a_well_formed_append_payload_passes():
    b = batch(3, 2, n=2) + batch(5, 2)
    check_append_payload(_append([AppendRow(1, 2, 3, 2, 6, 2, 0, 3, len(b), 0)], b)[0], b)


def test_the_check_returns_each_rows_batches_walked_once():
    one, two = batch(3, 2), batch(7, 2, n=2) + batch(9, 2)
    rows = [AppendRow(1, 2, 3, 2, 4, 2, 0, 3, len(one), 0), AppendRow(2, 2, 5, 2, 5, 0, 0, 3, 0, 0),
            AppendRow(3, 2, 7, 2, 10, 2, 0, 3, len(two), 0)]
    walked = check_append_payload(_append(rows, one + two)[0], one + two)
    assert [[(h.base_offset, h.record_count, raw) for h, raw in w] for w in walked] == [
        [(3, 1, one)], [], [(7, 2, two[:len(batch(7, 2, n=2))]), (9, 1, batch(9, 2))]]
    (h, raw), = check_append_payload(_append(rows[:1], one)[0], one)[0]
    assert raw is one   # a lone batch is staged as received, not copied


def test_the_term_jump_bound_is_a_config_field():
    assert ReplicationConfig().max_term_jump == 100
    with pytest.raises(MeshError):
        ReplicationConfig(max_term_jump=0)
